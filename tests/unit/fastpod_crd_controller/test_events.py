"""Events on FaSTPods: the v1 Event body, repeats folded into a count, and written in the background."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest

from fastpod_crd_controller.errors import ApiError
from fastpod_crd_controller.events import BackgroundEvents, EventRecorder
from tests.unit.fastpod_crd_controller.fakes import FakeKube
from tests.unit.fastpod_crd_controller.objects import UID, fastpod


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_the_event_shows_on_the_fastpod() -> None:
    kube = FakeKube()
    EventRecorder(kube, instance="ctl-1", timestamp=lambda: "T").event(fastpod(), "Warning", "InvalidSpec", "bad")
    [event] = kube.events
    event["metadata"].pop("name")
    assert event == {
        "apiVersion": "v1", "kind": "Event", "metadata": {"namespace": "team-a"},
        "involvedObject": {"apiVersion": "fastgshare.caps.in.tum/v1", "kind": "FaSTPod", "name": "web",
                           "namespace": "team-a", "uid": UID, "resourceVersion": "7"},
        "type": "Warning", "reason": "InvalidSpec", "message": "bad",
        "source": {"component": "fastgshare-controller"}, "reportingComponent": "fastgshare-controller",
        "reportingInstance": "ctl-1", "firstTimestamp": "T", "lastTimestamp": "T", "count": 1,
    }


def test_repeats_bump_the_count_until_the_aggregation_window_ends() -> None:
    kube, clock = FakeKube(), Clock()
    recorder = EventRecorder(kube, instance="i", clock=clock, aggregate_s=600)
    for _ in range(3):
        recorder.event(fastpod(), "Warning", "FailedCreate", "quota")
    assert len(kube.events) == 1
    assert [body["count"] for _, body in kube.event_patches] == [2, 3]
    clock.now += 601
    recorder.event(fastpod(), "Warning", "FailedCreate", "quota")
    assert len(kube.events) == 2


def test_a_failed_event_write_is_only_logged() -> None:
    kube = FakeKube()
    kube.fail("create/events", ApiError(403, "Forbidden"))
    recorder = EventRecorder(kube, instance="i")
    recorder.event(fastpod(), "Normal", "SuccessfulCreate", "x")
    recorder.event(fastpod(), "Normal", "SuccessfulCreate", "x")
    assert len(kube.events) == 1  # the second try creates it: nothing was remembered from the failure


class BlockingKube(FakeKube):
    """Event writes wait until :attr:`release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.writing = threading.Event()

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.writing.set()
        assert self.release.wait(10)
        super().create_event(namespace, body)


def test_background_events_do_not_wait_for_the_write_and_keep_their_order() -> None:
    kube = BlockingKube()
    events = BackgroundEvents(EventRecorder(kube, instance="i"))
    started = time.monotonic()
    for reason in ("Created", "Deleted", "FailedCreate"):
        events.event(fastpod(), "Normal", reason, reason.lower())
    assert time.monotonic() - started < 1.0
    assert kube.writing.wait(10)
    assert kube.events == []  # the first write is still waiting; the caller was not held up
    kube.release.set()
    events.stop()
    assert [event["reason"] for event in kube.events] == ["Created", "Deleted", "FailedCreate"]


def test_background_events_copy_the_metadata_when_queued() -> None:
    kube = BlockingKube()
    events = BackgroundEvents(EventRecorder(kube, instance="i"))
    obj = fastpod()
    events.event(obj, "Normal", "Created", "x")
    obj["metadata"]["name"] = "renamed"
    kube.release.set()
    events.stop()
    assert [event["involvedObject"]["name"] for event in kube.events] == ["web"]


def test_background_events_drop_what_does_not_fit_and_say_so(caplog: pytest.LogCaptureFixture) -> None:
    kube = BlockingKube()
    events = BackgroundEvents(EventRecorder(kube, instance="i"), capacity=1)
    events.event(fastpod(), "Normal", "First", "x")
    assert kube.writing.wait(10)  # taken off the queue, being written
    events.event(fastpod(), "Normal", "Second", "x")  # fills the queue
    events.event(fastpod(), "Normal", "Third", "x")
    assert "event dropped" in caplog.text
    assert "reason=Third" in caplog.text
    kube.release.set()
    events.stop()
    assert [event["reason"] for event in kube.events] == ["First", "Second"]
