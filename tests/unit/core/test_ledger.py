"""The per-GPU ledger: slots, memory, the time x SM bin, and its invariants under any history."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from fastgshare.errors import LedgerError
from fastgshare.ledger import GpuLedger, NodeState, Rejection
from fastgshare.packing import BIN, MaxRectsBin, Rect
from fastgshare.share import ShareSpec
from tests.builders import GiB, make_gpu, make_node, make_share


def test_empty_gpu_takes_a_pod_and_accounts_for_it() -> None:
    ledger = GpuLedger(make_gpu(), slots=4)
    rect = ledger.add("ns/a", make_share(request=400, sm=50, mem=2 * GiB))
    assert rect is not None
    assert (rect.width, rect.height) == (400, 50)
    assert ledger.used_memory == 2 * GiB
    assert ledger.free_slots == 3
    assert ledger.used_area == 20_000
    assert ledger.area_fraction == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("setup", "candidate", "rejection", "message"),
    [
        pytest.param([], make_share(mem=17 * GiB), Rejection.MEMORY, "needs 17 GiB, GPU 0 has 16 GiB free",
                     id="memory-larger-than-gpu"),
        pytest.param([make_share(mem=10 * GiB)], make_share(mem=7 * GiB), Rejection.MEMORY,
                     "needs 7 GiB, GPU 0 has 6 GiB free", id="memory-left"),
        pytest.param([make_share(request=600, sm=60)], make_share(request=600, sm=60), Rejection.COMPUTE,
                     "GPU 0 has no 60 percent of its SMs free for 0.6 of the time", id="sm-and-time-conflict"),
        pytest.param([make_share(request=1000, sm=100)], make_share(request=1, sm=1), Rejection.COMPUTE,
                     "no 1 percent of its SMs free for 0.001 of the time", id="whole-gpu-taken"),
    ],
)
def test_refusals_say_why(setup: list[ShareSpec], candidate: ShareSpec, rejection: Rejection,
                          message: str) -> None:
    ledger = GpuLedger(make_gpu())
    for i, share in enumerate(setup):
        ledger.add(f"ns/p{i}", share)
    fit = ledger.check(candidate)
    assert fit.rejection is rejection
    assert message in fit.message
    assert not ledger.fits(candidate)


def test_unhealthy_gpu_refuses_everything() -> None:
    fit = GpuLedger(make_gpu(healthy=False)).check(make_share(request=0, limit=1))
    assert fit.rejection is Rejection.UNHEALTHY


def test_slots_run_out() -> None:
    ledger = GpuLedger(make_gpu(), slots=2)
    ledger.add("ns/a", make_share(request=0, limit=1, mem=1))
    ledger.add("ns/b", make_share(request=0, limit=1, mem=1))
    fit = ledger.check(make_share(request=0, limit=1, mem=1))
    assert fit.rejection is Rejection.NO_SLOT
    assert "all 2 slots taken" in fit.message


def test_best_effort_pods_need_only_memory_and_a_slot() -> None:
    ledger = GpuLedger(make_gpu())
    ledger.add("ns/full", make_share(request=1000, sm=100, mem=GiB))
    assert ledger.add("ns/be", make_share(request=0, limit=1000, sm=100, mem=GiB)) is None
    assert "ns/be" in ledger.pods
    assert "ns/be" not in ledger.layout


def test_without_mps_every_pod_takes_the_full_sm_height() -> None:
    ledger = GpuLedger(make_gpu(mps=False))
    ledger.add("ns/a", make_share(request=600, sm=10))
    assert ledger.layout["ns/a"].height == 100
    fit = ledger.check(make_share(request=500, sm=10))
    assert fit.rejection is Rejection.COMPUTE
    assert "no MPS" in fit.message
    assert ledger.fits(make_share(request=400, sm=10))


def test_adding_repacks_when_the_current_layout_has_no_room() -> None:
    sizes = [(300, 40), (500, 50), (300, 30), (300, 60), (300, 40)]
    incremental = MaxRectsBin()
    assert [incremental.insert(w, h) is not None for w, h in sizes] == [True] * 4 + [False]
    ledger = GpuLedger(make_gpu())
    for i, (request, sm) in enumerate(sizes):
        ledger.add(f"ns/{i}", make_share(request=request, sm=sm))
    assert len(ledger.layout) == 5
    assert ledger.layout["ns/0"] != Rect(0, 0, 300, 40)  # moved by the repack


def test_remove_keeps_the_others_in_place_and_restores_capacity() -> None:
    ledger = GpuLedger(make_gpu())
    ledger.add("ns/a", make_share(request=500, sm=100))
    before = dict(ledger.layout)
    ledger.add("ns/b", make_share(request=500, sm=100))
    assert not ledger.fits(make_share(request=1, sm=1))
    assert ledger.remove("ns/b") == make_share(request=500, sm=100)
    assert ledger.layout == before
    assert ledger.fits(make_share(request=500, sm=100))


def test_duplicate_and_unknown_pods_are_errors() -> None:
    ledger = GpuLedger(make_gpu())
    ledger.add("ns/a", make_share())
    with pytest.raises(LedgerError, match="already on GPU"):
        ledger.add("ns/a", make_share())
    with pytest.raises(LedgerError, match="is not on GPU"):
        ledger.remove("ns/zzz")


def test_adding_a_pod_that_does_not_fit_is_refused() -> None:
    ledger = GpuLedger(make_gpu())
    with pytest.raises(LedgerError, match="does not fit GPU GPU-0000: needs 20 GiB"):
        ledger.add("ns/a", make_share(mem=20 * GiB))
    assert ledger.is_empty


def test_forced_pods_mark_the_gpu_overcommitted_until_removed() -> None:
    ledger = GpuLedger(make_gpu())
    ledger.add("ns/a", make_share(request=600, sm=60))
    ledger.add("ns/b", make_share(request=600, sm=60), force=True)
    assert ledger.overcommitted
    fit = ledger.check(make_share(request=1, sm=1))
    assert fit.rejection is Rejection.COMPUTE
    assert "over-committed" in fit.message
    assert ledger.fits(make_share(request=0, limit=1))  # best effort needs no time
    ledger.remove("ns/a")
    assert not ledger.overcommitted
    assert set(ledger.layout) == {"ns/b"}


def test_copy_is_independent() -> None:
    ledger = GpuLedger(make_gpu())
    ledger.add("ns/a", make_share())
    clone = ledger.copy()
    clone.add("ns/b", make_share())
    assert set(ledger.pods) == {"ns/a"}
    assert set(clone.pods) == {"ns/a", "ns/b"}


def test_ledger_needs_at_least_one_slot() -> None:
    with pytest.raises(LedgerError, match="slots must be >= 1"):
        GpuLedger(make_gpu(), slots=0)


def test_node_state_orders_gpus_and_finds_pods() -> None:
    node = make_node(gpus=[make_gpu(1), make_gpu(0)])
    assert [ledger.gpu.index for ledger in node.ledgers.values()] == [0, 1]
    node.ledger("GPU-0001").add("ns/a", make_share())
    found = node.find_pod("ns/a")
    assert found is not None
    assert found.gpu.index == 1
    assert node.find_pod("ns/b") is None
    assert node.empty_gpu_count() == 1
    with pytest.raises(LedgerError, match="has no GPU GPU-9"):
        node.ledger("GPU-9")
    clone = node.copy()
    clone.ledger("GPU-0000").add("ns/b", make_share())
    assert node.ledger("GPU-0000").is_empty


shares = st.builds(
    lambda request, sm, mem_gib, extra: ShareSpec(
        request_permille=request, limit_permille=max(1, min(1000, request + extra)),
        sm_percent=sm, memory_bytes=mem_gib * GiB),
    request=st.sampled_from([0, 100, 200, 250, 300, 400, 500, 600, 800, 1000]) | st.integers(0, 1000),
    sm=st.sampled_from([10, 12, 24, 25, 30, 50, 60, 100]) | st.integers(1, 100),
    mem_gib=st.integers(1, 6),
    extra=st.integers(0, 1000),
)


class LedgerMachine(RuleBasedStateMachine):
    """Any sequence of adds and removes keeps the ledger physically valid."""

    pods = Bundle("pods")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = GpuLedger(make_gpu(mps=True), slots=8)
        self.counter = 0

    @rule(target=pods, share=shares)
    def add(self, share: ShareSpec) -> str:
        key = f"ns/p{self.counter}"
        self.counter += 1
        if self.ledger.fits(share):
            self.ledger.add(key, share)
        else:
            with pytest.raises(LedgerError):
                self.ledger.add(key, share)
        return key

    @rule(key=consumes(pods))
    def remove(self, key: str) -> None:
        if key not in self.ledger.pods:
            return
        share = self.ledger.remove(key)
        assert key not in self.ledger.pods
        # Capacity is restored: the pod just removed fits again.
        assert self.ledger.fits(share)

    @invariant()
    def budgets_hold(self) -> None:
        assert self.ledger.used_memory <= self.ledger.gpu.memory_bytes
        assert len(self.ledger.pods) <= self.ledger.slots

    @invariant()
    def rectangles_are_inside_and_disjoint(self) -> None:
        layout = self.ledger.layout
        compute = {k for k, s in self.ledger.pods.items() if not s.is_best_effort}
        assert set(layout) == compute
        rects = list(layout.items())
        for i, (key, rect) in enumerate(rects):
            share = self.ledger.pods[key]
            assert (rect.width, rect.height) == (share.request_permille, share.sm_percent)
            assert BIN.contains(rect)
            for _, other in rects[i + 1:]:
                assert not rect.intersects(other)


TestLedgerMachine = LedgerMachine.TestCase


def test_a_rebuilt_node_state_matches_one_built_incrementally() -> None:
    shares_in_order = [make_share(request=r, sm=s) for r, s in [(600, 50), (400, 24), (600, 50), (400, 12)]]
    first = NodeState(make_node().inventory)
    second = NodeState(make_node().inventory)
    for i, share in enumerate(shares_in_order):
        first.ledger("GPU-0000").add(f"ns/{i}", share)
        second.ledger("GPU-0000").add(f"ns/{i}", share)
    assert first.ledger("GPU-0000").layout == second.ledger("GPU-0000").layout
