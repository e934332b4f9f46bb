"""The HTTP edge through Flask's test client: verbs, health, metrics, inspect, and every bad request."""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request

import flask
import flask.testing
import pytest
from werkzeug.test import TestResponse

from fastgshare import keys
from scheduler_extender.config import ExtenderConfig
from scheduler_extender.http.apps import create_app, status_server
from scheduler_extender.records import NodeRecord, PodRecord
from scheduler_extender.services import Services, build_services
from scheduler_extender.state import ClusterState
from tests.builders import TEST_TRUST, share_annotations
from tests.unit.scheduler_extender.conftest import FakeKube, node_record, pod_json, pod_record, synced_state
from tests.unit.scheduler_extender.test_wire import recorded

Client = flask.testing.FlaskClient


def post(client: Client, verb: str, body: object) -> TestResponse:
    return client.post(f"/{verb}", json=body)


def extender_args(*names: str, annotations: dict[str, str] | None = None) -> dict[str, object]:
    return {"Pod": pod_json(pod_record("new", uid="uid-new", annotations=annotations)), "Nodes": None,
            "NodeNames": list(names)}


def test_filter_answers_with_names_and_reasons(client: Client) -> None:
    answer = post(client, "filter", extender_args("node-a", "node-b", "ghost"))
    assert answer.status_code == 200
    assert answer.json == {"Nodes": None, "NodeNames": ["node-a", "node-b"],
                           "FailedNodes": {"ghost": "node ghost is not in the fastgshare extender's cache yet"},
                           "FailedAndUnresolvableNodes": {}, "Error": ""}


def test_filter_of_recorded_node_list_request_answers_with_nodes(client: Client) -> None:
    answer = post(client, "filter", recorded("nocache-filter"))
    assert answer.status_code == 200
    body = answer.json
    assert body is not None
    assert body["NodeNames"] is None
    assert [item["metadata"]["name"] for item in body["Nodes"]["items"]] == ["node-a", "node-b"]


def test_filter_with_invalid_share_fails_every_node_unresolvably(client: Client) -> None:
    answer = post(client, "filter", extender_args("node-a", annotations=share_annotations(sm="150")))
    body = answer.json
    assert body is not None
    assert body["NodeNames"] == []
    assert "fastgshare/gpu_sm_partition" in body["FailedAndUnresolvableNodes"]["node-a"]
    assert "1..100" in body["FailedAndUnresolvableNodes"]["node-a"]


def test_prioritize_answers_a_bare_host_priority_list(client: Client) -> None:
    answer = post(client, "prioritize", extender_args("node-a", "node-b"))
    assert answer.status_code == 200
    assert [entry["Host"] for entry in answer.json] == ["node-a", "node-b"]  # type: ignore[union-attr]
    assert all(0 <= entry["Score"] <= 10 for entry in answer.json)  # type: ignore[union-attr]


def filtered(client: Client, pod: PodRecord, *names: str) -> None:
    """The scheduler's filter call that comes before its bind."""
    post(client, "filter", {"Pod": pod_json(pod), "Nodes": None, "NodeNames": list(names)})


def test_bind_answers_an_empty_error_and_binds(client: Client, kube: FakeKube) -> None:
    pod = kube.add(pod_record("p", uid="u1"))
    filtered(client, pod, "node-a")
    answer = post(client, "bind", {"PodName": "p", "PodNamespace": pod.namespace, "PodUID": "u1", "Node": "node-a"})
    assert answer.json == {"Error": ""}
    assert kube.pods[pod.key].node_name == "node-a"


def bind_body(pod_uid: str, node: str, name: str = "new") -> dict[str, str]:
    return {"PodName": name, "PodNamespace": "team-a", "PodUID": pod_uid, "Node": node}


def test_bind_only_to_a_node_that_passed_the_extenders_filter_for_that_pod(client: Client, kube: FakeKube,
                                                                           services: Services) -> None:
    """Issue 15, defect 10: /bind bound any pending pod to any node, filtered or not."""
    services.state.upsert_node(NodeRecord(name="bare"))  # no GPU inventory: fails the filter
    kube.add(pod_record("new", uid="uid-new"))
    kube.add(pod_record("other", uid="uid-other"))
    # never filtered: refused without a write
    answer = post(client, "bind", bind_body("uid-other", "node-a", "other")).json
    assert answer == {"Error": "fastgshare: pod team-a/other did not pass the fastgshare extender's filter for "
                               "node node-a (this extender has no filter result for it: never filtered here, "
                               "filtered before the extender restarted, or over 600 s ago); only nodes the filter "
                               "passed may be bound"}
    assert post(client, "filter", extender_args("node-a", "bare")).json["NodeNames"] == ["node-a"]  # type: ignore
    # filtered, but this node failed (or was never a candidate): refused
    for node in ("bare", "node-b"):
        answer = post(client, "bind", bind_body("uid-new", node)).json
        assert answer == {"Error": f"fastgshare: pod team-a/new did not pass the fastgshare extender's filter for "
                                   f"node {node} (it passed for: node-a); only nodes the filter passed may be bound"}
    assert not [action for action in kube.actions if action[0] != "get"]
    assert all(pod.node_name == "" for pod in kube.pods.values())
    assert post(client, "bind", bind_body("uid-new", "node-a")).json == {"Error": ""}
    assert kube.pods["team-a/new"].node_name == "node-a"


