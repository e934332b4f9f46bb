"""The arbiter's native usage meter (``arbiter_engine/meter.c``, driven through
:class:`~device_plugin.arbiter.native.NativeMeter`) measures as its specification,
:class:`~fastgshare.usage.UsageMeter`: fed the same random events (pods joining, leaving and coming
back on two GPUs; asking for tokens, at their limit or not, and being granted them after waits that
fall on and beside the buckets' bounds; reporting what they used of each token) and read at random
times, at the instants a pod's last use leaves the window among them, both list the same pods on the
same GPUs, with the same totals, waits, throttled time and GPU busy shares.

One difference is by design (``engine_abi.h``, the meter): the C meter keeps a pod's uses that end within the same
millisecond as one, so the use that straddles the window's start may count up to 1 ms more or less,
and a pod's share may differ by at most 1 ms over the window. That holds for uses as the engine
reports them, one token after another: a pod's use never starts before its previous one ended.
"""

from __future__ import annotations

import random

import pytest

from device_plugin.arbiter.native import NativeMeter
from fastgshare.usage import WAIT_BUCKETS_S, UsageMeter, UsageSnapshot

MS = 1_000_000
S = 1_000_000_000
GPUS = ["GPU-b", "GPU-a"]  # not in name order: the snapshots are
PODS = ["ns/a", "ns/b", "team/c", "a-long-namespace-name/" + "p" * 60]
WAIT_BOUNDS_NS = [round(bound * 1e9) for bound in WAIT_BUCKETS_S]
EVENTS = 1_500  # per seed
SLOT_NS = 1 * MS  # uses ending in the same millisecond are one in the C meter

Key = tuple[str, str]


