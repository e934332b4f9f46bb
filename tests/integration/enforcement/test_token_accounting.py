"""What a token costs a pod: the hook reports the GPU time it really used, the arbiter charges it.

Real processes (the C hook, the real arbiter, the fake GPU). The bounds are loose on purpose: the
defects they catch are several times larger than the noise of a loaded 2-core machine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fastgshare_cli.sandbox import HookBuild, SandboxError, TenantSpec, build_hook, sandbox


@pytest.fixture(scope="module")
def hook_build() -> Iterator[HookBuild]:
    try:
        yield build_hook()
    except SandboxError as error:
        pytest.fail(str(error))


@pytest.mark.parametrize("quota", [0.25, 0.5])
def test_a_request_after_an_idle_period_does_not_pay_for_the_idle_time(hook_build: HookBuild, quota: float) -> None:
    """Idle time after a token's last kernel is not GPU time: the first 10 ms request after 1 s idle
    gets a token at once (it took ~(1 - quota) x 100 ms when the idle second was charged)."""
    spec = TenantSpec(name="idler", request=quota, limit=quota)
    with sandbox(hook_build, [spec]) as box:
        summary = box.run_tenant(spec, "--launches", "3", "--duration-us", "10000", "--burst-on-ms", "1",
                                 "--burst-off-ms", "1000")
    assert summary["launches"] == 3
    assert summary["max_later_launch_ms"] < 40, summary
