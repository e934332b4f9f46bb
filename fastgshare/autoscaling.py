"""How many pods of which configuration a function needs for a demand, from its profile: the
FaST-GShare heuristic ("RPR", residual-process-rate), pure.

Each configuration (a profile point) has an SLO capacity ``T`` (requests/s one pod serves within
the SLO, :func:`fastgshare.profile.slo_capacity`) and a cost, the share of one GPU a pod of it
takes:

- ``dominant`` (default): the largest of its guaranteed time × SM area, its memory share and its
  slot share — the resource that runs out first (tiny configurations run out of memory and slots
  long before time × SM area);
- ``area``: its time × SM area alone, the paper's resource unit.

**Model sharing** (a FaSTFunc with ``spec.model``, :mod:`fastgshare.model`): a point's
``memoryBytes`` is then the pod's own memory (what its ``gpu_mem`` is: activations, workspace), and
the function's weights (:attr:`GpuBudget.model_bytes`) are held once on every GPU its pods use, as
the extender charges them. So a GPU offers the pods its memory less the weights: a pod's memory
share is its memory over that, and a plan whose pods fill GPUs by memory costs as many GPUs as hold
their memory plus one copy of the weights each (:func:`plan_memory_bytes`: the pods' memory and
the weights once per GPU of :func:`plan_gpus`). A point fits when it fits next to the weights.
(``bench/autoscale_sim.py``'s ``*_model_sharing`` policies charge the same way in their fleet
packer: the weights once per GPU, each pod its memory less them; its profiles predate model sharing,
so their ``memoryBytes`` include the weights.)

Only configurations that meet the SLO at some load (``T > 0``) and fit the GPU's memory are used.
The plan fills the demand with the most efficient configuration (largest ``T / cost``) and covers
the remainder with the cheapest pods of one configuration that suffice. Rounding can make a plan of
one configuration alone cheaper (a pod of a larger configuration may cover what two of the best
would), so those are candidates too, and the cheapest candidate wins (then the one with fewer pods).
The plan's capacity is at least the demand; no plan of one configuration is cheaper; and its cost
exceeds the cheapest possible plan's by less than one pod of the most efficient configuration (the
fractional bound: no plan costs less than ``demand / (T / cost)`` of the best).

:func:`step` is one tick of the scaler around the plan: it scales up at once by the missing
capacity, scales down only after a delay and below a dead band (least efficient pods first), and
trusts a short rate window over the long one when it shows a burst (Knative's "panic" mode).
Before adding pods it tries a **vertical step**: raising the time quota of the running pods of one
configuration to a larger point of the same SM %, memory and batch (a live share change: no cold
start), when that covers the missing capacity for no more than the pods it would add cost. Every
``rebalance_interval_s`` it **re-plans**: when the plan for today's rate costs at least
``rebalance_gain`` less than what runs (incremental scale-ups leave a patchwork of configurations),
the new plan becomes the target and the old pods are kept (:attr:`ScalerState.keep`) until the new
ones are ready — make-before-break; the caller reports readiness with :func:`settle` and runs
:func:`running` pods.

:func:`hpa_step` is the baseline: Kubernetes' HPA with its default behaviour on one configuration.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence

import attrs

from fastgshare import keys
from fastgshare.errors import FastGShareError
from fastgshare.profile import ProfilePoint, Slo, slo_capacity

EPSILON_RPS = 1e-9


class PlanError(FastGShareError):
    """No plan is possible (no configuration meets the SLO and fits the GPU); the message says why."""


class CostModel(enum.Enum):
    DOMINANT = "dominant"
    AREA = "area"


@attrs.frozen(kw_only=True)
class GpuBudget:
    """What one GPU offers a function's pods. Each pod there also holds ``context_reserve_bytes``
    of GPU memory for its CUDA context, next to its own memory (the extender charges the same). With
    model sharing every GPU the function uses also holds its weights once (``model_bytes``)."""

    memory_bytes: int
    slots: int = keys.DEFAULT_SLOTS_PER_GPU
    context_reserve_bytes: int = 0
    model_bytes: int = 0  # the function's shared weights (spec.model.bytes), once per GPU; 0: no model

    @property
    def pods_memory_bytes(self) -> int:
        """The memory a GPU offers the function's pods: all of it less one copy of the weights."""
        return self.memory_bytes - self.model_bytes

    def memory_of(self, point: ProfilePoint) -> int:
        """The GPU memory a pod of ``point`` takes: its own and its context reserve (with a model,
        ``memoryBytes`` is the pod's own memory, without the weights)."""
        return point.memory_bytes + self.context_reserve_bytes

    def fits(self, point: ProfilePoint) -> bool:
        """Whether a pod of ``point`` fits a GPU (next to the weights, with a model)."""
        return self.memory_of(point) <= self.pods_memory_bytes


