"""What the gateway reads from a FaSTFunc, and the decisions it takes on it. Pure: no I/O, no clock.

- :class:`FunctionSettings` / :func:`settings_of`: a FaSTFunc's ``spec.scaling.minReplicas`` (default 1,
  as the CRD), its policy, ``spec.fixed.replicas`` and ``spec.slo.latencyMs``, carried from the watch to
  where requests wait and are measured;
- :func:`on_idle`: scale from zero. A request that finds a function with ``minReplicas: 0`` without a ready
  pod is held up to the cold-start timeout (not the queue timeout), and the first such request sends one
  wake-up (a merge patch setting ``spec.fixed.replicas`` to ``max(1, minReplicas)``) unless one is already
  on its way (single flight: until a pod is ready or the cold-start timeout has passed) or the FaSTFunc
  already asks for pods (a wake-up must never lower a count someone set);
- :func:`scale_problem`: ``scale-function`` to 0 only for a function that may scale to zero.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fastgshare_gateway.openfaas import POLICY_FIXED

DEFAULT_MIN_REPLICAS = 1  # the CRD's default


@attrs.frozen
class FunctionSettings:
    min_replicas: int = DEFAULT_MIN_REPLICAS
    policy: str = POLICY_FIXED
    replicas: int | None = None  # spec.fixed.replicas, None when absent
    slo_s: float | None = None  # spec.slo.latencyMs in seconds, None when the FaSTFunc has no SLO

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
        slo_s=slo_s)


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
