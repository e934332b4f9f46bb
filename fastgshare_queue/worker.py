"""The queue worker's loop and rules (see :mod:`fastgshare_queue`), through ports: :class:`Source` gives
messages (:class:`Delivery`), :class:`Calls` makes the HTTP calls, :class:`Counters` records. No NATS, no
HTTP here; asyncio for the tasks and the back-off sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import attrs

from fastgshare_gateway.queue import AsyncRequest, BadMessage, QueueUnavailable, decode
from fastgshare_queue.retry import delay_s, retryable

log = logging.getLogger(__name__)

FETCH_BATCH = 64
FETCH_WAIT_S = 1.0
REMEMBERED_CALLS = 10_000


@attrs.frozen
class Outcome:
    """One call's answer; ``status`` None: the gateway could not be reached (``error`` says why)."""

    status: int | None
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""
    duration_s: float = 0.0
    error: str = ""


class Delivery(Protocol):
    @property
    def data(self) -> bytes: ...
    @property
    def num_delivered(self) -> int: ...
    async def ack(self) -> None: ...
    async def nak(self, delay_s: float) -> None: ...
    async def in_progress(self) -> None: ...
    async def term(self) -> None: ...


class Source(Protocol):
    async def fetch(self, batch: int, timeout_s: float) -> Sequence[Delivery]:
        """Up to ``batch`` messages, [] when none came within ``timeout_s``; :class:`QueueUnavailable`."""
        ...


class Calls(Protocol):
    async def invoke(self, request: AsyncRequest) -> Outcome: ...
    async def post_callback(self, request: AsyncRequest, outcome: Outcome, attempts: int) -> int | None:
        """The callback's status, None when it could not be reached."""
        ...


class Counters(Protocol):
    def inflight(self, function: str, delta: int) -> None: ...
    def retry(self, function: str) -> None: ...
    def failure(self, function: str) -> None: ...
    def callback_failure(self, function: str) -> None: ...
    def duplicate(self, function: str) -> None: ...
    def redelivery(self, function: str) -> None: ...
    def completed(self, function: str, status: int) -> None: ...
    def malformed(self) -> None: ...


@attrs.frozen
class Settings:
    max_inflight: int = 8  # calls at once per function
    max_held: int = 256  # messages taken from the stream and not yet acknowledged, all functions
    max_retries: int = 5
    retry_base_s: float = 0.5
    retry_max_s: float = 30.0
    ack_wait_s: float = 30.0  # JetStream redelivers a message not acknowledged (nor in progress) within this
    shutdown_timeout_s: float = 10.0


