"""Events on objects, as ``kubectl describe`` shows them (core ``v1`` Events).

The v1.20 API server serves both ``v1`` and ``events.k8s.io/v1`` Events over one store;
``kubectl describe`` lists the ``v1`` form, which is what this recorder writes. Like client-go's
recorder, a repeat of the same event (same object, type, reason and message) within
``aggregate_s`` bumps the first one's ``count`` and ``lastTimestamp`` instead of adding another.
A failed event write is logged and never fails a reconcile. One recorder reports on one kind of
object (``api_version``/``kind`` of the ``involvedObject``) for one component.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from fastgshare_kube.errors import ApiError

log = logging.getLogger(__name__)

NORMAL = "Normal"
WARNING = "Warning"
MAX_MESSAGE = 1024
REMEMBERED = 4096


class EventSink(Protocol):
    """The two event writes (``v1`` Events, bodies as dicts); failures are :class:`ApiError`."""

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None: ...

    def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None: ...


@attrs.define
class _Sent:
    name: str
    count: int
    first: str
    at: float


class EventRecorder:
    """Writes events about objects of one kind through an :class:`EventSink`."""

    def __init__(self, kube: EventSink, *, component: str, instance: str, api_version: str, kind: str,
                 aggregate_s: float = 600.0, clock: Callable[[], float] = time.time,
                 timestamp: Callable[[], str] | None = None) -> None:
        self._kube = kube
        self._component = component
        self._instance = instance
        self._api_version, self._kind = api_version, kind
        self._aggregate_s = aggregate_s
        self._clock = clock
        self._timestamp = timestamp or (lambda: rfc3339(self._clock()))
        self._lock = threading.Lock()  # guards _sent; workers record events concurrently
        self._sent: OrderedDict[tuple[str, str, str, str], _Sent] = OrderedDict()

    def event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Record a ``kind`` (Normal, Warning) event on ``obj`` (a dict with its ``metadata``)."""
        metadata = obj.get("metadata") or {}
        namespace, uid = str(metadata.get("namespace", "")), str(metadata.get("uid", ""))
        message = message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 3] + "..."
        key = (uid, kind, reason, message)
        now, stamp = self._clock(), self._timestamp()
        with self._lock:
            sent = self._sent.get(key)
            repeat = sent is not None and now - sent.at < self._aggregate_s
            if sent is not None and repeat:
                sent.count, sent.at = sent.count + 1, now
                patch = (sent.name, {"count": sent.count, "lastTimestamp": stamp})
        try:
            if repeat:
                self._kube.patch_event(namespace, *patch)
                return
            body = self._body(metadata, kind, reason, message, stamp)
            self._kube.create_event(namespace, body)
            self._remember(key, _Sent(body["metadata"]["name"], 1, stamp, now))
        except ApiError as error:
            log.warning("cannot write event object=%s/%s reason=%s error=%s", namespace, metadata.get("name"),
                        reason, error)
            with self._lock:
                self._sent.pop(key, None)

    def _remember(self, key: tuple[str, str, str, str], sent: _Sent) -> None:
        with self._lock:
            self._sent[key] = sent
            while len(self._sent) > REMEMBERED:
                self._sent.popitem(last=False)

    def _body(self, metadata: Mapping[str, Any], kind: str, reason: str, message: str,
              stamp: str) -> dict[str, Any]:
        name = str(metadata.get("name", ""))
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": metadata.get("namespace")},
            "involvedObject": {
                "apiVersion": self._api_version, "kind": self._kind, "name": name,
                "namespace": metadata.get("namespace"), "uid": metadata.get("uid"),
                "resourceVersion": metadata.get("resourceVersion"),
            },
            "type": kind,
            "reason": reason,
            "message": message,
            "source": {"component": self._component},
            "reportingComponent": self._component,
            "reportingInstance": self._instance,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }


def rfc3339(seconds: float) -> str:
    """Seconds since the epoch as the API writes times: ``2026-01-31T12:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