class _Twin:
    """A UsageMeter and a NativeMeter fed the same events; the pods' lives, as the engine leads them."""

    def __init__(self, seed: int, window_ns: int) -> None:
        self.python = UsageMeter(window_ns)
        self.native = NativeMeter(GPUS, window_ns)
        self.window_ns = window_ns
        self.setting = f"seed={seed} window_ns={window_ns}"
        self.log: list[str] = []
        self.status: dict[Key, str] = {}  # absent (never joined or faded out), present, or left
        self.asked: set[Key] = set()
        self.holding: dict[Key, int] = {}  # pod -> when its token was granted
        self.last_end: dict[Key, int] = {}  # end of the pod's last use
        self.snapshots = self.faded = 0

    def context(self) -> str:
        return f"{self.setting}, after {len(self.log)} events, the last ones:\n  " + "\n  ".join(self.log[-25:])

    def do(self, event: str, *args: object, **kwargs: object) -> None:
        self.log.append(f"{event}{args!r}{kwargs or ''}")
        for meter in (self.python, self.native):
            getattr(meter, event)(*args, **kwargs)

    def pods(self, status: str) -> list[Key]:
        return [key for key in sorted(self.status) if self.status[key] == status]

    def used(self, rng: random.Random, key: Key, now: int) -> None:
        """The pod reports what it used of the token it holds: at most the time since the grant."""
        granted_at = self.holding.pop(key)
        elapsed = now - granted_at
        used = rng.choice([0, elapsed, elapsed, rng.randint(0, elapsed), rng.randint(1, 1_000), -5])
        self.do("used", *key, granted_at, used)
        if used > 0:
            self.last_end[key] = max(self.last_end.get(key, 0), granted_at + used)

    def snapshot(self, now: int) -> None:
        self.log.append(f"snapshot({now})")
        python, native = self.python.snapshot(now), self.native.snapshot(now)
        _compare(python, native, self.window_ns, self.context)
        listed = {(pod.gpu, pod.pod) for pod in python.pods}
        for key in self.pods("left"):
            if key not in listed:
                self.status[key] = "absent"  # faded out: it must join again
                self.faded += 1

    # --- the random events: each takes the time and returns it, moved on or not ---------------------
    def join(self, rng: random.Random, now: int) -> int:
        keys = [(gpu, pod) for gpu in GPUS for pod in PODS]
        key = rng.choice([key for key in keys if self.status.get(key, "absent") != "present"] or keys)
        self.do("join", *key)
        self.status[key] = "present"
        return now

    def leave(self, rng: random.Random, now: int) -> int:
        key = rng.choice(self.pods("present"))
        if key in self.holding:
            self.used(rng, key, now)  # the engine charges a leaving holder its time held
        self.do("leave", *key)
        self.status[key] = "left"
        self.asked.discard(key)
        return now

    def ask(self, rng: random.Random, now: int) -> int:
        key = rng.choice(self.pods("present"))
        if key in self.holding:
            self.used(rng, key, now)  # a renewal: what it used of its token, then it asks again
        self.do("asked", *key, now, at_limit=rng.random() < 0.3)  # again while asking: a no-op in both
        self.asked.add(key)
        return now

    def grant(self, rng: random.Random, now: int) -> int:
        key = rng.choice(self.pods("present"))
        if key not in self.holding:  # also one that did not ask: a no-op in both
            self.do("granted", *key, now)
            if key in self.asked:
                self.asked.remove(key)
                self.holding[key] = now
        return now

    def exact_wait(self, rng: random.Random, now: int) -> int:
        """A wait of exactly a bucket's bound, or a nanosecond either side."""
        idle = [key for key in self.pods("present") if key not in self.asked and key not in self.holding]
        if idle:
            key = rng.choice(idle)
            self.do("asked", *key, now, at_limit=rng.random() < 0.5)
            now += rng.choice(WAIT_BOUNDS_NS) + rng.choice([-1, 0, 0, 1])
            self.do("granted", *key, now)
            self.holding[key] = now
        return now

    def renewals(self, rng: random.Random, now: int) -> int:
        """A pod renewing its token again and again, microseconds apart (the engine's hot path): many
        uses end within one millisecond."""
        key = rng.choice(self.pods("present"))
        for _ in range(rng.randint(5, 60)):
            if key not in self.asked and key not in self.holding:
                self.do("asked", *key, now, at_limit=False)
                self.asked.add(key)
            if key in self.asked:
                self.do("granted", *key, now)
                self.asked.remove(key)
                self.holding[key] = now
            now += rng.randint(1, 300_000)
            self.used(rng, key, now)
            self.do("asked", *key, now, at_limit=rng.random() < 0.1)
            self.asked.add(key)
            now += rng.choice([0, rng.randint(1, 50_000)])
        return now

    def nothing_used(self, rng: random.Random, now: int) -> int:
        self.do("used", *rng.choice(self.pods("present")), now - rng.randint(0, self.window_ns), rng.choice([0, -1]))
        return now

    def read(self, rng: random.Random, now: int) -> int:
        left = [key for key in self.pods("left") if key in self.last_end]
        if left and rng.random() < 0.2:  # when a pod's last use leaves the window, or a nanosecond either side
            now = max(now, self.last_end[rng.choice(left)] + self.window_ns + rng.choice([-1, 0, 1]))
        self.snapshot(now)
        self.snapshots += 1
        return now


def _compare(python: UsageSnapshot, native: UsageSnapshot, window_ns: int, context: object) -> None:
    assert native.window_s == python.window_s
    assert [(pod.gpu, pod.pod) for pod in native.pods] == [(pod.gpu, pod.pod) for pod in python.pods], context
    for ours, spec in zip(native.pods, python.pods, strict=True):
        assert ours.used_seconds_total == pytest.approx(spec.used_seconds_total, rel=1e-12, abs=0), context
        assert ours.throttled_seconds_total == pytest.approx(spec.throttled_seconds_total, rel=1e-12, abs=0), context
        assert ours.wait_count == spec.wait_count, context
        assert ours.wait_bucket_counts == spec.wait_bucket_counts, context
        assert ours.wait_sum_seconds == pytest.approx(spec.wait_sum_seconds, rel=1e-12, abs=0), context
        # The one difference by design: uses ending in the same millisecond are one (the docstring).
        assert ours.share == pytest.approx(spec.share, abs=SLOT_NS / window_ns + 1e-9), context
    assert [gpu.gpu for gpu in native.gpus] == [gpu.gpu for gpu in python.gpus], context
    for ours_gpu, spec_gpu in zip(native.gpus, python.gpus, strict=True):
        assert ours_gpu.busy_share == pytest.approx(spec_gpu.busy_share, rel=1e-12, abs=1e-15), context


