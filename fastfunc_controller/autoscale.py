"""The autoscaler's decisions for one FaSTFunc of policy ``rpr`` or ``hpa`` (pure: no I/O, no clock).

- :func:`usable_configs`: the profile ConfigMap (``spec.profile.configMapRef``, the document under
  ``data["profile.json"]``, :mod:`fastgshare.profile`) and the spec → the configurations the policy
  may run, each with its share (checked by :func:`fastgshare.share.parse_share`), its child
  FaSTPod's config label and its SLO capacity; :class:`ProfileUnusable` says why there are none
  (no ConfigMap, no key, a bad document, no SLO, nothing SLO-feasible, for ``hpa`` no whole-GPU
  point). ``rpr`` may use every SLO-feasible point within ``spec.scaling.configs``; ``hpa`` only
  the whole GPU (quota 1, SM 100), Kubernetes' HPA on its ``maxRps``. With ``spec.model`` a
  point's ``memoryBytes`` is the pod's own memory and the weights are held once per GPU
  (:attr:`fastgshare.autoscaling.GpuBudget.model_bytes`): a pod's memory share is of the GPU less
  the weights, and a point fits only next to them.
- :func:`start`: the scaler's state from the child FaSTPods that exist (a restart keeps what
  runs), with no scale-down within the delay of it.
- :func:`tick`: one interval: the rates → :func:`fastgshare.autoscaling.step` (``rpr``: up at once
  by the missing capacity with ``headroom``, down after ``scaleDownDelaySeconds`` below the dead
  band, least efficient first, panic on bursts, within [minReplicas, maxReplicas]) or
  :func:`fastgshare.autoscaling.hpa_step` (``hpa``); :func:`hold` when no rate can be read
  (the current plan, raised to minReplicas).
- make-before-break: :func:`pods_of` is what runs (a re-plan's old pods too, until the new ones
  are ready by the children's ``status.readyReplicas``, :func:`ready_pods`); no re-plan while a
  child is :func:`starting`.
- vertical steps: :func:`raise_of` finds one in a tick's result (the controller checks that the
  pods have room for it and patches the child's quota in place; children are matched to
  configurations by what they run, :func:`~.spec.running_config_label`).
- :func:`desired_configs`: the scaler's pods → one :class:`~.spec.Config` per configuration with
  pods (a configuration at 0 is not desired: its FaSTPod is deleted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fastfunc_controller import names
from fastfunc_controller.rates import Rates
from fastfunc_controller.spec import (
    Config,
    FunctionSpec,
    config_label,
    parked_share,
    running_config_label,
    running_share,
)
from fastgshare import keys
from fastgshare.autoscaling import (
    EPSILON_RPS,
    CostModel,
    GpuBudget,
    HpaSettings,
    HpaState,
    Option,
    ScalerState,
    ScalingSettings,
    cost_of,
    hpa_step,
    options,
    running,
    same_but_quota,
    settle,
    step,
)
from fastgshare.codec import decode_assignment
from fastgshare.errors import FastGShareError, InvalidShareSpec
from fastgshare.gpu_models import gpu_model_spec
from fastgshare.profile import Profile, ProfileError, decode_profile, slo_capacity
from fastgshare.share import ShareSpec, parse_share

PROFILE_KEY = "profile.json"
DEFAULT_GPU_MEMORY_BYTES = 16 * 2**30  # a profile without a known gpuModel: a 16 GiB GPU (V100-16GB)
LONG_WINDOW_S = 10.0  # the stable rate: over max(this, the interval)
SHORT_WINDOW_S = 2.0  # the panic rate
DEFAULTS = {names.POLICY_RPR: {"interval": 2.0, "delay": 60.0},
            names.POLICY_HPA: {"interval": 15.0, "delay": 300.0}}  # HPA: its sync period, stabilisation window
DEFAULT_HEADROOM = ScalingSettings().headroom
DEFAULT_MAX_PODS = 1000


class ProfileUnusable(Exception):
    """The profile cannot drive the policy; ``reason`` is the ProfileMissing condition's reason."""

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(message)


