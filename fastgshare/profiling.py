"""The profiler's arithmetic: from timed requests to load steps, from load steps to a profile point,
and which points of a grid are worth keeping. No I/O: ``fastgshare profile run``
(:mod:`fastgshare_cli.profile_command`) sends the requests and times them; this module decides.

A **sweep** puts open-loop load on one pod at increasing offered rates, one step each
(:class:`SweepPlan`): arrivals are drawn in advance (Poisson or evenly spaced,
:func:`arrival_times`), each request's latency runs from its *scheduled* arrival to its answer, so
a request that waits in the client's queue because the pod is busy is charged that wait (no
coordinated omission). A step (:func:`analyse_step`) records the offered rate (the arrivals
actually drawn for the step, not the nominal rate: a short Poisson step offers ±10 % of its
nominal rate by chance, and comparing the achieved rate with the nominal one would call an
unlucky step saturated), the achieved rate (answers that completed inside the step's window,
per second of window) and the latency percentiles over all of the step's requests. A request
that has not finished when the client gives up counts as an error, with the time it waited as
its latency.

A step is **saturated** when the pod did not keep up (achieved < 90 % of offered). The achieved
rate of a step is the pod's capacity only when a backlog kept it busy all step long, i.e. when it
was clearly overloaded (offered >= 1.3 x achieved); a step just past capacity starts with an empty
queue and idles in the gaps of the arrivals, and understates it. So (:func:`step_verdict`,
:class:`SweepPlan`) the sweep stops at the first overloaded step, at a second saturated one, or at
a step with errors; after a step that is saturated but not overloaded, or one whose SLO
percentile exceeds the SLO (which ends the search for the SLO capacity), it jumps to twice the
rate (a saturation probe), so ``maxRps`` is measured where the pod is overloaded, not where the
SLO happened to be crossed.

A point (:func:`point_from_steps`) has ``maxRps`` = the highest achieved rate of any step,
``sloRps`` = :func:`fastgshare.profile.slo_capacity` of its steps (the planner's own figure, with
its margin), and the percentiles of the highest sustained step (achieved >= 90 % of offered,
no errors): the latency near saturation, not the arbitrary queueing delay of an overloaded step.

**Pruning** (:func:`dominated`): a point is dominated when another point serves at least as much
(``sloRps``, or ``maxRps`` without an SLO) with no more quota, no more SM and no more memory, and
is strictly better in one of them; a dominated point never helps a plan.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from enum import StrEnum

import attrs

from fastgshare.profile import LoadStep, Profile, ProfilePoint, Slo, slo_capacity

SATURATED_BELOW = 0.9  # achieved / offered below this: the pod cannot keep up
OVERLOADED_AT = 1.3  # offered / achieved at least this: the pod worked through a backlog all step long
SHORTFALL_SLACK = 2  # requests a step may miss at its window's end and still count as sustained
PROBE_FACTOR = 2.0  # after the SLO is crossed, or near saturation, the next offered rate is this multiple
MAX_STEPS = 24


class Arrivals(StrEnum):
    POISSON = "poisson"
    CONSTANT = "constant"


class Verdict(StrEnum):
    OK = "ok"  # sustained and within the SLO: raise the rate
    OVER_SLO = "over-slo"  # sustained but over the SLO: probe for saturation
    SATURATING = "saturating"  # achieved < 90 % of offered, but not overloaded: probe once more
    SATURATED = "saturated"  # offered >= 1.3 x achieved: the achieved rate is the pod's capacity; stop
    ERRORS = "errors"  # some requests failed or timed out: stop


@attrs.frozen(kw_only=True)
class RequestTiming:
    """One request of a step: when it was due (seconds from the step's start), how long it took
    from then to its answer (ms), and whether it succeeded (an answer 2xx in time)."""

    due_s: float
    latency_ms: float
    ok: bool


def arrival_times(rate_rps: float, seconds: float, kind: Arrivals, rng: random.Random) -> list[float]:
    """Arrival offsets in [0, seconds) at ``rate_rps``: exponential gaps (Poisson) or even spacing."""
    if rate_rps <= 0 or seconds <= 0:
        return []
    if kind is Arrivals.CONSTANT:
        gap = 1 / rate_rps
        return [n * gap for n in range(math.ceil(seconds * rate_rps - 1e-9))]
    times, t = [], rng.expovariate(rate_rps)
    while t < seconds:
        times.append(t)
        t += rng.expovariate(rate_rps)
    return times


def percentile(values: Sequence[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def analyse_step(timings: Sequence[RequestTiming], window_s: float) -> LoadStep:
    """One load step from its requests: offered = requests due / window, achieved = successful
    answers completed within the window / window, percentiles over every request."""
    if window_s <= 0:
        raise ValueError(f"a step's window must be > 0 s, got {window_s}")
    done_in_window = sum(1 for t in timings if t.ok and t.due_s + t.latency_ms / 1000 <= window_s)
    latencies = [t.latency_ms for t in timings]
    failed = sum(1 for t in timings if not t.ok)
    return LoadStep(offered_rps=round(len(timings) / window_s, 3), achieved_rps=round(done_in_window / window_s, 3),
                    p50_ms=round(percentile(latencies, 50), 3), p95_ms=round(percentile(latencies, 95), 3),
                    p99_ms=round(percentile(latencies, 99), 3),
                    error_rate=round(failed / len(timings), 4) if timings else 0.0)


def sustained(step: LoadStep, window_s: float | None = None) -> bool:
    """The pod kept up: no errors and achieved >= 90 % of offered. Given the step's window, a
    shortfall of at most :data:`SHORTFALL_SLACK` requests is forgiven: in a short, light step one
    request still in flight at the window's end is 25 % of four, not a sign of saturation."""
    if step.error_rate != 0:
        return False
    if step.achieved_rps >= SATURATED_BELOW * step.offered_rps:
        return True
    return window_s is not None and (step.offered_rps - step.achieved_rps) * window_s <= SHORTFALL_SLACK


def step_verdict(step: LoadStep, slo: Slo | None, window_s: float | None = None) -> Verdict:
    if step.error_rate > 0:
        return Verdict.ERRORS
    if not sustained(step, window_s):
        overloaded = step.offered_rps >= OVERLOADED_AT * step.achieved_rps
        return Verdict.SATURATED if overloaded else Verdict.SATURATING
    if slo is not None and step.percentile_ms(slo.percentile) > slo.latency_ms:
        return Verdict.OVER_SLO
    return Verdict.OK


@attrs.frozen(kw_only=True)
class SweepPlan:
    """The offered rates of one point's sweep: ``start_rps``, then ``factor`` times the last,
    jumping by :data:`PROBE_FACTOR` once the SLO is crossed or after a step that is only just
    saturated; stops after an overloaded step or a second unsustained one, on errors, after
    ``max_steps`` or above ``max_rps``."""

    start_rps: float
    factor: float = 1.4
    max_steps: int = MAX_STEPS
    max_rps: float = 10_000.0

    def __attrs_post_init__(self) -> None:
        if not (math.isfinite(self.start_rps) and self.start_rps > 0):
            raise ValueError(f"the starting rate must be > 0 req/s, got {self.start_rps}")
        if not (math.isfinite(self.factor) and self.factor > 1):
            raise ValueError(f"the step factor must be > 1, got {self.factor}")
        if self.max_steps < 1:
            raise ValueError(f"at least one step, got {self.max_steps}")

    def next_rate(self, history: Sequence[tuple[float, Verdict]]) -> float | None:
        """The next nominal rate after ``history`` (each step's nominal rate and verdict); None: done."""
        if not history:
            return self.start_rps
        if len(history) >= self.max_steps:
            return None
        rate, verdict = history[-1]
        unsustained = sum(1 for _, v in history if v in (Verdict.SATURATING, Verdict.SATURATED))
        if verdict in (Verdict.SATURATED, Verdict.ERRORS) or unsustained >= 2:
            return None
        over = any(v in (Verdict.OVER_SLO, Verdict.SATURATING) for _, v in history)
        following = rate * (PROBE_FACTOR if over else self.factor)
        return following if following <= self.max_rps else None


def point_from_steps(*, quota_request: float, quota_limit: float, sm_partition: int, memory_bytes: int,
                     steps: Sequence[LoadStep], slo: Slo | None, batch: int = 1) -> ProfilePoint:
    """The profile point of one sweep (see the module's docstring for what each figure is)."""
    if not steps:
        raise ValueError("a point needs at least one load step")
    held = [s for s in steps if sustained(s)]
    near_saturation = max(held, key=lambda s: s.achieved_rps) if held else steps[0]
    point = ProfilePoint(
        quota_request=quota_request, quota_limit=quota_limit, sm_partition=sm_partition, memory_bytes=memory_bytes,
        batch=batch, max_rps=max(s.achieved_rps for s in steps), p50_ms=near_saturation.p50_ms,
        p95_ms=near_saturation.p95_ms, p99_ms=near_saturation.p99_ms, steps=tuple(steps))
    if slo is None:
        return point
    return attrs.evolve(point, slo_rps=round(slo_capacity(point, slo), 3))


def capacity(point: ProfilePoint, slo: Slo | None) -> float:
    """What a point serves for pruning and display: its SLO capacity, or ``maxRps`` without an SLO."""
    return slo_capacity(point, slo) if slo is not None else point.max_rps


def dominated(points: Sequence[ProfilePoint], slo: Slo | None) -> list[bool]:
    """For each point, whether another point dominates it (at least its capacity with no more quota,
    SM or memory, strictly better somewhere). Points of another batch size are not compared."""
    capacities = [capacity(p, slo) for p in points]

    def beats(a: int, b: int) -> bool:
        pa, pb = points[a], points[b]
        no_worse = (pa.batch == pb.batch and capacities[a] >= capacities[b]
                    and pa.quota_request <= pb.quota_request and pa.quota_limit <= pb.quota_limit
                    and pa.sm_partition <= pb.sm_partition and pa.memory_bytes <= pb.memory_bytes)
        better = (capacities[a] > capacities[b] or pa.quota_request < pb.quota_request
                  or pa.quota_limit < pb.quota_limit
                  or pa.sm_partition < pb.sm_partition or pa.memory_bytes < pb.memory_bytes)
        return no_worse and better

    return [any(beats(other, n) for other in range(len(points)) if other != n) for n in range(len(points))]


def prune(profile: Profile) -> tuple[Profile, list[ProfilePoint]]:
    """The profile without its dominated points, and those points."""
    flags = dominated(profile.points, profile.slo)
    kept = tuple(p for p, flag in zip(profile.points, flags, strict=True) if not flag)
    return attrs.evolve(profile, points=kept), [p for p, flag in zip(profile.points, flags, strict=True) if flag]


def profile_rows(profile: Profile) -> list[dict[str, object]]:
    """One row per point for ``fastgshare profile show``: the share, the rates, the percentiles
    and whether the point is kept or dominated."""
    flags = dominated(profile.points, profile.slo)
    rows: list[dict[str, object]] = []
    for point, flag in zip(profile.points, flags, strict=True):
        rows.append({
            "config": point.key, "quotaRequest": point.quota_request, "quotaLimit": point.quota_limit,
            "smPartition": point.sm_partition, "memoryBytes": point.memory_bytes, "batch": point.batch,
            "maxRps": point.max_rps,
            "sloRps": round(slo_capacity(point, profile.slo), 3) if profile.slo is not None else point.slo_rps,
            "p50Ms": point.p50_ms, "p95Ms": point.p95_ms, "p99Ms": point.p99_ms, "steps": len(point.steps),
            "derived": point.derived, "dominated": flag})
    return rows
