"""Admission of one function's requests to its pods: a bounded FIFO queue and per-pod in-flight counts.

A request takes a pod at once when none is queued before it and a pod admits it (fewer than
``max_inflight`` in flight there); the pod is the dispatcher's choice
(:class:`fastgshare.dispatch.Dispatcher`: requests in proportion to capacity). Otherwise it waits in the
function's FIFO queue: :class:`QueueFull` when ``max_queue`` wait already (429), :class:`QueueTimeout`
after ``queue_timeout_s`` (503). A finished request or a changed set of endpoints hands pods to the
waiting requests in order. Runs on the event loop only (asyncio, no locks).

A pod that could not be reached (a connect failure: nothing was sent) is left out for ``eject_s``
(:meth:`FunctionPool.unreachable`), as a proxy's outlier detection does: a node that died keeps its
pods in the watch until Kubernetes marks them not ready (seconds), and requests should not keep
finding them meanwhile. If every pod is left out, they are all tried again.

Scale from zero is a hook: ``on_idle_wait`` is called (once per wait) when a request starts waiting while
the function has no endpoint at all; it may wake the function and returns how long to hold the request
instead of ``queue_timeout_s`` (None: the queue timeout), and a request held that long without a pod gets
:class:`ColdStartTimeout` (503). The gateway's hook is :meth:`fastgshare_gateway.routing.Functions.on_idle_wait`.
"""

from __future__ import annotations

import asyncio
import collections
import time
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
    eject_s: float = 10.0  # how long a pod that could not be reached is left out


class FunctionPool:
    """One function's endpoints, in-flight counts and queue."""

    def __init__(self, key: FunctionKey, limits: Limits,
                 on_idle_wait: Callable[[FunctionKey], float | None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.key = key
        self._clock = clock
        self._ejected: dict[str, float] = {}  # pod -> until when it is left out
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

    def unreachable(self, pod: str) -> None:
        """``pod`` could not be reached: leave it out for ``eject_s``."""
        self._ejected[pod] = self._clock() + self.limits.eject_s

    def _left_out(self) -> set[str]:
        now = self._clock()
        self._ejected = {pod: until for pod, until in self._ejected.items() if until > now and pod in self._endpoints}
        return set(self._ejected)

    def _choose(self, exclude: Collection[str] = ()) -> Endpoint | None:
        candidates = [e for e in self._endpoints.values() if e.pod not in exclude]
        left_out = self._left_out()
        if any(e.pod not in left_out for e in candidates):
            candidates = [e for e in candidates if e.pod not in left_out]
        loads = [PodLoad(name=e.pod, capacity_rps=e.capacity, queued=self._inflight.get(e.pod, 0),
                         max_queued=self.limits.max_inflight) for e in candidates]
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
