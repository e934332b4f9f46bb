"""Events on FaSTPods: the v1 Event body, and repeats folded into a count."""

from __future__ import annotations

from fastpod_crd_controller.errors import ApiError
from fastpod_crd_controller.events import EventRecorder
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