def _advance(rng: random.Random, now: int, window: int) -> int:
    roll = rng.random()
    if roll < 0.3:
        return now
    if roll < 0.65:
        return now + rng.randint(1, 200_000)  # well inside a millisecond: uses that the C meter joins
    if roll < 0.85:
        return now + rng.randint(1, 5 * MS)
    if roll < 0.96:
        return now + rng.randint(1, window // 2)
    return now + rng.randint(window, 3 * window)  # idle: what the pods used leaves the window


# How often each event comes, when some pod is present (when none is, one joins).
EVENT_WEIGHTS = [(_Twin.join, 8), (_Twin.leave, 5), (_Twin.ask, 25), (_Twin.grant, 20), (_Twin.exact_wait, 10),
                 (_Twin.renewals, 4), (_Twin.nothing_used, 2), (_Twin.read, 26)]


@pytest.mark.parametrize("window_ns", [20 * MS, 100 * MS, 1 * S], ids=["20ms", "100ms", "1s"])
@pytest.mark.parametrize("seed", range(8))
def test_random_events_give_the_same_snapshots(seed: int, window_ns: int) -> None:
    rng = random.Random(seed)
    twin = _Twin(seed, window_ns)
    now = rng.randint(0, 3 * window_ns)
    twin.snapshot(now)  # nobody yet: no pods, no GPUs
    events, weights = zip(*EVENT_WEIGHTS, strict=True)
    for _ in range(EVENTS):
        if rng.random() < 0.5:
            now = _advance(rng, now, window_ns)
        event = rng.choices(events, weights)[0] if twin.pods("present") else _Twin.join
        now = event(twin, rng, now)
    assert twin.snapshots > EVENTS // 10
    assert twin.faded > 0  # pods faded out (and came back)


def test_a_pod_that_left_fades_out_in_both_when_its_last_use_leaves_the_window() -> None:
    twin = _Twin(0, 100 * MS)
    for gpu in GPUS:
        twin.do("join", gpu, "ns/a")
        twin.do("used", gpu, "ns/a", 10 * MS, 5 * MS)
    twin.do("leave", "GPU-a", "ns/a")
    twin.snapshot(115 * MS - 1)  # the use ended at 15 ms: still in the window that starts just before
    assert [pod.gpu for pod in twin.python.snapshot(115 * MS - 1).pods] == ["GPU-a", "GPU-b"]
    twin.snapshot(115 * MS)
    assert [pod.gpu for pod in twin.python.snapshot(115 * MS).pods] == ["GPU-b"]


def test_thousands_of_uses_in_one_window_give_the_same_snapshots() -> None:
    """More uses in the window than the C meter keeps before it merges a GPU's busy intervals."""
    twin = _Twin(0, 1 * S)
    for pod in ("ns/a", "ns/b"):
        twin.do("join", "GPU-a", pod)
    now = 0
    for step in range(12_000):
        pod = "ns/a" if step % 3 else "ns/b"
        twin.do("used", "GPU-a", pod, now, 10_000 + step % 7 * 1_000)  # 10 to 16 µs of every 100
        now += 100_000
        if step % 1_500 == 0:
            twin.snapshot(now)
    twin.snapshot(now)
    twin.snapshot(now + S // 2)


def test_a_use_reported_near_the_int64_limit_counts_in_both() -> None:
    """A report no hook makes fills the window and the GPU's busy time in both: the C once added it to
    its start in int64, wrapped around and counted it nowhere. It caps a use at 2**61 ns, so only the
    total differs."""
    python, native = UsageMeter(window_ns=100 * MS), NativeMeter(["GPU-a"], 100 * MS)
    for meter in (python, native):
        meter.join("GPU-a", "ns/a")
        meter.used("GPU-a", "ns/a", 1 * MS, 2**63 - 1)
    expected, got = python.snapshot(2 * MS), native.snapshot(2 * MS)
    assert [pod.share for pod in got.pods] == [pod.share for pod in expected.pods] == [1.0]
    assert got.gpus == expected.gpus
    assert got.pods[0].used_seconds_total == pytest.approx(2**61 / 1e9)