def test_bind_refusal_goes_back_in_error_with_status_200(client: Client) -> None:
    answer = post(client, "bind", {"PodName": "p", "PodNamespace": "x", "PodUID": "u1", "Node": "node-a"})
    assert answer.status_code == 200
    assert answer.json == {"Error": "fastgshare: pod x/p no longer exists"}


def test_health_and_readiness(client: Client, services: Services) -> None:
    assert client.get("/healthz").json == {"status": "ok"}
    assert client.get("/readyz").status_code == 200


def test_not_ready_before_the_cache_synced(kube: FakeKube) -> None:
    app = create_app(build_services(ExtenderConfig(), ClusterState(bind_wait_s=0, trust=TEST_TRUST), kube))
    with app.test_client() as client:
        assert client.get("/readyz").status_code == 503
        body = client.post("/filter", json=extender_args("node-a")).json
        assert body is not None
        assert "has not synced" in body["Error"]


def test_metrics_show_latency_decisions_and_cache_size(client: Client) -> None:
    post(client, "filter", extender_args("node-a", "ghost"))
    answer = client.get("/metrics")
    assert answer.status_code == 200
    assert answer.content_type.startswith("text/plain")
    text = answer.get_data(as_text=True)
    assert 'fastgshare_extender_request_duration_seconds_count{verb="filter"} 1.0' in text
    assert 'fastgshare_extender_decisions_total{result="passed",verb="filter"} 1.0' in text
    assert 'fastgshare_extender_failures_total{reason="not-cached",verb="filter"} 1.0' in text
    assert "fastgshare_extender_cache_nodes 2.0" in text


def test_inspect_shows_every_gpu_its_pods_and_free_share(client: Client, kube: FakeKube,
                                                          services: Services) -> None:
    filtered(client, kube.add(pod_record("p", uid="u1")), "node-a")
    post(client, "bind", {"PodName": "p", "PodNamespace": "team-a", "PodUID": "u1", "Node": "node-a"})
    services.state.upsert_node(NodeRecord(name="bare"))
    body = client.get("/inspect").json
    assert body is not None
    assert body["synced"] is True
    assert body["policy"] == "binpack"
    assert (body["bindWaitSeconds"], body["bindWindow"]) == (services.config.bind_wait_s, services.config.bind_window)
    assert body["filterPasses"] == "best"
    assert sorted(body["nodes"]) == ["bare", "node-a", "node-b"]
    gpu = body["nodes"]["node-a"]["gpus"][0]
    assert gpu["uuid"] == "GPU-node-a-0"
    assert (gpu["freeSlots"], gpu["areaUsed"], gpu["freeMemoryBytes"]) == (15, 0.2, 15 * 2**30)
    assert gpu["pods"] == [{"pod": "team-a/p", "uid": "u1", "status": "bound", "assignedAtMs": gpu["pods"][0][
        "assignedAtMs"], "request": "0.4", "limit": "0.8", "smPercent": 50, "memoryBytes": 2**30, "model": None,
        "rect": {"time": [0, 400], "sm": [0, 50]}}]
    assert body["nodes"]["node-a"]["pendingBinds"] == ["team-a/p"]
    assert "no GPU inventory" in body["nodes"]["bare"]["problem"]
    one = client.get("/inspect?node=node-b").json
    assert one is not None
    assert list(one["nodes"]) == ["node-b"]


def test_inspecting_a_node_the_extender_does_not_know_is_404(client: Client) -> None:
    """Issue 15, defect 8: it answered 200 with no nodes, as if the node were empty."""
    response = client.get("/inspect?node=no-such-node")
    assert response.status_code == 404
    assert response.json == {"Error": "node 'no-such-node' is not in the extender's cache; the nodes it knows: "
                                      "node-a, node-b (GET /inspect lists them all)"}


