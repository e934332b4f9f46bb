"""The pod-wide memory ledger: limits shared by a pod's processes, release on exit."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from fastgshare.memory import MemoryLedgerError, PodMemoryLedger

MiB = 2**20


def test_processes_of_a_pod_share_the_limit() -> None:
    ledger = PodMemoryLedger(100 * MiB)
    assert ledger.reserve("p1", 60 * MiB)
    assert not ledger.reserve("p2", 50 * MiB)  # 110 MiB would pass the limit
    assert ledger.reserve("p2", 40 * MiB)
    assert ledger.used_bytes == 100 * MiB
    assert not ledger.reserve("p1", 1)


def test_release_returns_what_was_held_and_no_more() -> None:
    ledger = PodMemoryLedger(100 * MiB)
    ledger.reserve("p1", 30 * MiB)
    assert ledger.release("p1", 10 * MiB) == 10 * MiB
    assert ledger.release("p1", 50 * MiB) == 20 * MiB  # a double free gives back only what it held
    assert ledger.release("p2", 5) == 0
    assert ledger.used_bytes == 0


def test_a_process_that_exits_frees_everything_it_held() -> None:
    ledger = PodMemoryLedger(100 * MiB)
    ledger.reserve("p1", 70 * MiB)
    ledger.reserve("p2", 20 * MiB)
    assert ledger.release_process("p1") == 70 * MiB
    assert ledger.used_bytes == 20 * MiB
    assert ledger.release_process("p1") == 0


def test_a_lower_limit_applies_to_new_reservations() -> None:
    ledger = PodMemoryLedger(100 * MiB)
    ledger.reserve("p1", 80 * MiB)
    ledger.set_limit(50 * MiB)
    assert ledger.used_bytes == 80 * MiB
    assert not ledger.reserve("p1", 1)
    ledger.release("p1", 40 * MiB)
    assert ledger.reserve("p1", 10 * MiB)


def test_negative_sizes_are_errors() -> None:
    with pytest.raises(MemoryLedgerError, match="size must be >= 0"):
        PodMemoryLedger(10).reserve("p", -1)
    with pytest.raises(MemoryLedgerError, match="limit must be >= 0"):
        PodMemoryLedger(-1)


class MemoryMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = PodMemoryLedger(64 * MiB)
        self.model: dict[str, int] = {}

    @rule(process=st.sampled_from(["a", "b", "c"]), size=st.integers(0, 40 * MiB))
    def reserve(self, process: str, size: int) -> None:
        fits = sum(self.model.values()) + size <= 64 * MiB
        assert self.ledger.reserve(process, size) == fits
        if fits:
            self.model[process] = self.model.get(process, 0) + size

    @rule(process=st.sampled_from(["a", "b", "c"]), size=st.integers(0, 40 * MiB))
    def release(self, process: str, size: int) -> None:
        released = self.ledger.release(process, size)
        assert released == min(size, self.model.get(process, 0))
        self.model[process] = self.model.get(process, 0) - released

    @rule(process=st.sampled_from(["a", "b", "c"]))
    def exit(self, process: str) -> None:
        assert self.ledger.release_process(process) == self.model.pop(process, 0)

    @invariant()
    def matches_the_model_and_the_limit(self) -> None:
        assert self.ledger.used_bytes == sum(self.model.values()) <= 64 * MiB


TestMemoryMachine = MemoryMachine.TestCase
