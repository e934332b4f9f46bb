"""How a controller runs: no worker before every cache filled, a clean stop, and the leader-elected loop."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from fastgshare_kube.errors import ApiError
from fastgshare_kube.leader import LeaderElector
from fastgshare_kube.reflector import Reflector
from fastgshare_kube.runner import Workers, run_elected
from fastgshare_kube.store import Store, whole
from fastgshare_kube.workqueue import WorkQueue
from tests.unit.fastgshare_kube.fakes import FakeLeases


class Source:
    """A ListWatch whose list answers once ``listable`` is set; its watch waits until closed."""

    def __init__(self, listable: bool = True) -> None:
        self.listable = threading.Event()
        if listable:
            self.listable.set()
        self.closed = threading.Event()

    def list(self) -> tuple[list[dict[str, Any]], str]:
        while not self.listable.wait(0.01):
            if self.closed.is_set():
                raise ApiError(0, "Closed")
        return [{"metadata": {"namespace": "a", "name": "x"}}], "1"

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        self.closed.wait()
        return iter(())

    def close(self) -> None:
        self.closed.set()


def reflector(name: str, source: Source) -> Reflector:
    return Reflector(name, source, Store(lambda old, new: None, convert=whole), retry_delay_s=0.01)


def test_a_cache_that_does_not_fill_is_named_and_no_worker_starts() -> None:
    queue = WorkQueue()
    workers = Workers(queue, sync_timeout_s=0.05)
    ran = threading.Event()
    stuck = Source(listable=False)
    with pytest.raises(TimeoutError, match="the pods cache did not fill within 0s"):
        workers.start([reflector("fastpods", Source()), reflector("pods", stuck)], [("worker", ran.set)])
    workers.stop(grace_s=1)
    assert not ran.is_set()
    assert stuck.closed.is_set()


def test_workers_start_after_the_caches_fill_and_stop_with_the_queue() -> None:
    queue = WorkQueue()
    workers = Workers(queue)
    source = Source()
    taken: list[str | None] = []
    ticks = threading.Semaphore(0)

    def work() -> None:
        while (key := queue.get()) is not None:
            taken.append(key)
            queue.done(key)

    workers.start([reflector("things", source)], [("worker", work), ("tick", workers.every(0.001, ticks.release))])
    assert workers.alive
    queue.add("a/x")
    assert ticks.acquire(timeout=5)
    workers.stop(grace_s=5)
    assert taken == ["a/x"]
    assert not workers.alive
    assert source.closed.is_set()


def elector(leases: FakeLeases) -> LeaderElector:
    return LeaderElector(leases, "sys", "lease", "me", lease_duration_s=0.3, renew_deadline_s=0.2,
                         retry_period_s=0.01)


class Calls:
    def __init__(self, fail_start: bool = False) -> None:
        self.seen: list[str] = []
        self.fail_start = fail_start

    def start(self) -> None:
        self.seen.append("start")
        if self.fail_start:
            raise TimeoutError("the pods cache did not fill within 120s")

    def stop(self) -> None:
        self.seen.append("stop")


def test_a_stop_request_stops_the_controller_and_releases_the_lease() -> None:
    leases, calls, stopping = FakeLeases(), Calls(), threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(run_elected(
        elector(leases), stopping, start=calls.start, stop=calls.stop, not_filled_hint="")))
    thread.start()
    try:
        while calls.seen != ["start"]:
            assert thread.is_alive()
            thread.join(0.01)
    finally:
        stopping.set()
        thread.join(5)
    assert result == [0]
    assert calls.seen == ["start", "stop"]
    assert leases.leases[("sys", "lease")]["spec"]["holderIdentity"] == ""  # released for a standby


def test_a_lost_lease_stops_the_controller_with_status_1() -> None:
    leases, calls, stopping = FakeLeases(), Calls(), threading.Event()

    def lose() -> None:
        leases.fail("get/leases", *[ApiError(500, "InternalError", "etcd")] * 1000)

    try:
        assert run_elected(elector(leases), stopping, start=calls.start, stop=calls.stop, not_filled_hint="",
                           started=lose) == 1
    finally:
        stopping.set()
    assert calls.seen == ["start", "stop"]


def test_caches_that_do_not_fill_are_one_line_with_the_hint(caplog: pytest.LogCaptureFixture) -> None:
    calls = Calls(fail_start=True)
    assert run_elected(None, threading.Event(), start=calls.start, stop=calls.stop,
                       not_filled_hint="is the CRD installed?") == 1
    assert calls.seen == ["start", "stop"]
    assert "the pods cache did not fill within 120s; is the CRD installed?" in caplog.text


def test_a_missing_lease_namespace_is_one_line_and_nothing_starts(caplog: pytest.LogCaptureFixture) -> None:
    leases, calls = FakeLeases(), Calls()
    leases.fail("create/leases", ApiError(404, "NotFound", "namespaces \"sys\" not found"))
    assert run_elected(elector(leases), threading.Event(), start=calls.start, stop=calls.stop,
                       not_filled_hint="") == 1
    assert calls.seen == []
    assert "the leader-election namespace 'sys' does not exist" in caplog.text
