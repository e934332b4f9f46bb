"""A FaSTFunc object, validated into the one configuration its FaSTPod runs.

:func:`parse_function` takes the FaSTFunc as the API returns it (a dict) and returns a
:class:`FunctionSpec`, or raises :class:`InvalidFunction` listing every problem, each naming the
field as the user wrote it (``spec.fixed.smPartition``, ``spec.memory``), the bad value and what
is allowed. The share is checked by the core's :func:`fastgshare.share.parse_share`, the same
parser the FaSTPod controller, the extender and the node agent use, so a FaSTFunc this module
accepts yields a FaSTPod they accept.

Policies: ``fixed`` runs ``spec.fixed``. ``rpr`` and ``hpa`` are autoscaled from the profile
(``spec.profile.configMapRef``, :mod:`.autoscale`) with the parameters of ``spec.scaling``
(:class:`Scaling`); without a profile, or when it cannot be used, they run ``spec.fixed``, or,
without it, the whole-GPU configuration (quota 1, SM 100) with ``max(minReplicas, 1)`` replicas
(``configs``, described by ``fixed_fallback``), and say so (``fallback``). ``quotaLimit``
defaults to ``quotaRequest`` (profile what you deploy).

Model sharing: ``spec.model`` (``name``, ``bytes``, ``source.path``) is checked by the core's
:func:`fastgshare.model.parse_model_spec` (its problems join the others); a valid one is the
``fastgshare/model`` annotation (:func:`fastgshare.model.model_annotation`) every child FaSTPod, and
so every pod, carries (:attr:`FunctionSpec.annotations`): a changed model is a new revision of the
pods. ``spec.memory`` is then each pod's own memory, the weights not included.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import attrs

from fastfunc_controller import names
from fastgshare import keys
from fastgshare.errors import InvalidShareSpec
from fastgshare.model import InvalidModelSpec, ModelRef, ModelSpec, model_annotation, parse_model_spec
from fastgshare.profile import PERCENTILES, ProfileError, Slo
from fastgshare.share import ShareSpec, format_fraction, parse_share

MAX_NAME = 63  # a label value, and the Service's DNS-1035 label
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
# FaSTFunc annotations its FaSTPod inherits besides the share (which comes from spec.fixed and spec.memory).
INHERITED_ANNOTATIONS = (keys.GPU_CONTAINERS_ANNOTATION, keys.SCHEDULING_POLICY_ANNOTATION)
WHOLE_GPU = {"quotaRequest": "1", "quotaLimit": "1", "smPartition": 100}

REASON_SHARE = "InvalidShare"
REASON_NAME = "InvalidName"
REASON_FIELD = "InvalidField"


class InvalidFunction(Exception):
    """A FaSTFunc the controller cannot run; ``reason`` is the InvalidSpec condition's reason."""

    def __init__(self, reason: str, problems: list[str]) -> None:
        self.reason = reason
        self.problems = tuple(problems)
        super().__init__("; ".join(problems))


@attrs.frozen(kw_only=True)
class Config:
    """One (quota, SM) configuration with its replica count: one child FaSTPod."""

    share: ShareSpec
    memory: str  # spec.memory as written (bytes or a quantity), the FaSTPod's gpu_mem
    replicas: int
    wake: ShareSpec | None = None  # a parked configuration (share 0/0): the share its pods are woken to

    @property
    def label(self) -> str:
        """``q40-s12`` (``parked-s12`` for a parked configuration): what the child runs."""
        return config_label(self.share)

    @property
    def name_label(self) -> str:
        """The FaSTPod name's suffix: the label, or for a parked configuration the one it wakes to."""
        return config_label(self.wake or self.share)

    def annotations(self) -> dict[str, str]:
        """The four share annotations of the FaSTPod (fractions in their canonical form)."""
        return {keys.GPU_QUOTA_REQUEST: format_fraction(self.share.request_permille),
                keys.GPU_QUOTA_LIMIT: format_fraction(self.share.limit_permille),
                keys.GPU_SM_PARTITION: str(self.share.sm_percent), keys.GPU_MEM: self.memory}


