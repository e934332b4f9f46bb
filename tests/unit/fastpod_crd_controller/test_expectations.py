"""Expectations: no new actions for a FaSTPod until its last creates and deletes were observed."""

from __future__ import annotations

from fastpod_crd_controller.expectations import Expectations


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_unknown_keys_are_satisfied() -> None:
    assert Expectations().satisfied("ns/a")


def test_creates_and_deletes_must_all_be_observed() -> None:
    expectations = Expectations()
    expectations.expect("ns/a", creates=2, deletes=["u1"])
    expectations.creation_observed("ns/a")
    expectations.deletion_observed("ns/a", "u1")
    assert not expectations.satisfied("ns/a")
    expectations.creation_observed("ns/a")
    assert expectations.satisfied("ns/a")


def test_a_delete_of_another_pod_does_not_count() -> None:
    expectations = Expectations()
    expectations.expect("ns/a", deletes=["u1"])
    expectations.deletion_observed("ns/a", "someone-else")
    expectations.deletion_observed("ns/b", "u1")
    assert not expectations.satisfied("ns/a")


def test_expectations_expire_so_a_lost_event_cannot_wedge_a_fastpod() -> None:
    clock = Clock()
    expectations = Expectations(ttl_s=60, clock=clock)
    expectations.expect("ns/a", creates=1)
    clock.now = 59
    assert not expectations.satisfied("ns/a")
    clock.now = 61
    assert expectations.satisfied("ns/a")


def test_forget() -> None:
    expectations = Expectations()
    expectations.expect("ns/a", creates=3)
    expectations.forget("ns/a")
    assert expectations.satisfied("ns/a")
