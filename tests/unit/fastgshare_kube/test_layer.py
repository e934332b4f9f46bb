"""The Kubernetes layer's own pieces: one error type out of the client, events on any kind."""

from __future__ import annotations

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


def test_unchecked_skips_the_clients_argument_check_and_still_sends_the_request() -> None:
    core = rest.core_v1(unreachable_client())
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"name": "n"}}
    with pytest.raises(ValueError, match="namespace"):  # checked on the client: a namespace must be a string
        core.create_namespaced_binding(123, binding)
    with pytest.raises(ApiError) as failed:  # not checked: it went out (to nobody)
        rest.call(rest.unchecked(core, core.create_namespaced_binding), 123, binding, timeout_s=(1, 1))
    assert failed.value.unreachable

    def plain(*args: object) -> None:
        """A method without the client's check."""

    assert rest.unchecked(core, plain) is plain


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
