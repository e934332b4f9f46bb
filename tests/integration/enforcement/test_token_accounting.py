"""What a token costs a pod: the hook reports the GPU time it really used, the arbiter charges it.

Real processes (the C hook, the real arbiter, the fake GPU). The bounds are loose on purpose: the
defects they catch are several times larger than the noise of a loaded 2-core machine.
"""

from __future__ import annotations

import time

import pytest

from fastgshare_cli.sandbox import HookBuild, Sandbox, TenantSpec, sandbox

MS = 1_000_000


@pytest.mark.parametrize("quota", [0.25, 0.5])
def test_a_request_after_an_idle_period_does_not_pay_for_the_idle_time(hook_build: HookBuild, quota: float) -> None:
    """Idle time after a token's last kernel is not GPU time: the first 10 ms request after 1 s idle
    gets a token at once (it took ~(1 - quota) x 100 ms when the idle second was charged)."""
    spec = TenantSpec(name="idler", request=quota, limit=quota)
    with sandbox(hook_build, [spec]) as box:
        summary = box.run_tenant(spec, "--launches", "3", "--duration-us", "10000", "--burst-on-ms", "1",
                                 "--burst-off-ms", "1000")
    assert summary["launches"] == 3
    later_ms = summary["max_later_launch_ms"]
    assert isinstance(later_ms, float)
    assert later_ms < 40, summary


def _share_of_quota(box: Sandbox, spec: TenantSpec, *args: str, seconds: float = 3.0) -> float:
    """Run one tenant for ``seconds``; its GPU time over the middle of the run (the fake GPU's own
    accounting), as a fraction of its quota."""
    start_at = time.monotonic_ns() + 300 * MS
    box.start_process(spec, [str(box.build.tenant), "--seconds", str(seconds), "--start-at-ns", str(start_at),
                             *args])
    time.sleep(0.3 + 0.5)
    first, first_at = box.sample(), time.monotonic_ns()
    time.sleep(seconds - 0.9)
    last, last_at = box.sample(), time.monotonic_ns()
    box.wait_tenants(timeout_s=seconds + 30)
    assert first is not None
    assert last is not None
    used = box.busy_ns(last)[spec.name] - box.busy_ns(first)[spec.name]
    return used / (last_at - first_at) / spec.limit


def test_a_second_threads_kernel_is_charged_to_the_token_it_passed_the_gate_under(hook_build: HookBuild) -> None:
    """A kernel that passed the gate in one thread while another thread's kernel ran (the fake GPU
    runs a process's kernels one at a time, like a real stream queue) still belongs to that token:
    the token is returned only after it. Two launching threads got ~185 % of the quota when the
    token was returned before it, ~137 % when tokens were admitted by the window's usage alone,
    ~100 % since the arbiter's credit pays every overrun back."""
    spec = TenantSpec(name="threads", request=0.25, limit=0.25)
    with sandbox(hook_build, [spec]) as box:
        share = _share_of_quota(box, spec, "--threads", "2", "--duration-us", "10000")
    assert 0.9 < share < 1.1, share


def test_kernels_that_overrun_their_token_are_paid_back(hook_build: HookBuild) -> None:
    """A non-stop launcher of 10 ms kernels at quota 0.25 gets its quota (its request too), not the
    110-114 % it got when the arbiter admitted by the window's usage alone (fastgshare/arbitration.py,
    the credit)."""
    spec = TenantSpec(name="overrun", request=0.25, limit=0.25)
    with sandbox(hook_build, [spec]) as box:
        share = _share_of_quota(box, spec, "--duration-us", "10000")
    assert 0.94 < share < 1.06, share
