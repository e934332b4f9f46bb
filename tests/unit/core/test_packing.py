"""Maximal Rectangles: placement rule, free-space bookkeeping and the paper's example."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastgshare.packing import BIN, MaxRectsBin, Rect, pack


def _assert_valid(rects: list[Rect]) -> None:
    for i, rect in enumerate(rects):
        assert BIN.contains(rect)
        for other in rects[i + 1:]:
            assert not rect.intersects(other), (rect, other)


def test_empty_bin_has_one_free_rectangle() -> None:
    assert MaxRectsBin().free_rects == (BIN,)


def test_first_rectangle_goes_to_the_origin_and_splits_free_space_maximally() -> None:
    packer = MaxRectsBin()
    assert packer.insert(600, 50) == Rect(0, 0, 600, 50)
    assert set(packer.free_rects) == {Rect(600, 0, 400, 100), Rect(0, 50, 1000, 50)}


def test_best_area_fit_prefers_the_tightest_free_rectangle() -> None:
    packer = MaxRectsBin([Rect(0, 0, 600, 50)])
    # 400x100 (area 40000) and 1000x50 (area 50000) both take 300x40: the smaller wins.
    assert packer.insert(300, 40) == Rect(600, 0, 300, 40)


def test_rectangles_never_rotate() -> None:
    assert MaxRectsBin().insert(100, 1000) is None


def test_insert_that_does_not_fit_leaves_the_bin_unchanged() -> None:
    packer = MaxRectsBin([Rect(0, 0, 1000, 60)])
    before = packer.free_rects
    assert packer.insert(10, 41) is None
    assert packer.free_rects == before


def test_rejects_empty_rectangles() -> None:
    with pytest.raises(ValueError, match="positive size"):
        MaxRectsBin().insert(0, 10)


def test_paper_mixed_workload_packs_into_one_bin() -> None:
    sizes = [(600, 50)] * 2 + [(400, 24)] * 2 + [(400, 12)] * 4
    placed = pack(sizes)
    assert placed is not None
    _assert_valid(placed)


def test_two_pods_of_60_percent_sm_and_60_percent_time_do_not_pack() -> None:
    # Sum of r*s/100 is 0.72 <= 1, but they cannot run concurrently and need 1.2 of the time.
    assert pack([(600, 60), (600, 60)]) is None


def test_full_bin_packs_exactly() -> None:
    assert pack([(500, 50)] * 4) is not None
    assert pack([(500, 50)] * 5) is None


def test_rebuilding_from_placements_matches_incremental_free_space() -> None:
    incremental = MaxRectsBin()
    placed = [incremental.insert(w, h) for w, h in [(300, 40), (200, 70), (500, 10)]]
    assert all(placed)
    rebuilt = MaxRectsBin([r for r in placed if r is not None])
    assert set(rebuilt.free_rects) == set(incremental.free_rects)


@given(st.lists(st.tuples(st.integers(1, 1000), st.integers(1, 100)), max_size=20))
def test_packed_rectangles_stay_inside_and_never_overlap(sizes: list[tuple[int, int]]) -> None:
    packer = MaxRectsBin()
    placed = []
    for width, height in sizes:
        rect = packer.insert(width, height)
        if rect is not None:
            assert (rect.width, rect.height) == (width, height)
            placed.append(rect)
    _assert_valid(placed)
    free = packer.free_rects
    for rect in free:
        assert BIN.contains(rect)
        assert not any(rect.intersects(used) for used in placed)
        assert not any(other != rect and other.contains(rect) for other in free)
