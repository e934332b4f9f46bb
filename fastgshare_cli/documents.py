"""Reading YAML/JSON files into documents, with errors that name the file and line.

Input is bounded, since a manifest may come from anywhere: files over :data:`MAX_BYTES` are
refused, YAML aliases (``*name``: self-references and "billion laughs" bombs) are refused, and
so is nesting deeper than :data:`MAX_DEPTH`. Kubernetes manifests need none of these.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")
MAX_BYTES = 16 * 2**20
MAX_DEPTH = 100


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader without aliases and with a nesting limit."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise ComposerError(None, None, "YAML aliases (*name) are not allowed in manifests; write the value out",
                                self.peek_event().start_mark)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels; allowed: at most "
                                                f"{MAX_DEPTH}", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class DocumentError(Exception):
    """A file could not be read or parsed; the message names the file."""


def manifest_files(path: str) -> list[str]:
    """``path`` itself, or for a directory every ``.yaml``, ``.yml`` and ``.json`` file under it
    (sorted, hidden ones left out); raises :class:`DocumentError` for a directory without any."""
    if path == "-" or not Path(path).is_dir():
        return [path]
    found = sorted(str(file) for file in Path(path).rglob("*")
                   if file.suffix in MANIFEST_SUFFIXES and file.is_file()
                   and not any(part.startswith(".") for part in file.relative_to(path).parts))
    if not found:
        raise DocumentError(f"{path}: no {', '.join(MANIFEST_SUFFIXES[:-1])} or {MANIFEST_SUFFIXES[-1]} files "
                            "in this directory")
    return found


def load_documents(path: str) -> list[object]:
    """Every YAML document in ``path`` (``-`` reads standard input), empty ones dropped."""
    try:
        if path == "-":
            text = sys.stdin.read(MAX_BYTES + 1)
        else:
            with Path(path).open(encoding="utf-8") as file:
                text = file.read(MAX_BYTES + 1)
    except OSError as error:
        raise DocumentError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise DocumentError(f"{path}: not a UTF-8 text file") from None
    if len(text) > MAX_BYTES:
        raise DocumentError(f"{path}: larger than {MAX_BYTES // 2**20} MiB; allowed: manifests up to "
                            f"{MAX_BYTES // 2**20} MiB")
    try:
        return [doc for doc in yaml.load_all(text, Loader=_BoundedLoader) if doc is not None]  # safe, bounded
    except RecursionError:
        raise DocumentError(f"{path}: nested too deeply to read") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise DocumentError(f"{path}:{where}: not valid YAML: {problem}") from None
