"""The hook tests' fixtures (build once, a fresh fake GPU directory, fake arbiters) and a running fake-fn."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.fake_fn.server import FakeFn, fake_fn_env, start_fake_fn
from tests.integration.hook.conftest import build, gpu_dir, short_tmp, start_arbiter  # noqa: F401 - fixtures
from tests.integration.hook.fake_arbiter import FakeArbiter, Script
from tests.integration.hook.tenants import Build


@pytest.fixture
def arbiter(start_arbiter: Callable[[Script | None], FakeArbiter]) -> FakeArbiter:  # noqa: F811 - the fixture
    return start_arbiter(None)


@pytest.fixture
def run_fake_fn(build: Build, gpu_dir: Path, arbiter: FakeArbiter) -> Iterator[Callable[..., FakeFn]]:  # noqa: F811
    """Starts fake-fn under the hook against the fake arbiter (settings: FAKE_FN_* overrides); stops it after."""
    started: list[FakeFn] = []

    def run(**settings: str) -> FakeFn:
        server = start_fake_fn(fake_fn_env(build, gpu_dir, arbiter=arbiter, settings=settings))
        started.append(server)
        return server

    yield run
    for server in started:
        if server.process.poll() is None:
            server.process.kill()
            server.process.communicate()
