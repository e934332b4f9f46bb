"""Reading YAML/JSON files into documents, with errors that name the file and line."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


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
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise DocumentError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise DocumentError(f"{path}: not a UTF-8 text file") from None
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or str(error)
        raise DocumentError(f"{path}:{where}: not valid YAML: {problem}") from None
