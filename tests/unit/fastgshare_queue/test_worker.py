"""The queue worker's rules (:mod:`fastgshare_queue.worker`) through fake ports: retries, failures told to
the callback, acknowledgement only at the end, duplicates, malformed messages, per-function concurrency."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence
from typing import Any

from fastgshare_gateway import queue
from fastgshare_gateway.queue import AsyncRequest
from fastgshare_queue.worker import Delivery, Outcome, Settings, Worker

FAST = Settings(max_inflight=2, max_held=8, max_retries=3, retry_base_s=0.001, retry_max_s=0.002, ack_wait_s=30.0)


def request(call_id: str = "c1", function: str = "f", callback: str | None = "http://cb/") -> AsyncRequest:
    return AsyncRequest(call_id=call_id, function=function, namespace="ns", method="POST", path="", query="",
                        headers=(), body=b"in", callback_url=callback, queued_at=0.0)


class FakeDelivery:
    def __init__(self, data: bytes, num_delivered: int = 1) -> None:
        self._data, self._num = data, num_delivered
        self.settled: list[str] = []

    @property
    def data(self) -> bytes:
        return self._data

    @property
    def num_delivered(self) -> int:
        return self._num

    async def ack(self) -> None:
        self.settled.append("ack")

    async def nak(self, delay_s: float) -> None:
        self.settled.append("nak")

    async def in_progress(self) -> None:
        self.settled.append("in_progress")

    async def term(self) -> None:
        self.settled.append("term")


class FakeCalls:
    def __init__(self, statuses: list[int | None] | None = None, callback_statuses: list[int | None] | None = None,
                 gate: asyncio.Event | None = None) -> None:
        self.statuses = statuses or [200]
        self.callback_statuses = callback_statuses or [202]
        self.gate = gate
        self.invoked: list[str] = []
        self.callbacks: list[tuple[str, int | None, int]] = []
        self.running: collections.Counter[str] = collections.Counter()
        self.most: collections.Counter[str] = collections.Counter()
        self.order: list[str] = []  # "invoke"/"callback" events, with the deliveries' "ack" recorded apart

    async def invoke(self, req: AsyncRequest) -> Outcome:
        self.invoked.append(req.call_id)
        self.running[req.function] += 1
        self.most[req.function] = max(self.most[req.function], self.running[req.function])
        try:
            if self.gate is not None:
                await self.gate.wait()
            else:
                await asyncio.sleep(0)
        finally:
            self.running[req.function] -= 1
        status = self.statuses[min(len(self.invoked) - 1, len(self.statuses) - 1)]
        return Outcome(status, (("X-A", "1"),), b"out", 0.01, "" if status else "refused")

    async def post_callback(self, req: AsyncRequest, outcome: Outcome, attempts: int) -> int | None:
        self.callbacks.append((req.call_id, outcome.status, attempts))
        return self.callback_statuses[min(len(self.callbacks) - 1, len(self.callback_statuses) - 1)]


class Recorder:
    def __init__(self) -> None:
        self.events: collections.Counter[tuple[str, str]] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        def record(*args: Any) -> None:
            self.events[(name, str(args[0]) if args and name not in ("inflight",) else name)] += 1
        return record


def handle(calls: FakeCalls, *deliveries: FakeDelivery, settings: Settings = FAST) -> Recorder:
    recorder = Recorder()
    worker = Worker(calls, recorder, settings)

    async def scenario() -> None:
        for delivery in deliveries:
            await worker.handle(delivery)
    asyncio.run(scenario())
    return recorder


def test_429_and_500_are_retried_until_success_then_the_callback_then_the_ack() -> None:
    calls, delivery = FakeCalls([429, 500, 200]), FakeDelivery(queue.encode(request()))
    recorder = handle(calls, delivery)
    assert calls.invoked == ["c1"] * 3
    assert calls.callbacks == [("c1", 200, 3)]
    assert delivery.settled == ["ack"]
    assert recorder.events[("retry", "f.ns")] == 2
    assert recorder.events[("failure", "f.ns")] == 0
    assert recorder.events[("completed", "f.ns")] == 1


def test_a_function_that_keeps_failing_is_recorded_and_the_callback_gets_its_last_status() -> None:
    calls, delivery = FakeCalls([503, 500]), FakeDelivery(queue.encode(request()))
    recorder = handle(calls, delivery)
    assert len(calls.invoked) == FAST.max_retries + 1
    assert calls.callbacks == [("c1", 500, FAST.max_retries + 1)]
    assert delivery.settled == ["ack"]
    assert recorder.events[("failure", "f.ns")] == 1


def test_a_final_answer_is_not_retried() -> None:
    calls = FakeCalls([404])
    handle(calls, FakeDelivery(queue.encode(request())))
    assert calls.callbacks == [("c1", 404, 1)]


def test_an_unreachable_gateway_leaves_the_message_in_the_queue_without_a_callback() -> None:
    calls, delivery = FakeCalls([None]), FakeDelivery(queue.encode(request()))
    recorder = handle(calls, delivery)
    assert len(calls.invoked) == FAST.max_retries + 1
    assert calls.callbacks == []
    assert delivery.settled == ["nak"]
    assert recorder.events[("failure", "f.ns")] == 0


def test_a_callback_that_fails_is_retried_then_given_up_and_the_message_still_acknowledged() -> None:
    calls, delivery = FakeCalls([200], callback_statuses=[None, 500, 429, 503]), FakeDelivery(queue.encode(request()))
    recorder = handle(calls, delivery)
    assert len(calls.callbacks) == FAST.max_retries + 1
    assert delivery.settled == ["ack"]
    assert recorder.events[("callback_failure", "f.ns")] == 1


def test_without_a_callback_url_nothing_is_posted() -> None:
    calls, delivery = FakeCalls([200]), FakeDelivery(queue.encode(request(callback=None)))
    handle(calls, delivery)
    assert (calls.callbacks, delivery.settled) == ([], ["ack"])


def test_a_call_completed_here_and_delivered_again_is_acknowledged_not_run_again() -> None:
    calls = FakeCalls([200])
    first, again = FakeDelivery(queue.encode(request())), FakeDelivery(queue.encode(request()), num_delivered=2)
    recorder = handle(calls, first, again)
    assert calls.invoked == ["c1"]
    assert again.settled == ["ack"]
    assert recorder.events[("duplicate", "f.ns")] == 1
    assert recorder.events[("redelivery", "f.ns")] == 1


def test_a_redelivered_call_not_seen_here_runs() -> None:
    calls = FakeCalls([200])
    recorder = handle(calls, FakeDelivery(queue.encode(request()), num_delivered=3))
    assert calls.invoked == ["c1"]
    assert recorder.events[("redelivery", "f.ns")] == 1


def test_a_malformed_message_is_terminated_not_redelivered() -> None:
    calls, delivery = FakeCalls(), FakeDelivery(b"garbage")
    recorder = handle(calls, delivery)
    assert (calls.invoked, delivery.settled) == ([], ["term"])
    assert recorder.events[("malformed", "malformed")] == 1


class ListSource:
    def __init__(self, deliveries: list[Delivery], stop: asyncio.Event) -> None:
        self.waiting = list(deliveries)
        self.stop = stop
        self.batches: list[int] = []

    async def fetch(self, batch: int, timeout_s: float) -> Sequence[Delivery]:
        self.batches.append(batch)
        taken, self.waiting = self.waiting[:batch], self.waiting[batch:]
        if not taken:
            await asyncio.sleep(0.01)
        return taken


def test_at_most_max_inflight_calls_per_function_and_other_functions_are_not_held_up() -> None:
    async def scenario() -> tuple[FakeCalls, list[FakeDelivery], ListSource]:
        gate, stop = asyncio.Event(), asyncio.Event()
        calls = FakeCalls([200], gate=gate)
        deliveries = [FakeDelivery(queue.encode(request(f"a{i}", "a"))) for i in range(6)]
        deliveries += [FakeDelivery(queue.encode(request(f"b{i}", "b"))) for i in range(2)]
        source = ListSource(list(deliveries), stop)
        worker = Worker(calls, Recorder(), FAST)
        loop_task = asyncio.create_task(worker.run(source, stop))
        while calls.running["a"] + calls.running["b"] < 4:  # a: 2 (its cap), b: 2
            await asyncio.sleep(0.001)
        gate.set()
        while any(not d.settled for d in deliveries):
            await asyncio.sleep(0.001)
        stop.set()
        await loop_task
        return calls, deliveries, source
    calls, deliveries, source = asyncio.run(scenario())
    assert calls.most == {"a": FAST.max_inflight, "b": 2}
    assert all(d.settled == ["ack"] for d in deliveries)
    assert max(source.batches) <= FAST.max_held


def test_no_more_than_max_held_messages_are_taken() -> None:
    async def scenario() -> list[int]:
        gate, stop = asyncio.Event(), asyncio.Event()
        calls = FakeCalls([200], gate=gate)
        settings = Settings(max_inflight=100, max_held=3, max_retries=0)
        source = ListSource([FakeDelivery(queue.encode(request(f"c{i}"))) for i in range(10)], stop)
        task = asyncio.create_task(Worker(calls, Recorder(), settings).run(source, stop))
        while len(calls.invoked) < 3:
            await asyncio.sleep(0.001)
        for _ in range(20):
            await asyncio.sleep(0.001)
        held = len(calls.invoked)
        gate.set()
        while len(calls.invoked) < 10:
            await asyncio.sleep(0.001)
        stop.set()
        await task
        return [held, *source.batches]
    held, *batches = asyncio.run(scenario())
    assert held == 3
    assert max(batches) <= 3
