"""Where ``make -C simgpu`` puts the simulated GPU's libraries and workloads, and building them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SOURCES = Path(__file__).resolve().parent
BUILD = SOURCES / "build"
DRIVER = BUILD / "libcuda.so.1"
NVML = BUILD / "libnvidia-ml.so.1"
TENANT = BUILD / "tenant"
FAKE_FN = BUILD / "fake-fn"
OUTPUTS = (DRIVER, NVML, TENANT, FAKE_FN)


class SimGpuBuildError(RuntimeError):
    """The simulated GPU could not be built; the message says why and how to fix it."""


def build(python: str = sys.executable) -> Path:
    """Run ``make -C simgpu`` (a no-op when up to date); returns the build directory."""
    if not (SOURCES / "Makefile").exists():
        raise SimGpuBuildError(f"the simulated GPU's sources are not at {SOURCES}: run from a checkout of the project")
    if shutil.which("make") is None or shutil.which("gcc") is None:
        raise SimGpuBuildError("building the simulated GPU needs make and gcc (apt-get install make gcc)")
    result = subprocess.run(["make", "-C", str(SOURCES), f"PYTHON={python}"], capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        raise SimGpuBuildError(f"make -C {SOURCES} failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return BUILD
