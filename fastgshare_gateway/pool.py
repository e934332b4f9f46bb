"""Admission of one function's requests to its pods: a bounded FIFO queue and per-pod in-flight counts.

A request takes a pod at once when none is queued before it and a pod admits it (fewer than
``max_inflight`` in flight there); the pod is the dispatcher's choice
(:class:`fastgshare.dispatch.Dispatcher`: requests in proportion to capacity). Otherwise it waits in the
function's FIFO queue: :class:`QueueFull` when ``max_queue`` wait already (429), :class:`QueueTimeout`
after ``queue_timeout_s`` (503). A finished request or a changed set of endpoints hands pods to the
waiting requests in order. Runs on the event loop only (asyncio, no locks).

Scale from zero is a hook: ``on_idle_wait`` is called (once per wait) when a request starts waiting while
the function has no endpoint at all; it may wake the function and returns how long to hold the request
instead of ``queue_timeout_s`` (None: the queue timeout), and a request held that long without a pod gets
:class:`ColdStartTimeout` (503). The gateway's hook is :meth:`fastgshare_gateway.routing.Functions.on_idle_wait`.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Collection

import attrs

from fastgshare.dispatch import Dispatcher, PodLoad
from fastgshare_gateway.endpoints import Endpoint, FunctionKey


class QueueFull(Exception):
    """The function's queue is at its bound."""


class QueueTimeout(Exception):
    """No pod took the request within the queue timeout."""


class ColdStartTimeout(QueueTimeout):
    """The function, woken from zero replicas, had no ready pod within the cold-start timeout."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        super().__init__(f"no ready pod within the cold-start timeout ({timeout_s:g}s)")


@attrs.frozen
class Limits:
    max_queue: int = 1000  # requests waiting per function
    queue_timeout_s: float = 30.0
    max_inflight: int = 8  # per pod


class FunctionPool:
    """One function's endpoints, in-flight counts and queue."""

    def __init__(self, key: FunctionKey, limits: Limits,
                 on_idle_wait: Callable[[FunctionKey], float | None] | None = None) -> None:
        self.key = key
        self.limits = limits
        self._on_idle_wait = on_idle_wait
        self._endpoints: dict[str, Endpoint] = {}
        self._inflight: dict[str, int] = {}
        self._dispatcher = Dispatcher()
        self._waiting: collections.deque[asyncio.Future[Endpoint]] = collections.deque()

    @property
    def endpoints(self) -> list[Endpoint]:
        return list(self._endpoints.values())

    @property
    def queued(self) -> int:
        return len(self._waiting)

    @property
    def inflight(self) -> int:
        return sum(self._inflight.values())

    def set_endpoints(self, endpoints: Collection[Endpoint]) -> None:
        self._endpoints = {e.pod: e for e in endpoints}
        # a pod that left keeps its in-flight requests' count until they finish
        self._inflight = {pod: n for pod, n in self._inflight.items() if n > 0 or pod in self._endpoints}
        self._pump()

    def _choose(self, exclude: Collection[str] = ()) -> Endpoint | None:
        loads = [PodLoad(name=e.pod, capacity_rps=e.capacity, queued=self._inflight.get(e.pod, 0),
                         max_queued=self.limits.max_inflight)
                 for e in self._endpoints.values() if e.pod not in exclude]
        chosen = self._dispatcher.choose(loads)
        if chosen is None:
            return None
        self._inflight[chosen] = self._inflight.get(chosen, 0) + 1
        return self._endpoints[chosen]

    async def acquire(self) -> Endpoint:
        """A pod for one request (call :meth:`release` when it is done); raises QueueFull / QueueTimeout."""
        if not self._waiting and (endpoint := self._choose()) is not None:
            return endpoint
        if len(self._waiting) >= self.limits.max_queue:
            raise QueueFull
        future: asyncio.Future[Endpoint] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        hold_s = None
        if not self._endpoints and self._on_idle_wait is not None:
            hold_s = self._on_idle_wait(self.key)
        try:
            return await asyncio.wait_for(asyncio.shield(future), hold_s or self.limits.queue_timeout_s)
        except TimeoutError:
            if future.done() and not future.cancelled():  # a pod came with the timeout: give it back
                self.release(future.result())
            raise (QueueTimeout() if hold_s is None else ColdStartTimeout(hold_s)) from None
        except asyncio.CancelledError:  # the client left
            if future.done() and not future.cancelled():
                self.release(future.result())
            raise
        finally:
            if future in self._waiting:
                self._waiting.remove(future)
            future.cancel()

    def retry_endpoint(self, failed: Collection[str]) -> Endpoint | None:
        """Another pod, now, for a request whose pod could not be reached (no queueing); None if none."""
        return self._choose(exclude=failed)

    def release(self, endpoint: Endpoint) -> None:
        count = self._inflight.get(endpoint.pod, 0) - 1
        if count > 0 or endpoint.pod in self._endpoints:
            self._inflight[endpoint.pod] = max(count, 0)
        else:
            self._inflight.pop(endpoint.pod, None)
        self._pump()

    def _pump(self) -> None:
        while self._waiting:
            if self._waiting[0].done():
                self._waiting.popleft()
                continue
            endpoint = self._choose()
            if endpoint is None:
                return
            self._waiting.popleft().set_result(endpoint)
