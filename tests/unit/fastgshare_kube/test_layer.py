"""The Kubernetes layer's own pieces: one error type out of the client, events on any kind."""

from __future__ import annotations

import http.server
import json
import math
import threading
from collections.abc import Mapping
from typing import Any

import kubernetes.client
import pytest

from fastgshare_kube import rest
from fastgshare_kube.errors import ApiError
from fastgshare_kube.events import EventRecorder


def unreachable_client() -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # nothing listens on the discard port
    configuration.retries = 0
    return kubernetes.client.ApiClient(configuration)


def test_no_answer_is_an_api_error_with_status_0() -> None:
    with pytest.raises(ApiError) as failed:
        rest.call(rest.core_v1(unreachable_client()).read_node, "n", timeout_s=(1, 1))
    assert failed.value.unreachable
    assert failed.value.reason == "Unreachable"


def test_a_watch_that_cannot_start_is_an_api_error() -> None:
    source = rest.RawListWatch(rest.core_v1(unreachable_client()).list_node)
    with pytest.raises(ApiError) as failed:
        next(iter(source.watch("1", 1)))
    assert failed.value.unreachable


class Sink:
    def __init__(self) -> None:
        self.created: list[Mapping[str, Any]] = []

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self.created.append(body)

    def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        raise AssertionError("no repeat here")


def test_the_recorder_reports_on_the_kind_and_as_the_component_it_was_given() -> None:
    sink = Sink()
    recorder = EventRecorder(sink, component="fastgshare-node-agent", instance="node-1", api_version="v1",
                             kind="Pod", timestamp=lambda: "T")
    recorder.event({"metadata": {"name": "p", "namespace": "a", "uid": "u"}}, "Warning", "NoGpu", "why")
    [body] = sink.created
    assert body["involvedObject"]["kind"] == "Pod"
    assert body["involvedObject"]["apiVersion"] == "v1"
    assert body["source"] == {"component": "fastgshare-node-agent"}
    assert body["reportingInstance"] == "node-1"


class RecordingServer:
    """A real HTTP server on loopback that records each request and answers with ``answer``."""

    def __init__(self, status: int, answer: Mapping[str, Any]) -> None:
        self.requests: list[dict[str, Any]] = []
        recorded = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                recorded.append({"method": self.command, "path": self.path, "headers": dict(self.headers),
                                 "body": json.loads(self.rfile.read(length)) if length else None})
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_POST = do_PATCH = do_DELETE = _serve

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def client(self) -> kubernetes.client.ApiClient:
        configuration = kubernetes.client.Configuration()
        configuration.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        configuration.api_key = {"authorization": "stale-token"}
        configuration.api_key_prefix = {"authorization": "Bearer"}

        def refresh(config: kubernetes.client.Configuration) -> None:  # as kubeconfig exec plugins do
            config.api_key = {"authorization": "fresh-token"}

        configuration.refresh_api_key_hook = refresh
        api = kubernetes.client.ApiClient(configuration)
        api.user_agent = "fastgshare-test/1"
        return api


def test_send_uses_the_clients_credentials_headers_and_path_and_returns_the_answer() -> None:
    with RecordingServer(201, {"kind": "Pod", "metadata": {"name": "p-1"}}) as server:
        answer = rest.send(server.client(), "PATCH", rest.namespaced_path("fastgshare.caps.in.tum/v1", "team a",
                                                                          "fastpods", "f/1", "status"),
                           {"status": {"replicas": 2}}, content_type=rest.MERGE_PATCH)
    assert answer == {"kind": "Pod", "metadata": {"name": "p-1"}}
    [request] = server.requests
    assert request["method"] == "PATCH"
    assert request["path"] == "/apis/fastgshare.caps.in.tum/v1/namespaces/team%20a/fastpods/f%2F1/status"
    assert request["headers"]["authorization"] == "Bearer fresh-token"  # refreshed, as a generated call does
    assert request["headers"]["User-Agent"] == "fastgshare-test/1"
    assert request["headers"]["Content-Type"] == rest.MERGE_PATCH
    assert request["body"] == {"status": {"replicas": 2}}


def test_a_refused_send_is_an_api_error_with_the_servers_message_and_causes() -> None:
    status = {"kind": "Status", "status": "Failure", "reason": "Invalid", "code": 422,
              "message": "Pod \"p\" is invalid",
              "details": {"causes": [{"field": "spec.containers[0].image", "message": "Required value"}]}}
    with RecordingServer(422, status) as server, pytest.raises(ApiError) as failed:
        rest.send(server.client(), "POST", rest.namespaced_path("v1", "a", "pods"), {"kind": "Pod"})
    assert server.requests[0]["path"] == "/api/v1/namespaces/a/pods"
    assert failed.value.status == 422
    assert failed.value.message == "Pod \"p\" is invalid"
    assert failed.value.causes == (("spec.containers[0].image", "Required value"),)


def test_a_send_nobody_answers_is_an_api_error_with_status_0() -> None:
    with pytest.raises(ApiError) as failed:
        rest.send(unreachable_client(), "DELETE", rest.namespaced_path("v1", "a", "pods", "p"), timeout_s=(1, 1))
    assert failed.value.unreachable


def test_answers_decode_as_json_does_even_where_orjson_refuses() -> None:
    event = '{"type":"MODIFIED","object":{"metadata":{"name":"p","annotations":{"a":"ü"}},"spec":{"n":3.5}}}'
    assert rest.decode_json(event) == json.loads(event)
    assert rest.decode_json(event.encode()) == json.loads(event)
    extremes = '{"spec":{"min":-9223372036854775808,"max":9223372036854775807},"resourceVersion":"184467"}'
    assert rest.decode_json(extremes) == json.loads(extremes)  # int64's range, exactly
    assert math.isnan(rest.decode_json('{"x":NaN}')["x"])  # orjson refuses it; json decodes it
    with pytest.raises(json.JSONDecodeError):
        rest.decode_json("{not json")
