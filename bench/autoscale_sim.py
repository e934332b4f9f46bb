"""Autoscaling policies on shared GPUs, simulated (prints one JSON object).

A deterministic discrete-event simulation of one function under a load trace, with the core's own
planner and scaling step (:mod:`fastgshare.autoscaling`), dispatcher (:mod:`fastgshare.dispatch`)
and fleet packer (:mod:`fastgshare.fleet`, for the GPUs the pods need). Compared:

- ``rpr``: the profile-driven scaler (every 1 s; 0.5 headroom; scale-down after 60 s; panic on a
  doubling 2 s window), choosing (quota, SM) configurations by dominant-share cost;
- ``time_sharing_only``: the same scaler restricted to configurations with all SMs (SM 100), as a
  GPU shared in time only would run it;
- ``hpa_whole_gpu``: Kubernetes' HPA on whole-GPU pods (target 70 % of a pod's ``maxRps``, every
  15 s, tolerance 0.1, up by at most max(2n, n + 4), down to the largest recommendation of the last
  300 s, at least one pod), what serverless platforms without sharing do.

Model: Poisson arrivals (thinning) at the trace's rate; each pod a FIFO server taking
``1 / maxRps`` s per request (its configuration's saturation throughput, measured one pod per GPU),
ready ``cold_start_s`` after it is created and costing GPU time from creation to deletion; at most
8 requests queued at a pod, the rest wait at the function (FIFO) and count as violations after 10 s.
Every policy starts from no pods ready; violations are also given without the requests that
arrived during the first cold start.
The rates the scalers see are the arrivals of the last 10 s and 2 s. Each configuration's SLO
capacity is measured on this model (the highest Poisson rate one pod serves with its p95 under
0.9 x SLO), so the planner plans with the same physics the simulation runs. GPUs in use at each
tick: the fleet packer's count for the pods' shares (time x SM, memory, slots), and at least
``sum(SLO capacity) / (kappa x SLO capacity of a whole GPU)``: co-located pods do not each serve as
much as they did alone (profiles are measured one pod per GPU); kappa = 3.15, the paper's gain of
spatio-temporal over time sharing, caps what sharing one GPU can give.

Traces (rates in req/s): ``ramp`` (30 -> 110 -> 50 over 180 s, four times: the ICPP'23 ramp),
``bursty`` (60 + 45 sin(2 pi t / 1800), plus 12 bursts an hour of x2.5 for 30 s), ``steps``
(5 s stages of uniform rates in [20, 60] that persist with probability 0.6).

Run: ``python -m bench.autoscale_sim [--profile FILE] [--traces ramp,bursty,steps] [--seconds S]``.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import heapq
import json
import math
import random
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs

from fastgshare.autoscaling import GpuBudget, Option, ScalerState, ScalingSettings, cost_of, step
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
RPR_SETTINGS = ScalingSettings(headroom=0.5, scale_down_delay_s=60, dead_band=0.25, panic=True, min_pods=1)
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
DEFAULT_SECONDS = {"ramp": 720.0, "bursty": 3600.0, "steps": 1000.0}


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
    gpu_seconds: float = 0.0
    area_seconds: float = 0.0
    pods_created: int = 0
    scale_actions: int = 0


class Simulation:
    def __init__(self, options: Sequence[Option], slo: Slo, gpu: GpuSpec, whole_gpu_slo_rps: float, *,
                 cold_start_s: float, seed: int) -> None:
        self.options, self.slo, self.gpu, self.whole_gpu_rps = options, slo, gpu, whole_gpu_slo_rps
        self.cold_start_s, self.rng = cold_start_s, random.Random(seed)
        self.pods: dict[str, Pod] = {}
        self.dispatcher = Dispatcher()
        self.waiting: collections.deque[float] = collections.deque()
        self.arrivals: collections.deque[float] = collections.deque()
        self.result = Result()
        self._serial = 0
        self._gpu_cache: dict[tuple[tuple[str, int], ...], int] = {}

    # pods
    def scale_to(self, wanted: dict[str, int], now: float) -> None:
        by_key = {o.point.key: o for o in self.options}
        live = [p for p in self.pods.values() if p.deleted is None]
        changed = False
        for key in set(wanted) | {p.option.point.key for p in live}:
            mine = sorted((p for p in live if p.option.point.key == key), key=lambda p: p.created)
            for _ in range(wanted.get(key, 0) - len(mine)):
                self._serial += 1
                name = f"{key}-{self._serial}"
                self.pods[name] = Pod(name=name, option=by_key[key], created=now, ready=now + self.cold_start_s)
                self.result.pods_created += 1
                changed = True
            for pod in reversed(mine[wanted.get(key, 0):]):  # the newest go first
                pod.deleted = now
                changed = True
        self.result.scale_actions += changed

    def ready_pods(self, now: float) -> list[Pod]:
        return [p for p in self.pods.values() if p.deleted is None and p.ready <= now]

    def gpus_in_use(self) -> int:
        live = collections.Counter(p.option.point.key for p in self.pods.values() if p.deleted is None)
        key = tuple(sorted(live.items()))
        if key not in self._gpu_cache:
            by_key = {o.point.key: o.point for o in self.options}
            shares = [(f"{k}-{n}", ShareSpec(request_permille=round(by_key[k].quota_request * 1000),
                                              limit_permille=round(by_key[k].quota_limit * 1000),
                                              sm_percent=by_key[k].sm_partition, memory_bytes=by_key[k].memory_bytes))
                      for k, count in live.items() for n in range(count)]
            packed = len(pack_fleet(shares, self.gpu).gpus) if shares else 0
            slo_rps = {o.point.key: o.capacity_rps for o in self.options}
            speed = sum(slo_rps[k] * count for k, count in live.items()) / (KAPPA * self.whole_gpu_rps)
            self._gpu_cache[key] = max(packed, math.ceil(speed - 1e-9))
        return self._gpu_cache[key]

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
            ready = self.ready_pods(now)
            for pod in ready:
                while pod.finishes and pod.finishes[0] <= now:
                    heapq.heappop(pod.finishes)
            chosen = self.dispatcher.choose([PodLoad(name=p.name, capacity_rps=p.option.capacity_rps,
                                                     queued=len(p.finishes), max_queued=MAX_QUEUED_AT_POD)
                                             for p in ready])
            if chosen is None:
                return
            pod, arrived = self.pods[chosen], self.waiting.popleft()
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


def run(trace: Trace, seconds: float, sim: Simulation, policy: str, tick_s: float) -> dict[str, object]:
    state, hpa = ScalerState(), HpaState()
    now, next_tick, next_arrival = 0.0, 0.0, 0.0
    peak = max(trace(t) for t in range(int(seconds) + 1)) * 1.01 + 1
    next_arrival = _next_arrival(trace, peak, 0.0, sim.rng)
    while min(next_tick, next_arrival) < seconds:
        if next_tick <= next_arrival:
            now = next_tick
            sim.drain(now)
            if policy == "hpa_whole_gpu":
                sim.scale_to(hpa.step(sim, now), now)
            else:
                state = step(state, sim.options, rate_long=sim.rate(now, 10), rate_short=sim.rate(now, 2),
                             now_s=now, settings=RPR_SETTINGS)
                sim.scale_to(dict(state.pods), now)
            live = [p for p in sim.pods.values() if p.deleted is None]
            sim.result.gpu_seconds += sim.gpus_in_use() * tick_s
            sim.result.area_seconds += sum(p.option.point.quota_request * p.option.point.sm_partition / 100
                                           for p in live) * tick_s
            next_tick += tick_s
        else:
            now = next_arrival
            sim.arrive(now)
            next_arrival = _next_arrival(trace, peak, now, sim.rng)
    latencies = sorted(sim.result.latencies) or [0.0]
    requests = sim.result.requests
    after_start = requests - sim.result.warmup_requests
    return {"requests": requests, "slo_violations_pct": round(100 * sim.result.violations / max(1, requests), 2),
            "slo_violations_pct_after_first_cold_start": round(
                100 * (sim.result.violations - sim.result.warmup_violations) / max(1, after_start), 2),
            "p50_ms": round(1000 * statistics.median(latencies), 1),
            "p95_ms": round(1000 * latencies[int(0.95 * (len(latencies) - 1))], 1),
            "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
            "gpu_seconds": round(sim.result.gpu_seconds), "area_seconds": round(sim.result.area_seconds),
            "pods_created": sim.result.pods_created, "scale_actions": sim.result.scale_actions}


def _next_arrival(trace: Trace, peak: float, now: float, rng: random.Random) -> float:
    while True:  # thinning
        now += rng.expovariate(peak)
        if rng.random() * peak <= trace(now):
            return now


@attrs.define
class HpaState:
    """Kubernetes' HPA on whole-GPU pods, every 15 s (its defaults)."""

    pods: int = 1
    last: float = -math.inf
    recommendations: list[tuple[float, int]] = attrs.field(factory=list)

    def step(self, sim: Simulation, now: float) -> dict[str, int]:
        whole = max(sim.options, key=lambda o: (o.point.sm_partition, o.point.quota_request))
        if now - self.last >= 15:
            self.last = now
            utilisation = sim.rate(now, 10) / (self.pods * 0.7 * whole.point.max_rps)
            want = self.pods if abs(utilisation - 1) <= 0.1 else max(1, math.ceil(self.pods * utilisation))
            self.recommendations = [(t, n) for t, n in self.recommendations if t > now - 300] + [(now, want)]
            if want > self.pods:
                self.pods = min(want, max(2 * self.pods, self.pods + 4))
            else:
                self.pods = max(n for _, n in self.recommendations)
        return {whole.point.key: self.pods}


