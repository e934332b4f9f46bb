"""Leader election over a Lease: take, renew, respect a live holder, take over a dead one, release."""

from __future__ import annotations

import threading

import pytest

from fastgshare_kube.errors import ApiError
from fastgshare_kube.leader import LeaderElector
from tests.unit.fastgshare_kube.fakes import FakeLeases

NS, NAME = "fastgshare-system", "fastgshare-controller"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def elector(kube: FakeLeases, identity: str, clock: Clock) -> LeaderElector:
    return LeaderElector(kube, NS, NAME, identity, lease_duration_s=15, renew_deadline_s=10, retry_period_s=2,
                         clock=clock, wall_clock=lambda: 1_800_000_000 + clock.now)


def holder(kube: FakeLeases) -> str:
    return str(kube.leases[(NS, NAME)]["spec"]["holderIdentity"])


def test_the_first_candidate_creates_the_lease_and_renews_it() -> None:
    kube, clock = FakeLeases(), Clock()
    a = elector(kube, "a", clock)
    assert a.try_acquire_or_renew()
    spec = kube.leases[(NS, NAME)]["spec"]
    assert (spec["holderIdentity"], spec["leaseDurationSeconds"], spec["leaseTransitions"]) == ("a", 15, 0)
    assert spec["renewTime"] == "2027-01-15T08:00:00.000000Z"
    clock.now = 5
    assert a.try_acquire_or_renew()
    assert kube.leases[(NS, NAME)]["spec"]["renewTime"] == "2027-01-15T08:00:05.000000Z"
    assert kube.leases[(NS, NAME)]["spec"]["acquireTime"] == spec["acquireTime"]


def test_a_second_candidate_waits_while_the_holder_renews_and_takes_over_when_it_stops() -> None:
    kube, clock = FakeLeases(), Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew()
    for step in range(1, 10):
        clock.now = step * 2
        assert a.try_acquire_or_renew()
        assert not b.try_acquire_or_renew()
    clock.now += 14  # a stopped renewing; b has seen the same record for 14 s < 15 s
    assert not b.try_acquire_or_renew()
    clock.now += 2
    assert b.try_acquire_or_renew()
    assert holder(kube) == "b"
    assert kube.leases[(NS, NAME)]["spec"]["leaseTransitions"] == 1
    assert not a.try_acquire_or_renew()
    assert not a.is_leader


def test_a_released_lease_is_taken_at_once() -> None:
    kube, clock = FakeLeases(), Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew()
    a.release()
    assert holder(kube) == ""
    assert b.try_acquire_or_renew()


def test_two_candidates_racing_for_a_free_lease_cannot_both_win() -> None:
    kube, clock = FakeLeases(), Clock()
    a, b = elector(kube, "a", clock), elector(kube, "b", clock)
    assert a.try_acquire_or_renew()
    a.release()
    stale = kube.get_lease(NS, NAME)
    assert b.try_acquire_or_renew()
    kube.get_lease = lambda namespace, name: stale  # type: ignore[method-assign]  # a read before b's write
    assert not a.try_acquire_or_renew()  # its write carries the old resourceVersion: 409
    assert holder(kube) == "b"


def test_hold_returns_false_when_renewal_keeps_failing_past_the_deadline() -> None:
    kube, clock = FakeLeases(), Clock()
    a = elector(kube, "a", clock)
    stop = threading.Event()
    assert a.acquire(stop)
    failures = [ApiError(500, "InternalError")] * 20
    kube.fail("get/leases", *failures)
    waits = iter(range(1, 100))

    def fake_wait(timeout: float | None = None) -> bool:
        clock.now = next(waits) * 2.0
        return False

    stop.wait = fake_wait  # type: ignore[method-assign]
    assert a.hold(stop) is False
    assert clock.now == 12.0  # the first attempt more than 10 s after the last renewal


def test_durations_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry period < renew deadline < lease duration"):
        LeaderElector(FakeLeases(), NS, NAME, "a", lease_duration_s=5, renew_deadline_s=10, retry_period_s=2)