@attrs.frozen(kw_only=True)
class Option:
    """A configuration the planner may use: its point, SLO capacity and cost."""

    point: ProfilePoint
    capacity_rps: float
    cost: float

    @property
    def efficiency(self) -> float:
        return self.capacity_rps / self.cost


@attrs.frozen(kw_only=True)
class PlannedConfig:
    option: Option
    replicas: int


@attrs.frozen(kw_only=True)
class Plan:
    configs: tuple[PlannedConfig, ...]

    @property
    def capacity_rps(self) -> float:
        return sum(c.option.capacity_rps * c.replicas for c in self.configs)

    @property
    def cost(self) -> float:
        return sum(c.option.cost * c.replicas for c in self.configs)

    @property
    def replicas(self) -> int:
        return sum(c.replicas for c in self.configs)


def cost_of(point: ProfilePoint, gpu: GpuBudget, model: CostModel = CostModel.DOMINANT) -> float:
    """The share of one GPU a pod of ``point`` takes (0..1]."""
    area = point.quota_request * point.sm_partition / 100
    if model is CostModel.AREA:
        return area
    room = gpu.pods_memory_bytes
    return max(area, gpu.memory_of(point) / room if room > 0 else math.inf, 1 / gpu.slots)


def options(points: Iterable[ProfilePoint], slo: Slo, gpu: GpuBudget,
            model: CostModel = CostModel.DOMINANT) -> list[Option]:
    """The usable configurations, most efficient first (ties: larger capacity, then smaller quota)."""
    usable = [Option(point=point, capacity_rps=capacity, cost=cost_of(point, gpu, model))
              for point in points if gpu.fits(point)
              and (capacity := slo_capacity(point, slo)) > 0]
    return sorted(usable, key=lambda o: (-o.efficiency, -o.capacity_rps, o.point.quota_request, o.point.key))


def plan(demand_rps: float, usable: Sequence[Option]) -> Plan:
    """Pods per configuration serving ``demand_rps`` (see the module docstring)."""
    if not math.isfinite(demand_rps) or demand_rps < 0:
        raise PlanError(f"demand must be a finite number of requests per second >= 0, got {demand_rps}")
    if demand_rps <= EPSILON_RPS:
        return Plan(configs=())
    if not usable:
        raise PlanError("no configuration of the profile meets the SLO at any load and fits the GPU's memory")
    best = max(usable, key=lambda o: (o.efficiency, o.capacity_rps, -o.point.quota_request))
    count = math.floor(demand_rps / best.capacity_rps + EPSILON_RPS)
    remainder = demand_rps - count * best.capacity_rps
    filled = {best: count}
    if remainder > EPSILON_RPS:
        cover = min(usable, key=lambda o: (_pods(remainder, o) * o.cost, _pods(remainder, o)))
        filled[cover] = filled.get(cover, 0) + _pods(remainder, cover)
    candidates = [_plan(filled), *(_plan({o: _pods(demand_rps, o)}) for o in usable)]
    return min(candidates, key=lambda p: (round(p.cost, 9), p.replicas))


def plan_gpus(result: Plan) -> int:
    """The GPUs a plan takes at least: its cost rounded up (the dominant cost is a share of one GPU,
    its memory part with one copy of the weights per GPU; the area cost counts time x SM alone);
    0 for no pods."""
    return math.ceil(result.cost - EPSILON_RPS) if result.replicas else 0


def plan_memory_bytes(result: Plan, gpu: GpuBudget) -> int:
    """The GPU memory a plan holds: each pod's own memory and context reserve, and with a model its
    weights once per GPU of :func:`plan_gpus` (the pods of a GPU share one copy)."""
    pods = sum(gpu.memory_of(c.option.point) * c.replicas for c in result.configs)
    return pods + gpu.model_bytes * plan_gpus(result)


def _pods(demand_rps: float, option: Option) -> int:
    """Pods of ``option`` that serve ``demand_rps``."""
    return max(1, math.ceil(demand_rps / option.capacity_rps - EPSILON_RPS))


def _plan(replicas: dict[Option, int]) -> Plan:
    return Plan(configs=tuple(PlannedConfig(option=o, replicas=n) for o, n in replicas.items() if n > 0))


# --- the scaling step --------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class ScalingSettings:
    """How eagerly a function scales (FaSTFunc ``spec.scaling``)."""

    headroom: float = 0.5  # plan for rate x (1 + headroom)
    scale_down_delay_s: float = 60.0  # no scale-down within this long of the last scale-up or -down
    dead_band: float = 0.25  # scale down only when the target is below (1 - dead_band) x capacity
    panic: bool = True  # trust the short window when it shows twice the capacity (a burst)
    min_pods: int = 0
    max_pods: int = 1000
    vertical: bool = True  # try raising running pods' time quota before adding pods
    rebalance_gain: float = 0.15  # re-plan when the plan for the rate costs this much less than what runs
    rebalance_interval_s: float = 300.0  # at most one re-plan this often, and not within the delay of a scale


