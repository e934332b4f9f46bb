"""The enforcement tests' shared fixture: the C hook and the fake GPU, built once per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fastgshare_cli.sandbox import HookBuild, SandboxError, build_hook


@pytest.fixture(scope="module")
def hook_build() -> Iterator[HookBuild]:
    try:
        yield build_hook()
    except SandboxError as error:
        pytest.fail(str(error))
