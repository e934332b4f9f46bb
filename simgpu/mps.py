"""A stand-in for the MPS control daemon (``nvidia-cuda-mps-control -d``) on the simulated GPU.

The real daemon makes a ``control`` pipe in its pipe directory (``CUDA_MPS_PIPE_DIRECTORY``) while it
runs and removes it when it quits; whoever asks whether MPS runs looks for that pipe. :func:`start`
and :func:`stop` do the same to a directory, so a test can turn MPS on and off under a running
node agent. Nothing else of MPS is simulated (the simulated driver applies SM partitions itself).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CONTROL_PIPE = "control"  # NVIDIA's name


def start(pipe_dir: Path) -> Path:
    """Make ``pipe_dir`` and its ``control`` FIFO, as the daemon does when it starts; the FIFO's path."""
    pipe_dir.mkdir(parents=True, exist_ok=True)
    control = pipe_dir / CONTROL_PIPE
    if not running(pipe_dir):
        control.unlink(missing_ok=True)
        os.mkfifo(control, 0o666)
    return control


def stop(pipe_dir: Path) -> None:
    """Remove the ``control`` FIFO, as the daemon does when it quits."""
    (pipe_dir / CONTROL_PIPE).unlink(missing_ok=True)


def running(pipe_dir: Path) -> bool:
    """Whether the stand-in's ``control`` FIFO is there."""
    try:
        return stat.S_ISFIFO((pipe_dir / CONTROL_PIPE).stat().st_mode)
    except OSError:
        return False
