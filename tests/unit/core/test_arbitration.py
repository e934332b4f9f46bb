"""The token arbiter as a deterministic simulation: requests guaranteed, limits never exceeded."""

from __future__ import annotations

import pytest

from fastgshare.arbitration import ArbitrationError, Decision, GpuArbiter, Grant, TimeShare, _usage
from tests.arbiter_sim import MS, bursty, saturating, simulate

TOLERANCE = 0.02  # two percentage points


@pytest.mark.parametrize("limit", [0.05, 0.3, 0.7])
def test_a_tenant_alone_is_held_to_its_limit(limit: float) -> None:
    shares = simulate(GpuArbiter(), {"a": saturating(0.05, limit)}, duration_ms=5_000)
    assert shares["a"] == pytest.approx(limit, abs=TOLERANCE / 2)


def test_three_saturating_tenants_get_requests_and_respect_limits() -> None:
    tenants = {"a": saturating(0.2, 0.3), "b": saturating(0.3, 0.5), "c": saturating(0.1, 1.0)}
    shares = simulate(GpuArbiter(), tenants, duration_ms=5_000)
    for name, tenant in tenants.items():
        request, limit = tenant.share.request_permille / 1000, tenant.share.limit_permille / 1000
        assert request - TOLERANCE <= shares[name] <= limit, (name, shares)
    assert sum(shares.values()) >= 1 - TOLERANCE  # work-conserving: the GPU never idles


def test_spare_time_goes_to_the_least_used() -> None:
    shares = simulate(GpuArbiter(), {"a": saturating(0.2, 1.0), "b": saturating(0.2, 1.0)}, duration_ms=5_000)
    assert shares["a"] == pytest.approx(0.5, abs=TOLERANCE)
    assert shares["b"] == pytest.approx(0.5, abs=TOLERANCE)


@pytest.mark.parametrize(("mps", "expected"), [(True, 1.0), (False, 0.5)])
def test_half_sm_tenants_run_together_only_with_mps(mps: bool, expected: float) -> None:
    tenants = {"a": saturating(0.5, 1.0, sm=50), "b": saturating(0.5, 1.0, sm=50)}
    shares = simulate(GpuArbiter(mps_enabled=mps), tenants, duration_ms=3_000)
    assert shares["a"] == pytest.approx(expected, abs=TOLERANCE)
    assert shares["b"] == pytest.approx(expected, abs=TOLERANCE)


def test_a_whole_gpu_tenant_is_not_starved_by_small_bursting_ones() -> None:
    tenants = {"big": saturating(0.5, 1.0, sm=100), "s1": saturating(0.1, 1.0, sm=50),
               "s2": saturating(0.1, 1.0, sm=50)}
    shares = simulate(GpuArbiter(), tenants, duration_ms=5_000)
    assert shares["big"] >= 0.5 - TOLERANCE
    assert shares["s1"] >= 0.1 - TOLERANCE
    assert shares["s2"] >= 0.1 - TOLERANCE


def test_a_bursty_tenant_gets_its_request_while_active() -> None:
    tenants = {"steady": saturating(0.3, 1.0), "burst": bursty(0.5, 1.0, on_ms=200, off_ms=200)}
    shares = simulate(GpuArbiter(), tenants, duration_ms=6_000, warmup_ms=0)
    # Active half of the time with a 0.5 request: at least 0.25 overall; the rest is the steady one's.
    assert shares["burst"] >= 0.25 - TOLERANCE
    assert shares["steady"] >= 0.3
    assert sum(shares.values()) >= 1 - TOLERANCE


def test_update_share_takes_effect_mid_run() -> None:
    arbiter = GpuArbiter()
    tenants = {"a": saturating(0.1, 0.3)}
    shares = simulate(arbiter, tenants, duration_ms=4_000, warmup_ms=2_200,
                      changes={2_000: lambda: arbiter.update_share("a", TimeShare(100, 600, 100))})
    assert shares["a"] == pytest.approx(0.6, abs=TOLERANCE)


