"""Installing the hook library (and, with simulated GPUs, the simulated driver and each GPU's two
state files) into the state directory, safe for running containers.

Containers bind-mount these files by host path. Overwriting it in place would change the
code that running processes have mapped, so each build is installed under a name carrying a
digest of its content (``libfastgshare-hook.<digest>.so``), written to a temporary file and
renamed into place atomically. The same content installs to the same name (idempotent);
an upgrade adds a new file and leaves the old one for the containers still using it.

A simulated GPU's state is two files, ``fake_gpu.state`` and ``fake_gpu.lock`` (the names
``simgpu/driver/fake_gpu_state.h`` gives them), which containers bind-mount one by one: the
directory holding them is never mounted, so no pod can create a file another pod sees (issue 42,
row 8). :func:`ensure_simulated_gpu_files` makes them before a container mounts them: a bind mount
of a missing file makes the container runtime create a directory in its place.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

HOOK_PREFIX = "libfastgshare-hook"
# The simulated GPU's state and lock files, as simgpu/driver/fake_gpu_state.h names them
# (FAKE_GPU_STATE_FILE, FAKE_GPU_LOCK_FILE); the driver opens both read-write.
SIMULATED_GPU_FILES = ("fake_gpu.state", "fake_gpu.lock")


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


class SimulatedGpuFilesError(RuntimeError):
    """A simulated GPU's state files could not be made, or something other than a file is there."""


def ensure_simulated_gpu_files(gpu_dir: Path) -> tuple[Path, ...]:
    """Make the simulated GPU's state and lock files in ``gpu_dir`` if missing (empty: the first
    process to attach initialises the state; mode 0666: containers of any user attach), keep
    them if there, and return their paths. The directory is made root's alone (0755): containers
    never mount it, and nobody else may plant a link the runtime would mount in their place."""
    try:
        gpu_dir.mkdir(parents=True, exist_ok=True)
        if gpu_dir.stat().st_mode & 0o022:
            gpu_dir.chmod(0o755)
        return tuple(_ensure_file(gpu_dir / name) for name in SIMULATED_GPU_FILES)
    except OSError as error:
        raise SimulatedGpuFilesError(f"cannot make {error.filename or gpu_dir}: {error.strerror or error}") from None


def _ensure_file(path: Path) -> Path:
    try:
        handle = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except FileExistsError:
        mode = path.lstat().st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "a symbolic link" if stat.S_ISLNK(mode) else "not a file"
            raise SimulatedGpuFilesError(f"{path} is {what}; remove it (the simulated GPU's state is a "
                                         "regular file)") from None
        return path
    try:
        os.fchmod(handle, 0o666)
    finally:
        os.close(handle)
    return path
