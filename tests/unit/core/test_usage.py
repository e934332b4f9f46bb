"""The usage meter: achieved shares over a sliding window, token waits and throttling, GPU busy time."""

from __future__ import annotations

import pytest

from fastgshare.usage import WAIT_BUCKETS_S, UsageMeter

MS = 1_000_000
S = 1_000_000_000


def test_a_pods_share_is_its_reported_use_over_the_window() -> None:
    meter = UsageMeter(window_ns=10 * S)
    meter.join("G", "ns/a")
    for start in range(0, 10 * S, 100 * MS):  # 40 ms of every 100 ms for 10 s
        meter.used("G", "ns/a", start, 40 * MS)
    [pod] = meter.snapshot(10 * S).pods
    assert pod.share == pytest.approx(0.4)
    assert pod.used_seconds_total == pytest.approx(4.0)


def test_use_older_than_the_window_stops_counting_and_a_pod_that_left_disappears() -> None:
    meter = UsageMeter(window_ns=10 * S)
    meter.join("G", "ns/a")
    meter.used("G", "ns/a", 0, 1 * S)
    meter.leave("G", "ns/a")
    assert meter.snapshot(5 * S).pods[0].share == pytest.approx(0.1)
    assert meter.snapshot(10 * S + S // 2).pods[0].share == pytest.approx(0.05)  # half of it is still inside
    assert meter.snapshot(11 * S + 1).pods == ()


def test_a_pod_still_connected_stays_at_zero_share() -> None:
    meter = UsageMeter(window_ns=S)
    meter.join("G", "ns/a")
    meter.used("G", "ns/a", 0, 10 * MS)
    [pod] = meter.snapshot(5 * S).pods
    assert pod.share == 0.0


def test_waits_fill_the_histogram_and_only_waits_at_the_limit_are_throttling() -> None:
    meter = UsageMeter()
    meter.asked("G", "ns/a", 0, at_limit=False)
    meter.asked("G", "ns/a", 1 * MS, at_limit=True)  # already waiting: the first ask counts
    meter.granted("G", "ns/a", 3 * MS)
    meter.asked("G", "ns/a", 10 * MS, at_limit=True)
    meter.granted("G", "ns/a", 70 * MS)
    [pod] = meter.snapshot(100 * MS).pods
    assert pod.wait_count == 2
    assert pod.wait_sum_seconds == pytest.approx(0.063)
    assert pod.throttled_seconds_total == pytest.approx(0.060)
    counts = dict(zip((*WAIT_BUCKETS_S, float("inf")), pod.wait_bucket_counts, strict=True))
    assert counts[0.002] == 0
    assert counts[0.005] == 1
    assert counts[0.05] == 1
    assert counts[0.1] == 2
    assert counts[float("inf")] == 2


def test_gpu_busy_share_counts_overlapping_uses_once_whatever_order_they_arrive_in() -> None:
    meter = UsageMeter(window_ns=S)
    meter.join("G", "ns/a")
    meter.join("G", "ns/b")
    meter.used("G", "ns/b", 500 * MS, 100 * MS)  # reported first, happened later
    meter.used("G", "ns/a", 400 * MS, 200 * MS)  # overlaps b: together 400..600
    meter.used("G", "ns/a", 800 * MS, 100 * MS)
    [gpu] = meter.snapshot(S).gpus
    assert gpu.busy_share == pytest.approx(0.3)
    shares = {p.pod: p.share for p in meter.snapshot(S).pods}
    assert shares == {"ns/a": pytest.approx(0.3), "ns/b": pytest.approx(0.1)}


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError, match="window_ns"):
        UsageMeter(window_ns=0)
