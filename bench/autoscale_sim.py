"""Autoscaling policies on shared GPUs, simulated (prints one JSON object).

A deterministic discrete-event simulation of functions under load traces, with the core's own
planner and scaling steps (:mod:`fastgshare.autoscaling`: ``step`` and the controller's HPA model
``hpa_step``), dispatcher (:mod:`fastgshare.dispatch`) and fleet packer (:mod:`fastgshare.fleet`,
for the GPUs all functions' pods need together). Compared:

- ``rpr``: the profile-driven scaler (every 1 s; 0.5 headroom; scale-down after 60 s; panic on a
  doubling 2 s window), choosing (quota, SM) configurations by dominant-share cost;
- ``time_sharing_only``: the same scaler restricted to configurations with all SMs (SM 100), as a
  GPU shared in time only would run it;
- ``hpa_whole_gpu``: Kubernetes' HPA on whole-GPU pods, exactly the function controller's model
  (:func:`fastgshare.autoscaling.hpa_step` with its defaults: target 70 % of a pod's ``maxRps``,
  tolerance 0.1, up by at most max(2n, n + 4), down to the largest recommendation of the last
  300 s, at least one pod), every 15 s: what serverless platforms without sharing do.

Model: Poisson arrivals (thinning) at each function's rate; each pod a FIFO server taking
``1 / maxRps`` s per request (its configuration's saturation throughput, measured one pod per GPU),
ready ``cold_start_s`` after it is created and costing GPU time from creation to deletion; at most
8 requests queued at a pod, the rest wait at the function (FIFO) and count as violations after 10 s.
Every policy starts from no pods ready; violations are also given without the requests that
arrived during the first cold start.
The rates the scalers see are the arrivals of the last 10 s and 2 s. Each configuration's SLO
capacity is measured on this model (the highest Poisson rate one pod serves with its p95 under
0.9 x SLO), so the planner plans with the same physics the simulation runs. GPUs in use at each
tick: the fleet packer's count for all functions' pods' shares (time x SM, memory, slots), and at
least ``sum over pods of SLO capacity / (kappa x SLO capacity of its function on a whole GPU)``:
co-located pods do not each serve as much as they did alone (profiles are measured one pod per
GPU); kappa = 3.15, the paper's gain of spatio-temporal over time sharing, caps what sharing one GPU
can give. ``ticks_capacity_below_rate`` counts (tick, function) pairs whose planned SLO capacity
was below the 10 s rate the scaler planned for (zero for rpr by construction; HPA's rate limit and
target differ).

Traces (rates in req/s): ``ramp`` (30 -> 110 -> 50 over 180 s, four times: the ICPP'23 ramp),
``bursty`` (60 + 45 sin(2 pi t / 1800), plus 12 bursts an hour of x2.5 for 30 s), ``steps``
(5 s stages of uniform rates in [20, 60] that persist with probability 0.6), all of one function
with the given profile; and ``fleet``: ``--fleet-functions`` (50) functions, each with a profile
derived from the given one (seeded: service times and the SLO x a size log-uniform in [0.5, 2], so
each configuration's SLO capacity / size, which this model's scale invariance makes exact; memory x
log-uniform [0.25, 2]), base rates log-normal (median ``--fleet-median-rps``, sigma 1.5), diurnal
amplitude U(0.2, 0.8) of period 1800 s with a random phase, bursts at 2 an hour of x U(1.5, 3) for
U(10, 60) s, and 10 % of the functions sparse (ON/OFF, exponential, mean 10 min each). With
``--trace FILE`` (the Azure Functions 2019 invocation counts: ``HashOwner,HashApp,HashFunction,
Trigger,1..1440``, per-minute counts per function) the first ``--trace-functions`` rows run as a
fleet, each at its minute's count / 60 req/s, with profiles derived as for ``fleet``.

Run: ``python -m bench.autoscale_sim [--profile FILE] [--traces ramp,bursty,steps,fleet]
[--seconds S] [--trace FILE]``.
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

from fastgshare.autoscaling import GpuBudget, HpaState, Option, ScalerState, ScalingSettings, cost_of, hpa_step, step
from fastgshare.dispatch import Dispatcher, PodLoad
from fastgshare.fleet import pack_fleet
from fastgshare.gpu_models import gpu_model_spec
from fastgshare.inventory import GpuSpec
from fastgshare.profile import Profile, ProfilePoint, Slo, decode_profile
from fastgshare.share import ShareSpec

PROFILE = Path(__file__).resolve().parents[1] / "examples" / "profile-resnet50.json"
KAPPA = 3.15
MAX_QUEUED_AT_POD = 8
FUNCTION_QUEUE_TIMEOUT_S = 10.0
TICK_S = 1.0
HPA_PERIOD_S = 15.0
RPR_SETTINGS = ScalingSettings(headroom=0.5, scale_down_delay_s=60, dead_band=0.25, panic=True, min_pods=1)
POLICIES = ("rpr", "time_sharing_only", "hpa_whole_gpu")
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


TRACES: dict[str, Callable[[int], Trace]] = {"ramp": lambda seed: ramp, "bursty": bursty, "steps": steps}
DEFAULT_SECONDS = {"ramp": 720.0, "bursty": 3600.0, "steps": 1000.0, "fleet": 1800.0}


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
    """A function as the policies see it: its SLO, its usable options per policy and its whole-GPU option."""

    name: str
    trace: Trace
    slo: Slo
    options: dict[str, tuple[Option, ...]]
    whole: Option  # the whole-GPU configuration (HPA's pods; the kappa bound's unit)
    points: dict[str, ProfilePoint]


def make_function(name: str, trace: Trace, profile: Profile, gpu: GpuSpec, capacities: dict[str, float], *,
                  size: float = 1.0, memory_scale: float = 1.0) -> Function:
    """``profile`` with service times and the SLO x ``size`` and memory x ``memory_scale``; ``capacities``
    are the base profile's model capacities (this model is scale invariant: they scale by 1 / size)."""
    base_slo = profile.slo or Slo(percentile=95, latency_ms=69)
    slo = attrs.evolve(base_slo, latency_ms=base_slo.latency_ms * size)
    budget = GpuBudget(memory_bytes=gpu.memory_bytes)
    points = {p.key: attrs.evolve(p, max_rps=p.max_rps / size, slo_rps=p.slo_rps / size,
                                  memory_bytes=max(1, round(p.memory_bytes * memory_scale)))
              for p in profile.points}
    usable = sorted((Option(point=p, capacity_rps=capacities[k] / size, cost=cost_of(p, budget))
                     for k, p in points.items() if capacities[k] > 0 and p.memory_bytes <= gpu.memory_bytes),
                    key=lambda o: (-o.efficiency, o.point.key))
    whole_point = max(points.values(), key=lambda p: (p.sm_partition, p.quota_request))
    whole = Option(point=whole_point, capacity_rps=capacities[whole_point.key] / size,
                   cost=cost_of(whole_point, budget))
    return Function(name=name, trace=trace, slo=slo, points=points, whole=whole,
                    options={"rpr": tuple(usable),
                             "time_sharing_only": tuple(o for o in usable if o.point.sm_partition == 100),
                             "hpa_whole_gpu": tuple(o for o in usable if o.point.key == whole.point.key)})


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


