"""What each pod really got from the arbiter: GPU time over a sliding window, token waits,
throttling, and how busy each GPU was. Pure: the arbiter feeds it events with their times; the
metrics adapter reads :meth:`UsageMeter.snapshot`.

- A pod's *achieved share* is the GPU time its processes reported using (the hook measures it)
  during the last ``window_ns``, divided by the window: 0..1 of one GPU.
- A *token wait* runs from a pod asking for a token to the grant; it is *throttled* when the pod
  had already used its limit in the arbiter's window when it asked (it waited for its own cap,
  not for other pods).
- A GPU's *busy share* is the part of the window in which at least one pod held a token.

Pods that left are kept until their last use has left the window, so their series fade to zero
and then disappear.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable

import attrs

DEFAULT_WINDOW_NS = 10_000_000_000
# Token waits in seconds: from well under a token (2 ms) to several windows of the arbiter.
WAIT_BUCKETS_S: tuple[float, ...] = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


@attrs.frozen
class PodUsage:
    """One pod on one GPU, as of a snapshot."""

    pod: str  # namespace/name
    gpu: str
    share: float  # achieved share of GPU time over the window
    used_seconds_total: float
    throttled_seconds_total: float
    wait_bucket_counts: tuple[int, ...]  # cumulative, aligned with WAIT_BUCKETS_S, then +Inf
    wait_sum_seconds: float
    wait_count: int


@attrs.frozen
class GpuUsage:
    gpu: str
    busy_share: float


@attrs.frozen
class UsageSnapshot:
    window_s: float
    pods: tuple[PodUsage, ...]
    gpus: tuple[GpuUsage, ...]


@attrs.define
class _PodMeter:
    uses: deque[tuple[int, int]] = attrs.field(factory=deque)  # (end time, ns used)
    used_ns_total: int = 0
    throttled_ns_total: int = 0
    wait_counts: list[int] = attrs.field(factory=lambda: [0] * (len(WAIT_BUCKETS_S) + 1))
    wait_sum_ns: int = 0
    asked_at: int | None = None
    asked_throttled: bool = False
    last_use_ns: int = 0
    present: bool = True


def _in_window(uses: Iterable[tuple[int, int]], start: int) -> int:
    """Nanoseconds of the uses that fall after ``start`` (a use straddling it counts in part)."""
    total = 0
    for end, used in uses:
        if end > start:
            total += min(used, end - start)
    return total


def _union_ns(intervals: Iterable[tuple[int, int]], start: int, end: int) -> int:
    """Length of the union of ``intervals`` clipped to [start, end)."""
    total, covered_to = 0, start
    for begin, finish in sorted(intervals):
        new_from, new_to = max(begin, covered_to), min(finish, end)
        if new_to > new_from:
            total += new_to - new_from
            covered_to = new_to
    return total


class UsageMeter:
    """Per (GPU, pod) usage and per GPU busy time, over a sliding window."""

    def __init__(self, window_ns: int = DEFAULT_WINDOW_NS) -> None:
        if window_ns <= 0:
            raise ValueError(f"window_ns must be > 0, got {window_ns}")
        self.window_ns = window_ns
        self._pods: dict[tuple[str, str], _PodMeter] = {}
        self._busy: dict[str, list[tuple[int, int]]] = {}  # gpu -> (start, end) of each use, any order

    def join(self, gpu: str, pod: str) -> None:
        """The pod's first process connected on ``gpu``."""
        meter = self._pods.setdefault((gpu, pod), _PodMeter())
        meter.present = True
        self._busy.setdefault(gpu, [])

    def leave(self, gpu: str, pod: str) -> None:
        """The pod's last process left; its series stay until its use has left the window."""
        meter = self._pods.get((gpu, pod))
        if meter is not None:
            meter.present = False
            meter.asked_at = None

    def asked(self, gpu: str, pod: str, now_ns: int, *, at_limit: bool) -> None:
        """The pod asks for a token (unless it is already waiting)."""
        meter = self._pods.get((gpu, pod)) or self._pods.setdefault((gpu, pod), _PodMeter())
        if meter.asked_at is None:
            meter.asked_at, meter.asked_throttled = now_ns, at_limit

    def granted(self, gpu: str, pod: str, now_ns: int) -> None:
        """The pod got its token: its wait ends."""
        meter = self._pods.get((gpu, pod))
        if meter is None or meter.asked_at is None:
            return
        wait_ns = max(0, now_ns - meter.asked_at)
        meter.asked_at = None
        meter.wait_sum_ns += wait_ns
        seconds = wait_ns / 1e9
        index = bisect.bisect_left(WAIT_BUCKETS_S, seconds)  # the first bucket with seconds <= bound
        meter.wait_counts[index] += 1
        if meter.asked_throttled:
            meter.throttled_ns_total += wait_ns

    def used(self, gpu: str, pod: str, start_ns: int, used_ns: int) -> None:
        """The pod held the GPU from ``start_ns`` and used ``used_ns`` of it (reported by the hook)."""
        if used_ns <= 0:
            return
        meter = self._pods.get((gpu, pod)) or self._pods.setdefault((gpu, pod), _PodMeter())
        end = start_ns + used_ns
        meter.uses.append((end, used_ns))
        meter.used_ns_total += used_ns
        meter.last_use_ns = max(meter.last_use_ns, end)
        self._busy.setdefault(gpu, []).append((start_ns, end))

    def snapshot(self, now_ns: int) -> UsageSnapshot:
        """Shares over the window ending ``now_ns``; forgets what has left the window."""
        start = now_ns - self.window_ns
        pods = []
        for (gpu, pod), meter in list(self._pods.items()):
            while meter.uses and meter.uses[0][0] <= start:
                meter.uses.popleft()
            if not meter.present and not meter.uses and meter.last_use_ns <= start:
                del self._pods[(gpu, pod)]
                continue
            cumulative, running = [], 0
            for count in meter.wait_counts:
                running += count
                cumulative.append(running)
            pods.append(PodUsage(pod=pod, gpu=gpu, share=min(1.0, _in_window(meter.uses, start) / self.window_ns),
                                 used_seconds_total=meter.used_ns_total / 1e9,
                                 throttled_seconds_total=meter.throttled_ns_total / 1e9,
                                 wait_bucket_counts=tuple(cumulative), wait_sum_seconds=meter.wait_sum_ns / 1e9,
                                 wait_count=running))
        gpus = []
        for gpu, intervals in self._busy.items():
            intervals[:] = [(begin, end) for begin, end in intervals if end > start]
            gpus.append(GpuUsage(gpu=gpu, busy_share=min(1.0, _union_ns(intervals, start, now_ns) / self.window_ns)))
        return UsageSnapshot(window_s=self.window_ns / 1e9, pods=tuple(sorted(pods, key=lambda p: (p.gpu, p.pod))),
                             gpus=tuple(sorted(gpus, key=lambda g: g.gpu)))
