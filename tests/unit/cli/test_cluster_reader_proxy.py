"""``fastgshare inspect`` reads each node agent's metrics through the API server: the agent pod's
proxy where the agent is a pod (the DaemonSet has no hostPort since issue 37), the node proxy where
it is a host process (``fastgshare cluster up``), with a token in the header the proxy keeps
(issue 42, item 5)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare_cli import cluster_reader
from fastgshare_cli.inspection import NodeFacts
from fastgshare_kube.errors import ApiError
from fastgshare_kube.metrics_access import DENIAL_PREFIX

EXPOSITION = b'fastgshare_gpu_healthy{gpu="GPU-1"} 1\n'


@attrs.define
class _Answer:
    data: bytes


class FakeCore:
    def __init__(self, agents: list[dict[str, Any]]) -> None:
        self.agents = agents
        self.proxied: list[tuple[str, ...]] = []
        self.headers: list[dict[str, str]] = []
        self.refusal: ApiError | None = None

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        assert kwargs["label_selector"] == cluster_reader.AGENT_POD_SELECTOR
        return _Answer(json.dumps({"items": self.agents}).encode())

    def connect_get_namespaced_pod_proxy_with_path(self, name: str, namespace: str, path: str,
                                                   **kwargs: Any) -> _Answer:
        self.proxied.append(("pod", namespace, name, path))
        return self._answer(kwargs)

    def connect_get_node_proxy_with_path(self, name: str, path: str, **kwargs: Any) -> _Answer:
        self.proxied.append(("node", name, path))
        return self._answer(kwargs)

    def _answer(self, kwargs: dict[str, Any]) -> _Answer:
        self.headers.append(kwargs.get("_headers") or {})
        if self.refusal is not None:
            raise self.refusal
        return _Answer(EXPOSITION)


def agent(node: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"namespace": "fastgshare-system", "name": f"agent-{node}"}, "spec": {"nodeName": node},
            "status": {"phase": phase}}


TOKEN_HEADERS = {keys.METRICS_TOKEN_HEADER: "Bearer t0ken"}


def scrape(core: FakeCore, node: str, headers: dict[str, str] | None = None, no_token: str = "") -> tuple[Any, str]:
    facts = NodeFacts(name=node, inventory=object(), problem="")  # type: ignore[arg-type]
    return cluster_reader._scrape(core, (facts, 9401), cluster_reader._agent_pods(core).get(node),
                                  TOKEN_HEADERS if headers is None else headers, no_token)


def test_an_agent_pod_is_read_through_its_pod_proxy_on_the_metrics_port() -> None:
    core = FakeCore([agent("gpu-1"), agent("gpu-2", phase="Pending")])
    samples, problem = scrape(core, "gpu-1")
    assert problem == ""
    assert core.proxied == [("pod", "fastgshare-system", "agent-gpu-1:9401", "metrics")]
    assert samples.gpus["GPU-1"].healthy is True


def test_a_node_without_an_agent_pod_is_read_through_the_node_proxy() -> None:
    core = FakeCore([agent("gpu-2", phase="Pending")])  # a host-process agent under `fastgshare cluster up`
    _, problem = scrape(core, "gpu-1")
    assert problem == ""
    assert core.proxied == [("node", "gpu-1:9401", "metrics")]


def test_the_token_travels_in_the_header_the_api_servers_proxy_keeps() -> None:
    core = FakeCore([agent("gpu-1")])
    scrape(core, "gpu-1")
    scrape(core, "gpu-2")
    assert core.headers == [TOKEN_HEADERS, TOKEN_HEADERS]


def test_an_agents_refusal_is_shown_as_the_agents_with_why_there_was_no_token() -> None:
    core = FakeCore([agent("gpu-1")])
    core.refusal = ApiError(401, "Unauthorized", f"{DENIAL_PREFIX}/metrics needs a bearer token")
    samples, problem = scrape(core, "gpu-1", headers={}, no_token="this account may not create a token")
    assert samples.gpus == {}
    assert problem == ("the node agent refused its metrics: /metrics needs a bearer token; "
                       "this account may not create a token")
    core.refusal = ApiError(403, "Forbidden", 'pods "agent-gpu-1" is forbidden: cannot get resource "pods/proxy"')
    _, problem = scrape(core, "gpu-1")
    assert problem.startswith("the node agent's metrics on port 9401: 403 Forbidden: this account may not")


def _api(token: str | None) -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = "https://127.0.0.1:1"
    if token is not None:
        configuration.api_key = {"authorization": f"Bearer {token}"}
    return kubernetes.client.ApiClient(configuration)


def test_a_token_kubeconfig_shows_its_own_token(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_request(*_: Any, **__: Any) -> Any:
        raise AssertionError("no TokenRequest for a caller with a token of its own")

    monkeypatch.setattr(cluster_reader.rest, "send", no_request)
    headers, problem = cluster_reader.MetricsCredentials(_api("mine")).headers()
    assert (headers, problem) == ({keys.METRICS_TOKEN_HEADER: "Bearer mine"}, "")


def test_a_certificate_kubeconfig_reads_as_the_metrics_reader_with_a_short_token(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    requests: list[tuple[str, str, Any]] = []
    now = [0.0]

    def send(_api: Any, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        requests.append((method, path, body))
        return {"status": {"token": f"issued-{len(requests)}"}}

    monkeypatch.setattr(cluster_reader.rest, "send", send)
    credentials = cluster_reader.MetricsCredentials(_api(None), clock=lambda: now[0])
    assert credentials.headers() == ({keys.METRICS_TOKEN_HEADER: "Bearer issued-1"}, "")
    assert credentials.headers()[0] == {keys.METRICS_TOKEN_HEADER: "Bearer issued-1"}  # kept
    method, path, body = requests[0]
    assert (method, path) == ("POST", f"/api/v1/namespaces/{keys.SYSTEM_NAMESPACE}/serviceaccounts/"
                                      f"{keys.METRICS_READER_SERVICE_ACCOUNT}/token")
    assert body["spec"]["expirationSeconds"] == cluster_reader.TOKEN_SECONDS
    now[0] = cluster_reader.TOKEN_RENEW_S
    assert credentials.headers()[0] == {keys.METRICS_TOKEN_HEADER: "Bearer issued-2"}  # renewed before expiry
    assert len(requests) == 2


def test_a_caller_who_may_not_get_that_token_is_told_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    def send(*_: Any, **__: Any) -> Any:
        raise ApiError(403, "Forbidden", "cannot create resource serviceaccounts/token")

    monkeypatch.setattr(cluster_reader.rest, "send", send)
    headers, problem = cluster_reader.MetricsCredentials(_api(None)).headers()
    assert headers == {}
    assert "no bearer token" in problem
    assert "serviceaccounts/token" in problem
    assert keys.METRICS_READER_SERVICE_ACCOUNT in problem
