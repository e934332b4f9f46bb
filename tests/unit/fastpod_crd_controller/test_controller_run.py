"""The controller as it runs: caches filled by reflectors, workers, retries, and a clean stop."""

from __future__ import annotations

import time
from collections.abc import Callable

from fastgshare_kube.workqueue import WorkQueue
from fastpod_crd_controller.builder import PodConfig
from fastpod_crd_controller.controller import Controller, Settings
from fastpod_crd_controller.errors import ApiError
from fastpod_crd_controller.events import EventRecorder
from tests.unit.fastpod_crd_controller.fakes import FakeKube, ScriptedListWatch
from tests.unit.fastpod_crd_controller.objects import fastpod


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def start(kube: FakeKube, *fastpods: dict) -> tuple[Controller, ScriptedListWatch, ScriptedListWatch]:
    controller = Controller(kube, PodConfig(), EventRecorder(kube, instance="t"),
                            settings=Settings(workers=2, shutdown_grace_s=5), queue=WorkQueue(base_delay_s=0.01))
    fastpod_source, pod_source = ScriptedListWatch(), ScriptedListWatch()
    fastpod_source.lists = [(list(fastpods), "1")]
    pod_source.lists = [([], "1")]
    controller.start(fastpod_source, pod_source)
    return controller, fastpod_source, pod_source


def test_every_fastpod_listed_at_start_is_reconciled_and_stop_is_clean() -> None:
    kube = FakeKube()
    controller, *_ = start(kube, fastpod("a", uid="ua", replicas=2), fastpod("b", uid="ub", replicas=1))
    try:
        wait_for(lambda: len(kube.created) == 3)
        assert controller.healthy
    finally:
        controller.stop()
    assert not controller.healthy


def test_a_failing_reconcile_is_retried_with_backoff() -> None:
    kube = FakeKube()
    kube.fail("create/pods", ApiError(500, "InternalError", "etcd timeout"), ApiError(500, "InternalError", "again"))
    controller, *_ = start(kube, fastpod(replicas=1))
    try:
        wait_for(lambda: len(kube.created) == 1)
        assert [a[0] for a in kube.actions if a[1] == "pods"] == ["create"] * 3
    finally:
        controller.stop()
