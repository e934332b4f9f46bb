"""End to end on one machine: tenants under the C hook, the real arbiter, the fake GPU's accounting.

The tolerances (3 percentage points) leave room for a loaded CI machine; `bench/isolation.py`
reports the exact errors.
"""

from __future__ import annotations

import time

import pytest

from fastgshare_cli.sandbox import HookBuild, TenantSpec, measure_shares, sandbox

TOLERANCE = 0.03


def test_a_tenant_alone_gets_its_limit_not_the_whole_gpu(hook_build: HookBuild) -> None:
    specs = [TenantSpec(name="alone", request=0.1, limit=0.3)]
    with sandbox(hook_build, specs) as box:
        shares = measure_shares(box, specs, 3.0)
    assert shares["alone"] == pytest.approx(0.3, abs=TOLERANCE)


def test_saturating_tenants_get_their_requests_and_stay_under_their_limits(hook_build: HookBuild) -> None:
    specs = [TenantSpec(name="t1", request=0.2, limit=0.3), TenantSpec(name="t2", request=0.3, limit=0.5),
             TenantSpec(name="t3", request=0.1, limit=1.0)]
    with sandbox(hook_build, specs) as box:
        shares = measure_shares(box, specs, 3.0)
    for spec in specs:
        assert spec.request - TOLERANCE <= shares[spec.name] <= spec.limit + TOLERANCE, shares
    assert sum(shares.values()) >= 0.95  # the GPU is kept busy


@pytest.mark.parametrize(("mps", "each"), [(True, 1.0), (False, 0.5)])
def test_half_sm_tenants_share_the_gpu_in_space_only_with_mps(hook_build: HookBuild, mps: bool,
                                                              each: float) -> None:
    specs = [TenantSpec(name="h1", request=0.5, limit=1.0, sm=50), TenantSpec(name="h2", request=0.5, limit=1.0, sm=50)]
    with sandbox(hook_build, specs, mps=mps) as box:
        shares = measure_shares(box, specs, 2.5)
    assert shares["h1"] == pytest.approx(each, abs=0.05)
    assert shares["h2"] == pytest.approx(each, abs=0.05)


def test_a_killed_tenants_time_goes_to_the_others(hook_build: HookBuild) -> None:
    specs = [TenantSpec(name="victim", request=0.5, limit=1.0), TenantSpec(name="survivor", request=0.2, limit=1.0)]
    with sandbox(hook_build, specs) as box:
        start_at = box.start_tenants(specs, seconds=3.0)
        time.sleep(max(0.0, (start_at - time.monotonic_ns()) / 1e9) + 0.8)
        victim = box.tenants.pop("victim")
        victim.kill()
        victim.wait()
        time.sleep(0.5)
        first, first_at = box.sample(), time.monotonic_ns()
        time.sleep(1.0)
        last, last_at = box.sample(), time.monotonic_ns()
        box.wait_tenants(timeout_s=30)
    assert first is not None
    assert last is not None
    survivor = (box.busy_ns(last)["survivor"] - box.busy_ns(first)["survivor"]) / (last_at - first_at)
    assert survivor >= 0.9
