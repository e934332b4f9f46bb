"""The gateway's view of its functions: which exist, their endpoints and their pools. Event-loop only.

A function exists when a FaSTFunc of that name is in one of the gateway's namespaces or some pod carries
its label (ready or not; in the default function namespace also a FaSTPod's pods, see
:mod:`fastgshare_gateway.endpoints`). The Kubernetes adapter feeds pods and FaSTFunc names here from its
watch threads through ``loop.call_soon_threadsafe``; tests call the same methods, or :meth:`set_endpoints`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

from fastgshare import keys
from fastgshare_gateway.endpoints import Endpoint, EndpointIndex, FunctionKey
from fastgshare_gateway.metrics import GatewayMetrics, function_label
from fastgshare_gateway.pool import FunctionPool, Limits


class Functions:
    def __init__(self, namespaces: Collection[str], limits: Limits, metrics: GatewayMetrics, *,
                 default_namespace: str = keys.DEFAULT_FUNCTION_NAMESPACE,
                 on_idle_wait: Callable[[FunctionKey], None] | None = None) -> None:
        self.namespaces = tuple(namespaces)
        self.default_namespace = default_namespace
        self.limits = limits
        self.metrics = metrics
        self._on_idle_wait = on_idle_wait
        self._index = EndpointIndex(default_namespace)
        self._fastfuncs: set[FunctionKey] = set()
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

    def replace_fastfuncs(self, namespace: str, names: Iterable[str]) -> None:
        """A (re)list of one namespace's FaSTFuncs."""
        self._fastfuncs = {key for key in self._fastfuncs if key[0] != namespace} | {(namespace, n) for n in names}

    def add_fastfunc(self, key: FunctionKey) -> None:
        self._fastfuncs.add(key)

    def remove_fastfunc(self, key: FunctionKey) -> None:
        self._fastfuncs.discard(key)

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
            pool = self._pools[key] = FunctionPool(key, self.limits, self._on_idle_wait)
            pool.set_endpoints(self._endpoints(key))
        return pool

    def observe(self, key: FunctionKey) -> None:
        """Publish the function's queue, in-flight and ready gauges."""
        pool = self._pools.get(key)
        if pool is not None:
            self.metrics.load(function_label(key[1], key[0]), queued=pool.queued, inflight=pool.inflight,
                              ready=len(pool.endpoints))

    def _endpoints(self, key: FunctionKey) -> list[Endpoint]:
        return self._injected.get(key) or self._index.endpoints(key)

    def _refresh(self, changed: Iterable[FunctionKey]) -> None:
        for key in changed:
            pool = self._pools.get(key)
            if pool is not None:
                pool.set_endpoints(self._endpoints(key))
                self.observe(key)
