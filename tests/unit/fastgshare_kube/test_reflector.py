"""The list+watch loop: events reach the store, a normal end resumes, 410 Gone and errors relist."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from fastgshare_kube.errors import ApiError
from fastgshare_kube.reflector import Reflector
from fastgshare_kube.store import Store, whole
from tests.unit.fastgshare_kube.fakes import ScriptedListWatch


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "team-a", "name": name, "uid": f"uid-{name}"}, "spec": {}}


def event(kind: str, obj: dict, version: str) -> dict:
    obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": version}}
    return {"type": kind, "object": obj}


def run(source: ScriptedListWatch, until: Callable[[], bool]) -> tuple[list[tuple[str | None, str | None]], Reflector]:
    changes: list[tuple[str | None, str | None]] = []

    def record(old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        changes.append((old["metadata"]["name"] if old else None, new["metadata"]["name"] if new else None))

    store = Store(record, convert=whole)
    reflector = Reflector("pods", source, store, retry_delay_s=0.01)
    reflector.start()
    try:
        assert reflector.wait_synced(5)
        wait_for(until)
    finally:
        reflector.stop()
    return changes, reflector


def test_events_are_applied_and_a_watch_that_ends_is_resumed_from_the_last_version() -> None:
    source = ScriptedListWatch()
    source.lists = [([pod("a")], "10")]
    source.watches = [[event("ADDED", pod("b"), "11"), event("BOOKMARK", {"metadata": {}}, "12")],
                      [event("DELETED", pod("a"), "13")]]
    changes, _ = run(source, lambda: len(source.watched_from) == 3)
    assert changes == [(None, "a"), (None, "b"), ("a", None)]
    assert source.watched_from == ["10", "12", "13"]


def test_gone_relists_and_the_store_reports_what_changed_meanwhile() -> None:
    source = ScriptedListWatch()
    source.lists = [([pod("a"), pod("b")], "10"), ([pod("b"), pod("c")], "20")]
    source.watches = [[{"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                                     "message": "too old resource version"}}]]
    changes, reflector = run(source, lambda: source.watched_from == ["10", "20"])
    assert sorted(changes[2:], key=str) == [("a", None), (None, "c")]
    assert reflector.relists == 2


def test_a_failed_watch_relists_after_a_delay() -> None:
    source = ScriptedListWatch()
    source.lists = [([pod("a")], "10"), ([pod("a")], "30")]
    source.watches = [[ConnectionResetError("peer reset")], [ApiError(410, "Gone")]]
    _, reflector = run(source, lambda: len(source.watched_from) == 2)
    assert source.watched_from == ["10", "30"]
    assert reflector.relists == 2


def test_a_missing_resource_is_named_with_the_fix_and_retried_with_growing_delays(
        caplog: pytest.LogCaptureFixture) -> None:
    """Issue 15, defect 7: a missing CRD showed only as '404 NotFound' retried every second."""
    source = ScriptedListWatch()
    missing = ApiError(404, "NotFound", "the server could not find the requested resource")
    source.lists = [missing, missing, missing, missing, ([pod("a")], "10")]
    store = Store(lambda old, new: None, convert=whole)
    reflector = Reflector("fastpods", source, store, retry_delay_s=0.01, max_retry_delay_s=0.04,
                          hints={404: "the FaSTPod CRD is not installed; install it"})
    reflector.start()
    try:
        assert reflector.wait_synced(5)
    finally:
        reflector.stop()
    messages = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(messages) == 4
    assert messages[0] == ("list/watch failed resource=fastpods error=404 NotFound: the server could not find the "
                           "requested resource: the FaSTPod CRD is not installed; install it; retrying in 0.01s")
    assert [m.rsplit("retrying in ", 1)[1] for m in messages] == ["0.01s", "0.02s", "0.04s", "0.04s"]