@attrs.frozen(kw_only=True)
class ScalerState:
    """What the scaler decided last: pods per configuration (by key), when it last scaled and
    re-planned, and the pods of the allocation before a re-plan (``keep``) that run until the new
    plan's pods are ready."""

    pods: Mapping[str, int] = attrs.field(factory=dict)
    last_up_s: float = -math.inf
    last_down_s: float = -math.inf
    last_rebalance_s: float = -math.inf
    keep: Mapping[str, int] = attrs.field(factory=dict)

    def capacity(self, by_key: Mapping[str, Option]) -> float:
        return sum(by_key[key].capacity_rps * n for key, n in self.pods.items() if key in by_key)


def running(state: ScalerState) -> dict[str, int]:
    """The pods to run per configuration: the target, plus the old pods a re-plan keeps until the
    new ones are ready (make-before-break)."""
    keys_ = set(state.pods) | set(state.keep)
    pods = {key: max(state.pods.get(key, 0), state.keep.get(key, 0)) for key in keys_}
    return {key: n for key, n in sorted(pods.items()) if n > 0}


def settle(state: ScalerState, ready: Mapping[str, int]) -> ScalerState:
    """Drop the kept pods of a re-plan once every configuration has its target's pods ready."""
    if state.keep and all(ready.get(key, 0) >= n for key, n in state.pods.items()):
        return attrs.evolve(state, keep={})
    return state


@attrs.frozen(kw_only=True)
class VerticalStep:
    """Raise the time quota of the ``pods`` running pods of configuration ``source`` to ``target``'s."""

    source: Option
    target: Option
    pods: int

    @property
    def added_capacity_rps(self) -> float:
        return self.pods * (self.target.capacity_rps - self.source.capacity_rps)

    @property
    def added_cost(self) -> float:
        return self.pods * (self.target.cost - self.source.cost)


def same_but_quota(a: ProfilePoint, b: ProfilePoint) -> bool:
    """Whether ``b`` differs from ``a`` in its time quota alone (what a running pod may change)."""
    return (a.sm_partition, a.memory_bytes, a.batch) == (b.sm_partition, b.memory_bytes, b.batch)


def vertical_step(pods: Mapping[str, int], usable: Sequence[Option], missing_rps: float) -> VerticalStep | None:
    """The cheapest raise of one configuration's running pods to a larger quota of the same SM,
    memory and batch (a configuration no pod runs yet) that adds at least ``missing_rps``, if it
    costs no more than the pods :func:`plan` would add for it; None otherwise."""
    by_key = {option.point.key: option for option in usable}
    steps = [VerticalStep(source=by_key[key], target=target, pods=n)
             for key, n in sorted(pods.items()) if n > 0 and key in by_key
             for target in usable
             if pods.get(target.point.key, 0) == 0 and same_but_quota(by_key[key].point, target.point)
             and target.point.quota_request > by_key[key].point.quota_request]
    covering = [s for s in steps if s.added_capacity_rps >= missing_rps - EPSILON_RPS]
    if not covering:
        return None
    best = min(covering, key=lambda s: (round(s.added_cost, 9), -s.added_capacity_rps, s.target.point.key))
    return best if best.added_cost <= plan(missing_rps, usable).cost + EPSILON_RPS else None


