"""``fastgshare inspect`` reads each node agent's metrics through the API server: the agent pod's
proxy where the agent is a pod (the DaemonSet has no hostPort since issue 37), the node proxy where
it is a host process (``fastgshare cluster up``)."""

from __future__ import annotations

import json
from typing import Any

import attrs

from fastgshare_cli import cluster_reader
from fastgshare_cli.inspection import NodeFacts

EXPOSITION = b'fastgshare_gpu_healthy{gpu="GPU-1"} 1\n'


@attrs.define
class _Answer:
    data: bytes


class FakeCore:
    def __init__(self, agents: list[dict[str, Any]]) -> None:
        self.agents = agents
        self.proxied: list[tuple[str, ...]] = []

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        assert kwargs["label_selector"] == cluster_reader.AGENT_POD_SELECTOR
        return _Answer(json.dumps({"items": self.agents}).encode())

    def connect_get_namespaced_pod_proxy_with_path(self, name: str, namespace: str, path: str, **_: Any) -> _Answer:
        self.proxied.append(("pod", namespace, name, path))
        return _Answer(EXPOSITION)

    def connect_get_node_proxy_with_path(self, name: str, path: str, **_: Any) -> _Answer:
        self.proxied.append(("node", name, path))
        return _Answer(EXPOSITION)


def agent(node: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"namespace": "fastgshare-system", "name": f"agent-{node}"}, "spec": {"nodeName": node},
            "status": {"phase": phase}}


def scrape(core: FakeCore, node: str) -> tuple[Any, str]:
    facts = NodeFacts(name=node, inventory=object(), problem="")  # type: ignore[arg-type]
    return cluster_reader._scrape(core, (facts, 9401), cluster_reader._agent_pods(core).get(node))


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
