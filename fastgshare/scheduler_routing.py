"""Which scheduler a pod asking for the vGPU resource ends up with: the mutating webhook's rule.

A pod that asks for ``keys.VGPU_RESOURCE`` (in any container's or init container's requests or
limits) is placed by ``keys.SCHEDULER_NAME`` only: the default scheduler knows nothing of shares.
The admission webhook therefore

- **sets** ``spec.schedulerName: fastgshare-scheduler`` on such a pod when it names the default
  scheduler (``default-scheduler``, or none at all);
- **keeps** a pod that already names ours;
- **warns**, changing nothing, when it names another scheduler (that one may call our extender
  under its own name; if it does not, the pod never gets a share).

A pod without the resource is never touched. ``fastgshare check`` uses the same rule to say what
the webhook will do. This module decides only; the webhook's HTTP and JSONPatch live in
``scheduler_extender``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import attrs

from fastgshare import keys

DEFAULT_SCHEDULER = "default-scheduler"  # what the API server defaults an unset schedulerName to
MAX_SHOWN_NAME = 63  # characters of another scheduler's name quoted in a warning


class Route(enum.Enum):
    """What the webhook does with a pod's ``spec.schedulerName``."""

    UNTOUCHED = "untouched"  # no vGPU resource: not ours to route
    OURS = "ours"  # already names fastgshare-scheduler
    SET = "set"  # names the default scheduler: set to fastgshare-scheduler
    WARN = "warn"  # names another scheduler: kept, with a warning


@attrs.frozen(kw_only=True)
class Routing:
    """The decision for one pod spec; ``scheduler`` is what the pod named (``None``: nothing)."""

    route: Route
    scheduler: str | None = None

    @property
    def warning(self) -> str:
        """The warning the API server shows the pod's creator; empty unless ``route`` is WARN."""
        if self.route is not Route.WARN:
            return ""
        name = str(self.scheduler)
        shown = name if len(name) <= MAX_SHOWN_NAME else name[:MAX_SHOWN_NAME] + "..."
        return (f"fastgshare: the pod asks for {keys.VGPU_RESOURCE} but schedulerName is {shown!r}: "
                f"it gets no GPU share unless that scheduler calls the fastgshare extender "
                f"(use {keys.SCHEDULER_NAME})")

    @property
    def note(self) -> str:
        """What ``fastgshare check`` says of a pod the webhook changes; empty unless ``route`` is SET."""
        if self.route is not Route.SET:
            return ""
        named = "not set" if not self.scheduler else repr(self.scheduler)
        return (f"schedulerName is {named}: the admission webhook sets it to {keys.SCHEDULER_NAME} "
                f"when the pod is created")


def route(pod_spec: Mapping[str, object]) -> Routing:
    """The webhook's decision for a pod (or pod template) with this spec."""
    scheduler = pod_spec.get("schedulerName")
    named = scheduler if isinstance(scheduler, str) else None
    if not requests_vgpu(pod_spec):
        return Routing(route=Route.UNTOUCHED, scheduler=named)
    if scheduler == keys.SCHEDULER_NAME:
        return Routing(route=Route.OURS, scheduler=named)
    if scheduler is None or scheduler in ("", DEFAULT_SCHEDULER):
        return Routing(route=Route.SET, scheduler=named)
    return Routing(route=Route.WARN, scheduler=str(scheduler))


def requests_vgpu(pod_spec: Mapping[str, object]) -> bool:
    """Whether any container or init container names the vGPU resource in its requests or limits."""
    for section in ("containers", "initContainers"):
        containers = pod_spec.get(section)
        for container in containers if isinstance(containers, list) else []:
            resources = container.get("resources") if isinstance(container, Mapping) else None
            if not isinstance(resources, Mapping):
                continue
            for kind in ("requests", "limits"):
                amounts = resources.get(kind)
                if isinstance(amounts, Mapping) and keys.VGPU_RESOURCE in amounts:
                    return True
    return False
