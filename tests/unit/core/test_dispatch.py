"""The dispatcher: requests in proportion to capacity, admission bounds, ties."""

from __future__ import annotations

import heapq
import random

import pytest

from fastgshare.dispatch import Dispatcher, PodLoad


def simulate(capacities: dict[str, float], rate: float, seconds: float, seed: int = 1) -> dict[str, int]:
    """Poisson arrivals at ``rate`` over FIFO pods serving 1/capacity s each: requests per pod."""
    rng = random.Random(seed)
    dispatcher = Dispatcher()
    busy_until = dict.fromkeys(capacities, 0.0)
    finishing: dict[str, list[float]] = {name: [] for name in capacities}
    counts = dict.fromkeys(capacities, 0)
    now = 0.0
    while now < seconds:
        now += rng.expovariate(rate)
        for name in capacities:
            while finishing[name] and finishing[name][0] <= now:
                heapq.heappop(finishing[name])
        chosen = dispatcher.choose([PodLoad(name=name, capacity_rps=capacity, queued=len(finishing[name]),
                                            max_queued=1000) for name, capacity in capacities.items()])
        assert chosen is not None
        busy_until[chosen] = max(busy_until[chosen], now) + 1 / capacities[chosen]
        heapq.heappush(finishing[chosen], busy_until[chosen])
        counts[chosen] += 1
    return counts


def test_two_pods_of_capacity_10_and_30_under_32_per_second_get_requests_1_to_3() -> None:
    counts = simulate({"small": 10, "large": 30}, rate=32, seconds=600)
    assert counts["large"] / counts["small"] == pytest.approx(3, rel=0.1)


def test_a_full_pod_admits_nothing_and_a_full_function_says_none() -> None:
    full = PodLoad(name="a", capacity_rps=100, queued=8, max_queued=8)
    free = PodLoad(name="b", capacity_rps=1, queued=5, max_queued=8)
    dispatcher = Dispatcher()
    assert dispatcher.choose([full, free]) == "b"
    assert dispatcher.choose([full]) is None
    assert dispatcher.choose([]) is None


def test_equal_pods_take_turns() -> None:
    dispatcher, pods = Dispatcher(), [PodLoad(name=n, capacity_rps=10, queued=0) for n in "abc"]
    assert [dispatcher.choose(pods) for _ in range(6)] == ["c", "b", "a", "c", "b", "a"]
