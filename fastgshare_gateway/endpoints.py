"""Which pods serve which function: pods (API dicts) to endpoints, indexed by function. Pure.

A pod serves function ``<fn>`` of its namespace when it carries ``fastgshare.caps.in.tum/function: <fn>``
(a FaSTFunc's pods); in the default function namespace a pod of a FaSTPod (label
``fastgshare.caps.in.tum/fastpod: <name>``) also serves function ``<name>`` (the original's user flow: a
FaSTPod applied in ``fast-gshare-fn`` is a function). A pod is an endpoint while it is Ready, not being
deleted and has an IP; its address is ``podIP:8080``. Capacity is 1.0 unless known (profiles come with the
autoscaler). A pod whose share annotations give it no GPU time (quota 0/0) is *parked*: a function's
requests go to its parked pods only while it has no other endpoint (they wait on the GPU until the pods
are woken, see :mod:`fastgshare_gateway.routing`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from fastgshare import keys
from fastgshare.errors import InvalidShareSpec
from fastgshare.share import parse_share

FunctionKey = tuple[str, str]  # (namespace, name)


@attrs.frozen
class Endpoint:
    pod: str  # the pod's name, unique within the function's namespace
    address: str  # host:port
    capacity: float = 1.0
    parked: bool = False  # time quota 0/0: it serves once woken


@attrs.frozen
class PodEntry:
    uid: str
    functions: tuple[FunctionKey, ...]
    endpoint: Endpoint | None  # None: not (yet) able to serve


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions if isinstance(c, Mapping))


def _parked(annotations: Mapping[str, Any]) -> bool:
    try:
        return parse_share(annotations).is_parked
    except InvalidShareSpec:
        return False


def pod_entry(pod: Mapping[str, Any], default_namespace: str = keys.DEFAULT_FUNCTION_NAMESPACE,
              port: int = keys.FUNCTION_PORT) -> PodEntry:
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace", ""))
    labels = metadata.get("labels") or {}
    names = {labels[keys.FUNCTION_LABEL]} if labels.get(keys.FUNCTION_LABEL) else set()
    if namespace == default_namespace and labels.get(keys.FASTPOD_NAME_LABEL) and not names:
        names.add(labels[keys.FASTPOD_NAME_LABEL])
    ip = (pod.get("status") or {}).get("podIP")
    serving = bool(ip) and _ready(pod) and not metadata.get("deletionTimestamp")
    name = str(metadata.get("name", ""))
    return PodEntry(uid=str(metadata.get("uid") or f"{namespace}/{name}"),
                    functions=tuple((namespace, fn) for fn in sorted(names)),
                    endpoint=Endpoint(pod=name, address=f"{ip}:{port}",
                                      parked=_parked(metadata.get("annotations") or {})) if serving else None)


class EndpointIndex:
    """Pods by uid, and from them each function's endpoints. Not thread-safe: owned by one thread."""

    def __init__(self, default_namespace: str = keys.DEFAULT_FUNCTION_NAMESPACE) -> None:
        self._default_namespace = default_namespace
        self._pods: dict[str, PodEntry] = {}

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> set[FunctionKey]:
        """Take a whole list; the functions whose endpoints may have changed."""
        before = set(self.functions())
        self._pods = {entry.uid: entry for entry in (pod_entry(p, self._default_namespace) for p in pods)}
        return before | set(self.functions())

    def upsert(self, pod: Mapping[str, Any]) -> set[FunctionKey]:
        entry = pod_entry(pod, self._default_namespace)
        old = self._pods.get(entry.uid)
        self._pods[entry.uid] = entry
        return set(entry.functions) | set(old.functions if old else ())

    def delete(self, pod: Mapping[str, Any]) -> set[FunctionKey]:
        old = self._pods.pop(pod_entry(pod, self._default_namespace).uid, None)
        return set(old.functions) if old else set()

    def functions(self) -> set[FunctionKey]:
        """Every function some pod carries the label of, ready or not."""
        return {key for entry in self._pods.values() for key in entry.functions}

    def endpoints(self, key: FunctionKey) -> list[Endpoint]:
        """The function's serving pods; only while it has none, its parked ones."""
        found = [e.endpoint for e in self._pods.values() if key in e.functions and e.endpoint is not None]
        awake = [endpoint for endpoint in found if not endpoint.parked]
        return sorted(awake or found, key=lambda endpoint: endpoint.pod)