class Simulation:
    """One function's pods, requests and scaler state under one policy."""

    def __init__(self, function: Function, policy: str, *, cold_start_s: float, seed: int) -> None:
        self.function, self.options, self.slo = function, function.options[policy], function.slo
        self.cold_start_s, self.rng = cold_start_s, random.Random(seed)
        self.live: dict[str, Pod] = {}
        self.dispatcher = Dispatcher()
        self.waiting: collections.deque[float] = collections.deque()
        self.arrivals: collections.deque[float] = collections.deque()
        self.result = Result()
        self.scaler, self.hpa, self.hpa_last = ScalerState(), HpaState(), -math.inf
        self._serial = 0

    # pods
    def scale_to(self, wanted: dict[str, int], now: float) -> None:
        by_key = {o.point.key: o for o in self.options}
        live = list(self.live.values())
        changed = False
        for key in sorted(set(wanted) | {p.option.point.key for p in live}):
            mine = sorted((p for p in live if p.option.point.key == key), key=lambda p: p.created)
            for _ in range(wanted.get(key, 0) - len(mine)):
                self._serial += 1
                name = f"{self.function.name}/{key}-{self._serial}"
                self.live[name] = Pod(name=name, option=by_key[key], created=now, ready=now + self.cold_start_s)
                self.result.pods_created += 1
                changed = True
            for pod in reversed(mine[wanted.get(key, 0):]):  # the newest go first
                pod.deleted = now
                del self.live[pod.name]
                changed = True
        self.result.scale_actions += changed

    def live_counts(self) -> collections.Counter[str]:
        return collections.Counter(p.option.point.key for p in self.live.values())

    # requests
    def arrive(self, now: float) -> None:
        self.arrivals.append(now)
        self.result.requests += 1
        self.result.warmup_requests += now < self.cold_start_s
        self.waiting.append(now)
        self.drain(now)

    def drain(self, now: float) -> None:
        while self.waiting and now - self.waiting[0] > FUNCTION_QUEUE_TIMEOUT_S:
            self._violated(self.waiting.popleft())
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
        self.drain(now)
        rate_long = self.rate(now, 10)
        if policy == "hpa_whole_gpu":
            if now - self.hpa_last >= HPA_PERIOD_S:
                self.hpa_last = now
                self.hpa = hpa_step(self.hpa, rate=rate_long, pod_rps=self.function.whole.point.max_rps, now_s=now)
            wanted = {self.function.whole.point.key: self.hpa.pods}
        else:
            self.scaler = step(self.scaler, self.options, rate_long=rate_long, rate_short=self.rate(now, 2),
                               now_s=now, settings=RPR_SETTINGS)
            wanted = dict(self.scaler.pods)
        self.scale_to(wanted, now)
        by_key = {o.point.key: o for o in self.options}
        planned = sum(by_key[k].capacity_rps * n for k, n in wanted.items())
        self.result.ticks_capacity_below_rate += planned + 1e-9 < rate_long
        self.result.area_seconds += sum(p.option.point.quota_request * p.option.point.sm_partition / 100
                                        for p in self.live.values()) * TICK_S