def simulate(profile: Profile, trace_name: str, seconds: float, *, seed: int, cold_start_s: float = 5.0,
             gpu_model: str | None = None) -> dict[str, object]:
    slo = profile.slo or Slo(percentile=95, latency_ms=69)
    gpu = gpu_model_spec(gpu_model or profile.gpu_model or "V100-16GB")
    budget = GpuBudget(memory_bytes=gpu.memory_bytes)
    capacities = {p.key: model_capacity(p, slo, seed) for p in profile.points}
    usable = sorted((Option(point=p, capacity_rps=capacities[p.key], cost=cost_of(p, budget)) for p in profile.points
                     if capacities[p.key] > 0 and p.memory_bytes <= gpu.memory_bytes),
                    key=lambda o: (-o.efficiency, o.point.key))
    whole = max(profile.points, key=lambda p: (p.sm_partition, p.quota_request))
    policies = {"rpr": (usable, 1.0), "time_sharing_only": ([o for o in usable if o.point.sm_partition == 100], 1.0),
                "hpa_whole_gpu": ([o for o in usable if o.point.key == whole.key], 1.0)}
    results: dict[str, object] = {}
    for name, (options, tick) in policies.items():
        sim = Simulation(options, slo, gpu, capacities[whole.key], cold_start_s=cold_start_s, seed=seed)
        results[name] = run(TRACES[trace_name](seed), seconds, sim, name, tick)
    rpr, hpa, ts = (results[k] for k in ("rpr", "hpa_whole_gpu", "time_sharing_only"))
    return {"trace": trace_name, "seconds": seconds, "gpu": gpu.model,
            "slo_capacity_rps": {k: round(v, 1) for k, v in capacities.items()}, **results,
            "gpu_seconds_rpr_to_hpa": _ratio(rpr, hpa), "gpu_seconds_time_sharing_to_rpr": _ratio(ts, rpr)}


def _ratio(a: object, b: object) -> float | None:
    x, y = float(a["gpu_seconds"]), float(b["gpu_seconds"])  # type: ignore[index]
    return round(x / y, 3) if y else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", type=Path, default=PROFILE)
    parser.add_argument("--traces", default="ramp,bursty,steps")
    parser.add_argument("--seconds", type=float, help="length of every trace (default: each trace's own)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cold-start-seconds", type=float, default=5.0)
    parser.add_argument("--gpu", help="the GPU model (default: the profile's)")
    args = parser.parse_args(argv)
    profile = decode_profile(args.profile.read_text())
    runs = [simulate(profile, name, args.seconds or DEFAULT_SECONDS[name], seed=args.seed,
                     cold_start_s=args.cold_start_seconds, gpu_model=args.gpu) for name in args.traces.split(",")]
    print(json.dumps({"benchmark": "autoscale_sim", "function": profile.function, "seed": args.seed,
                      "cold_start_s": args.cold_start_seconds, "kappa": KAPPA, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
