"""The pod watches of several labels merged into one index (fastgshare_gateway.kube._Merged).

A fresh-clone run lost a function's endpoint: one label's reflector listed, a pod arrived on its
watch, then the other label's reflector listed and the merge replaced the index with the first
part's old list. Each part now keeps its watch events too."""

from __future__ import annotations

from fastgshare_gateway.kube import _Merged
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.pool import Limits
from fastgshare_gateway.routing import Functions
from tests.unit.fastgshare_gateway.test_routing import NS, pod


def endpoints(functions: Functions, name: str) -> list[str]:
    found = functions.pool((NS, name))
    return [] if found is None else [e.address for e in found.endpoints]


def test_a_later_list_of_another_label_keeps_the_pods_the_first_watch_added() -> None:
    functions = Functions([NS], Limits(), GatewayMetrics(), default_namespace=NS)
    merged = _Merged(functions, 2)
    merged.replace(0, [])  # the function-label reflector lists: nothing yet
    fn_pod = pod("fn-a", function="fn", ip="10.1.0.1")
    merged.upsert(0, fn_pod)  # then its watch sees the pod
    merged.replace(1, [pod("legacy-x", function=None, fastpod="legacy", ip="10.1.0.2")])
    assert endpoints(functions, "fn") == ["10.1.0.1:8080"]
    assert endpoints(functions, "legacy") == ["10.1.0.2:8080"]
    merged.replace(0, [fn_pod])  # a relist of part 0 after its watch expired
    merged.delete(0, fn_pod)
    assert endpoints(functions, "fn") == []


def test_a_pod_that_leaves_one_label_but_keeps_the_other_stays() -> None:
    functions = Functions([NS], Limits(), GatewayMetrics(), default_namespace=NS)
    merged = _Merged(functions, 2)
    both = pod("both", function="fn", fastpod="legacy", ip="10.1.0.3")
    merged.replace(0, [both])
    merged.replace(1, [both])
    merged.delete(0, both)
    assert endpoints(functions, "fn") == ["10.1.0.3:8080"]