COST_MODELS = ("dominant", "area")


@attrs.frozen(kw_only=True)
class Scaling:
    """``spec.scaling`` of an autoscaled function; None: the policy's default (:mod:`.autoscale`)."""

    min_replicas: int = 1
    max_replicas: int | None = None
    interval_s: float | None = None
    headroom: float | None = None
    scale_down_delay_s: float | None = None
    cost_model: str = "dominant"
    quotas: tuple[float, ...] = ()  # the allow-list of spec.scaling.configs (empty: any)
    sms: tuple[int, ...] = ()
    parked: int = 0  # pods kept parked (time quota 0/0, memory held) when the policy would run none


@attrs.frozen(kw_only=True)
class FunctionSpec:
    """What one valid FaSTFunc must run."""

    namespace: str
    name: str
    uid: str
    generation: int
    labels: Mapping[str, str]  # the FaSTFunc's own labels; its FaSTPods and pods get them too
    annotations: Mapping[str, str]  # what its FaSTPods inherit: FaSTFunc annotations, and the model's
    pod_spec: Mapping[str, Any]
    policy: str
    profile: str  # spec.profile.configMapRef.name, "" when none
    configs: tuple[Config, ...]
    fallback: str = ""  # why a non-fixed policy runs a fixed configuration ("" with policy fixed)
    fixed_fallback: str = ""  # what a non-fixed policy runs when it cannot autoscale: "running spec.fixed"
    profile_problem: str = ""  # the ProfileMissing reason when the profile given cannot be used
    scaling: Scaling = Scaling()
    slo: Slo | None = None  # spec.slo, when it gives latencyMs
    memory: str = ""  # spec.memory as written (with a model: each pod's own memory, without the weights)
    model: ModelSpec | None = None  # spec.model: the weights the pods share per GPU

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def percent(permille: int) -> str:
    """A permille as a percent for names: 400 -> ``40``, 125 -> ``12.5``, 5 -> ``0.5``."""
    text = str(Decimal(permille) / 10)
    return text.rstrip("0").rstrip(".") if "." in text else text


def config_label(share: ShareSpec) -> str:
    """``q40-s12``; a parked share (time quota 0/0) is ``parked-s12``."""
    if share.is_parked:
        return f"{PARKED_PREFIX}-s{share.sm_percent}"
    return f"q{percent(share.request_permille)}-s{share.sm_percent}"


PARKED_PREFIX = "parked"


def parked_share(share: ShareSpec) -> ShareSpec:
    """``share`` parked: time quota 0/0, the same SM partition and memory (neither can change on a
    running pod, so parking and waking are live changes of the time quota alone)."""
    return attrs.evolve(share, request_permille=0, limit_permille=0)


def running_config_label(child: Mapping[str, Any]) -> str | None:
    """The configuration a child FaSTPod runs, from its share annotations (``q40-s12``; None when
    they do not parse). Its name and ``config`` label say what it was created as: a live quota
    change (the autoscaler's vertical step) changes the annotations only."""
    share = running_share(child)
    return config_label(share) if share is not None else None


def running_share(child: Mapping[str, Any]) -> ShareSpec | None:
    """The share a child FaSTPod's annotations give (None when they do not parse)."""
    annotations = (child.get("metadata") or {}).get("annotations") or {}
    try:
        return parse_share(annotations)
    except InvalidShareSpec:
        return None


def fastpod_name(function: str, share: ShareSpec) -> str:
    """``<fn>-q<quota%>-s<sm%>``: the child FaSTPod of one configuration (a parked one is named for
    the configuration it wakes to: pass that)."""
    return f"{function}-{config_label(share)}"


