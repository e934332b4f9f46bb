"""What the gateway reads from a FaSTFunc, and the decisions it takes on it. Pure: no I/O, no clock.

- :class:`FunctionSettings` / :func:`settings_of`: a FaSTFunc's ``spec.scaling.minReplicas`` (default 1,
  as the CRD), its policy, ``spec.fixed.replicas`` and ``spec.slo.latencyMs``, carried from the watch to
  where requests wait and are measured;
- :func:`on_idle`: scale from zero. A request that finds a function with ``minReplicas: 0`` without a ready
  pod is held up to the cold-start timeout (not the queue timeout), and the first such request sends one
  wake-up (a merge patch setting ``spec.fixed.replicas`` to ``max(1, minReplicas)``) unless one is already
  on its way (single flight: until a pod is ready or the cold-start timeout has passed) or the FaSTFunc
  already asks for pods (a wake-up must never lower a count someone set);
- :func:`wake_parked`: parked pods (``spec.scaling.parked``: time quota 0/0, model loaded, GPU memory held).
  A request that finds only parked pods goes to them at once (it waits on the GPU), and the first one sends
  the wake-up: a JSON patch on the parked child FaSTPod (``status.parked`` names it and the time quota it
  wakes to) that tests it is still parked, sets the quota and marks it woken. The FaSTPod controller
  carries it to the pods in place and the extender to their GPU, as any live share change. The gateway
  wakes, not the function controller, because it sees the request the moment it arrives; the controller
  would see it at its next tick after the next scrape of the gateways' counters (a second or more);
- :func:`scale_problem`: ``scale-function`` to 0 only for a function that may scale to zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fastgshare import keys
from fastgshare_gateway.openfaas import POLICY_FIXED

DEFAULT_MIN_REPLICAS = 1  # the CRD's default


@attrs.frozen
class ParkedPods:
    """``status.parked`` of a FaSTFunc: its parked child FaSTPod and the time quota it wakes to."""
    fastpod: str
    wake_request: str
    wake_limit: str


@attrs.frozen
class FunctionSettings:
    min_replicas: int = DEFAULT_MIN_REPLICAS
    policy: str = POLICY_FIXED
    replicas: int | None = None  # spec.fixed.replicas, None when absent
    slo_s: float | None = None  # spec.slo.latencyMs in seconds, None when the FaSTFunc has no SLO
    parked: ParkedPods | None = None  # status.parked, None when the function has no parked pods

    @property
    def scales_from_zero(self) -> bool:
        return self.min_replicas == 0


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def settings_of(fastfunc: Mapping[str, Any]) -> FunctionSettings:
    """A FaSTFunc's settings; a malformed field reads as its default (the controller reports it)."""
    spec = fastfunc.get("spec") or {}
    scaling = spec.get("scaling") or {}
    fixed = spec.get("fixed") or {}
    slo = spec.get("slo") or {}
    minimum = _count(scaling.get("minReplicas"))
    latency = slo.get("latencyMs") if isinstance(slo, Mapping) else None
    slo_s = None
    if isinstance(latency, (int, float)) and not isinstance(latency, bool) and latency > 0:
        slo_s = latency / 1000
    return FunctionSettings(
        min_replicas=DEFAULT_MIN_REPLICAS if minimum is None else minimum,
        policy=str(scaling.get("policy") or POLICY_FIXED),
        replicas=_count(fixed.get("replicas")) if isinstance(fixed, Mapping) else None,
        slo_s=slo_s, parked=_parked(fastfunc.get("status") or {}))


def _parked(status: Mapping[str, Any]) -> ParkedPods | None:
    parked = status.get("parked")
    if not isinstance(parked, Mapping):
        return None
    fields = (parked.get("fastPod"), parked.get("wakeQuotaRequest"), parked.get("wakeQuotaLimit"))
    if not all(isinstance(field, str) and field for field in fields):
        return None
    return ParkedPods(*(str(field) for field in fields))


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def wake_parked(parked: ParkedPods, now: str) -> list[dict[str, Any]]:
    """The JSON patch that wakes the parked child FaSTPod: it fails (422) unless the child is still parked,
    so a wake-up never lowers a quota someone raised meanwhile. ``now``: RFC 3339, the woken mark."""
    annotations = "/metadata/annotations/"
    return [{"op": "test", "path": annotations + _pointer(keys.GPU_QUOTA_LIMIT), "value": "0"},
            {"op": "replace", "path": annotations + _pointer(keys.GPU_QUOTA_REQUEST), "value": parked.wake_request},
            {"op": "replace", "path": annotations + _pointer(keys.GPU_QUOTA_LIMIT), "value": parked.wake_limit},
            {"op": "add", "path": annotations + _pointer(keys.FASTPOD_WOKEN_ANNOTATION), "value": now}]


def wake_patch(settings: FunctionSettings) -> dict[str, Any]:
    """The merge patch that wakes a function scaled to zero."""
    return {"spec": {"fixed": {"replicas": max(1, settings.min_replicas)}}}


@attrs.frozen
class Hold:
    """Hold the request up to ``timeout_s``; send ``patch`` now (None: no wake-up to send)."""
    timeout_s: float
    patch: dict[str, Any] | None


def on_idle(settings: FunctionSettings | None, *, waking: bool, cold_start_timeout_s: float) -> Hold | None:
    """A request waits for a function without a ready pod: None (not a scale-from-zero function: the queue
    timeout applies), or how long to hold it and whether to send the wake-up. ``waking``: one was sent for
    this function and neither a pod became ready nor the cold-start timeout passed since."""
    if settings is None or not settings.scales_from_zero:
        return None
    asks_for_none = settings.policy == POLICY_FIXED and settings.replicas == 0
    return Hold(cold_start_timeout_s, wake_patch(settings) if asks_for_none and not waking else None)


def scale_problem(fastfunc: Mapping[str, Any], name: str, replicas: int) -> str | None:
    """Why ``scale-function`` may not set ``replicas``, or None: 0 only when ``minReplicas`` is 0."""
    settings = settings_of(fastfunc)
    if replicas == 0 and not settings.scales_from_zero:
        return (f"function {name!r} cannot scale to 0 replicas: its spec.scaling.minReplicas is "
                f"{settings.min_replicas}; deploy it with the label com.openfaas.scale.min=0 to allow scaling "
                "to zero")
    return None