def test_removing_a_holder_frees_the_gpu_at_once() -> None:
    arbiter = GpuArbiter()
    arbiter.add_client("a", TimeShare(500, 1000, 100))
    arbiter.add_client("b", TimeShare(500, 1000, 100))
    arbiter.request("a", 0, 0)
    arbiter.request("b", 0, 0)
    first = arbiter.schedule(0)
    assert [g.client for g in first.grants] == ["a"]
    arbiter.remove_client("a")
    assert arbiter.schedule(1 * MS).grants == (Grant("b", 50 * MS),)


def test_returning_a_token_early_is_credited() -> None:
    arbiter = GpuArbiter(window_ns=100 * MS)
    arbiter.add_client("a", TimeShare(300, 300, 100))
    arbiter.request("a", 0, 0)
    assert arbiter.schedule(0).grants == (Grant("a", 30 * MS),)
    arbiter.request("a", 30 * MS, 10 * MS)  # used only 10 ms of the 30
    assert arbiter.usage_ns("a", 30 * MS) == 10 * MS
    assert arbiter.schedule(30 * MS).grants == (Grant("a", 20 * MS),)  # the remaining limit budget


def test_an_over_limit_client_is_woken_exactly_when_budget_returns() -> None:
    arbiter = GpuArbiter(window_ns=100 * MS, min_token_ns=2 * MS)
    arbiter.add_client("a", TimeShare(300, 300, 100))
    arbiter.request("a", 0, 0)
    arbiter.schedule(0)
    arbiter.request("a", 30 * MS, 30 * MS)
    decision = arbiter.schedule(30 * MS)
    # Eligible again once half a minimum token of budget is back: usage 29 ms, 1 ms after the
    # grant began to slide out of the window; then it gets a whole minimum token.
    assert decision == Decision((), 101 * MS)
    assert arbiter.schedule(101 * MS).grants == (Grant("a", 2 * MS),)


def test_wake_time_is_the_earliest_token_end() -> None:
    arbiter = GpuArbiter()
    arbiter.add_client("a", TimeShare(200, 1000, 50))
    arbiter.add_client("b", TimeShare(400, 1000, 50))
    arbiter.request("a", 0, 0)
    arbiter.request("b", 0, 0)
    decision = arbiter.schedule(0)
    assert {g.client for g in decision.grants} == {"a", "b"}
    assert decision.wake_at_ns == 20 * MS


def test_best_effort_clients_get_minimum_tokens_when_the_gpu_is_free() -> None:
    arbiter = GpuArbiter(min_token_ns=2 * MS)
    arbiter.add_client("be", TimeShare(0, 1000, 100))
    arbiter.request("be", 0, 0)
    assert arbiter.schedule(0).grants == (Grant("be", 2 * MS),)


def test_decisions_are_deterministic() -> None:
    def run() -> dict[str, float]:
        tenants = {"a": saturating(0.2, 0.3), "b": saturating(0.3, 0.5, sm=60), "c": saturating(0.1, 1.0, sm=40)}
        return simulate(GpuArbiter(), tenants, duration_ms=2_000)

    assert run() == run()


def test_unknown_and_duplicate_clients_are_errors() -> None:
    arbiter = GpuArbiter()
    arbiter.add_client("a", TimeShare(1, 1, 1))
    with pytest.raises(ArbitrationError, match="already registered"):
        arbiter.add_client("a", TimeShare(1, 1, 1))
    with pytest.raises(ArbitrationError, match="is not registered"):
        arbiter.request("zz", 0, 0)
    arbiter.remove_client("zz")  # removing twice or an unknown client is harmless


def test_window_settings_are_validated() -> None:
    with pytest.raises(ArbitrationError, match="min_token_ns"):
        GpuArbiter(window_ns=10, min_token_ns=20)


def test_release_frees_the_sms_without_asking_again() -> None:
    arbiter = GpuArbiter()
    arbiter.add_client("a", TimeShare(500, 1000, 100))
    arbiter.add_client("b", TimeShare(500, 1000, 100))
    arbiter.request("a", 0, 0)
    arbiter.schedule(0)
    arbiter.request("b", 1 * MS, 0)
    assert arbiter.schedule(1 * MS).grants == ()
    assert arbiter.holding_until("a") == 50 * MS
    arbiter.release("a", 5 * MS, 5 * MS)
    assert not arbiter.is_waiting("a")
    assert arbiter.schedule(5 * MS).grants == (Grant("b", 50 * MS),)
    assert arbiter.usage_ns("a", 5 * MS) == 5 * MS


