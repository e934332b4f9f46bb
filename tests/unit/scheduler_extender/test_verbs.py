"""The scheduler's verbs as plain functions (:mod:`scheduler_extender.verbs`): a decoded request and
the services in, the answer's JSON body out; no HTTP, no Flask."""

from __future__ import annotations

import json

from scheduler_extender import verbs, wire
from scheduler_extender.services import Services
from tests.unit.scheduler_extender.conftest import FakeKube, pod_json, pod_record


def extender_args(pod_uid: str, *names: str) -> wire.ExtenderArgs:
    pod = pod_record("new", uid=pod_uid)
    return wire.decode_extender_args({"Pod": pod_json(pod), "Nodes": None, "NodeNames": list(names)})


def binding(pod_uid: str, node: str) -> wire.BindingArgs:
    return wire.decode_binding_args({"PodName": "new", "PodNamespace": "team-a", "PodUID": pod_uid, "Node": node})


def test_filter_passes_the_nodes_where_the_pod_fits(services: Services) -> None:
    answer = json.loads(verbs.filter_nodes(extender_args("u1", "node-a", "ghost"), services.decisions))
    assert answer["NodeNames"] == ["node-a"]
    assert set(answer["FailedNodes"]) == {"ghost"}


def test_prioritize_scores_every_node_asked(services: Services) -> None:
    answer = json.loads(verbs.prioritize(extender_args("u1", "node-a", "node-b"), services.decisions))
    assert [entry["Host"] for entry in answer] == ["node-a", "node-b"]
    assert all(0 <= entry["Score"] <= 10 for entry in answer)


def test_bind_binds_only_where_filter_passed(services: Services, kube: FakeKube) -> None:
    kube.add(pod_record("new", uid="u1"))
    refused = json.loads(verbs.bind(binding("u1", "node-a"), services.binder))
    assert "did not pass the fastgshare extender's filter" in refused["Error"]
    assert kube.writes() == []
    verbs.filter_nodes(extender_args("u1", "node-a"), services.decisions)
    assert verbs.bind(binding("u1", "node-a"), services.binder) == b'{"Error":""}'
    assert kube.pods["team-a/new"].node_name == "node-a"
