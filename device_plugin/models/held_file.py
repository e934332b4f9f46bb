"""``held.json``: what the node agent's model store holds per GPU, and the losses whose pods have not been
told yet, kept across restarts of the agent (so that a restarted agent whose workers died with its
container knows what was lost, :mod:`device_plugin.models.store`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import attrs

from device_plugin.durable_file import replace_durably
from fastgshare.model import HeldModel

log = logging.getLogger(__name__)

HELD_FILE_NAME = "held.json"
HELD_VERSION = 1


@attrs.frozen
class SavedModel:
    """One model of ``held.json``: held on ``gpu``, or (``why`` set) lost there and not yet told."""

    gpu: str
    model: HeldModel
    why: str = ""



class HeldFile:
    """``held.json``: what the store holds per GPU (``models``) and the losses whose pods have not
    been told yet (``lost``), each entry ``gpu``, ``identity``, ``key``, ``bytes`` (and ``why``).
    Written whole to a temporary file, fsynced, renamed over the old one, directory fsynced (as the
    arbiter's state file): a reader sees the old or the new file. A damaged file is ignored with
    one log line."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> tuple[list[SavedModel], list[SavedModel]]:
        """(held, lost); both empty without a file or with a damaged one."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return [], []
        except OSError as error:
            log.error("model store file %s cannot be read (%s): ignored", self.path, error.strerror or error)
            return [], []
        try:
            data = json.loads(raw.decode())
            if not isinstance(data, dict) or data.get("version") != HELD_VERSION:
                raise ValueError(f"version {data.get('version') if isinstance(data, dict) else None!r}, "
                                 f"expected {HELD_VERSION}")
            return ([_saved_model(entry, lost=False) for entry in _entries(data, "models")],
                    [_saved_model(entry, lost=True) for entry in _entries(data, "lost")])
        except (ValueError, RecursionError) as error:
            log.error("model store file %s is damaged (%s): ignored; models a worker lost while no node agent ran "
                      "go unreported", self.path, error)
            return [], []

    def save(self, held: list[SavedModel], lost: list[SavedModel]) -> None:
        """Replace the file, atomically and durably."""
        def entry(saved: SavedModel) -> dict[str, object]:
            fields: dict[str, object] = {"gpu": saved.gpu, "identity": saved.model.identity, "key": saved.model.key,
                                         "bytes": saved.model.bytes}
            if saved.why:
                fields["why"] = saved.why
            return fields

        data = {"version": HELD_VERSION, "models": [entry(s) for s in held], "lost": [entry(s) for s in lost]}
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # as the workers' sockets
        replace_durably(self.path, json.dumps(data, separators=(",", ":")).encode())


def _entries(data: dict[str, object], name: str) -> list[object]:
    entries = data.get(name, [])
    if not isinstance(entries, list):
        raise ValueError(f"{name} is a {type(entries).__name__}, not a list")
    return entries


def _saved_model(entry: object, *, lost: bool) -> SavedModel:
    if not isinstance(entry, dict):
        raise ValueError(f"an entry is a {type(entry).__name__}, not an object")
    texts = {}
    for name in ("gpu", "identity", "key") + (("why",) if lost else ()):
        value = entry.get(name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"{name} {value!r} is not a non-empty string")
        texts[name] = value
    size = entry.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ValueError(f"bytes {size!r} is not a positive integer")
    return SavedModel(texts["gpu"], HeldModel(identity=texts["identity"], key=texts["key"], bytes=size),
                      texts.get("why", ""))
