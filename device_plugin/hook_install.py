"""Installing the hook library (and, with simulated GPUs, the simulated driver) into the state
directory, safe for running containers.

Containers bind-mount these files by host path. Overwriting it in place would change the
code that running processes have mapped, so each build is installed under a name carrying a
digest of its content (``libfastgshare-hook.<digest>.so``), written to a temporary file and
renamed into place atomically. The same content installs to the same name (idempotent);
an upgrade adds a new file and leaves the old one for the containers still using it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

HOOK_PREFIX = "libfastgshare-hook"


class HookInstallError(RuntimeError):
    """The hook library could not be read or installed."""


def install_hook(source: Path, lib_dir: Path) -> Path:
    """Copy ``source`` into ``lib_dir`` under its versioned name and return that path."""
    return install_library(source, lib_dir, HOOK_PREFIX, "hook library")


def install_library(source: Path, lib_dir: Path, prefix: str, what: str) -> Path:
    """Copy the shared object ``source`` into ``lib_dir`` as ``<prefix>.<digest>.so``."""
    try:
        content = source.read_bytes()
    except OSError as error:
        raise HookInstallError(f"cannot read {what} {source}: {error.strerror or error}") from None
    if not content.startswith(b"\x7fELF"):
        raise HookInstallError(f"{what} {source} is not an ELF shared object")
    digest = hashlib.sha256(content).hexdigest()[:16]
    target = lib_dir / f"{prefix}.{digest}.so"
    if target.exists() and target.read_bytes() == content:
        return target
    lib_dir.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=lib_dir, prefix=f".{prefix}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(content)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o755)
        os.replace(temporary, target)
    except OSError as error:
        Path(temporary).unlink(missing_ok=True)
        raise HookInstallError(f"cannot install {what} into {lib_dir}: {error.strerror or error}") from None
    return target
