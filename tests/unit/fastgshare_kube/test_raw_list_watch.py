"""The layer's list-then-watch loop (:class:`Reflector` over :class:`RawListWatch`) against a scripted
generated ``list_*`` call: events, bookmarks, paging, 410 Gone, failures.

On a real API server a watch of pods or nodes rarely expires (they are served from the watch
cache), so the relist path is driven here by a watch that ends with an ERROR 410 event.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

from fastgshare_kube.reflector import Reflector
from fastgshare_kube.rest import RawListWatch


class FakeResponse:
    """What ``_preload_content=False`` returns: ``.data`` for a list, a byte stream for a watch."""

    def __init__(self, body: object = None, lines: list[dict[str, object]] | None = None) -> None:
        self.data = json.dumps(body).encode() if body is not None else b""
        self._lines = lines or []

    def stream(self, amt: object = None, decode_content: object = None) -> Iterator[bytes]:
        for line in self._lines:
            yield (json.dumps(line) + "\n").encode()

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def pod(name: str, version: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "n", "uid": name, "resourceVersion": version}}


class ScriptedApi:
    """Answers list and watch calls from a script; the last watch blocks until the test ends."""

    def __init__(self, script: list[FakeResponse | Exception]) -> None:
        self.script = script
        self.calls: list[dict[str, Any]] = []
        self.done = threading.Event()

    def __call__(self, **kwargs: Any) -> FakeResponse:
        self.calls.append(kwargs)
        if not self.script:
            self.done.set()
            raise ConnectionError("script finished")
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


class Recorder:
    """A sink that writes down what reached it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self.seen.append(("list", [item["metadata"]["name"] for item in objects]))

    def upsert(self, obj: Any) -> None:
        self.seen.append(("ADDED", obj["metadata"]["name"]))

    def delete(self, obj: Any) -> None:
        self.seen.append(("DELETED", obj["metadata"]["name"]))


def run(script: list[FakeResponse | Exception]) -> tuple[ScriptedApi, list[tuple[str, object]]]:
    api = ScriptedApi(script)
    sink = Recorder()
    reflector = Reflector("pods", RawListWatch(api), sink, retry_delay_s=0.01, max_retry_delay_s=0.05)
    reflector.start()
    assert api.done.wait(10)
    reflector.stop()
    return api, sink.seen


def test_lists_then_watches_from_the_list_version() -> None:
    api, seen = run([
        FakeResponse({"metadata": {"resourceVersion": "10"}, "items": [pod("a", "9")]}),
        FakeResponse(lines=[{"type": "ADDED", "object": pod("b", "11")},
                            {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
                            {"type": "DELETED", "object": pod("a", "13")}]),
    ])
    assert seen[:3] == [("list", ["a"]), ("ADDED", "b"), ("DELETED", "a")]
    assert api.calls[1]["watch"] is True
    assert api.calls[1]["resource_version"] == "10"
    assert api.calls[2]["resource_version"] == "13"  # the next watch resumes after the last event


def test_pages_through_a_long_list() -> None:
    _, seen = run([
        FakeResponse({"metadata": {"resourceVersion": "10", "continue": "page-2"}, "items": [pod("a", "1")]}),
        FakeResponse({"metadata": {"resourceVersion": "10"}, "items": [pod("b", "2")]}),
    ])
    assert seen[0] == ("list", ["a", "b"])


def test_gone_watch_is_followed_by_a_fresh_list() -> None:
    api, seen = run([
        FakeResponse({"metadata": {"resourceVersion": "10"}, "items": [pod("a", "9")]}),
        FakeResponse(lines=[{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}]),
        FakeResponse({"metadata": {"resourceVersion": "50"}, "items": [pod("c", "49")]}),
    ])
    assert seen[:2] == [("list", ["a"]), ("list", ["c"])]
    assert "watch" not in api.calls[2]


def test_failed_calls_are_retried_with_a_list() -> None:
    _, seen = run([
        ConnectionError("connection refused"),
        FakeResponse({"metadata": {"resourceVersion": "10"}, "items": []}),
    ])
    assert seen[0] == ("list", [])