class Worker:
    def __init__(self, calls: Calls, counters: Counters, settings: Settings | None = None) -> None:
        self.calls = calls
        self.counters = counters
        self.settings = settings or Settings()
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._done: OrderedDict[str, None] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()

    # --- the loop ----------------------------------------------------------------------------
    async def run(self, source: Source, stop: asyncio.Event) -> None:
        """Take messages and handle each in a task until ``stop``; then give the tasks in progress up to
        ``shutdown_timeout_s`` (the unfinished ones are delivered again later)."""
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                free = self.settings.max_held - len(self._tasks)
                if free <= 0:
                    await asyncio.wait([*self._tasks, stopping], return_when=asyncio.FIRST_COMPLETED)
                    continue
                try:
                    deliveries = await source.fetch(min(free, FETCH_BATCH), FETCH_WAIT_S)
                except QueueUnavailable as error:
                    log.warning("cannot take messages: %s; retrying", error)
                    await asyncio.wait([stopping], timeout=1.0)
                    continue
                for delivery in deliveries:
                    task = asyncio.get_running_loop().create_task(self.handle(delivery))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            stopping.cancel()
            if self._tasks:
                log.info("stopping: %d calls in progress, waiting up to %gs", len(self._tasks),
                         self.settings.shutdown_timeout_s)
                _, pending = await asyncio.wait(list(self._tasks), timeout=self.settings.shutdown_timeout_s)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

    # --- one message -------------------------------------------------------------------------
    async def handle(self, delivery: Delivery) -> None:
        try:
            await self._handle(delivery)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("a message could not be handled; JetStream delivers it again after --ack-wait")

    async def _handle(self, delivery: Delivery) -> None:
        try:
            request = decode(delivery.data)
        except BadMessage as error:
            log.error("dropping a message that is no async request: %s", error)
            self.counters.malformed()
            await delivery.term()
            return
        label = request.label
        if delivery.num_delivered > 1:
            self.counters.redelivery(label)
        if request.call_id in self._done:
            log.info("call=%s function=%s delivered again after it completed here; acknowledged, not run again",
                     request.call_id, label)
            self.counters.duplicate(label)
            await delivery.ack()
            return
        beat = asyncio.get_running_loop().create_task(self._heartbeat(delivery))
        try:
            async with self._slot(label):
                self.counters.inflight(label, 1)
                try:
                    outcome, attempts = await self._call(request)
                finally:
                    self.counters.inflight(label, -1)
            if outcome.status is None:
                log.warning("call=%s function=%s: the gateway was unreachable %d times (%s); left in the queue",
                            request.call_id, label, attempts, outcome.error)
                await delivery.nak(self.settings.retry_max_s)
                return
            if request.callback_url:
                await self._callback(request, outcome, attempts)
            await delivery.ack()
        finally:
            beat.cancel()
        self._remember(request.call_id)
        self.counters.completed(label, outcome.status)

    def _slot(self, label: str) -> asyncio.Semaphore:
        slot = self._slots.get(label)
        if slot is None:
            slot = self._slots[label] = asyncio.Semaphore(self.settings.max_inflight)
        return slot

    def _remember(self, call_id: str) -> None:
        self._done[call_id] = None
        while len(self._done) > REMEMBERED_CALLS:
            self._done.popitem(last=False)

    async def _heartbeat(self, delivery: Delivery) -> None:
        """Tell JetStream the message is being worked on, so that it is not redelivered meanwhile."""
        while True:
            await asyncio.sleep(self.settings.ack_wait_s / 3)
            try:
                await delivery.in_progress()
            except Exception as error:
                log.debug("in-progress acknowledgement not sent: %s", error)

    async def _call(self, request: AsyncRequest) -> tuple[Outcome, int]:
        label, attempts = request.label, 0
        while True:
            attempts += 1
            outcome = await self.calls.invoke(request)
            if not retryable(outcome.status):
                return outcome, attempts
            if attempts > self.settings.max_retries:
                if outcome.status is not None:
                    log.warning("call=%s function=%s failed: status %d after %d attempts (--max-retries %d)",
                                request.call_id, label, outcome.status, attempts, self.settings.max_retries)
                    self.counters.failure(label)
                return outcome, attempts
            self.counters.retry(label)
            wait = delay_s(attempts, self.settings.retry_base_s, self.settings.retry_max_s)
            log.info("call=%s function=%s: %s; retry %d of %d in %gs", request.call_id, label,
                     f"status {outcome.status}" if outcome.status is not None else outcome.error, attempts,
                     self.settings.max_retries, wait)
            await asyncio.sleep(wait)

    async def _callback(self, request: AsyncRequest, outcome: Outcome, attempts: int) -> None:
        label = request.label
        for attempt in range(1, self.settings.max_retries + 2):
            status = await self.calls.post_callback(request, outcome, attempts)
            if not retryable(status):
                log.info("call=%s function=%s status=%s: callback answered %s", request.call_id, label,
                         outcome.status, status)
                return
            if attempt <= self.settings.max_retries:
                await asyncio.sleep(delay_s(attempt, self.settings.retry_base_s, self.settings.retry_max_s))
        log.warning("call=%s function=%s: callback %s not taken after %d attempts (last: %s); given up",
                    request.call_id, label, request.callback_url, self.settings.max_retries + 1,
                    status if status is not None else "unreachable")
        self.counters.callback_failure(label)