class Fleet:
    """The GPUs all functions' live pods take: the fleet packer's count and the kappa bound, cached."""

    def __init__(self, functions: Sequence[Function], gpu: GpuSpec) -> None:
        self.functions, self.gpu = functions, gpu
        self._cache: dict[tuple[tuple[int, str, int], ...], int] = {}

    def gpus(self, counts: tuple[tuple[int, str, int], ...]) -> int:
        if counts not in self._cache:
            shares: list[tuple[str, ShareSpec]] = []
            speed = 0.0
            for i, key, n in counts:
                function = self.functions[i]
                point = function.points[key]
                share = ShareSpec(request_permille=round(point.quota_request * 1000),
                                  limit_permille=round(point.quota_limit * 1000), sm_percent=point.sm_partition,
                                  memory_bytes=point.memory_bytes)
                shares.extend((f"{function.name}/{key}-{j}", share) for j in range(n))
                capacity = next(o.capacity_rps for o in function.options["rpr"] if o.point.key == key)
                speed += capacity * n / (KAPPA * function.whole.capacity_rps)
            placement = pack_fleet(shares, self.gpu)
            if placement.unplaced:
                raise RuntimeError(f"pods that fit no empty GPU: {placement.unplaced[:3]}")
            self._cache[counts] = max(len(placement.gpus), math.ceil(speed - 1e-9))
        return self._cache[counts]


