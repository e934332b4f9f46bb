"""The extender JSON against bodies recorded from a real kube-scheduler v1.20.2 (``payloads/``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fastgshare import keys
from scheduler_extender import wire
from scheduler_extender.wire import FilterResult

PAYLOADS = Path(__file__).parent / "payloads"


def recorded(name: str) -> object:
    return json.loads((PAYLOADS / f"v1.20.2-{name}.json").read_text())


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_node_cache_capable_request_carries_names_only(verb: str) -> None:
    args = wire.decode_extender_args(recorded(f"cache-{verb}"))
    assert args.node_cache_capable
    assert args.node_names == ("node-a", "node-b")
    assert args.pod.key == "default/pod-cache"
    assert args.pod.uid == "24bc6d8f-7494-478f-a5d1-a8c9ec879f5d"
    assert args.pod.annotations[keys.GPU_QUOTA_REQUEST] == "0.4"
    assert args.pod.node_name == ""


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_full_node_list_request_is_read_from_the_items(verb: str) -> None:
    args = wire.decode_extender_args(recorded(f"nocache-{verb}"))
    assert not args.node_cache_capable
    assert args.node_names == ("node-a", "node-b")
    assert args.node_items is not None
    assert args.node_items[0]["status"]["allocatable"][keys.VGPU_RESOURCE] == "8"  # type: ignore[index]


def test_bind_request() -> None:
    args = wire.decode_binding_args(recorded("cache-bind"))
    assert args == wire.BindingArgs(pod_name="pod-cache", pod_namespace="default",
                                    pod_uid="24bc6d8f-7494-478f-a5d1-a8c9ec879f5d", node="node-b")
    assert args.pod_key == "default/pod-cache"


def test_filter_answer_mirrors_a_names_request() -> None:
    args = wire.decode_extender_args(recorded("cache-filter"))
    result = FilterResult(passed=("node-b",), failed={"node-a": "GPU 0 out of pod slots"})
    assert wire.encode_filter_result(args, result) == {
        "Nodes": None, "NodeNames": ["node-b"], "FailedNodes": {"node-a": "GPU 0 out of pod slots"},
        "FailedAndUnresolvableNodes": {}, "Error": "",
    }


def test_filter_answer_mirrors_a_node_list_request_with_the_nodes_as_sent() -> None:
    body = recorded("nocache-filter")
    args = wire.decode_extender_args(body)
    answer = wire.encode_filter_result(args, FilterResult(passed=("node-b",), unresolvable={"node-a": "no inventory"}))
    assert answer["NodeNames"] is None
    assert answer["Nodes"] == {"metadata": {}, "items": [body["Nodes"]["items"][1]]}  # type: ignore[index]
    assert answer["FailedAndUnresolvableNodes"] == {"node-a": "no inventory"}
    assert answer["FailedNodes"] == {"node-a": "no inventory"}  # what a v1.20 scheduler reads


def test_filter_error_answer_names_no_nodes() -> None:
    args = wire.decode_extender_args(recorded("cache-filter"))
    answer = wire.encode_filter_result(args, FilterResult(error="not synced"))
    assert answer["Error"] == "not synced"
    assert answer["NodeNames"] is None


def test_priorities_are_a_bare_list_with_go_field_names_clamped_to_0_10() -> None:
    assert wire.encode_priorities([("a", 7), ("b", 11), ("c", -1)]) == [
        {"Host": "a", "Score": 7}, {"Host": "b", "Score": 10}, {"Host": "c", "Score": 0}]


def test_binding_result() -> None:
    assert wire.encode_binding_result() == {"Error": ""}
    assert wire.encode_binding_result("no room") == {"Error": "no room"}


def test_keys_match_case_insensitively_as_in_go() -> None:
    args = wire.decode_extender_args({"pod": {"metadata": {"name": "p", "namespace": "n"}}, "nodenames": ["x"],
                                      "nodes": None})
    assert args.node_names == ("x",)
    bind = wire.decode_binding_args({"podName": "p", "podNamespace": "n", "podUID": "", "node": "x"})
    assert bind.node == "x"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param([], "request body must be a JSON object", id="not-an-object"),
        pytest.param({"NodeNames": ["a"]}, "Pod must be a JSON object", id="no-pod"),
        pytest.param({"Pod": {"metadata": {"namespace": "n"}}, "NodeNames": ["a"]},
                     "Pod.metadata.name must be a non-empty string", id="pod-without-name"),
        pytest.param({"Pod": {"metadata": {"name": "p", "namespace": "n", "annotations": {"a": 1}}},
                      "NodeNames": ["a"]}, "Pod.metadata.annotations must be an object of strings",
                     id="bad-annotation"),
        pytest.param({"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "NodeNames": None, "Nodes": None},
                     "exactly one of NodeNames", id="no-nodes"),
        pytest.param({"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "NodeNames": ["a"],
                      "Nodes": {"items": []}}, "exactly one of NodeNames", id="both"),
        pytest.param({"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "NodeNames": ["a", 3]},
                     "NodeNames must be an array of non-empty strings", id="name-not-string"),
        pytest.param({"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "NodeNames": ["a", ""]},
                     "NodeNames must be an array of non-empty strings", id="name-empty"),
        pytest.param({"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "NodeNames": [["a"]]},
                     "NodeNames must be an array of non-empty strings", id="name-an-array"),
        pytest.param({"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "Nodes": {"items": {}}},
                     "Nodes.items must be an array", id="items-not-array"),
        pytest.param({"Pod": {"metadata": {"name": "p", "namespace": "n"}}, "Nodes": {"items": [{"metadata": {}}]}},
                     "Nodes.items[0].metadata.name must be a non-empty string", id="node-without-name"),
    ],
)
def test_malformed_extender_args_name_the_field(body: object, message: str) -> None:
    with pytest.raises(wire.WireError) as caught:
        wire.decode_extender_args(body)
    assert message in str(caught.value)


@pytest.mark.parametrize("missing", ["PodName", "PodNamespace", "Node"])
def test_binding_args_need_every_name(missing: str) -> None:
    body = {"PodName": "p", "PodNamespace": "n", "PodUID": "u", "Node": "x"}
    body[missing] = ""
    with pytest.raises(wire.WireError, match=f"{missing} must be a non-empty string"):
        wire.decode_binding_args(body)


def test_no_percent_sign_reaches_the_scheduler() -> None:
    """kube-scheduler formats our text with printf: a '%' would show as '%!S(MISSING)' (issue 15, defect 1)."""
    args = wire.decode_extender_args(recorded("cache-filter"))
    answer = wire.encode_filter_result(args, FilterResult(failed={"node-a": "'50%' is not"},
                                                          unresolvable={"node-b": "100%"}, error=""))
    texts = [*answer["FailedNodes"].values(), *answer["FailedAndUnresolvableNodes"].values()]  # type: ignore[attr-defined]
    texts += [wire.encode_filter_result(args, FilterResult(error="5%"))["Error"],
              wire.encode_binding_result("at 5%")["Error"]]
    assert len(texts) == 5
    assert not any("%" in str(text) for text in texts)
    assert answer["FailedNodes"]["node-a"] == "'50\uff05' is not"  # type: ignore[index]
