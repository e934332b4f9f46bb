"""The verb lane: well-formed verbs answered without Flask, the same answers Flask gives, and
everything else handed to Flask with its body intact."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from werkzeug.test import Client, EnvironBuilder

from scheduler_extender.http.apps import create_app
from scheduler_extender.http.lane import VerbLane
from scheduler_extender.services import Services
from tests.unit.scheduler_extender.conftest import FakeKube, pod_json, pod_record


def extender_args(*names: str) -> bytes:
    return json.dumps({"Pod": pod_json(pod_record("new", uid="uid-new")), "Nodes": None,
                       "NodeNames": list(names)}).encode()


class Behind:
    """The app behind the lane: records what reached it, answers 299 with the body it read."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, bytes]] = []

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length)
        self.seen.append((environ["REQUEST_METHOD"], environ["PATH_INFO"], body))
        start_response("299 BEHIND", [("Content-Type", "text/plain")])
        return [body]


@pytest.fixture
def behind() -> Behind:
    return Behind()


@pytest.fixture
def lane(services: Services, behind: Behind) -> Client:
    return Client(VerbLane(services, behind))


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_a_well_formed_verb_is_answered_by_the_lane(lane: Client, behind: Behind, verb: str) -> None:
    answer = lane.post(f"/{verb}", data=extender_args("node-a"), content_type="application/json; charset=utf-8")
    assert (answer.status_code, answer.content_type) == (200, "application/json")
    assert behind.seen == []
    assert "node-a" in answer.get_data(as_text=True)


def test_bind_is_answered_by_the_lane_and_binds(lane: Client, behind: Behind, kube: FakeKube) -> None:
    pod = kube.add(pod_record("p", uid="u1"))
    lane.post("/filter", data=json.dumps({"Pod": pod_json(pod), "Nodes": None, "NodeNames": ["node-a"]}),
              content_type="application/json")
    answer = lane.post("/bind", data=json.dumps({"PodName": "p", "PodNamespace": pod.namespace, "PodUID": "u1",
                                                 "Node": "node-a"}), content_type="application/json")
    assert (answer.status_code, answer.json, behind.seen) == (200, {"Error": ""}, [])
    assert kube.pods[pod.key].node_name == "node-a"


@pytest.mark.parametrize(("method", "path", "body", "content_type"), [
    pytest.param("POST", "/inspect", b"{}", "application/json", id="other-path"),
    pytest.param("GET", "/filter", b"", "application/json", id="other-method"),
    pytest.param("POST", "/filter", b"{}", "text/plain", id="not-json-content-type"),
    pytest.param("POST", "/filter", b"{not json", "application/json", id="bad-json"),
    pytest.param("POST", "/filter", b'{"NodeNames": []}', "application/json", id="wrong-shape"),
    pytest.param("POST", "/bind", b'{"Node": 1}', "application/json", id="wrong-bind-shape"),
    pytest.param("POST", "/filter", b" " * 70_000, "application/json", id="over-the-limit"),
])
def test_what_the_lane_cannot_answer_reaches_flask_with_its_body(lane: Client, behind: Behind, method: str, path: str,
                                                                 body: bytes, content_type: str) -> None:
    answer = lane.open(path, method=method, data=body, content_type=content_type)
    assert answer.status_code == 299
    assert behind.seen == [(method, path, body)]


def test_a_body_without_a_length_reaches_flask(services: Services, behind: Behind) -> None:
    """A chunked body (no Content-Length) is Flask's to read."""
    environ = EnvironBuilder("/filter", method="POST", data=extender_args("node-a"),
                             content_type="application/json", headers={"Transfer-Encoding": "chunked"}).get_environ()
    del environ["CONTENT_LENGTH"]
    answered: list[str] = []
    VerbLane(services, behind)(environ, lambda status, headers: answered.append(status))
    assert answered == ["299 BEHIND"]
    assert [(method, path) for method, path, _ in behind.seen] == [("POST", "/filter")]


GONE_POD_BIND = json.dumps({"PodName": "p", "PodNamespace": "x", "PodUID": "u1", "Node": "node-a"}).encode()


@pytest.mark.parametrize(("verb", "body"), [("filter", extender_args("node-a", "node-b", "ghost")),
                                            ("prioritize", extender_args("node-a", "node-b", "ghost")),
                                            ("bind", GONE_POD_BIND)])
def test_the_lane_answers_exactly_as_the_flask_routes(services: Services, verb: str, body: bytes) -> None:
    """Byte for byte: both call the same verb function (scheduler_extender.verbs)."""
    app = create_app(services)
    assert isinstance(app.wsgi_app, VerbLane)
    flask_only = Client(app.wsgi_app._app)  # the routes without the lane in front
    with app.test_client() as through_lane:
        fast = through_lane.post(f"/{verb}", data=body, content_type="application/json")
        slow = flask_only.post(f"/{verb}", data=body, content_type="application/json")
    assert (fast.status_code, fast.content_type, fast.get_data()) == (slow.status_code, slow.content_type,
                                                                      slow.get_data())


def test_latency_is_observed_once_per_request_whichever_answers_it(services: Services) -> None:
    with create_app(services).test_client() as client:
        client.post("/filter", data=extender_args("node-a"), content_type="application/json")
        client.post("/filter", data=b"{not json", content_type="application/json")
        client.post("/filter", data=b'{"NodeNames": []}', content_type="application/json")
        metrics = client.get("/metrics").get_data(as_text=True)
    assert 'fastgshare_extender_request_duration_seconds_count{verb="filter"} 3.0' in metrics


def test_a_failure_inside_a_verb_is_a_500_json_and_a_logged_traceback(
        services: Services, lane: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    def explode(args: object) -> object:
        raise KeyError("boom")

    monkeypatch.setattr(services.decisions, "prioritize_body", explode)
    lane = Client(VerbLane(services, Behind()))
    with caplog.at_level(logging.ERROR, logger="scheduler_extender.http.lane"):
        answer = lane.post("/prioritize", data=extender_args("node-a"), content_type="application/json")
    assert (answer.status_code, answer.json) == (500, {"Error": "fastgshare extender internal error (KeyError); "
                                                                "see its log"})
    assert "Traceback" in caplog.text
    assert "boom" not in answer.get_data(as_text=True)
    metrics = services.metrics.exposition()[0].decode()
    assert 'fastgshare_extender_failures_total{reason="internal-error",verb="prioritize"} 1.0' in metrics
