"""Autoscaling policies on shared GPUs, simulated (prints one JSON object).

A deterministic discrete-event simulation of functions under load traces, with the core's own
planner and scaling steps (:mod:`fastgshare.autoscaling`: ``step`` and the controller's HPA model
``hpa_step``), dispatcher (:mod:`fastgshare.dispatch`) and fleet packer (:mod:`fastgshare.fleet`,
for the GPUs all functions' pods need together). Compared:

- ``rpr``: the profile-driven scaler (every 1 s; 0.5 headroom; scale-down after 60 s; panic on a
  doubling 2 s window; vertical steps; a make-before-break re-plan at most every 300 s), choosing
  (quota, SM) configurations by dominant-share cost;
- ``rpr_area``: the same with the paper's cost, time x SM area alone;
- ``time_sharing_only``: ``rpr`` restricted to configurations with all SMs (SM 100), as a GPU shared
  in time only would run it;
- ``hpa_whole_gpu``: Kubernetes' HPA on whole-GPU pods, exactly the function controller's model
  (:func:`fastgshare.autoscaling.hpa_step` with its defaults: target 70 % of a pod's ``maxRps``,
  tolerance 0.1, up by at most max(2n, n + 4), down to the largest recommendation of the last
  300 s, at least one pod), every 15 s: what serverless platforms without sharing do (the baseline
  of the ``*_to_hpa`` ratios);
- ``hpa_whole_gpu_fast``: the same every 2 s with a 30 s stabilisation window;
- ``hpa_fixed``: the HPA (15 s / 300 s) on pods of the most efficient configuration (by dominant
  cost): configuration choice without the profile-driven loop (its 70 % of ``maxRps`` is above
  what a small pod serves within the SLO, so it under-provisions);
- ``rpr_model_sharing`` (default) and ``rpr_area_model_sharing``: ``rpr`` and ``rpr_area`` (the same
  pods and requests) with model sharing: a function's pods on one GPU hold its weights once (the
  first brings them, each next one needs its memory less them; :func:`fastgshare.fleet.pack_fleet`
  with ``models``). The weights are ``--weights-fraction`` (default 0.556) of the function's smallest
  pod's memory: ASSUMED, since the example profile has no weights size, from the FaST-GShare
  paper's ViT-huge figure (-55.6 % memory: n pods sharing weights w save (n - 1)/n x w, so
  w >= 0.556); ResNet-50's own fp32 weights would be 0.05 of its 2 GB pods;
- ``rpr_zero`` and ``rpr_parked`` (with ``--policies``, not in the default run): ``rpr`` with
  ``minReplicas`` 0 (``rpr`` itself keeps one pod always on, ``minReplicas`` 1). ``rpr_zero`` scales
  to zero pods once no request arrived for the scale-down delay; a request then waits at the
  function until the scaler sees it at its next tick (as the function controller does) and the pod
  it plans is ready (``cold_start_s`` later: pod start and model load). ``rpr_parked``
  (``spec.scaling.parked: 1``) keeps one pod **parked** where ``rpr_zero`` has none: the awake pod
  of the most efficient configuration (or, with none, a new one of the most efficient
  configuration, as a new function starts) stays with its model loaded and its memory held at a
  time quota request and limit of 0. A request arriving with no awake pod wakes it at once by a
  live share change, ``--wake-s`` (default 0.1 s, ASSUMED: the real node's figure is measured
  apart) instead of a cold start; the woken pod becomes the scaler's one pod (of its
  configuration: a running pod changes its time quota only, and the example profile's pods differ
  in SM too) and ``rpr`` scales from there. In the fleet packer a parked pod takes its memory and a
  slot and no time x SM area (a share of quota 0), and it adds nothing to the kappa bound (it
  serves nothing).

The scalers run as the function controller runs them: each tick :func:`~fastgshare.autoscaling.settle`
with the ready pods per configuration (a re-plan's kept pods go once the new plan's are ready), then
:func:`~fastgshare.autoscaling.step` with ``starting`` (some live pod not ready yet: no re-plan), then
the pods of :func:`~fastgshare.autoscaling.running` (the target and the kept pods). A vertical step
(pods of one configuration moved to a larger quota of the same SM, memory and batch,
:func:`~fastgshare.autoscaling.same_but_quota`, that had no pods) changes those pods in place: a live
share change keeps the pod, its readiness and its queue, costs no cold start and creates no pod
(``vertical_steps``, ``pods_resized_in_place``; ``rebalances`` counts re-plans). The example profile
has no two usable points that differ only in quota (q20-s12 misses the SLO), so it makes no vertical
step; the CI subset uses a profile with a quota ladder.

Model: Poisson arrivals (thinning) at each function's rate; each pod a FIFO server taking
``1 / maxRps`` s per request (its configuration's saturation throughput, measured one pod per GPU),
ready ``cold_start_s`` after it is created and costing GPU time from creation to deletion; at most
8 requests queued at a pod, the rest wait at the function (FIFO) and count as violations after 10 s;
they go to pods at each arrival, tick and pod readiness (a cold start, a wake-up).
Every policy starts from no pods ready; violations are also given without the requests that
arrived during the first cold start.
The rates the scalers see are the arrivals of the last 10 s and 2 s. Each configuration's SLO
capacity is measured on this model (the highest Poisson rate one pod serves with its p95 under
0.9 x SLO), so the planner plans with the same physics the simulation runs. GPUs in use at each
tick: the fleet packer's count for all functions' pods' shares (time x SM, memory, slots), and at
least ``sum over pods of SLO capacity / (kappa x SLO capacity of its function on a whole GPU)``:
co-located pods do not each serve as much as they did alone (profiles are measured one pod per
GPU); kappa (``--kappa``, default 3.15, the paper's gain of spatio-temporal over time sharing) caps
what sharing one GPU can give. Kappa enters only this GPU count, not the pods' service times.
``ticks_capacity_below_rate`` counts (tick, function) pairs whose planned SLO capacity (rpr: the
target, without kept pods) was below the 10 s rate the scaler planned for (zero for rpr by
construction; HPA's rate limit and target differ). Each policy also reports ``gpu_seconds_ratio_vs_hpa``,
the GPU-s each lower bound alone needs (``gpu_seconds_lower_bounds``: memory, each function's weights once
under model sharing; time x SM area; slots; kappa), the ticks at each and ``bound_by`` (the largest);
each run's ``targets`` says, per non-HPA policy, whether the issue's targets are met (GPU-s <= 0.6 x
``hpa_whole_gpu`` on ``ramp``, <= 1/3 on ``fleet``; SLO violations <= 1 %) and the binding bound's ratio.

A run with ``rpr_zero`` or ``rpr_parked`` reports, for every policy it runs, ``from_zero``: the
**cold episodes** (a request arriving when the function has no awake pod, neither ready nor
starting; the requests that follow it until it is served are the same episode), how many a parked
pod served (``woken_parked``), the first request's wait until its service starts (median, p95 and
max s; one that times out in the function queue counts with the time it waited), the parked pods'
pod-seconds and memory (GiB·s of their pods' memory, context reserve not included), and
``gpu_seconds_without_parked`` (the packer's GPU·s with the parked pods left out: ``gpu_seconds``
counts them). Episodes that begin before ``cold_start_s`` (the first cold start, every policy's)
are left out; ``cold_episodes_in_first_cold_start`` counts them, ``cold_episodes_open_at_end`` those
whose first request was still waiting when the run ended. The JSON's top-level ``from_zero`` states
``wake_s``, ``cold_start_s`` and the parked pods per policy (absent from runs without these policies).

``--robustness`` (S5, not in the default run) adds ``rpr`` on ``ramp`` and ``bursty`` with kappa
1.5 and infinity (the same run's requests, other GPU counts), cold starts of 1 and 10 s, and a
profile error of x0.8 and x1.2 (the planner and dispatcher believe SLO capacities x that factor;
the pods serve at the profile's real speed).

Traces (rates in req/s): ``ramp`` (30 -> 110 -> 50 over 180 s, four times: the ICPP'23 ramp),
``bursty`` (60 + 45 sin(2 pi t / 1800), plus 12 bursts an hour of x2.5 for 30 s), ``steps``
(5 s stages of uniform rates in [20, 60] that persist with probability 0.6), all of one function
with the given profile; and ``fleet``: ``--fleet-functions`` (50) functions, each with a profile
derived from the given one (seeded: service times and the SLO x a size log-uniform in [0.5, 2], so
each configuration's SLO capacity / size, which this model's scale invariance makes exact; memory x
log-uniform [0.25, 2]), base rates log-normal (median ``--fleet-median-rps``, sigma 1.5), diurnal
amplitude U(0.2, 0.8) of period 1800 s with a random phase, bursts at 2 an hour of x U(1.5, 3) for
U(10, 60) s, and 10 % of the functions sparse (ON/OFF, exponential, mean 10 min each: those idle
to zero under ``rpr_zero``); ``sparse`` (not in the default run; 7200 s): one function with
the given profile idle most of the time: bursts of U(5, 30) s at a log-uniform rate in [2, 40]
req/s, separated by idle gaps of U(90, 300) s (all longer than ``rpr``'s 60 s scale-down delay,
so a ``minReplicas`` 0 policy goes to zero between bursts), the first burst at U(0, 60) s. With
``--trace FILE`` (the Azure Functions 2019 invocation counts: ``HashOwner,HashApp,HashFunction,
Trigger,1..1440``, per-minute counts per function) the first ``--trace-functions`` rows run as a
fleet, each at its minute's count / 60 req/s, with profiles derived as for ``fleet``.

Run: ``python -m bench.autoscale_sim [--profile FILE] [--traces ramp,bursty,steps,fleet,sparse]
[--seconds S] [--trace FILE] [--gpu MODEL] [--policies P,...] [--kappa K] [--weights-fraction W]
[--wake-s W] [--robustness]``; the parked comparison (``docs/benchmarks/autoscale_sim_parked.json``)
is ``--traces ramp,bursty,steps,fleet,sparse --policies rpr_zero,rpr,rpr_parked``. The
example profile is on a V100-16GB: its 2 GB pods pack at most 8 per GPU (memory-bound); with
``--gpu V100-32GB`` (the reference prototype's 32 GB GPUs) 16 (the slots).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import csv
import heapq
import json
import math
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from fastgshare.autoscaling import (
    CostModel,
    GpuBudget,
    HpaSettings,
    HpaState,
    Option,
    ScalerState,
    ScalingSettings,
    cost_of,
    hpa_step,
    running,
    same_but_quota,
    settle,
    step,
)
from fastgshare.dispatch import Dispatcher, PodLoad
from fastgshare.fleet import SharedModel, pack_fleet
from fastgshare.gpu_models import gpu_model_spec
from fastgshare.inventory import GpuSpec
from fastgshare.ledger import GpuLedger
from fastgshare.packing import BIN
from fastgshare.profile import Profile, ProfilePoint, Slo, decode_profile
from fastgshare.share import ShareSpec

PROFILE = Path(__file__).resolve().parents[1] / "examples" / "profile-resnet50.json"
KAPPA = 3.15
MAX_QUEUED_AT_POD = 8
FUNCTION_QUEUE_TIMEOUT_S = 10.0
TICK_S = 1.0
HPA_PERIOD_S = 15.0
RPR_SETTINGS = ScalingSettings(headroom=0.5, scale_down_delay_s=60, dead_band=0.25, panic=True, min_pods=1)
# the HPA policies: (period s, settings); their one configuration is in Function.options
HPA_POLICIES = {"hpa_whole_gpu": (HPA_PERIOD_S, HpaSettings()),
                "hpa_whole_gpu_fast": (2.0, HpaSettings(stabilisation_s=30)),
                "hpa_fixed": (HPA_PERIOD_S, HpaSettings())}
MODEL_SHARING = "_model_sharing"  # a policy with this suffix: its base policy, pods of a function share weights
# rpr with minReplicas 0: policy -> the pods it keeps parked when the scaler would have none (spec.scaling.parked)
FROM_ZERO = {"rpr_zero": 0, "rpr_parked": 1}
RPR_FROM_ZERO_SETTINGS = attrs.evolve(RPR_SETTINGS, min_pods=0)
WAKE_S = 0.1  # a parked pod's wake-up (a live share change raising its quota): assumed, measured on the real node
WAKE_S_SOURCE = ("assumed (--wake-s): a live share change raising a parked pod's time quota; the real node's "
                 "figure is measured apart")
PARKED = "+parked"  # a pod count's key with this suffix: parked pods of that configuration (no time, memory held)
POLICIES = ("rpr", "rpr_area", "time_sharing_only", "hpa_whole_gpu", "hpa_fixed", "hpa_whole_gpu_fast",
            "rpr_model_sharing", "rpr_area_model_sharing", *FROM_ZERO)
DEFAULT_POLICIES = ("rpr", "rpr_area", "time_sharing_only", "hpa_whole_gpu", "rpr_model_sharing")  # others: --policies
# The weights' share of a pod's memory under model sharing. The example profile states no weights size, so
# this is assumed from the FaST-GShare paper's ViT-huge figure: sharing the weights saves 55.6 % of the GPU
# memory; n pods holding weights w (a share of a pod's memory) once save (n - 1) / n x w, so w >= 0.556
# (0.556 as n grows; 0.59 at 16 pods, 0.74 at 4). The smallest such w, the least sharing can save.
WEIGHTS_FRACTION = 0.556
WEIGHTS_SOURCE = ("assumed: the FaST-GShare paper's ViT-huge figure (-55.6 % GPU memory with shared weights; "
                  "(n-1)/n x w = 0.556 gives w >= 0.556, its value for many pods); the example profile has no "
                  "weights size (ResNet-50's own fp32 weights, 25.6 M parameters = 0.1 GB, are 0.05 of a 2 GB pod)")
TARGETS = {"gpu_seconds_ratio_vs_hpa": {"ramp": 0.6, "fleet": 1 / 3}, "slo_violations_pct": 1.0}
Trace = Callable[[float], float]


# --- traces --------------------------------------------------------------------------------
RAMP_POINTS = ((0, 30), (5, 40), (15, 50), (25, 60), (35, 70), (50, 80), (65, 90), (80, 100), (95, 110),
               (110, 100), (125, 90), (135, 70), (145, 50), (160, 50), (180, 30))


def ramp(t: float) -> float:
    t %= RAMP_POINTS[-1][0]
    times = [p[0] for p in RAMP_POINTS]
    i = max(0, bisect.bisect_right(times, t) - 1)
    (t0, r0), (t1, r1) = RAMP_POINTS[i], RAMP_POINTS[min(i + 1, len(RAMP_POINTS) - 1)]
    return r0 if t1 == t0 else r0 + (r1 - r0) * (t - t0) / (t1 - t0)


def bursty(seed: int) -> Trace:
    rng = random.Random(seed)
    bursts = sorted(rng.uniform(0, 3600) for _ in range(12))

    def rate(t: float) -> float:
        base = 60 + 45 * math.sin(2 * math.pi * t / 1800)
        return base * (2.5 if any(start <= t % 3600 < start + 30 for start in bursts) else 1.0)
    return rate


def steps(seed: int) -> Trace:
    rng = random.Random(seed)
    stages = [rng.uniform(20, 60)]
    for _ in range(999):
        stages.append(stages[-1] if rng.random() < 0.6 else rng.uniform(20, 60))
    return lambda t: stages[int(t // 5) % len(stages)]


SPARSE_HORIZON_S = 100_000.0  # the sparse trace's bursts are drawn this far, whatever the run's length


def sparse(seed: int) -> Trace:
    """Idle most of the time (see the module docstring): bursts of U(5, 30) s at a log-uniform rate in
    [2, 40] req/s, separated by idle gaps of U(90, 300) s; deterministic in ``seed``."""
    rng = random.Random(f"sparse/{seed}")
    starts: list[float] = []
    bursts: list[tuple[float, float]] = []  # (end, rate)
    t = rng.uniform(0, 60)
    while t < SPARSE_HORIZON_S:
        length, rps = rng.uniform(5, 30), math.exp(rng.uniform(math.log(2), math.log(40)))
        starts.append(t)
        bursts.append((t + length, rps))
        t += length + rng.uniform(90, 300)

    def rate(t: float) -> float:
        i = bisect.bisect_right(starts, t) - 1
        return bursts[i][1] if i >= 0 and t < bursts[i][0] else 0.0
    return rate


TRACES: dict[str, Callable[[int], Trace]] = {"ramp": lambda seed: ramp, "bursty": bursty, "steps": steps,
                                             "sparse": sparse}
DEFAULT_SECONDS = {"ramp": 720.0, "bursty": 3600.0, "steps": 1000.0, "fleet": 1800.0, "sparse": 7200.0}


@attrs.frozen
class FleetFunction:
    """One function of a fleet: its rate over time and how its profile is derived from the base one."""

    name: str
    trace: Trace
    size: float  # service times and the SLO x size
    memory_scale: float  # memory x memory_scale


def _derived(rng: random.Random) -> tuple[float, float]:
    return math.exp(rng.uniform(math.log(0.5), math.log(2))), math.exp(rng.uniform(math.log(0.25), math.log(2)))


def fleet(seed: int, seconds: float, *, functions: int = 50, median_rps: float = 5.0,
          period_s: float = 1800.0) -> list[FleetFunction]:
    """The synthetic Azure-like fleet (see the module docstring), deterministic in ``seed``."""
    rng = random.Random(f"fleet/{seed}")
    sparse = set(rng.sample(range(functions), round(0.1 * functions)))
    made = []
    for i in range(functions):
        size, memory_scale = _derived(rng)
        base = median_rps * math.exp(1.5 * rng.gauss(0, 1))
        amplitude, phase = rng.uniform(0.2, 0.8), rng.uniform(0, 2 * math.pi)
        bursts, t = [], rng.expovariate(2 / 3600)
        while t < seconds:
            bursts.append((t, t + rng.uniform(10, 60), rng.uniform(1.5, 3)))
            t += rng.expovariate(2 / 3600)
        toggles: list[float] = []  # the function is ON before toggles[0], OFF until toggles[1], ...
        if i in sparse:
            t = rng.expovariate(1 / 600)
            while t < seconds:
                toggles.append(t)
                t += rng.expovariate(1 / 600)
        trace = _fleet_rate(base, amplitude, phase, period_s, bursts=bursts, toggles=toggles)
        made.append(FleetFunction(name=f"fn{i:02d}", trace=trace, size=size, memory_scale=memory_scale))
    return made


def _fleet_rate(base: float, amplitude: float, phase: float, period_s: float, *,
                bursts: Sequence[tuple[float, float, float]], toggles: Sequence[float]) -> Trace:
    def rate(t: float) -> float:
        if bisect.bisect_right(toggles, t) % 2:
            return 0.0
        burst = max((factor for start, end, factor in bursts if start <= t < end), default=1.0)
        return base * (1 + amplitude * math.sin(2 * math.pi * t / period_s + phase)) * burst
    return rate


def load_azure_trace(path: Path, *, functions: int, seed: int) -> tuple[list[FleetFunction], float]:
    """The first ``functions`` rows of an Azure Functions invocation-count CSV (per-minute counts in
    columns ``1``..``1440``) as a fleet, and the trace's length in seconds."""
    rng = random.Random(f"azure/{seed}")
    made: list[FleetFunction] = []
    minutes = 0
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        fields = reader.fieldnames or []
        missing = {"HashOwner", "HashApp", "HashFunction", "Trigger", "1"} - set(fields)
        if missing:
            raise ValueError(f"{path}: not an Azure Functions invocation-count CSV, missing columns {sorted(missing)}")
        columns = [name for name in fields if name.isdigit()]
        columns.sort(key=int)
        minutes = len(columns)
        for row in reader:
            if len(made) >= functions:
                break
            counts = [float(row[name] or 0) for name in columns]
            size, memory_scale = _derived(rng)
            made.append(FleetFunction(name=f"{row['HashFunction'][:8]}-{len(made)}", trace=_per_minute(counts),
                                      size=size, memory_scale=memory_scale))
    if not made:
        raise ValueError(f"{path}: no function rows")
    return made, 60.0 * minutes


