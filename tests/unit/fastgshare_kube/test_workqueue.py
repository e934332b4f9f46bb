"""The work queue: deduplication, one worker per key, delayed and rate-limited retries, shutdown, metrics."""

from __future__ import annotations

import threading

from fastgshare_kube.workqueue import WorkQueue


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_key_added_many_times_is_processed_once() -> None:
    queue = WorkQueue()
    for key in ("a", "b", "a", "a", "c", "b"):
        queue.add(key)
    assert len(queue) == 3
    assert [queue.get(0), queue.get(0), queue.get(0), queue.get(0)] == ["a", "b", "c", None]


def test_a_key_being_processed_is_not_handed_out_again_until_done() -> None:
    queue = WorkQueue()
    queue.add("a")
    assert queue.get(0) == "a"
    queue.add("a")  # changed while a worker has it
    assert queue.get(0) is None  # not to a second worker
    queue.done("a")
    assert queue.get(0) == "a"  # again, after the first worker finished
    queue.done("a")
    assert queue.get(0) is None


def test_rate_limited_retries_back_off_exponentially_and_forget_resets() -> None:
    clock = Clock()
    queue = WorkQueue(base_delay_s=0.5, max_delay_s=3.0, clock=clock)
    assert [queue.add_rate_limited("a") for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert queue.failures("a") == 5
    queue.forget("a")
    assert queue.failures("a") == 0
    assert queue.add_rate_limited("a") == 0.5


def test_delayed_keys_come_when_due() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    queue.add_after("later", 2.0)
    queue.add_after("sooner", 1.0)
    assert queue.get(0) is None
    clock.now += 1.5
    assert queue.get(0) == "sooner"
    assert queue.get(0) is None
    clock.now += 1.0
    assert queue.get(0) == "later"


def test_shutdown_wakes_a_waiting_worker() -> None:
    queue = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(queue.get()))
    worker.start()
    queue.shut_down()
    worker.join(5)
    assert got == [None]
    queue.add("ignored")
    assert queue.get(0) is None


def test_a_blocked_worker_wakes_for_a_new_key() -> None:
    queue = WorkQueue()
    got: list[str | None] = []
    worker = threading.Thread(target=lambda: got.append(queue.get(timeout_s=10)))
    worker.start()
    queue.add("a")
    worker.join(5)
    assert got == ["a"]


class Observer:
    def __init__(self) -> None:
        self.waits: list[float] = []
        self.retries = 0

    def queue_waited(self, seconds: float) -> None:
        self.waits.append(seconds)

    def retried(self) -> None:
        self.retries += 1


def test_the_queue_reports_how_long_each_key_waited() -> None:
    clock, observer = Clock(), Observer()
    queue = WorkQueue(clock=clock, observer=observer)
    queue.add("a/x")
    clock.now += 2.5
    queue.add("a/x")  # deduplicated: the wait counts from the first add
    queue.add("a/y")
    clock.now += 0.5
    assert queue.get(0) == "a/x"
    assert queue.get(0) == "a/y"
    assert observer.waits == [3.0, 0.5]


def test_each_rate_limited_retry_is_reported_and_a_plain_add_is_not() -> None:
    observer = Observer()
    queue = WorkQueue(clock=Clock(), observer=observer)
    queue.add("a")
    queue.add_after("b", 1.0)
    assert observer.retries == 0
    queue.add_rate_limited("a")
    queue.add_rate_limited("a")
    assert observer.retries == 2
