"""The simulated driver alone, as real processes: the build, and a fresh simulated GPU a test."""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from simgpu.build import SimGpuBuildError, build


@pytest.fixture(scope="session")
def simgpu_build() -> Path:
    """``make -C simgpu`` once a session; the build directory."""
    try:
        return build(sys.executable)
    except SimGpuBuildError as error:
        pytest.fail(str(error))


@pytest.fixture
def gpu_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="simgpu-") as directory:
        yield Path(directory)