@attrs.frozen(kw_only=True)
class Choice:
    """A configuration the autoscaler may run: its profile option, share and child's config label."""

    option: Option
    share: ShareSpec
    label: str

    @property
    def key(self) -> str:
        return self.option.point.key


@attrs.frozen(kw_only=True)
class Usable:
    """What a policy may run, most efficient first."""

    policy: str
    choices: tuple[Choice, ...]

    @property
    def options(self) -> list[Option]:
        return [choice.option for choice in self.choices]

    def by_label(self) -> dict[str, Choice]:
        return {choice.label: choice for choice in self.choices}

    def by_key(self) -> dict[str, Choice]:
        return {choice.key: choice for choice in self.choices}


def interval_s(spec: FunctionSpec) -> float:
    return spec.scaling.interval_s or DEFAULTS[spec.policy]["interval"]


def scale_down_delay_s(spec: FunctionSpec) -> float:
    delay = spec.scaling.scale_down_delay_s
    return DEFAULTS[spec.policy]["delay"] if delay is None else float(delay)


def windows(spec: FunctionSpec) -> tuple[float, float]:
    """The long (stable) and short (panic) rate windows, seconds."""
    return max(LONG_WINDOW_S, interval_s(spec)), SHORT_WINDOW_S


def usable_configs(spec: FunctionSpec, configmap: Mapping[str, Any] | None) -> Usable:
    """The configurations ``spec``'s policy may run from its profile ConfigMap (None: not found)."""
    where = f"ConfigMap {spec.namespace}/{spec.profile} (spec.profile.configMapRef)"
    if configmap is None:
        raise ProfileUnusable(names.REASON_PROFILE_NOT_FOUND, f"{where} does not exist")
    text = (configmap.get("data") or {}).get(PROFILE_KEY)
    if not isinstance(text, str):
        raise ProfileUnusable(names.REASON_PROFILE_NOT_FOUND,
                              f"{where} has no key {PROFILE_KEY}; allowed: the profile document (fastgshare profile "
                              f"run writes it) under data[\"{PROFILE_KEY}\"]")
    try:
        profile = decode_profile(text)
    except ProfileError as error:
        raise ProfileUnusable(names.REASON_PROFILE_INVALID, f"{where}, key {PROFILE_KEY}: {error}") from None
    slo = spec.slo or profile.slo
    if slo is None:
        raise ProfileUnusable(names.REASON_PROFILE_INVALID,
                              "no SLO: set spec.slo.latencyMs (or the profile's slo) for the autoscaler to plan for")
    gpu = GpuBudget(memory_bytes=_gpu_memory(profile), model_bytes=spec.model.bytes if spec.model else 0)
    allowed = [point for point in profile.points
               if (not spec.scaling.quotas or any(abs(point.quota_request - q) < 1e-6 for q in spec.scaling.quotas))
               and (not spec.scaling.sms or point.sm_partition in spec.scaling.sms)]
    model = CostModel(spec.scaling.cost_model)
    if spec.policy == names.POLICY_HPA:
        whole = [point for point in allowed if point.quota_request == 1 and point.sm_partition == 100]
        if not whole:
            raise ProfileUnusable(names.REASON_PROFILE_INVALID,
                                  f"{where}: policy hpa needs the whole-GPU point (quota 1, SM 100) of the profile, "
                                  "its maxRps is what one pod serves")
        best = max(whole, key=lambda point: point.max_rps)
        found = [Option(point=best, capacity_rps=slo_capacity(best, slo), cost=cost_of(best, gpu, model))]
    else:
        found = options(allowed, slo, gpu, model)
    choices: dict[str, Choice] = {}
    for option in found:
        share = _share(option, spec.memory)
        if share is not None and option.point.key not in choices:
            choices[option.point.key] = Choice(option=option, share=share, label=config_label(share))
    if not choices:
        raise ProfileUnusable(names.REASON_PROFILE_INVALID,
                              f"{where}: no configuration meets the SLO (p{slo.percentile} <= {slo.latency_ms:g} ms) "
                              "at any load and fits the GPU's memory"
                              + (f" next to the model's {gpu.model_bytes} bytes (spec.model.bytes)"
                                 if gpu.model_bytes else "")
                              + (" within spec.scaling.configs" if spec.scaling.quotas or spec.scaling.sms else ""))
    return Usable(policy=spec.policy, choices=tuple(choices.values()))


