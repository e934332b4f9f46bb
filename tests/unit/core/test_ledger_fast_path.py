"""The ledger's fast check (running sums, interned layouts, the process-wide fit memo) decides
exactly as the packing rules themselves, on random GPUs, histories and shares."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from fastgshare import keys
from fastgshare.ledger import FITS, Fit, GpuLedger, Rejection
from fastgshare.packing import BIN, MaxRectsBin, Rect, pack
from fastgshare.share import ShareSpec
from tests.builders import make_gpu

GiB = 2**30

def _share(request: int, extra: int, sm: int, mem: int) -> ShareSpec:
    return ShareSpec(request_permille=request, limit_permille=max(min(request + extra, 1000), 1), sm_percent=sm,
                     memory_bytes=mem)


shares = st.builds(
    _share,
    st.sampled_from([0, 0, 50, 100, 150, 200, 250, 300, 400, 500, 600, 750, 1000]),
    st.integers(0, 200),
    st.sampled_from([5, 10, 20, 25, 30, 40, 50, 60, 75, 100]),
    st.sampled_from([GiB // 2, GiB, 2 * GiB, 4 * GiB, 8 * GiB]),
)
step = st.one_of(st.tuples(st.just("add"), shares, st.booleans()), st.tuples(st.just("remove"), st.integers(0, 20)))


def reference_check(ledger: GpuLedger, share: ShareSpec) -> Fit:  # noqa: PLR0911 - one return per rule
    """The rules without any memo: budgets, then the free space, then a re-pack in three orders."""
    gpu = ledger.gpu
    if not gpu.healthy:
        return Fit(Rejection.UNHEALTHY)
    if len(ledger.pods) >= ledger.slots:
        return Fit(Rejection.NO_SLOT)
    reserve = gpu.context_reserve_bytes  # charged once per pod, next to its gpu_mem
    if share.memory_bytes + reserve > gpu.memory_bytes - sum(s.memory_bytes + reserve for s in ledger.pods.values()):
        return Fit(Rejection.MEMORY)
    if share.is_best_effort:
        return FITS
    if ledger.overcommitted:
        return Fit(Rejection.COMPUTE)
    width, height = share.request_permille, share.sm_percent if gpu.mps_enabled else keys.SM_UNITS
    sizes = [ledger.rectangle_size(s) for s in ledger.pods.values() if not s.is_best_effort]
    if sum(w * h for w, h in sizes) + width * height > BIN.area:
        return Fit(Rejection.COMPUTE)
    if MaxRectsBin(ledger.layout.values()).find_position(width, height) is not None:
        return FITS
    items = [*sizes, (width, height)]
    orders = (lambda r: (-r[0] * r[1], -r[1], -r[0]), lambda r: (-r[1], -r[0]), lambda r: (-r[0], -r[1]))
    if any(pack(sorted(items, key=order)) is not None for order in orders):
        return FITS
    return Fit(Rejection.COMPUTE)


def layout_is_valid(layout: Mapping[str, Rect]) -> bool:
    rects = list(layout.values())
    return all(BIN.contains(r) for r in rects) and not any(
        a.intersects(b) for i, a in enumerate(rects) for b in rects[i + 1:])


@settings(max_examples=300, deadline=None)
@given(mps=st.booleans(), healthy=st.booleans(), slots=st.integers(1, 6), history=st.lists(step, max_size=14),
       asked=st.lists(shares, min_size=1, max_size=6), reserve=st.sampled_from([0, 0, 300 * 2**20, GiB]))
def test_check_decides_exactly_as_the_packing_rules(mps: bool, healthy: bool, slots: int,
                                                    history: list[tuple[object, ...]], asked: list[ShareSpec],
                                                    reserve: int) -> None:
    ledger = GpuLedger(attrs.evolve(make_gpu(0, mps=mps, healthy=healthy), context_reserve_bytes=reserve), slots)
    for serial, (kind, *args) in enumerate(history):
        if kind == "add":
            share, force = args
            assert isinstance(share, ShareSpec)
            if force or ledger.check(share).ok:
                ledger.add(f"pod-{serial}", share, force=True)
        elif ledger.pods:
            assert isinstance(args[0], int)
            ledger.remove(sorted(ledger.pods)[args[0] % len(ledger.pods)])
        if not ledger.overcommitted:
            assert layout_is_valid(ledger.layout)
        assert ledger.used_memory == sum(s.memory_bytes for s in ledger.pods.values())
        assert ledger.used_area == sum(s.request_permille * ledger.rectangle_size(s)[1] for s in ledger.pods.values())
        for share in asked:
            fast, reference = ledger.check(share), reference_check(ledger, share)
            assert fast.rejection == reference.rejection, (share, ledger.layout)
            assert ledger.check(share) == fast  # and again, from the memo


@settings(max_examples=100, deadline=None)
@given(history=st.lists(shares, max_size=10), asked=shares)
def test_equal_summaries_give_equal_answers_and_a_copy_keeps_them(history: list[ShareSpec], asked: ShareSpec) -> None:
    first, second = GpuLedger(make_gpu(0, uuid="GPU-a")), GpuLedger(make_gpu(0, uuid="GPU-b"))
    for serial, share in enumerate(history):
        for ledger in (first, second):
            if ledger.fits(share):
                ledger.add(f"pod-{serial}", share)
    assert first.summary_id == second.summary_id
    assert first.layout_id == second.layout_id
    assert first.check(asked) == second.check(asked)
    clone = first.copy()
    assert (clone.summary_id, clone.check(asked)) == (first.summary_id, first.check(asked))


def test_summary_changes_with_every_change_and_returns_with_the_state() -> None:
    ledger = GpuLedger(make_gpu(0))
    empty = ledger.summary_id
    share = ShareSpec(request_permille=300, limit_permille=300, sm_percent=40, memory_bytes=GiB)
    ledger.add("a", share)
    one = ledger.summary_id
    assert one != empty
    ledger.add("b", ShareSpec(request_permille=0, limit_permille=100, sm_percent=10, memory_bytes=GiB))
    assert ledger.summary_id not in (empty, one)  # best effort: a slot and memory, same layout
    ledger.remove("b")
    assert ledger.summary_id == one
    ledger.remove("a")
    assert ledger.summary_id == empty
    assert GpuLedger(make_gpu(0, uuid="GPU-other")).summary_id == empty  # the uuid is not part of it
    assert GpuLedger(make_gpu(1)).summary_id != empty  # the index is (messages name it)