def _per_minute(counts: Sequence[float]) -> Trace:
    return lambda t: counts[int(t // 60)] / 60 if 0 <= t < 60 * len(counts) else 0.0


# --- the SLO capacity on this model --------------------------------------------------------
def p95_response_s(rate: float, service_s: float, seed: int, requests: int = 4000) -> float:
    """p95 response time of a FIFO server of fixed service time under Poisson arrivals."""
    rng, now, free_at, times = random.Random(seed), 0.0, 0.0, []
    for _ in range(requests):
        now += rng.expovariate(rate)
        free_at = max(now, free_at) + service_s
        times.append(free_at - now)
    return sorted(times)[int(0.95 * len(times))]


def model_capacity(point: ProfilePoint, slo: Slo, seed: int) -> float:
    """The highest rate (to 1 %) one pod of ``point`` serves on this model within 0.9 x the SLO."""
    service = 1 / point.max_rps
    bound = 0.9 * slo.latency_ms / 1000
    if service > bound:
        return 0.0
    low, high = 0.0, point.max_rps
    while high - low > 0.01 * point.max_rps:
        middle = (low + high) / 2
        low, high = (middle, high) if p95_response_s(middle, service, seed) <= bound else (low, middle)
    return low


# --- functions and their configurations ----------------------------------------------------
@attrs.frozen
class Function:
    """A function as the policies see it: its SLO, its usable options per policy (with the capacities the
    planner believes) and its whole-GPU option; ``capacity`` is what a pod of each configuration really
    serves within the SLO on this model."""

    name: str
    trace: Trace
    slo: Slo
    options: dict[str, tuple[Option, ...]]
    whole: Option  # the whole-GPU configuration (HPA's pods; the kappa bound's unit)
    points: dict[str, ProfilePoint]
    capacity: dict[str, float]


def make_function(name: str, trace: Trace, profile: Profile, gpu: GpuSpec, capacities: dict[str, float], *,
                  size: float = 1.0, memory_scale: float = 1.0, profile_error: float = 1.0) -> Function:
    """``profile`` with service times and the SLO x ``size`` and memory x ``memory_scale``; ``capacities``
    are the base profile's model capacities (this model is scale invariant: they scale by 1 / size). The
    planner believes capacities x ``profile_error`` of what the pods really serve (their service times
    stay the profile's)."""
    base_slo = profile.slo or Slo(percentile=95, latency_ms=69)
    slo = attrs.evolve(base_slo, latency_ms=base_slo.latency_ms * size)
    budget = GpuBudget(memory_bytes=gpu.memory_bytes)
    points = {p.key: attrs.evolve(p, max_rps=p.max_rps / size, slo_rps=p.slo_rps / size,
                                  memory_bytes=max(1, round(p.memory_bytes * memory_scale)))
              for p in profile.points}
    capacity = {k: capacities[k] / size for k in points}

    def usable(model: CostModel) -> tuple[Option, ...]:
        made = [Option(point=p, capacity_rps=capacity[k] * profile_error, cost=cost_of(p, budget, model))
                for k, p in points.items() if capacity[k] > 0 and p.memory_bytes <= gpu.memory_bytes]
        return tuple(sorted(made, key=lambda o: (-o.efficiency, o.point.key)))

    dominant = usable(CostModel.DOMINANT)
    if not dominant:
        raise ValueError(f"{name}: no configuration of the profile meets the SLO on this model and fits {gpu.model}")
    whole_point = max(points.values(), key=lambda p: (p.sm_partition, p.quota_request))
    whole = Option(point=whole_point, capacity_rps=capacity[whole_point.key] * profile_error,
                   cost=cost_of(whole_point, budget))
    return Function(name=name, trace=trace, slo=slo, points=points, whole=whole, capacity=capacity,
                    options={"rpr": dominant, "rpr_area": usable(CostModel.AREA),
                             "time_sharing_only": tuple(o for o in dominant if o.point.sm_partition == 100),
                             "hpa_whole_gpu": (whole,), "hpa_whole_gpu_fast": (whole,),
                             "hpa_fixed": dominant[:1], **dict.fromkeys(FROM_ZERO, dominant)})


# --- the simulation ------------------------------------------------------------------------
@attrs.define
class Pod:
    name: str
    option: Option
    created: float
    ready: float
    free_at: float = 0.0
    finishes: list[float] = attrs.field(factory=list)  # a heap of queued requests' finish times
    deleted: float | None = None


@attrs.define
class Result:
    latencies: list[float] = attrs.field(factory=list)
    violations: int = 0
    requests: int = 0
    warmup_violations: int = 0  # of requests that arrived before the first pod could be ready
    warmup_requests: int = 0
    area_seconds: float = 0.0
    pods_created: int = 0
    scale_actions: int = 0
    ticks_capacity_below_rate: int = 0
    vertical_steps: int = 0  # in-place quota changes of a configuration's pods (no pod created)
    pods_resized: int = 0  # pods those changes resized
    rebalances: int = 0  # make-before-break re-plans
    # scaling from zero: each cold episode's (first request's arrival, its wait until service starts or it
    # timed out, whether a parked pod was woken for it, whether it timed out)
    cold_episodes: list[tuple[float, float, bool, bool]] = attrs.field(factory=list)
    parked_seconds: float = 0.0  # parked pods x s
    parked_memory_byte_seconds: float = 0.0  # their memory x s


class Simulation:
    """One function's pods, requests and scaler state under one policy."""

    def __init__(self, function: Function, policy: str, *, cold_start_s: float, seed: int,
                 wake_s: float = WAKE_S) -> None:
        self.function, self.options, self.slo = function, function.options[base_policy(policy)], function.slo
        self.cold_start_s, self.rng = cold_start_s, random.Random(seed)
        self.live: dict[str, Pod] = {}  # the awake pods (ready or starting)
        self.parked: dict[str, Pod] = {}  # parked pods: memory held, no GPU time, serve nothing until woken
        self.parked_wanted, self.wake_s = FROM_ZERO.get(base_policy(policy), 0), wake_s
        self.ready_at: list[float] = []  # when pods created or woken since the caller last looked are ready
        self.cold_since: float | None = None  # the arrival of the open cold episode's first request
        self.dispatcher = Dispatcher()
        self.waiting: collections.deque[float] = collections.deque()
        self.arrivals: collections.deque[float] = collections.deque()
        self.result = Result()
        self.scaler, self.hpa, self.hpa_last = ScalerState(), HpaState(), -math.inf
        self._serial = 0

    # pods
    def scale_to(self, wanted: dict[str, int], now: float) -> None:
        """Run ``wanted`` pods per configuration. Pods of a configuration that loses pods move in place to
        a configuration that had none and differs only in time quota (a live share change: a vertical
        step keeps the pod, its readiness and its queue; no pod is created); then the newest surplus pods
        go and missing ones are created, ready ``cold_start_s`` later."""
        by_key = {o.point.key: o for o in self.options}
        counts = self.live_counts()
        surplus = {k: n - wanted.get(k, 0) for k, n in sorted(counts.items()) if n > wanted.get(k, 0)}
        missing = {k: n for k, n in sorted(wanted.items()) if n > 0 and counts[k] == 0}
        changed = False
        for target, source in [(t, s) for t in missing for s in surplus]:
            moved = min(missing[target], surplus[source])
            if moved <= 0 or not same_but_quota(by_key[source].point, by_key[target].point):
                continue
            oldest = sorted((p for p in self.live.values() if p.option.point.key == source),
                            key=lambda p: (p.created, p.name))
            for pod in oldest[:moved]:
                pod.option = by_key[target]
            surplus[source] -= moved
            missing[target] -= moved
            self.result.vertical_steps += 1
            self.result.pods_resized += moved
            changed = True
        live = list(self.live.values())
        for key in sorted(set(wanted) | {p.option.point.key for p in live}):
            mine = sorted((p for p in live if p.option.point.key == key), key=lambda p: (p.created, p.name))
            for _ in range(wanted.get(key, 0) - len(mine)):
                self._serial += 1
                name = f"{self.function.name}/{key}-{self._serial}"
                self.live[name] = Pod(name=name, option=by_key[key], created=now, ready=now + self.cold_start_s)
                self.ready_at.append(now + self.cold_start_s)
                self.result.pods_created += 1
                changed = True
            for pod in reversed(mine[wanted.get(key, 0):]):  # the newest go first
                pod.deleted = now
                del self.live[pod.name]
                changed = True
        self.result.scale_actions += changed

    def live_counts(self) -> collections.Counter[str]:
        return collections.Counter(p.option.point.key for p in self.live.values())

    def pod_counts(self) -> collections.Counter[str]:
        """The awake pods per configuration and the parked ones (keys with :data:`PARKED`)."""
        return self.live_counts() + collections.Counter(p.option.point.key + PARKED for p in self.parked.values())

    def park_or_wake(self, wanted: dict[str, int], now: float) -> None:
        """With ``wanted`` empty, keep the parked pods the policy wants: the awake pods of the most efficient
        configurations go parked (no pod created), else new pods of the most efficient configuration are
        created parked. With pods wanted, a parked pod of a wanted configuration is woken (a live share
        change: ready ``wake_s`` later, no cold start) and the others go."""
        if not wanted:
            awake = sorted(self.live.values(), key=lambda p: (-p.option.efficiency, p.created, p.name))
            best = max(self.options, key=lambda o: (o.efficiency, o.capacity_rps))
            while len(self.parked) < self.parked_wanted:
                if awake:
                    pod = awake.pop(0)
                    del self.live[pod.name]
                else:
                    self._serial += 1
                    name = f"{self.function.name}/{best.point.key}-{self._serial}"
                    pod = Pod(name=name, option=best, created=now, ready=now + self.cold_start_s)
                    self.result.pods_created += 1
                self.parked[pod.name] = pod
            return
        for pod in list(self.parked.values()):
            del self.parked[pod.name]
            if wanted.get(pod.option.point.key, 0) > self.live_counts()[pod.option.point.key]:
                self._wake(pod, now)
            else:
                pod.deleted = now

    def _wake(self, pod: Pod, now: float) -> None:
        pod.ready = max(pod.ready, now + self.wake_s)
        self.live[pod.name] = pod
        self.ready_at.append(pod.ready)

    def ready_counts(self, now: float) -> collections.Counter[str]:
        return collections.Counter(p.option.point.key for p in self.live.values() if p.ready <= now)

    # requests
    def arrive(self, now: float) -> None:
        self.arrivals.append(now)
        self.result.requests += 1
        self.result.warmup_requests += now < self.cold_start_s
        if not self.live and self.cold_since is None:  # no awake pod: a cold episode begins
            self.cold_since = now
            woken = bool(self.parked)
            if woken:  # the request wakes a parked pod at once, which becomes the scaler's one pod
                name = min(self.parked, key=lambda n: (-self.parked[n].option.efficiency, n))
                pod = self.parked.pop(name)
                self._wake(pod, now)
                self.scaler = attrs.evolve(self.scaler, pods={pod.option.point.key: 1}, keep={}, last_up_s=now)
            self.result.cold_episodes.append((now, math.nan, woken, False))
        self.waiting.append(now)
        self.drain(now)

    def _first_served(self, arrived: float, start: float, *, timed_out: bool = False) -> None:
        """Close the open cold episode when its first request (arrived at ``arrived``) starts service."""
        if self.cold_since is not None and arrived == self.cold_since:
            at, _, woken, _ = self.result.cold_episodes[-1]
            self.result.cold_episodes[-1] = (at, start - arrived, woken, timed_out)
            self.cold_since = None

    def drain(self, now: float) -> None:
        while self.waiting and now - self.waiting[0] > FUNCTION_QUEUE_TIMEOUT_S:
            arrived = self.waiting.popleft()
            self._first_served(arrived, now, timed_out=True)
            self._violated(arrived)
        while self.waiting:
            ready = [p for p in self.live.values() if p.ready <= now]
            for pod in ready:
                while pod.finishes and pod.finishes[0] <= now:
                    heapq.heappop(pod.finishes)
            chosen = self.dispatcher.choose([PodLoad(name=p.name, capacity_rps=p.option.capacity_rps,
                                                     queued=len(p.finishes), max_queued=MAX_QUEUED_AT_POD)
                                             for p in ready])
            if chosen is None:
                return
            pod, arrived = self.live[chosen], self.waiting.popleft()
            self._first_served(arrived, max(now, pod.free_at))
            pod.free_at = max(now, pod.free_at) + 1 / pod.option.point.max_rps
            heapq.heappush(pod.finishes, pod.free_at)
            latency = pod.free_at - arrived
            self.result.latencies.append(latency)
            if latency * 1000 > self.slo.latency_ms:
                self._violated(arrived)

    def _violated(self, arrived: float) -> None:
        self.result.violations += 1
        self.result.warmup_violations += arrived < self.cold_start_s

    def rate(self, now: float, window: float) -> float:
        while self.arrivals and self.arrivals[0] <= now - 10:
            self.arrivals.popleft()
        return sum(1 for t in self.arrivals if t > now - window) / window

    # scaling
    def tick(self, policy: str, now: float) -> None:
        policy = base_policy(policy)
        self.drain(now)
        rate_long = self.rate(now, 10)
        if policy in HPA_POLICIES:
            period, settings = HPA_POLICIES[policy]
            (option,) = self.options
            if now - self.hpa_last >= period:
                self.hpa_last = now
                self.hpa = hpa_step(self.hpa, rate=rate_long, pod_rps=option.point.max_rps, now_s=now,
                                    settings=settings)
            wanted = {option.point.key: self.hpa.pods}
        else:
            self.scaler = settle(self.scaler, self.ready_counts(now))  # the kept pods go once the new are ready
            before = self.scaler
            scaling = RPR_FROM_ZERO_SETTINGS if policy in FROM_ZERO else RPR_SETTINGS
            self.scaler = step(before, self.options, rate_long=rate_long, rate_short=self.rate(now, 2), now_s=now,
                               settings=scaling, starting=any(p.ready > now for p in self.live.values()))
            self.result.rebalances += self.scaler.last_rebalance_s != before.last_rebalance_s
            wanted = running(self.scaler)
        if self.parked_wanted:
            self.park_or_wake(wanted, now)
        self.scale_to(wanted, now)
        by_key = {o.point.key: o for o in self.options}
        target = wanted if policy in HPA_POLICIES else self.scaler.pods  # rpr: the target alone, without kept pods
        planned = sum(by_key[k].capacity_rps * n for k, n in target.items())
        self.result.ticks_capacity_below_rate += planned + 1e-9 < rate_long
        self.result.area_seconds += sum(p.option.point.quota_request * p.option.point.sm_partition / 100
                                        for p in self.live.values()) * TICK_S
        self.result.parked_seconds += len(self.parked) * TICK_S
        self.result.parked_memory_byte_seconds += sum(p.option.point.memory_bytes
                                                      for p in self.parked.values()) * TICK_S


def base_policy(policy: str) -> str:
    """The policy whose scaler ``policy`` runs: ``rpr_model_sharing`` scales as ``rpr`` does."""
    return policy.removesuffix(MODEL_SHARING)


def weights_bytes(function: Function, fraction: float) -> int:
    """The function's weights under model sharing: ``fraction`` of its smallest pod's memory."""
    return int(fraction * min(p.memory_bytes for p in function.points.values()))


BOUNDS = ("memory", "area", "slots", "kappa")  # what each tick's GPU count is at least


class Fleet:
    """The GPUs all functions' live pods take: the fleet packer's count and the kappa bound, cached.
    With ``weights_fraction`` (model sharing), a function's pods on one GPU hold its weights once."""

    def __init__(self, functions: Sequence[Function], gpu: GpuSpec, *, weights_fraction: float | None = None) -> None:
        self.functions, self.gpu = functions, gpu
        self.weights = [weights_bytes(f, weights_fraction) if weights_fraction is not None else 0 for f in functions]
        self.sharing = weights_fraction is not None
        self._empty = GpuLedger(gpu.devices(uuid_prefix="GPU", first_index=0)[0])
        self._cache: dict[tuple[tuple[int, str, int], ...], tuple[int, float, dict[str, int]]] = {}

    def packed(self, counts: tuple[tuple[int, str, int], ...]) -> tuple[int, float]:
        """The packer's GPU count for ``counts`` (function index, key, pods) and the pods' speed in
        whole GPUs (SLO capacity / the whole-GPU pod's, summed)."""
        gpus, speed, _ = self._packed(counts)
        return gpus, speed

    def lower_bounds(self, counts: tuple[tuple[int, str, int], ...], kappa: float = KAPPA) -> dict[str, int]:
        """The GPUs ``counts`` need at least by memory (weights once per function under model sharing),
        time x SM area, slots, and kappa alone."""
        _, speed, bounds = self._packed(counts)
        return {**bounds, "kappa": math.ceil(speed / kappa - 1e-9)}

    def _packed(self, counts: tuple[tuple[int, str, int], ...]) -> tuple[int, float, dict[str, int]]:
        if counts not in self._cache:
            shares: list[tuple[str, ShareSpec]] = []
            models: dict[str, SharedModel] = {}
            speed, memory, area, with_pods = 0.0, 0, 0, set()
            reserve = self._empty.gpu.context_reserve_bytes
            for i, key, n in counts:
                function = self.functions[i]
                parked = key.endswith(PARKED)  # a quota of 0: its memory and a slot, no time x SM area, no speed
                point = function.points[key.removesuffix(PARKED)]
                share = ShareSpec(request_permille=0 if parked else round(point.quota_request * 1000),
                                  limit_permille=0 if parked else round(point.quota_limit * 1000),
                                  sm_percent=point.sm_partition, memory_bytes=point.memory_bytes)
                names = [f"{function.name}/{key}-{j}" for j in range(n)]
                shares.extend((name, share) for name in names)
                if self.sharing:
                    models.update(dict.fromkeys(names, SharedModel(function.name, self.weights[i])))
                if not parked:
                    speed += function.capacity[point.key] * n / function.capacity[function.whole.point.key]
                memory += n * (point.memory_bytes - self.weights[i] + reserve)
                area += n * math.prod(self._empty.rectangle_size(share))
                if n:
                    with_pods.add(i)
            memory += sum(self.weights[i] for i in with_pods)  # at least one copy each
            placement = pack_fleet(shares, self.gpu, models=models)
            if placement.unplaced:
                raise RuntimeError(f"pods that fit no empty GPU: {placement.unplaced[:3]}")
            bounds = {"memory": math.ceil(memory / self.gpu.memory_bytes), "area": math.ceil(area / BIN.area),
                      "slots": math.ceil(len(shares) / self._empty.slots)}
            self._cache[counts] = (len(placement.gpus), speed, bounds)
        return self._cache[counts]

    def gpus(self, counts: tuple[tuple[int, str, int], ...], kappa: float = KAPPA) -> int:
        """The packer's count, and at least the pods' speed / kappa (co-located pods serve less)."""
        packed, speed = self.packed(counts)
        return max(packed, math.ceil(speed / kappa - 1e-9))


def run(functions: Sequence[Function], seconds: float, policy: str, *, gpu: GpuSpec, seed: int,
        cold_start_s: float, kappa: float = KAPPA, other_kappas: Sequence[float] = (),
        weights_fraction: float = WEIGHTS_FRACTION, record: list[tuple[int, dict[str, int]]] | None = None,
        wake_s: float = WAKE_S, from_zero: bool = False) -> dict[str, object]:
    """One policy on all ``functions`` together for ``seconds``: the summary of every request and the GPUs
    (also under ``other_kappas``: kappa enters only the GPU count, so one run gives them all). A
    ``*_model_sharing`` policy packs with each function's weights (``weights_fraction`` of its pods'
    memory) held once per GPU. ``record`` gets each tick's GPU count and lower bounds. With ``from_zero``
    the summary has ``from_zero``: cold episodes, first-request waits and parked pods (``wake_s``: a
    parked pod's wake-up)."""
    sims = [Simulation(f, policy, cold_start_s=cold_start_s, seed=seed + 1_000_003 * i, wake_s=wake_s)
            for i, f in enumerate(functions)]
    sharing = policy.endswith(MODEL_SHARING)
    fleet_gpus = Fleet(functions, gpu, weights_fraction=weights_fraction if sharing else None)
    bound_seconds = dict.fromkeys(BOUNDS, 0.0)
    bound_ticks = dict.fromkeys(BOUNDS, 0)
    peaks = [max(f.trace(t) for t in range(int(seconds) + 1)) * 1.01 + 1 for f in functions]
    arrivals = [(_next_arrival(f.trace, peak, 0.0, sim.rng, seconds), i)
                for i, (f, peak, sim) in enumerate(zip(functions, peaks, sims, strict=True))]
    heapq.heapify(arrivals)
    next_tick, gpu_seconds, peak_gpus, awake_gpu_seconds = 0.0, 0.0, 0, 0.0
    others = dict.fromkeys(other_kappas, 0.0)
    # (when a pod is ready, function): the requests waiting for it start then, also between ticks and arrivals
    # (a woken pod, a cold start of a fraction of a second); first, so a tick at the same time sees them served
    readiness: list[tuple[float, int]] = []

    def collect_ready(i: int) -> None:
        for ready in sims[i].ready_at:
            heapq.heappush(readiness, (ready, i))
        sims[i].ready_at.clear()

    while min(next_tick, arrivals[0][0], readiness[0][0] if readiness else math.inf) < seconds:
        if readiness and readiness[0][0] <= min(next_tick, arrivals[0][0]):
            now, i = heapq.heappop(readiness)
            sims[i].drain(now)
        elif next_tick <= arrivals[0][0]:
            now = next_tick
            for i, sim in enumerate(sims):
                sim.tick(policy, now)
                collect_ready(i)
            counts = tuple((i, key, n) for i, sim in enumerate(sims) for key, n in sorted(sim.pod_counts().items()))
            gpus = fleet_gpus.gpus(counts, kappa)
            gpu_seconds += gpus * TICK_S
            if from_zero:
                awake = tuple(c for c in counts if not c[1].endswith(PARKED))
                awake_gpu_seconds += (gpus if awake == counts else fleet_gpus.gpus(awake, kappa)) * TICK_S
            bounds = fleet_gpus.lower_bounds(counts, kappa)
            for name, bound in bounds.items():
                bound_seconds[name] += bound * TICK_S
                bound_ticks[name] += bound == gpus
            if record is not None:
                record.append((gpus, bounds))
            peak_gpus = max(peak_gpus, gpus)
            for other in others:
                others[other] += fleet_gpus.gpus(counts, other) * TICK_S
            next_tick += TICK_S
        else:
            now, i = arrivals[0]
            sims[i].arrive(now)
            collect_ready(i)
            heapq.heapreplace(arrivals, (_next_arrival(functions[i].trace, peaks[i], now, sims[i].rng, seconds), i))
    results = [sim.result for sim in sims]
    summary = _summary(results, seconds=seconds, gpu_seconds=gpu_seconds, peak_gpus=peak_gpus,
                       bound_seconds=bound_seconds, bound_ticks=bound_ticks)
    if sharing:
        summary["model_sharing"] = {"weights_fraction": weights_fraction, "source": WEIGHTS_SOURCE}
    if others:
        summary["gpu_seconds_at_kappa"] = {_kappa_name(k): round(v) for k, v in others.items()}
    if from_zero:
        summary["from_zero"] = _from_zero_summary(results, cold_start_s=cold_start_s, wake_s=wake_s,
                                                  awake_gpu_seconds=awake_gpu_seconds)
    return summary


def _summary(results: Sequence[Result], *, seconds: float, gpu_seconds: float, peak_gpus: int,
             bound_seconds: dict[str, float], bound_ticks: dict[str, int]) -> dict[str, object]:
    """Every request's and the GPUs' figures of one run."""
    latencies = sorted(x for r in results for x in r.latencies) or [0.0]
    requests = sum(r.requests for r in results)
    violations = sum(r.violations for r in results)
    warmup_requests, warmup_violations = (sum(r.warmup_requests for r in results),
                                          sum(r.warmup_violations for r in results))
    ticks = max(1, math.ceil(seconds / TICK_S))
    summary: dict[str, object] = {
        "requests": requests, "slo_violations_pct": round(100 * violations / max(1, requests), 2),
        "slo_violations_pct_after_first_cold_start": round(
            100 * (violations - warmup_violations) / max(1, requests - warmup_requests), 2),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p95_ms": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 1),
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
        "gpu_seconds": round(gpu_seconds), "peak_gpus": peak_gpus, "mean_gpus": round(gpu_seconds / ticks, 2),
        "area_seconds": round(sum(r.area_seconds for r in results)),
        "pods_created": sum(r.pods_created for r in results),
        "scale_actions": sum(r.scale_actions for r in results),
        "ticks_capacity_below_rate": sum(r.ticks_capacity_below_rate for r in results),
        "vertical_steps": sum(r.vertical_steps for r in results),
        "pods_resized_in_place": sum(r.pods_resized for r in results),
        "rebalances": sum(r.rebalances for r in results),
        "gpu_seconds_lower_bounds": {name: round(v) for name, v in bound_seconds.items()},
        "ticks_at_lower_bound": bound_ticks,
        "bound_by": max(BOUNDS, key=lambda name: (bound_seconds[name], -BOUNDS.index(name)))}
    return summary


def _from_zero_summary(results: Sequence[Result], *, cold_start_s: float, wake_s: float,
                       awake_gpu_seconds: float) -> dict[str, object]:
    """Cold episodes (those after the first cold start), their first requests' waits, the parked pods."""
    episodes = [e for r in results for e in r.cold_episodes if e[0] >= cold_start_s and not math.isnan(e[1])]
    waits = sorted(wait for _, wait, _, _ in episodes)

    def at(q: float) -> float | None:
        return round(waits[int(q * (len(waits) - 1))], 3) if waits else None

    return {"wake_s": wake_s, "cold_episodes": len(episodes),
            "woken_parked": sum(woken for _, _, woken, _ in episodes),
            "first_request_wait_s": {"median": round(statistics.median(waits), 3) if waits else None,
                                     "p95": at(0.95), "max": at(1.0)},
            "first_request_timed_out": sum(timed_out for *_, timed_out in episodes),
            "cold_episodes_in_first_cold_start": sum(e[0] < cold_start_s for r in results for e in r.cold_episodes),
            "cold_episodes_open_at_end": sum(e[0] >= cold_start_s and math.isnan(e[1])
                                             for r in results for e in r.cold_episodes),
            "parked_pod_seconds": round(sum(r.parked_seconds for r in results)),
            "parked_memory_gib_seconds": round(sum(r.parked_memory_byte_seconds for r in results) / 2**30),
            "gpu_seconds_without_parked": round(awake_gpu_seconds)}


def _kappa_name(kappa: float) -> str:
    return "inf" if math.isinf(kappa) else f"{kappa:g}"


def _next_arrival(trace: Trace, peak: float, now: float, rng: random.Random, until: float) -> float:
    """The next arrival after ``now`` (thinning), or infinity when none comes before ``until``."""
    while now < until:
        now += rng.expovariate(peak)
        if rng.random() * peak <= trace(now):
            return now
    return math.inf


# --- the runs ------------------------------------------------------------------------------
def _setup(profile: Profile, seed: int, gpu_model: str | None) -> tuple[GpuSpec, dict[str, float]]:
    slo = profile.slo or Slo(percentile=95, latency_ms=69)
    gpu = gpu_model_spec(gpu_model or profile.gpu_model or "V100-16GB")
    return gpu, {p.key: model_capacity(p, slo, seed) for p in profile.points}


def _compare(functions: Sequence[Function], seconds: float, gpu: GpuSpec, *, seed: int, cold_start_s: float,
             policies: Sequence[str], kappa: float, weights_fraction: float, wake_s: float) -> dict[str, object]:
    from_zero = any(policy in FROM_ZERO for policy in policies)  # then every policy reports its cold episodes
    results = {policy: run(functions, seconds, policy, gpu=gpu, seed=seed, cold_start_s=cold_start_s, kappa=kappa,
                           weights_fraction=weights_fraction, wake_s=wake_s, from_zero=from_zero)
               for policy in policies}
    for result in results.values():
        result["gpu_seconds_ratio_vs_hpa"] = _ratio({"a": result, **results}, "a", "hpa_whole_gpu", "gpu_seconds")
    return {**results, "gpu_seconds_rpr_to_hpa": _ratio(results, "rpr", "hpa_whole_gpu", "gpu_seconds"),
            "peak_gpus_rpr_to_hpa": _ratio(results, "rpr", "hpa_whole_gpu", "peak_gpus"),
            "gpu_seconds_time_sharing_to_rpr": _ratio(results, "time_sharing_only", "rpr", "gpu_seconds"),
            "area_seconds_rpr_to_hpa": _ratio(results, "rpr", "hpa_whole_gpu", "area_seconds"),
            "gpu_seconds_rpr_area_to_hpa": _ratio(results, "rpr_area", "hpa_whole_gpu", "gpu_seconds")}


def targets(trace_name: str, compared: dict[str, object]) -> dict[str, object]:
    """The issue's targets for each of our (non-HPA) policies in one run: GPU-s against whole-GPU HPA
    (ramp <= 0.6x, fleet <= 1/3) with the lower bound that binds (its GPU-s / HPA's: above the target,
    no packing meets it without changing that resource), and SLO violations <= 1 %."""
    hpa = compared.get("hpa_whole_gpu")
    made: dict[str, object] = {}
    for policy, result in compared.items():
        if not isinstance(result, dict) or policy in HPA_POLICIES:
            continue
        row: dict[str, object] = {}
        at_most = TARGETS["gpu_seconds_ratio_vs_hpa"]
        assert isinstance(at_most, dict)
        if trace_name in at_most and isinstance(hpa, dict):
            ratio, bound = result["gpu_seconds_ratio_vs_hpa"], result["bound_by"]
            row["gpu_seconds_ratio_vs_hpa"] = {
                "value": ratio, "at_most": round(at_most[trace_name], 3),
                "met": ratio is not None and ratio <= at_most[trace_name], "bound_by": bound,
                "bound_ratio_vs_hpa": round(result["gpu_seconds_lower_bounds"][bound] / hpa["gpu_seconds"], 3)}
        violations = result["slo_violations_pct"]
        row["slo_violations_pct"] = {
            "value": violations, "at_most": TARGETS["slo_violations_pct"],
            "met": violations <= TARGETS["slo_violations_pct"],
            "after_first_cold_start": result["slo_violations_pct_after_first_cold_start"]}
        made[policy] = row
    return made


def simulate(profile: Profile, trace_name: str, seconds: float, *, seed: int, cold_start_s: float = 5.0,
             gpu_model: str | None = None, policies: Sequence[str] = DEFAULT_POLICIES,
             kappa: float = KAPPA, weights_fraction: float = WEIGHTS_FRACTION,
             wake_s: float = WAKE_S) -> dict[str, object]:
    """One single-function trace (``ramp``, ``bursty``, ``steps``, ``sparse``) under every policy."""
    gpu, capacities = _setup(profile, seed, gpu_model)
    function = make_function(profile.function, TRACES[trace_name](seed), profile, gpu, capacities)
    compared = _compare([function], seconds, gpu, seed=seed, cold_start_s=cold_start_s, policies=policies,
                        kappa=kappa, weights_fraction=weights_fraction, wake_s=wake_s)
    return {"trace": trace_name, "seconds": seconds, "gpu": gpu.model, "functions": 1,
            "slo_capacity_rps": {k: round(v, 1) for k, v in capacities.items()},
            **compared, "targets": targets(trace_name, compared)}


def simulate_fleet(profile: Profile, fleet_functions: Sequence[FleetFunction], seconds: float, *, trace_name: str,
                   seed: int, cold_start_s: float = 5.0, gpu_model: str | None = None,
                   policies: Sequence[str] = DEFAULT_POLICIES, kappa: float = KAPPA,
                   weights_fraction: float = WEIGHTS_FRACTION, wake_s: float = WAKE_S) -> dict[str, object]:
    """Many functions (the ``fleet`` trace or a trace file) under every policy, packed together."""
    gpu, capacities = _setup(profile, seed, gpu_model)
    functions = [make_function(f.name, f.trace, profile, gpu, capacities, size=f.size, memory_scale=f.memory_scale)
                 for f in fleet_functions]
    compared = _compare(functions, seconds, gpu, seed=seed, cold_start_s=cold_start_s, policies=policies,
                        kappa=kappa, weights_fraction=weights_fraction, wake_s=wake_s)
    return {"trace": trace_name, "seconds": seconds, "gpu": gpu.model, "functions": len(functions),
            **compared, "targets": targets(trace_name, compared)}


ROBUSTNESS_KAPPAS = (1.5, math.inf)  # besides the default
ROBUSTNESS_COLD_STARTS_S = (1.0, 10.0)  # besides the default
ROBUSTNESS_PROFILE_ERRORS = (0.8, 1.2)  # the planner believes capacities x this of what pods serve
ROBUSTNESS_FIELDS = ("requests", "slo_violations_pct", "slo_violations_pct_after_first_cold_start", "p99_ms",
                     "gpu_seconds", "peak_gpus", "pods_created", "vertical_steps", "rebalances")


def robustness(profile: Profile, trace_name: str, seconds: float, *, seed: int, cold_start_s: float = 5.0,
               gpu_model: str | None = None, policy: str = "rpr") -> list[dict[str, object]]:
    """S5: ``policy`` on one single-function trace with kappa in {default, 1.5, inf} (one run: kappa only
    bounds the GPU count), cold starts of 1 and 10 s, and a profile error of x0.8 and x1.2."""
    gpu, capacities = _setup(profile, seed, gpu_model)

    def once(*, cold: float, error: float, kappas: Sequence[float] = ()) -> dict[str, object]:
        function = make_function(profile.function, TRACES[trace_name](seed), profile, gpu, capacities,
                                 profile_error=error)
        return run([function], seconds, policy, gpu=gpu, seed=seed, cold_start_s=cold, other_kappas=kappas)

    def row(result: dict[str, object], *, kappa: float = KAPPA, cold: float = cold_start_s,
            error: float = 1.0) -> dict[str, object]:
        return {"trace": trace_name, "policy": policy, "gpu": gpu.model, "kappa": _kappa_name(kappa),
                "cold_start_s": cold, "profile_error": error, **{k: result[k] for k in ROBUSTNESS_FIELDS}}

    base = once(cold=cold_start_s, error=1.0, kappas=ROBUSTNESS_KAPPAS)
    at_kappa = base["gpu_seconds_at_kappa"]
    assert isinstance(at_kappa, dict)
    rows = [row(base)]
    rows.extend(row({**base, "gpu_seconds": at_kappa[_kappa_name(k)], "peak_gpus": None}, kappa=k)
                for k in ROBUSTNESS_KAPPAS)
    rows.extend(row(once(cold=cold, error=1.0), cold=cold) for cold in ROBUSTNESS_COLD_STARTS_S)
    rows.extend(row(once(cold=cold_start_s, error=error), error=error) for error in ROBUSTNESS_PROFILE_ERRORS)
    return rows


def _ratio(results: dict[str, dict[str, object]], a: str, b: str, field: str) -> float | None:
    if a not in results or b not in results:
        return None
    x, y = float(results[a][field]), float(results[b][field])  # type: ignore[arg-type]
    return round(x / y, 3) if y else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--traces", default="ramp,bursty,steps,fleet", help="synthetic traces ('' for none)")
    parser.add_argument("--seconds", type=float, help="length of every trace (default: each trace's own)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cold-start-seconds", type=float, default=5.0)
    parser.add_argument("--gpu", help="the GPU model (default: the profile's)")
    parser.add_argument("--fleet-functions", type=int, default=50)
    parser.add_argument("--fleet-median-rps", type=float, default=5.0)
    parser.add_argument("--trace", type=Path, help="an Azure Functions invocation-count CSV to run as a fleet")
    parser.add_argument("--trace-functions", type=int, default=50, help="how many of its rows (the first)")
    parser.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help=f"of {', '.join(POLICIES)}")
    parser.add_argument("--kappa", type=float, default=KAPPA, help="the co-location cap ('inf' for none)")
    parser.add_argument("--weights-fraction", type=float, default=WEIGHTS_FRACTION,
                        help="model sharing: the weights' share of each pod's memory, in [0, 1)")
    parser.add_argument("--wake-s", type=float, default=WAKE_S,
                        help="rpr_parked: seconds a parked pod takes to wake (a live share change), >= 0")
    parser.add_argument("--robustness", action="store_true",
                        help="also S5: rpr on ramp and bursty under kappa, cold-start and profile-error variations")
    args = parser.parse_args(argv)
    policies = tuple(filter(None, args.policies.split(",")))
    if unknown := sorted(set(policies) - set(POLICIES)):
        parser.error(f"unknown policies {unknown}; known: {', '.join(POLICIES)}")
    if not 0 <= args.weights_fraction < 1:
        parser.error(f"--weights-fraction {args.weights_fraction}: must be in [0, 1) "
                     "(the weights' share of a pod's memory)")
    if not (math.isfinite(args.wake_s) and args.wake_s >= 0):
        parser.error(f"--wake-s {args.wake_s}: must be a finite number of seconds >= 0 (a parked pod's wake-up)")
    profile = decode_profile(args.profile.read_text())
    common = {"seed": args.seed, "cold_start_s": args.cold_start_seconds, "gpu_model": args.gpu,
              "policies": policies, "kappa": args.kappa, "weights_fraction": args.weights_fraction,
              "wake_s": args.wake_s}
    runs = []
    for name in filter(None, args.traces.split(",")):
        seconds = args.seconds or DEFAULT_SECONDS[name]
        if name == "fleet":
            made = fleet(args.seed, seconds, functions=args.fleet_functions, median_rps=args.fleet_median_rps)
            runs.append(simulate_fleet(profile, made, seconds, trace_name=name, **common))
        else:
            runs.append(simulate(profile, name, seconds, **common))
    if args.trace:
        made, length = load_azure_trace(args.trace, functions=args.trace_functions, seed=args.seed)
        runs.append(simulate_fleet(profile, made, args.seconds or length, trace_name=f"file:{args.trace.name}",
                                   **common))
    report: dict[str, object] = {
        "benchmark": "autoscale_sim", "function": profile.function, "seed": args.seed,
        "cold_start_s": args.cold_start_seconds, "kappa": args.kappa if math.isfinite(args.kappa) else "inf",
        "policies": list(policies),
        "model_sharing": {"weights_fraction": args.weights_fraction, "source": WEIGHTS_SOURCE,
                          "policies": [p for p in policies if p.endswith(MODEL_SHARING)]},
        "fleet": {"functions": args.fleet_functions, "median_rps": args.fleet_median_rps}, "runs": runs}
    if from_zero := [p for p in policies if p in FROM_ZERO]:  # absent otherwise: the default run's JSON stays as it was
        report["from_zero"] = {"policies": from_zero, "parked_pods": {p: FROM_ZERO[p] for p in from_zero},
                               "wake_s": args.wake_s, "wake_s_source": WAKE_S_SOURCE,
                               "cold_start_s": args.cold_start_seconds}
    if args.robustness:
        report["robustness"] = [row for name in ("ramp", "bursty")
                                for row in robustness(profile, name, args.seconds or DEFAULT_SECONDS[name],
                                                      seed=args.seed, cold_start_s=args.cold_start_seconds,
                                                      gpu_model=args.gpu)]
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