def test_running_usage_matches_the_definition() -> None:
    arbiter = GpuArbiter(window_ns=100 * MS, min_token_ns=1 * MS)
    arbiter.add_client("a", TimeShare(70, 900, 100))
    now = 0
    for step in range(200):
        arbiter.request("a", now, (step * 7919) % (8 * MS))  # uses a varying part of each token
        grants = arbiter.schedule(now).grants
        now += grants[0].token_ns if grants else 3 * MS
        state = arbiter._clients["a"]
        assert arbiter.usage_ns("a", now) == _usage(state.history, now, 100 * MS)


def test_an_overrun_past_the_token_is_charged() -> None:
    arbiter = GpuArbiter(window_ns=100 * MS)
    arbiter.add_client("a", TimeShare(300, 300, 100))
    arbiter.request("a", 0, 0)
    assert arbiter.schedule(0).grants == (Grant("a", 30 * MS),)
    arbiter.request("a", 35 * MS, 34 * MS)  # its last kernel ended 4 ms after the token
    assert arbiter.usage_ns("a", 35 * MS) == 34 * MS


def test_a_claimed_use_past_now_is_clipped() -> None:
    arbiter = GpuArbiter(window_ns=100 * MS)
    arbiter.add_client("a", TimeShare(300, 300, 100))
    arbiter.request("a", 0, 0)
    arbiter.schedule(0)
    arbiter.request("a", 10 * MS, 99 * MS)
    assert arbiter.usage_ns("a", 10 * MS) == 10 * MS


@pytest.mark.parametrize("kernel_ms", [10, 20, 30])
@pytest.mark.parametrize("limit", [0.1, 0.25, 0.5])
def test_kernels_that_run_past_their_tokens_are_paid_back(kernel_ms: int, limit: float) -> None:
    """A tenant whose last kernel of each token runs on past its end (it is charged for that) is
    held to its limit over the long run, also when one kernel is longer than its limit's share of a
    window. Admitting by the window's usage alone gave 113 % of the limit (10 ms kernels at 0.25)
    and 180 % (20 ms at 0.1): a debt older than the window was forgotten."""
    shares = simulate(GpuArbiter(), {"a": saturating(limit, limit, kernel_ms=kernel_ms)}, duration_ms=10_000)
    assert shares["a"] == pytest.approx(limit, abs=TOLERANCE / 2)


def test_a_debt_longer_than_the_window_delays_the_next_token_until_it_is_paid() -> None:
    arbiter = GpuArbiter(window_ns=100 * MS, min_token_ns=2 * MS)
    arbiter.add_client("a", TimeShare(100, 100, 100))  # 10 ms a window, earned at 0.1 ms per ms
    arbiter.request("a", 0, 0)
    assert arbiter.schedule(0).grants == (Grant("a", 10 * MS),)
    arbiter.request("a", 50 * MS, 50 * MS)  # its kernel ran 40 ms past the token
    # The window's usage is back under the limit (less half a minimum token) at 141 ms ...
    assert arbiter.schedule(50 * MS) == Decision((), 141 * MS)
    # ... but 40 ms of debt less 5 ms earned meanwhile and 9.1 ms earned by 141 ms is paid at 400 ms.
    assert arbiter.schedule(141 * MS) == Decision((), 400 * MS)
    assert arbiter.schedule(399 * MS).grants == ()
    assert arbiter.schedule(400 * MS).grants == (Grant("a", 10 * MS),)


def test_idle_time_banks_at_most_one_window_of_the_limit() -> None:
    """A tenant idle for 5 s then launching kernels that overrun their tokens does not spend 5 s of
    saved-up budget on the overruns: it is held to its limit from the start."""
    tenant = saturating(0.25, 0.25, kernel_ms=10)
    tenant.wants = lambda now: now >= 5_000 * MS
    shares = simulate(GpuArbiter(), {"a": tenant}, duration_ms=10_500, warmup_ms=5_500)
    assert shares["a"] == pytest.approx(0.25, abs=TOLERANCE / 2)
