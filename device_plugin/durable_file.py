"""Replacing a file atomically and durably: the whole new content is written to a temporary file next to
it, fsynced, renamed over the old one (``os.replace``: a reader sees the old or the new file, never half
of one), and the directory fsynced, so that the rename itself survives a crash of the machine. The
arbiter's state file and the model store's ``held.json`` are written so."""

from __future__ import annotations

import os
from pathlib import Path


def replace_durably(path: Path, content: bytes) -> None:
    """``path`` now holds ``content`` (mode 0600 if new); its directory must exist."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(descriptor, view):]
        os.fsync(descriptor)
    except BaseException:
        os.close(descriptor)
        temporary.unlink(missing_ok=True)
        raise
    os.close(descriptor)
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