def parse_function(fastfunc: Mapping[str, Any]) -> FunctionSpec:
    """Validate ``fastfunc``; raises :class:`InvalidFunction` naming every problem found."""
    metadata = fastfunc.get("metadata") or {}
    spec = fastfunc.get("spec") or {}
    name = str(metadata.get("name", ""))
    problems: list[str] = []
    reason = ""
    if len(name) > MAX_NAME or not _DNS_1035.fullmatch(name):
        problems.append(f'metadata.name: "{name}" cannot name the function\'s Service; allowed: a DNS-1035 label '
                        f"(lower-case letters, digits and '-', starting with a letter, at most {MAX_NAME} characters)")
        reason = REASON_NAME
    labels = {str(k): v for k, v in (metadata.get("labels") or {}).items()}
    bad_labels = sorted(k for k, v in labels.items() if not (isinstance(v, str) and len(v) <= MAX_NAME
                                                              and _LABEL_VALUE.fullmatch(v)))
    if bad_labels:
        problems.append(f"metadata.labels: {', '.join(bad_labels)} are not label values")
    pod_spec = spec.get("podSpec")
    problems += _pod_spec_problems(pod_spec)
    policy, profile, scaling = _policy(spec, problems)
    # spec.scaling and spec.slo matter to the autoscaled policies only: a fixed function is not refused for them.
    autoscaled = problems if policy != names.POLICY_FIXED else []
    parsed_scaling = _scaling(scaling, autoscaled)
    slo = _slo(spec.get("slo"), autoscaled)
    model = _model(spec.get("model"), problems)
    reason = reason or (REASON_FIELD if problems else "")
    config, fallback, fixed_fallback = _config(spec, policy, profile, scaling, problems)
    if config is None and not reason:
        reason = REASON_SHARE
    if config is not None and not reason and len(child := fastpod_name(name, config.share)) > MAX_NAME:
        problems.append(f'metadata.name: "{name}" is too long: its FaSTPod "{child}" has {len(child)} characters; '
                        f"allowed: at most {MAX_NAME}, so a name of at most "
                        f"{MAX_NAME - len(child) + len(name)} characters for this configuration")
        reason = REASON_NAME
    if problems or config is None:
        raise InvalidFunction(reason or REASON_FIELD, problems)
    annotations = {k: str(v) for k, v in (metadata.get("annotations") or {}).items() if k in INHERITED_ANNOTATIONS}
    if model is not None:
        annotations[keys.MODEL_ANNOTATION] = model_annotation(name, model)
    return FunctionSpec(
        namespace=str(metadata.get("namespace", "")), name=name, uid=str(metadata.get("uid", "")),
        generation=int(metadata.get("generation") or 0), labels=labels, annotations=annotations,
        pod_spec=pod_spec if isinstance(pod_spec, Mapping) else {}, policy=policy, profile=profile,
        configs=(config,), fallback=fallback, fixed_fallback=fixed_fallback, scaling=parsed_scaling, slo=slo,
        memory=config.memory, model=model)


def model_ref(spec: FunctionSpec) -> ModelRef | None:
    """The function's model as its pods declare it (None without ``spec.model``)."""
    if spec.model is None:
        return None
    return ModelRef(namespace=spec.namespace, function=spec.name, spec=spec.model)


def _model(raw: object, problems: list[str]) -> ModelSpec | None:
    """``spec.model`` (None when absent); each of its problems names the field, the value and what is allowed."""
    if raw is None:
        return None
    try:
        return parse_model_spec(raw, "spec.model")
    except InvalidModelSpec as error:
        problems.extend(str(problem) for problem in error.problems)
        return None


def _pod_spec_problems(pod_spec: object) -> list[str]:
    if not isinstance(pod_spec, Mapping):
        return ["spec.podSpec: is required; allowed: a Pod spec (containers, volumes, ...)"]
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return ["spec.podSpec.containers: must list at least one container"]
    if not all(isinstance(c, Mapping) and isinstance(c.get("name"), str) and c["name"] for c in containers):
        return ["spec.podSpec.containers: every container needs a name"]
    return []


def _policy(spec: Mapping[str, Any], problems: list[str]) -> tuple[str, str, Mapping[str, Any]]:
    scaling = spec.get("scaling") or {}
    policy = scaling.get("policy", names.POLICY_FIXED) if isinstance(scaling, Mapping) else None
    if policy not in names.POLICIES:
        problems.append(f"spec.scaling.policy: {policy!r} is not a policy; allowed: {', '.join(names.POLICIES)}")
        policy = names.POLICY_FIXED
    profile = (((spec.get("profile") or {}).get("configMapRef") or {}).get("name")) or ""
    return str(policy), str(profile), scaling if isinstance(scaling, Mapping) else {}