def _gpu_memory(profile: Profile) -> int:
    if profile.gpu_model:
        try:
            return gpu_model_spec(profile.gpu_model).memory_bytes
        except FastGShareError:
            pass
    return DEFAULT_GPU_MEMORY_BYTES


def _share(option: Option, memory: str) -> ShareSpec | None:
    point = option.point
    try:
        return parse_share({keys.GPU_QUOTA_REQUEST: f"{point.quota_request:g}",
                            keys.GPU_QUOTA_LIMIT: f"{point.quota_limit:g}",
                            keys.GPU_SM_PARTITION: str(point.sm_partition), keys.GPU_MEM: memory})
    except InvalidShareSpec:
        return None  # a share the cluster cannot run (e.g. a quota finer than a permille)


# --- the scaler ----------------------------------------------------------------------------
State = ScalerState | HpaState


def current_pods(usable: Usable, children: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Pods per configuration key of the child FaSTPods (``spec.replicas``) the policy may run."""
    return _count_by_key(usable, children, "spec", "replicas")


def ready_pods(usable: Usable, children: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Ready pods per configuration key of the child FaSTPods (``status.readyReplicas``)."""
    return _count_by_key(usable, children, "status", "readyReplicas")


def _count_by_key(usable: Usable, children: Sequence[Mapping[str, Any]], part: str, field: str) -> dict[str, int]:
    """``child[part][field]`` summed per configuration key, a child's key being what it runs."""
    by_label = usable.by_label()
    counts: dict[str, int] = {}
    for child in children:
        label = running_config_label(child)
        count = (child.get(part) or {}).get(field)
        if label is not None and label in by_label and isinstance(count, int) and count > 0:
            counts[by_label[label].key] = counts.get(by_label[label].key, 0) + count
    return counts


def starting(usable: Usable, children: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a child has fewer ready pods than it asks for (a pod is starting, or stuck)."""
    ready = ready_pods(usable, children)
    return any(ready.get(key, 0) < n for key, n in current_pods(usable, children).items())


def start(usable: Usable, children: Sequence[Mapping[str, Any]], now_s: float) -> State:
    """The state of what runs now; no scale-down within the delay (of a new plan or a restart)."""
    pods = current_pods(usable, children)
    if usable.policy == names.POLICY_HPA:
        count = sum(pods.values())
        return HpaState(pods=count, recommendations=((now_s, count),))
    return ScalerState(pods=pods, last_up_s=now_s)


def pods_of(usable: Usable, state: State) -> dict[str, int]:
    """Pods to run per configuration key: the plan, and during a make-before-break re-plan also the
    old pods until the new ones are ready."""
    if isinstance(state, HpaState):
        return {usable.choices[0].key: state.pods} if state.pods else {}
    return running(state)


@attrs.frozen(kw_only=True)
class Tick:
    state: State
    planned_rps: float  # what the plan was sized for


def tick(spec: FunctionSpec, usable: Usable, state: State, rates: Rates, now_s: float, *,
         children: Sequence[Mapping[str, Any]] = (), vertical: bool = True) -> Tick:
    """One interval of the policy with the observed ``rates``; the ``children`` as they are now
    (their ready pods end a re-plan's overlap; a pod starting holds the next re-plan back);
    ``vertical``: whether raising running pods' time quota may be tried before adding pods."""
    high = spec.scaling.max_replicas or DEFAULT_MAX_PODS
    low = min(spec.scaling.min_replicas, high)
    if isinstance(state, HpaState):
        pod_rps = usable.choices[0].option.point.max_rps
        hpa = HpaSettings(stabilisation_s=scale_down_delay_s(spec), min_pods=low, max_pods=high)
        return Tick(state=hpa_step(state, rate=rates.long, pod_rps=pod_rps, now_s=now_s, settings=hpa),
                    planned_rps=rates.long)
    headroom = DEFAULT_HEADROOM if spec.scaling.headroom is None else float(spec.scaling.headroom)
    settings = ScalingSettings(headroom=headroom, scale_down_delay_s=scale_down_delay_s(spec), min_pods=low,
                               max_pods=high, vertical=vertical)
    state = settle(state, ready_pods(usable, children))
    capacity = state.capacity({c.key: c.option for c in usable.choices})
    rate = max(rates.long, rates.short) if settings.panic and rates.short >= 2 * capacity else rates.long
    new = step(state, usable.options, rate_long=rates.long, rate_short=rates.short, now_s=now_s, settings=settings,
               starting=starting(usable, children))
    return Tick(state=new, planned_rps=rate * (1 + headroom))


def hold(spec: FunctionSpec, usable: Usable, state: State) -> State:
    """No rate to act on: keep the plan, raised to minReplicas (a new function gets its minimum)."""
    high = spec.scaling.max_replicas or DEFAULT_MAX_PODS
    low = min(spec.scaling.min_replicas, high)
    if isinstance(state, HpaState):
        return attrs.evolve(state, pods=max(state.pods, low))
    pods = dict(state.pods)
    missing = low - sum(pods.values())
    if missing > 0:
        best = usable.choices[0].key
        pods[best] = pods.get(best, 0) + missing
    return attrs.evolve(state, pods=pods)


@attrs.frozen(kw_only=True)
class Raise:
    """A vertical step: the pods of configuration ``source`` now run ``target``'s larger time quota."""

    source: Choice
    target: Choice


def raise_of(usable: Usable, before: State, after: State) -> Raise | None:
    """The vertical step from ``before`` to ``after``, if the step took one (all pods of one
    configuration moved to a configuration that differs in its time quota alone)."""
    if not isinstance(before, ScalerState) or not isinstance(after, ScalerState):
        return None
    by_key = usable.by_key()
    gone = [key for key, n in before.pods.items() if n > 0 and after.pods.get(key, 0) == 0 and key in by_key]
    new = [key for key, n in after.pods.items() if n > 0 and before.pods.get(key, 0) == 0 and key in by_key]
    for source in gone:
        for target in new:
            if (after.pods[target] == before.pods[source]
                    and same_but_quota(by_key[source].option.point, by_key[target].option.point)):
                return Raise(source=by_key[source], target=by_key[target])
    return None


def desired_configs(usable: Usable, pods: Mapping[str, int], memory: str) -> tuple[Config, ...]:
    """One configuration per key with pods, by label."""
    by_key = usable.by_key()
    configs = [Config(share=by_key[key].share, memory=memory, replicas=n) for key, n in pods.items()
               if n > 0 and key in by_key]
    return tuple(sorted(configs, key=lambda config: config.label))


# --- parked pods ---------------------------------------------------------------------------
def parked_config(usable: Usable, children: Sequence[Mapping[str, Any]], parked: int,
                  memory: str) -> tuple[Config, str | None]:
    """The configuration of ``parked`` parked pods (time quota 0/0), for a function the policy runs
    no pod of, and the child to park in place (None: a new child).

    The pods wake to the configuration an already parked child was created as (its ``config``
    label), else to the one a running child runs (that child is parked in place: its pods keep
    running with their model loaded, only their time quota goes to 0), else to the policy's first
    choice. The SM partition and memory are the wake configuration's: neither can change on a
    running pod."""
    by_label = usable.by_label()
    ordered = sorted(children, key=lambda child: str((child.get("metadata") or {}).get("name", "")))
    found: tuple[Choice, str] | None = None
    for child in ordered:
        share = running_share(child)
        label = ((child.get("metadata") or {}).get("labels") or {}).get(keys.FUNCTION_CONFIG_LABEL)
        if share is not None and share.is_parked and label in by_label:
            found = (by_label[label], str(child["metadata"]["name"]))
            break
    for child in ordered if found is None else ():
        label = running_config_label(child)
        if label in by_label:
            found = (by_label[label], str(child["metadata"]["name"]))
            break
    wake, source = found if found is not None else (usable.choices[0], None)
    return Config(share=parked_share(wake.share), memory=memory, replicas=parked, wake=wake.share), source


def woken(usable: Usable, children: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the gateway woke parked pods (a child marked woken runs a configuration of the policy):
    the controller then takes them as running (:func:`start`) instead of parking them again."""
    by_label = usable.by_label()
    return any(keys.FASTPOD_WOKEN_ANNOTATION in ((child.get("metadata") or {}).get("annotations") or {})
               and running_config_label(child) in by_label for child in children)


def woken_without_request(usable: Usable, children: Sequence[Mapping[str, Any]],
                          pods: Sequence[Mapping[str, Any]]) -> dict[str, set[str]]:
    """Configuration key -> the uids of its pods that run on their memory alone: their child asks for
    a time quota request, their signed assignment gives 0 (a wake on a GPU without room, see the
    extender's ``WokenWithoutRequest``). Each calls for one more pod of its configuration, placed
    where there is room."""
    by_label = usable.by_label()
    asked = {str((child.get("metadata") or {}).get("uid", "")): running_share(child) for child in children}
    found: dict[str, set[str]] = {}
    for pod in pods:
        metadata = pod.get("metadata") or {}
        owner = next((ref.get("uid") for ref in metadata.get("ownerReferences") or []
                      if ref.get("controller") and ref.get("kind") == keys.FASTPOD_KIND), None)
        share = asked.get(str(owner))
        text = (metadata.get("annotations") or {}).get(keys.POD_ASSIGNMENT_ANNOTATION)
        if share is None or share.request_permille == 0 or text is None or metadata.get("deletionTimestamp"):
            continue
        try:
            given = decode_assignment(text).share
        except FastGShareError:
            continue
        choice = by_label.get(config_label(share))
        if given.request_permille == 0 and not given.is_parked and choice is not None:
            found.setdefault(choice.key, set()).add(str(metadata.get("uid", "")))
    return found


def with_more_pods(state: State, key: str, count: int, now_s: float) -> State:
    """``state`` with ``count`` more pods of configuration ``key`` (a scale-up at ``now_s``)."""
    if isinstance(state, HpaState):
        return attrs.evolve(state, pods=state.pods + count,
                            recommendations=(*state.recommendations, (now_s, state.pods + count)))
    return attrs.evolve(state, pods={**state.pods, key: state.pods.get(key, 0) + count}, last_up_s=now_s)


def summary(configs: Sequence[Config]) -> str:
    """``q40-s12x2, q100-s100x1`` (``-`` for none)."""
    return ", ".join(f"{config.label}x{config.replicas}" for config in configs) or "-"


def capacity_rps(usable: Usable, pods: Mapping[str, int]) -> float:
    by_key = usable.by_key()
    return sum(by_key[key].option.capacity_rps * n for key, n in pods.items() if key in by_key)


def cost(usable: Usable, pods: Mapping[str, int]) -> float:
    """The share of GPUs ``pods`` take (the profile's cost model)."""
    by_key = usable.by_key()
    return sum(by_key[key].option.cost * n for key, n in pods.items() if key in by_key)


def rounded(rps: float) -> float:
    """A rate as the status shows it (two decimals; never -0)."""
    value = round(rps, 2)
    return 0.0 if math.isclose(value, 0.0, abs_tol=EPSILON_RPS) else value
