"""The C hook and the fake GPU driver as real processes: build once, then run tenants against them.

``make -C vgpu_hook`` builds the hook, the fake ``libcuda.so.1`` and ``libnvidia-ml.so.1``, the
``tenant`` and ``memcheck`` test programs and the C unit tests into ``vgpu_hook/build``. Each test
gets a fresh fake GPU directory and, where it needs one, a
:class:`~tests.integration.hook.fake_arbiter.FakeArbiter` on a unix socket.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.hook.fake_arbiter import FakeArbiter, Script
from tests.integration.hook.tenants import BUILD, SIMGPU_BUILD, Build, make_hook


@pytest.fixture(scope="session")
def build() -> Build:
    make_hook()
    return Build(hook=BUILD / "libfastgshare-hook.so", fake_dir=SIMGPU_BUILD, tenant=SIMGPU_BUILD / "tenant",
                 test_quota=BUILD / "test_quota", memcheck=BUILD / "memcheck")


@pytest.fixture
def gpu_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fakegpu-") as directory:
        yield Path(directory)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory with a short path: unix socket paths must fit in 108 bytes."""
    with tempfile.TemporaryDirectory(prefix="fgs-", dir="/tmp") as directory:
        yield Path(directory)


@pytest.fixture
def start_arbiter(short_tmp: Path) -> Iterator[Callable[[Script | None], FakeArbiter]]:
    """Starts fake arbiters (each on its own socket) and stops them after the test."""
    started: list[FakeArbiter] = []

    def start(script: Script | None = None) -> FakeArbiter:
        arbiter = FakeArbiter(short_tmp / f"arbiter-{len(started)}.sock", script)
        started.append(arbiter)
        return arbiter

    yield start
    for arbiter in started:
        arbiter.close()