# What the core's share parser calls each value, and the field the user wrote it in.
_FIELDS = {keys.GPU_QUOTA_REQUEST: "spec.fixed.quotaRequest", keys.GPU_QUOTA_LIMIT: "spec.fixed.quotaLimit",
           keys.GPU_SM_PARTITION: "spec.fixed.smPartition", keys.GPU_MEM: "spec.memory"}


def _config(spec: Mapping[str, Any], policy: str, profile: str, scaling: Mapping[str, Any],
            problems: list[str]) -> tuple[Config | None, str, str]:
    fixed = spec.get("fixed")
    fallback = what = ""
    if policy != names.POLICY_FIXED:
        if isinstance(fixed, Mapping):
            what = "running spec.fixed"
        else:
            replicas = max(_int(scaling.get("minReplicas"), 1), 1)
            fixed = {**WHOLE_GPU, "replicas": replicas}
            what = f"running the whole-GPU configuration (quota 1, SM 100) with {replicas} replicas"
        if not profile:
            fallback = f"no profile (spec.profile.configMapRef) for policy {policy}: {what}"
    elif not isinstance(fixed, Mapping):
        problems.append("spec.fixed: is required with policy fixed; allowed: {quotaRequest, quotaLimit, "
                        "smPartition, replicas}, e.g. {quotaRequest: \"0.4\", smPartition: 12, replicas: 1}")
        return None, "", ""
    replicas = fixed.get("replicas", 1)
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        problems.append(f"spec.fixed.replicas: {replicas!r} is not a replica count; allowed: an integer >= 0")
        return None, fallback, what
    request = fixed.get("quotaRequest")
    limit_defaulted = "quotaLimit" not in fixed
    annotations: dict[str, object] = {
        keys.GPU_QUOTA_REQUEST: _text(request),
        keys.GPU_QUOTA_LIMIT: _text(request if limit_defaulted else fixed.get("quotaLimit")),
        keys.GPU_SM_PARTITION: _text(fixed.get("smPartition", 100)),
    }
    memory = spec.get("memory")
    if memory is not None:
        annotations[keys.GPU_MEM] = _text(memory)
    annotations = {k: v for k, v in annotations.items() if v is not None}
    try:
        share = parse_share(annotations)
    except InvalidShareSpec as error:
        request_bad = any(problem.field == keys.GPU_QUOTA_REQUEST for problem in error.problems)
        problems += [_field_problem(str(problem), limit_defaulted) for problem in error.problems
                     if not (limit_defaulted and request_bad and problem.field == keys.GPU_QUOTA_LIMIT)]
        return None, fallback, what
    if share.is_parked:
        field = "spec.fixed.quotaLimit" + (" (defaults to spec.fixed.quotaRequest)" if limit_defaulted else "")
        problems.append(f'{field}: "0" gives the pods no GPU time; allowed: a fraction of GPU time in (0, 1] '
                        "(pods that wait parked, their GPU memory held, are spec.scaling.parked)")
        return None, fallback, what
    return Config(share=share, memory=str(annotations[keys.GPU_MEM]), replicas=replicas), fallback, what


def _number(scaling: Mapping[str, Any], field: str, minimum: float, problems: list[str], *,
            integer: bool = False) -> Any:
    """``spec.scaling.<field>``, None when absent; a problem naming it when it is not a number >= minimum."""
    value = scaling.get(field)
    if value is None:
        return None
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value < minimum:
        kind = "an integer" if integer else "a number"
        problems.append(f"spec.scaling.{field}: {value!r} is not allowed; allowed: {kind} >= {minimum:g}")
        return None
    return value


