"""The controller's /metrics: reconciles and errors by result, the work queue's depth and latency,
FaSTPods by condition; served over real HTTP beside /healthz and parsed with prometheus-client's
own text parser."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from fastgshare_kube.health import HealthServer
from fastpod_crd_controller.builder import PodConfig
from fastpod_crd_controller.controller import Controller, Settings
from fastpod_crd_controller.errors import ApiError
from fastpod_crd_controller.events import EventRecorder
from fastpod_crd_controller.metrics import ControllerMetrics
from tests.unit.fastpod_crd_controller.fakes import FakeKube, ScriptedListWatch
from tests.unit.fastpod_crd_controller.objects import fastpod
from tests.unit.fastpod_crd_controller.test_controller_run import wait_for


def samples(metrics: ControllerMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the exposition, parsed as Prometheus would: (name, labels) -> value."""
    text = metrics.exposition()[0].decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(metrics: ControllerMetrics, name: str, **labels: str) -> float:
    return samples(metrics).get((name, tuple(sorted(labels.items()))), 0.0)


def run_controller(kube: FakeKube, metrics: ControllerMetrics, *fastpods: dict) -> Controller:
    controller = Controller(kube, PodConfig(), EventRecorder(kube, instance="t"), observer=metrics,
                            settings=Settings(workers=1, shutdown_grace_s=5))
    metrics.follow(depth=lambda: len(controller.queue), leader=lambda: True, fastpods=controller.fastpod_statuses)
    fastpod_source, pod_source = ScriptedListWatch(), ScriptedListWatch()
    fastpod_source.lists = [(list(fastpods), "1")]
    pod_source.lists = [([], "1")]
    controller.start(fastpod_source, pod_source)
    return controller


def test_reconciles_are_counted_by_result_and_failures_as_retries() -> None:
    kube = FakeKube()
    kube.fail("create/pods", ApiError(500, "InternalError", "etcd timeout"), ApiError(500, "InternalError", "again"))
    metrics = ControllerMetrics(clock=lambda: 1234.0)
    bad = fastpod("bad", uid="u-bad", annotations={"fastgshare/gpu_quota_request": "2"})
    controller = run_controller(kube, metrics, fastpod("web", replicas=1), bad)
    try:
        wait_for(lambda: len(kube.created) == 1 and value(metrics, "fastgshare_controller_reconcile_total",
                                                          result="synced") >= 1)
    finally:
        controller.stop()
    assert value(metrics, "fastgshare_controller_reconcile_total", result="error") == 2
    assert value(metrics, "fastgshare_controller_workqueue_retries_total") == 2
    assert value(metrics, "fastgshare_controller_reconcile_total", result="invalid") >= 1
    reconciles = sum(value(metrics, "fastgshare_controller_reconcile_total", result=result)
                     for result in ("synced", "invalid", "gone", "error"))
    assert value(metrics, "fastgshare_controller_reconcile_duration_seconds_count") == reconciles
    assert value(metrics, "fastgshare_controller_workqueue_wait_seconds_count") == reconciles
    assert value(metrics, "fastgshare_controller_last_reconcile_timestamp_seconds") == 1234.0
    assert value(metrics, "fastgshare_controller_fastpods") == 2
    assert value(metrics, "fastgshare_controller_leader") == 1


def test_every_result_series_exists_before_the_first_reconcile() -> None:
    found = samples(ControllerMetrics())
    assert {labels for name, labels in found if name == "fastgshare_controller_reconcile_total"} == {
        (("result", result),) for result in ("synced", "invalid", "gone", "error")}


def test_fastpods_are_counted_by_condition_from_their_cached_status() -> None:
    metrics = ControllerMetrics()
    conditions = [{"type": "Available", "status": "True"}, {"type": "InvalidSpec", "status": "False"}]
    statuses = [{"status": {"conditions": conditions}}, {"status": {"conditions": conditions[:1]}},
                {"status": {"conditions": [{"type": "InvalidSpec", "status": "True"}]}}, {"status": {}}]
    metrics.follow(depth=lambda: 3, leader=lambda: False, fastpods=lambda: statuses)
    assert value(metrics, "fastgshare_controller_fastpods") == 4
    assert value(metrics, "fastgshare_controller_fastpod_conditions", condition="Available", status="True") == 2
    assert value(metrics, "fastgshare_controller_fastpod_conditions", condition="InvalidSpec", status="True") == 1
    assert value(metrics, "fastgshare_controller_fastpod_conditions", condition="InvalidSpec", status="False") == 1
    assert value(metrics, "fastgshare_controller_workqueue_depth") == 3
    assert value(metrics, "fastgshare_controller_leader") == 0


def test_metrics_are_served_beside_the_health_check() -> None:
    metrics = ControllerMetrics()
    server = HealthServer("127.0.0.1", 0, lambda: True, metrics.exposition)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            names = {family.name for family in text_string_to_metric_families(response.read().decode())}
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=5) as response:
            assert response.status == 200
    finally:
        server.stop()
    assert {"fastgshare_controller_reconcile", "fastgshare_controller_workqueue_depth"} <= names