# --- bad requests: 4xx JSON and a log line, never a traceback ------------------------------
@pytest.mark.parametrize(
    ("request_kwargs", "status", "message"),
    [
        pytest.param({"data": "{not json", "content_type": "application/json"}, 400, "not valid JSON", id="malformed"),
        pytest.param({"data": "[" * 20_000 + "]" * 20_000, "content_type": "application/json"}, 400,
                     "not valid JSON", id="too-deep"),
        pytest.param({"data": json.dumps({"NodeNames": []}), "content_type": "application/json"}, 400,
                     "malformed extender request: Pod must be a JSON object", id="wrong-shape"),
        pytest.param({"data": "{}", "content_type": "text/plain"}, 415, "Content-Type must be application/json",
                     id="wrong-content-type"),
        pytest.param({"data": "{}"}, 415, 'got "none"', id="no-content-type"),
        pytest.param({"data": " " * 70_000, "content_type": "application/json"}, 413, "", id="oversized"),
    ],
)
def test_bad_request_bodies_get_a_4xx_json_answer_and_a_log_line(
        client: Client, caplog: pytest.LogCaptureFixture, request_kwargs: dict[str, object], status: int,
        message: str) -> None:
    with caplog.at_level(logging.WARNING, logger="scheduler_extender.http.routes"):
        answer = client.post("/filter", **request_kwargs)
    assert answer.status_code == status
    assert answer.is_json
    assert message in answer.json["Error"]  # type: ignore[index]
    assert f"status={status}" in caplog.text
    assert "Traceback" not in answer.get_data(as_text=True)


def test_unknown_verb_and_wrong_method_are_404_and_405_json(client: Client) -> None:
    unknown = client.post("/preempt", json={})
    assert (unknown.status_code, unknown.is_json) == (404, True)
    wrong = client.get("/filter")
    assert (wrong.status_code, wrong.is_json) == (405, True)


def test_unexpected_failure_is_a_500_json_without_traceback(services: Services, caplog: pytest.LogCaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(args: object) -> object:
        raise RuntimeError("boom")

    monkeypatch.setattr(services.decisions, "filter_body", explode)
    app = create_app(services)  # not TESTING: errors are handled as in production
    with app.test_client() as client, caplog.at_level(logging.ERROR):
        answer = client.post("/filter", json=extender_args("node-a"))
    assert answer.status_code == 500
    assert answer.json == {"Error": "fastgshare extender internal error (RuntimeError); see its log"}
    assert "Traceback" in caplog.text  # the log has it, the answer does not


def test_app_factory_takes_the_body_limit_from_the_config(services: Services) -> None:
    assert create_app(services).config["MAX_CONTENT_LENGTH"] == services.config.max_body_bytes
    assert keys.SCHEDULER_NAME == "fastgshare-scheduler"


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize("annotations", [
    pytest.param(share_annotations(sm="1" * 5000), id="sm-5000-digits"),
    pytest.param(share_annotations(mem="1" + "0" * 308), id="memory-1e308"),
    pytest.param(share_annotations(mem="1" * 100_000), id="memory-100k-digits"),
])
def test_hostile_share_values_get_an_answer_not_a_500(verb: str, annotations: dict[str, str]) -> None:
    """Issue 15, defect 9: these four requests (two values x filter, prioritize) got HTTP 500."""
    services = build_services(ExtenderConfig(bind_wait_s=0.0), synced_state(node_record("node-a")), FakeKube())
    app = create_app(services)  # not TESTING: errors are handled as in production
    with app.test_client() as client:
        answer = post(client, verb, extender_args("node-a", annotations=annotations))
    assert answer.status_code == 200
    if verb == "filter":
        reason = answer.json["FailedAndUnresolvableNodes"]["node-a"]  # type: ignore[index]
        assert reason.startswith("invalid GPU share: fastgshare/")
        assert len(reason) < 1000
    else:
        assert answer.json == [{"Host": "node-a", "Score": 0}]


def test_the_status_server_serves_probes_and_metrics_but_no_verb_and_no_inspection(services: Services) -> None:
    """What --metrics-listen puts on the pod network while the verbs stay on loopback (issue 15, defect 10)."""
    server = status_server(services, "127.0.0.1", 0)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert _status(f"{base}/healthz") == 200
        assert _status(f"{base}/readyz") == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as answer:
            assert "fastgshare_extender_cache_nodes" in answer.read().decode()
        for verb in ("filter", "prioritize", "bind"):
            assert _status(f"{base}/{verb}", body=b"{}") in (404, 405)
        assert _status(f"{base}/inspect") == 404
    finally:
        server.stop()


def _status(url: str, body: bytes | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code