def _scaling(scaling: Mapping[str, Any], problems: list[str]) -> Scaling:
    low = _number(scaling, "minReplicas", 0, problems, integer=True)
    high = _number(scaling, "maxReplicas", 1, problems, integer=True)
    if low is not None and high is not None and high < low:
        problems.append(f"spec.scaling.maxReplicas: {high} is below minReplicas {low}; allowed: >= minReplicas")
    cost = scaling.get("costModel", COST_MODELS[0])
    if cost not in COST_MODELS:
        problems.append(f"spec.scaling.costModel: {cost!r} is not a cost model; allowed: {', '.join(COST_MODELS)}")
        cost = COST_MODELS[0]
    allowed = scaling.get("configs") or {}
    quotas = allowed.get("quota") or [] if isinstance(allowed, Mapping) else []
    sms = allowed.get("sm") or [] if isinstance(allowed, Mapping) else []
    if not all(isinstance(q, int | float) and not isinstance(q, bool) and 0 < q <= 1 for q in quotas):
        problems.append(f"spec.scaling.configs.quota: {quotas!r} is not allowed; allowed: fractions of GPU time in "
                        "(0, 1], e.g. [0.2, 0.4, 1]")
        quotas = []
    if not all(isinstance(sm, int) and not isinstance(sm, bool) and 1 <= sm <= 100 for sm in sms):
        problems.append(f"spec.scaling.configs.sm: {sms!r} is not allowed; allowed: SM percents 1..100, "
                        "e.g. [12, 50, 100]")
        sms = []
    return Scaling(min_replicas=1 if low is None else low, max_replicas=high,
                   interval_s=_number(scaling, "intervalSeconds", 0.1, problems),
                   headroom=_number(scaling, "headroom", 0, problems),
                   scale_down_delay_s=_number(scaling, "scaleDownDelaySeconds", 0, problems),
                   cost_model=str(cost), quotas=tuple(float(q) for q in quotas), sms=tuple(int(sm) for sm in sms),
                   parked=_parked(scaling, low, high, problems))


MAX_PARKED = 16


def _parked(scaling: Mapping[str, Any], low: float | None, high: float | None, problems: list[str]) -> int:
    """``spec.scaling.parked``: 0 (the default) or, with ``minReplicas: 0``, up to maxReplicas and
    MAX_PARKED pods."""
    value = scaling.get("parked", 0)
    most = min(MAX_PARKED, int(high)) if high is not None else MAX_PARKED
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= most:
        problems.append(f"spec.scaling.parked: {value!r} is not allowed; allowed: a whole number of pods, 0..{most} "
                        "(at most maxReplicas and 16)")
        return 0
    if value and (low if low is not None else 1) != 0:
        problems.append(f"spec.scaling.parked: {value} needs spec.scaling.minReplicas 0 (it is "
                        f"{int(low) if low is not None else 1}); allowed: parked pods only for a function that "
                        "scales to zero")
        return 0
    return value


def _slo(raw: object, problems: list[str]) -> Slo | None:
    if not isinstance(raw, Mapping) or raw.get("latencyMs") is None:
        return None
    latency, percentile = raw.get("latencyMs"), raw.get("percentile", 95)
    if percentile not in PERCENTILES:
        problems.append(f"spec.slo.percentile: {percentile!r} is not allowed; allowed: one of "
                        f"{', '.join(map(str, PERCENTILES))} (the percentiles a profile records)")
        return None
    try:
        return Slo(percentile=int(percentile), latency_ms=float(str(latency)))
    except (ProfileError, TypeError, ValueError):
        problems.append(f"spec.slo.latencyMs: {latency!r} is not allowed; allowed: a positive number of milliseconds")
        return None


def _field_problem(problem: str, limit_defaulted: bool) -> str:
    """The core's problem text with each annotation key replaced by the FaSTFunc field."""
    for key, field in _FIELDS.items():
        defaulted = key == keys.GPU_QUOTA_LIMIT and limit_defaulted
        problem = problem.replace(key, f"{field} (defaults to spec.fixed.quotaRequest)" if defaulted else field)
    return problem


def _text(value: object) -> object:
    """Numbers as the strings annotations carry; other values as they are (the parser names them)."""
    if isinstance(value, bool):
        return value
    return str(value) if isinstance(value, int | float) else value


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default
