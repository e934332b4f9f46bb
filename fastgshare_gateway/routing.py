"""The gateway's view of its functions: which exist, their endpoints and their pools. Event-loop only.

A function exists when a FaSTFunc of that name is in one of the gateway's namespaces or some pod carries
its label (ready or not; in the default function namespace also a FaSTPod's pods, see
:mod:`fastgshare_gateway.endpoints`). The Kubernetes adapter feeds pods and FaSTFunc names here from its
watch threads through ``loop.call_soon_threadsafe``; tests call the same methods, or :meth:`set_endpoints`.

The FaSTFuncs' settings (:mod:`fastgshare_gateway.fastfunc`: minimum replicas, SLO) come with them. Scale
from zero: :meth:`Functions.on_idle_wait` is the pools' hook; it takes :func:`~fastgshare_gateway.fastfunc.on_idle`'s
decision, keeps the single-flight state (a wake-up is on its way until a pod of the function is ready, the
cold-start timeout passes or the wake-up fails) and hands the patch to ``waker`` (the HTTP edge sends it
through the store). Parked pods: :meth:`Functions.arriving` is called for each request before it waits; when
the function's endpoints are all parked it hands :func:`~fastgshare_gateway.fastfunc.wake_parked`'s patch
to ``parked_waker`` (single flight per function, until a pod serves, ``PARKED_WAKE_TIMEOUT_S`` passes or
the wake-up fails).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from fastgshare import keys
from fastgshare_gateway.endpoints import Endpoint, EndpointIndex, FunctionKey
from fastgshare_gateway.fastfunc import FunctionSettings, on_idle, settings_of, wake_parked
from fastgshare_gateway.metrics import GatewayMetrics, function_label
from fastgshare_gateway.pool import FunctionPool, Limits

PARKED_WAKE_TIMEOUT_S = 10.0  # a wake-up of parked pods counts as on its way this long


def _rfc3339_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class Functions:
    def __init__(self, namespaces: Collection[str], limits: Limits, metrics: GatewayMetrics, *,
                 default_namespace: str = keys.DEFAULT_FUNCTION_NAMESPACE,
                 cold_start_timeout_s: float = 120.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.namespaces = tuple(namespaces)
        self.default_namespace = default_namespace
        self.limits = limits
        self.metrics = metrics
        self.cold_start_timeout_s = cold_start_timeout_s
        # sends a wake-up patch (the HTTP edge sets it when it has a store); it calls wake_failed on failure
        self.waker: Callable[[FunctionKey, dict[str, Any]], None] | None = None
        # sends a parked child's wake-up: (function, FaSTPod name, JSON patch); wake_failed on failure
        self.parked_waker: Callable[[FunctionKey, str, list[dict[str, Any]]], None] | None = None
        self.now: Callable[[], str] = _rfc3339_now
        self._clock = clock
        self._waking: dict[FunctionKey, float] = {}  # a wake-up sent: until when it counts as on its way
        self._waking_parked: dict[FunctionKey, float] = {}  # the same for parked pods
        self._wake_wanted: set[FunctionKey] = set()  # a request found parked pods before status.parked
        self._index = EndpointIndex(default_namespace)
        self._fastfuncs: dict[FunctionKey, FunctionSettings] = {}
        self._injected: dict[FunctionKey, list[Endpoint]] = {}
        self._pools: dict[FunctionKey, FunctionPool] = {}
        self.synced = False

    # --- what the watches report -------------------------------------------------------------
    def replace_pods(self, pods: Iterable[Mapping[str, Any]]) -> None:
        self._refresh(self._index.replace(pods))
        self.synced = True

    def upsert_pod(self, pod: Mapping[str, Any]) -> None:
        self._refresh(self._index.upsert(pod))

    def delete_pod(self, pod: Mapping[str, Any]) -> None:
        self._refresh(self._index.delete(pod))

    def replace_fastfuncs(self, namespace: str, fastfuncs: Iterable[Mapping[str, Any]]) -> None:
        """A (re)list of one namespace's FaSTFuncs (API objects)."""
        self._fastfuncs = {key: settings for key, settings in self._fastfuncs.items() if key[0] != namespace}
        for fastfunc in fastfuncs:
            self.upsert_fastfunc(fastfunc, namespace)

    def upsert_fastfunc(self, fastfunc: Mapping[str, Any], namespace: str | None = None) -> None:
        metadata = fastfunc.get("metadata") or {}
        key = (str(namespace or metadata.get("namespace", "")), str(metadata.get("name", "")))
        self._fastfuncs[key] = settings_of(fastfunc)
        if key in self._wake_wanted:
            self.arriving(key)

    def remove_fastfunc(self, key: FunctionKey) -> None:
        self._fastfuncs.pop(key, None)
        self._waking.pop(key, None)
        self._waking_parked.pop(key, None)
        self._wake_wanted.discard(key)

    def settings(self, key: FunctionKey) -> FunctionSettings | None:
        """The function's FaSTFunc settings; None when it is no FaSTFunc (a FaSTPod, endpoints injected)."""
        return self._fastfuncs.get(key)

    def set_endpoints(self, key: FunctionKey, endpoints: Iterable[Endpoint]) -> None:
        """Endpoints given directly (tests, benchmarks): the function exists while they are set."""
        self._injected[key] = list(endpoints)
        self._refresh({key})

    # --- what requests ask -------------------------------------------------------------------
    def exists(self, key: FunctionKey) -> bool:
        return key[0] in self.namespaces and (
            key in self._fastfuncs or key in self._injected or key in self._index.functions())

    def pool(self, key: FunctionKey) -> FunctionPool | None:
        """The function's pool, or None when there is no such function."""
        if not self.exists(key):
            return None
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = FunctionPool(key, self.limits, self.on_idle_wait)
            pool.set_endpoints(self._endpoints(key))
        return pool

    def on_idle_wait(self, key: FunctionKey) -> float | None:
        """The pools' hook: a request waits for ``key``, which has no ready pod. How long to hold it (None:
        the queue timeout); sends the wake-up when one is due."""
        until = self._waking.get(key)
        hold = on_idle(self._fastfuncs.get(key), waking=until is not None and self._clock() < until,
                       cold_start_timeout_s=self.cold_start_timeout_s)
        if hold is None:
            return None
        if hold.patch is not None and self.waker is not None:
            self._waking[key] = self._clock() + hold.timeout_s
            self.waker(key, hold.patch)
        return hold.timeout_s

    def arriving(self, key: FunctionKey) -> None:
        """A request for ``key`` is about to wait for a pod: when all its pods are parked, wake them (once).
        Pods seen parked before the FaSTFunc's ``status.parked`` says what they wake to: the wake-up goes
        when it does (:meth:`upsert_fastfunc`)."""
        endpoints = self._endpoints(key)
        if not endpoints or not all(e.parked for e in endpoints):
            return
        settings = self._fastfuncs.get(key)
        if settings is None or settings.parked is None:
            self._wake_wanted.add(key)
            return
        self._wake_wanted.discard(key)
        until = self._waking_parked.get(key)
        if (until is not None and self._clock() < until) or self.parked_waker is None:
            return
        self._waking_parked[key] = self._clock() + PARKED_WAKE_TIMEOUT_S
        self.metrics.wakeups.labels(function_label(key[1], key[0])).inc()
        self.parked_waker(key, settings.parked.fastpod, wake_parked(settings.parked, self.now()))

    def wake_failed(self, key: FunctionKey) -> None:
        """The wake-up could not be sent: the next request waiting for ``key`` sends another."""
        self._waking.pop(key, None)
        self._waking_parked.pop(key, None)

    def observe(self, key: FunctionKey) -> None:
        """Publish the function's queue, in-flight and ready gauges."""
        pool = self._pools.get(key)
        if pool is not None:
            parked = sum(1 for endpoint in pool.endpoints if endpoint.parked)
            self.metrics.load(function_label(key[1], key[0]), queued=pool.queued, inflight=pool.inflight,
                              ready=len(pool.endpoints) - parked, parked=parked)

    def _endpoints(self, key: FunctionKey) -> list[Endpoint]:
        return self._injected.get(key) or self._index.endpoints(key)

    def _refresh(self, changed: Iterable[FunctionKey]) -> None:
        for key in changed:
            pool = self._pools.get(key)
            endpoints = self._endpoints(key)
            if endpoints:
                self._waking.pop(key, None)  # woken
            if any(not endpoint.parked for endpoint in endpoints):
                self._waking_parked.pop(key, None)
                self._wake_wanted.discard(key)
            if pool is not None:
                pool.set_endpoints(endpoints)
                self.observe(key)
