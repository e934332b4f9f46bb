"""The tier of NVIDIA user-space tests: NVIDIA's own Python packages (cuda-bindings, NVRTC,
numba-cuda with NVVM; pinned in setup.cfg's ``test`` extra) as real processes under the hook, with
the real arbiter, on the simulated GPU. See tests/nvidia/harness.py for how a program runs.

Every test here is marked ``nvidia``. The tests that need the packages take the ``nvidia_stack``
fixture: where a package is missing they are skipped with the reason, unless
``FASTGSHARE_REQUIRE_NVIDIA=1`` (CI) makes that a failure. Tests that need none of them (the proof
that the call-count comparison catches a call around the hook) always run.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from fastgshare_cli.sandbox import HookBuild, SandboxError, build_hook

HERE = Path(__file__).parent
ENV_REQUIRE = "FASTGSHARE_REQUIRE_NVIDIA"

# What the tier runs, and the pinned package that provides it (setup.cfg, extra "test").
_MODULES = {"cuda.bindings.driver": "cuda-bindings", "cuda.bindings.nvrtc": "cuda-bindings",
            "numba.cuda": "numba-cuda", "numpy": "numpy"}
_LIBRARIES = {"libnvrtc.so.*": "nvidia-cuda-nvrtc", "libnvvm.so.*": "nvidia-nvvm"}  # in nvidia/cu13/lib


def _required() -> bool:
    return os.environ.get(ENV_REQUIRE, "") == "1"


def _cu13_roots() -> list[str]:
    """Where NVIDIA's CUDA 13 wheels put their files (the namespace package nvidia.cu13)."""
    try:
        spec = importlib.util.find_spec("nvidia.cu13")
    except ImportError:
        return []
    return list(spec.submodule_search_locations or []) if spec is not None else []


def missing_packages() -> str | None:
    """Why the tier cannot run here (which pinned package is missing), or None."""
    missing = []
    for module, package in _MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            missing.append(f"{package} ({module})")
    for pattern, package in _LIBRARIES.items():
        if not any(Path(root, "lib").glob(pattern) for root in _cu13_roots()):
            missing.append(f"{package} ({pattern})")
    if not missing:
        return None
    return ("NVIDIA user-space packages missing: " + ", ".join(missing)
            + "; install them with `make install` (setup.cfg's test extra)")


def pytest_configure(config: pytest.Config) -> None:
    # Also declared in pyproject.toml; repeated so this directory works on its own.
    config.addinivalue_line("markers", "nvidia: NVIDIA's user-space packages on the simulated GPU (tests/nvidia)")


_UNAVAILABLE = pytest.StashKey[str]()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this directory's tests ``nvidia``; skip those that need the packages where they are
    missing, unless FASTGSHARE_REQUIRE_NVIDIA=1 (then the ``nvidia_stack`` fixture fails saying why)."""
    ours = [item for item in items if item.path.is_relative_to(HERE)]  # the hook sees every item
    if not ours:
        return
    reason = missing_packages()
    for item in ours:
        item.add_marker(pytest.mark.nvidia)
        if reason is not None and not _required() and "nvidia_stack" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.skip(reason=f"nvidia tier skipped: {reason}"))


def unavailable(reason: str) -> None:
    """Skip the test for ``reason``, or fail it where the tier is required."""
    if _required():
        pytest.fail(f"{reason} ({ENV_REQUIRE}=1: the tier is required)")
    pytest.skip(f"nvidia tier skipped: {reason}")


@pytest.fixture(scope="session")
def nvidia_stack() -> None:
    """The pinned NVIDIA packages are importable (else the test fails: skips happen at collection)."""
    reason = missing_packages()
    if reason is not None:
        pytest.fail(f"{reason} ({ENV_REQUIRE}=1: the tier is required)")


@pytest.fixture(scope="session")
def hook_build() -> HookBuild:
    """The hook and the simulated GPU, built once (make -C vgpu_hook)."""
    try:
        return build_hook()
    except SandboxError as error:
        pytest.fail(str(error))