def step(state: ScalerState, usable: Sequence[Option], *, rate_long: float, rate_short: float, now_s: float,
         settings: ScalingSettings = ScalingSettings(), starting: bool = False) -> ScalerState:
    """One tick of the scaler: scale up at once by the missing capacity (a vertical step when it
    covers it as cheaply, else pods planned for the missing rate alone, so running pods stay);
    scale down only after the delay and below the dead band, least efficient pods first; re-plan
    make-before-break when it saves enough and no pod is ``starting``; then keep the pod count
    within [min_pods, max_pods]."""
    by_key = {option.point.key: option for option in usable}
    pods = {key: n for key, n in state.pods.items() if key in by_key and n > 0}
    current = attrs.evolve(state, pods=pods, keep={k: n for k, n in state.keep.items() if k in by_key and n > 0})
    capacity = current.capacity(by_key)
    rate = rate_long
    if settings.panic and rate_short >= 2 * capacity:
        rate = max(rate_long, rate_short)
    target = rate * (1 + settings.headroom)
    if target > capacity + EPSILON_RPS:
        # no vertical step while a re-plan's old pods run: its target may be one of their configurations
        raise_ = vertical_step(pods, usable, target - capacity) if settings.vertical and not current.keep else None
        if raise_ is not None:
            pods[raise_.target.point.key] = pods.pop(raise_.source.point.key)
        else:
            for planned in plan(target - capacity, usable).configs:
                key = planned.option.point.key
                pods[key] = pods.get(key, 0) + planned.replicas
        current = attrs.evolve(current, pods=pods, last_up_s=now_s)
    elif (target < (1 - settings.dead_band) * capacity
          and now_s - state.last_up_s >= settings.scale_down_delay_s
          and now_s - state.last_down_s >= settings.scale_down_delay_s):
        surplus, before = capacity - target, sum(pods.values())
        for key in sorted(pods, key=lambda k: (by_key[k].efficiency, k)):  # least efficient first
            while pods[key] > 0 and surplus >= by_key[key].capacity_rps - EPSILON_RPS:
                pods[key] -= 1
                surplus -= by_key[key].capacity_rps
        if sum(pods.values()) < before:
            current = attrs.evolve(current, pods={k: n for k, n in pods.items() if n > 0}, last_down_s=now_s)
    if (not starting and not current.keep and target > EPSILON_RPS
            and now_s - state.last_rebalance_s >= settings.rebalance_interval_s
            and now_s - max(current.last_up_s, current.last_down_s) >= settings.scale_down_delay_s):
        ideal = {c.option.point.key: c.replicas for c in plan(target, usable).configs}
        pods = dict(current.pods)
        if (_cost(ideal, by_key) <= (1 - settings.rebalance_gain) * _cost(pods, by_key) + EPSILON_RPS
                and settings.min_pods <= sum(ideal.values()) <= settings.max_pods):
            current = attrs.evolve(current, pods=ideal, keep=pods, last_rebalance_s=now_s)
    return _clamp(current, usable, settings)


def _cost(pods: Mapping[str, int], by_key: Mapping[str, Option]) -> float:
    return sum(by_key[key].cost * n for key, n in pods.items())


def _clamp(state: ScalerState, usable: Sequence[Option], settings: ScalingSettings) -> ScalerState:
    pods = dict(state.pods)
    if usable and sum(pods.values()) < settings.min_pods:
        best = max(usable, key=lambda o: (o.efficiency, o.capacity_rps))
        pods[best.point.key] = pods.get(best.point.key, 0) + settings.min_pods - sum(pods.values())
    by_key = {option.point.key: option for option in usable}
    while sum(pods.values()) > settings.max_pods:
        worst = min((k for k, n in pods.items() if n > 0), key=lambda k: (by_key[k].efficiency, k))
        pods[worst] -= 1
    return attrs.evolve(state, pods={k: n for k, n in pods.items() if n > 0})


# --- the HPA baseline ----------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class HpaSettings:
    """Kubernetes' HorizontalPodAutoscaler with its defaults, on a requests-per-second metric:
    target ``target_utilisation`` x a pod's ``maxRps``, a tolerance of 0.1, scale-up by at most
    max(2n, n + 4) pods a period, scale-down to the largest recommendation of the last
    ``stabilisation_s`` (300 s)."""

    target_utilisation: float = 0.7
    tolerance: float = 0.1
    stabilisation_s: float = 300.0
    min_pods: int = 1
    max_pods: int = 1000


@attrs.frozen(kw_only=True)
class HpaState:
    """The HPA's pod count and its recent recommendations ``(time, pods)``."""

    pods: int = 0
    recommendations: tuple[tuple[float, int], ...] = ()


def hpa_step(state: HpaState, *, rate: float, pod_rps: float, now_s: float,
             settings: HpaSettings = HpaSettings()) -> HpaState:
    """One HPA period: the desired count ``ceil(rate / (target x pod_rps))`` (unchanged within the
    tolerance), up by at most max(2n, n + 4), down only to the largest recommendation of the
    stabilisation window, within [min_pods, max_pods]."""
    if not (math.isfinite(pod_rps) and pod_rps > 0):
        raise PlanError(f"a pod's throughput must be a positive number of requests per second, got {pod_rps}")
    per_pod = settings.target_utilisation * pod_rps
    pods = state.pods
    want = math.ceil(rate / per_pod - EPSILON_RPS) if rate > EPSILON_RPS else 0
    if pods > 0 and abs(rate / (pods * per_pod) - 1) <= settings.tolerance:
        want = pods
    want = min(max(want, settings.min_pods), settings.max_pods)
    recommendations = (*((t, n) for t, n in state.recommendations if t > now_s - settings.stabilisation_s),
                       (now_s, want))
    # up: at most doubling or 4 more a period; down: only to the largest recent recommendation (never up)
    pods = min(want, max(2 * pods, pods + 4)) if want > pods else min(pods, max(n for _, n in recommendations))
    return HpaState(pods=min(max(pods, settings.min_pods), settings.max_pods), recommendations=recommendations)