def run(functions: Sequence[Function], seconds: float, policy: str, *, gpu: GpuSpec, seed: int,
        cold_start_s: float) -> dict[str, object]:
    """One policy on all ``functions`` together for ``seconds``: the summary of every request and the GPUs."""
    sims = [Simulation(f, policy, cold_start_s=cold_start_s, seed=seed + 1_000_003 * i)
            for i, f in enumerate(functions)]
    fleet_gpus = Fleet(functions, gpu)
    peaks = [max(f.trace(t) for t in range(int(seconds) + 1)) * 1.01 + 1 for f in functions]
    arrivals = [(_next_arrival(f.trace, peak, 0.0, sim.rng, seconds), i)
                for i, (f, peak, sim) in enumerate(zip(functions, peaks, sims, strict=True))]
    heapq.heapify(arrivals)
    next_tick, gpu_seconds, peak_gpus = 0.0, 0.0, 0
    while min(next_tick, arrivals[0][0]) < seconds:
        if next_tick <= arrivals[0][0]:
            now = next_tick
            for sim in sims:
                sim.tick(policy, now)
            counts = tuple((i, key, n) for i, sim in enumerate(sims) for key, n in sorted(sim.live_counts().items()))
            gpus = fleet_gpus.gpus(counts)
            gpu_seconds += gpus * TICK_S
            peak_gpus = max(peak_gpus, gpus)
            next_tick += TICK_S
        else:
            now, i = arrivals[0]
            sims[i].arrive(now)
            heapq.heapreplace(arrivals, (_next_arrival(functions[i].trace, peaks[i], now, sims[i].rng, seconds), i))
    results = [sim.result for sim in sims]
    latencies = sorted(x for r in results for x in r.latencies) or [0.0]
    requests = sum(r.requests for r in results)
    violations = sum(r.violations for r in results)
    warmup_requests, warmup_violations = (sum(r.warmup_requests for r in results),
                                          sum(r.warmup_violations for r in results))
    ticks = max(1, math.ceil(seconds / TICK_S))
    return {"requests": requests, "slo_violations_pct": round(100 * violations / max(1, requests), 2),
            "slo_violations_pct_after_first_cold_start": round(
                100 * (violations - warmup_violations) / max(1, requests - warmup_requests), 2),
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p95_ms": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 1),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
            "gpu_seconds": round(gpu_seconds), "peak_gpus": peak_gpus, "mean_gpus": round(gpu_seconds / ticks, 2),
            "area_seconds": round(sum(r.area_seconds for r in results)),
            "pods_created": sum(r.pods_created for r in results),
            "scale_actions": sum(r.scale_actions for r in results),
            "ticks_capacity_below_rate": sum(r.ticks_capacity_below_rate for r in results)}


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


def _compare(functions: Sequence[Function], seconds: float, gpu: GpuSpec, *, seed: int,
             cold_start_s: float) -> dict[str, object]:
    results = {policy: run(functions, seconds, policy, gpu=gpu, seed=seed, cold_start_s=cold_start_s)
               for policy in POLICIES}
    rpr, hpa, ts = (results[k] for k in ("rpr", "hpa_whole_gpu", "time_sharing_only"))
    return {**results, "gpu_seconds_rpr_to_hpa": _ratio(rpr, hpa, "gpu_seconds"),
            "peak_gpus_rpr_to_hpa": _ratio(rpr, hpa, "peak_gpus"),
            "gpu_seconds_time_sharing_to_rpr": _ratio(ts, rpr, "gpu_seconds")}


def simulate(profile: Profile, trace_name: str, seconds: float, *, seed: int, cold_start_s: float = 5.0,
             gpu_model: str | None = None) -> dict[str, object]:
    """One single-function trace (``ramp``, ``bursty``, ``steps``) under every policy."""
    gpu, capacities = _setup(profile, seed, gpu_model)
    function = make_function(profile.function, TRACES[trace_name](seed), profile, gpu, capacities)
    return {"trace": trace_name, "seconds": seconds, "gpu": gpu.model, "functions": 1,
            "slo_capacity_rps": {k: round(v, 1) for k, v in capacities.items()},
            **_compare([function], seconds, gpu, seed=seed, cold_start_s=cold_start_s)}


def simulate_fleet(profile: Profile, fleet_functions: Sequence[FleetFunction], seconds: float, *, trace_name: str,
                   seed: int, cold_start_s: float = 5.0, gpu_model: str | None = None) -> dict[str, object]:
    """Many functions (the ``fleet`` trace or a trace file) under every policy, packed together."""
    gpu, capacities = _setup(profile, seed, gpu_model)
    functions = [make_function(f.name, f.trace, profile, gpu, capacities, size=f.size, memory_scale=f.memory_scale)
                 for f in fleet_functions]
    return {"trace": trace_name, "seconds": seconds, "gpu": gpu.model, "functions": len(functions),
            **_compare(functions, seconds, gpu, seed=seed, cold_start_s=cold_start_s)}


def _ratio(a: dict[str, object], b: dict[str, object], field: str) -> float | None:
    x, y = float(a[field]), float(b[field])  # type: ignore[arg-type]
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
    args = parser.parse_args(argv)
    profile = decode_profile(args.profile.read_text())
    common = {"seed": args.seed, "cold_start_s": args.cold_start_seconds, "gpu_model": args.gpu}
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
    print(json.dumps({"benchmark": "autoscale_sim", "function": profile.function, "seed": args.seed,
                      "cold_start_s": args.cold_start_seconds, "kappa": KAPPA,
                      "fleet": {"functions": args.fleet_functions, "median_rps": args.fleet_median_rps},
                      "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
