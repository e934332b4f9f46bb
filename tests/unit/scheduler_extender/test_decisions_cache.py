"""The decisions' memory (answers per node signature, evaluations patched by the cache's change
log, encoded replies) never changes an answer: under any sequence of pod and node events, filter
and prioritize say exactly what judging every node afresh says, whether filter passes every
fitting node or only the best scored."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastgshare.placement import Policy, score_node
from scheduler_extender.decisions import Decisions, judge, pod_request
from scheduler_extender.metrics import Metrics
from scheduler_extender.records import NodeRecord, PodRecord
from scheduler_extender.state import CHANGE_LOG, ClusterState
from scheduler_extender.wire import ExtenderArgs, FilterResult, encode_filter_result, encode_priorities
from tests.builders import share_annotations
from tests.unit.scheduler_extender.conftest import GiB, assignment, node_record, pod_record, synced_state

NODES = tuple(f"node-{i}" for i in range(6))
ASKED = ({**share_annotations(request="0.3", limit="0.5", sm="40")},
         {**share_annotations(request="0.5", limit="0.5", sm="60", mem=str(6 * GiB))},
         {**share_annotations(request="0", limit="0.5", sm="100", mem=str(12 * GiB))})
PLACED = ((400, 50, GiB), (600, 60, 4 * GiB), (300, 100, 2 * GiB), (0, 100, 8 * GiB))

# (kind, pod key, node, gpu, placed share): fields a kind does not use are ignored
event = st.tuples(st.sampled_from(["place", "place", "place", "delete", "delete", "relist", "drop-node", "readd-node"]),
                  st.integers(0, 11), st.sampled_from(NODES), st.integers(0, 1), st.integers(0, len(PLACED) - 1))


def reference(state: ClusterState, args: ExtenderArgs, *,
              best_only: bool) -> tuple[dict[str, object], list[tuple[str, int]]]:
    request = pod_request(args.pod, Policy.BINPACK)
    entries = state.entries_for(args.pod.uid, args.node_names)
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    scores: list[tuple[str, int]] = []
    for name, entry in zip(args.node_names, entries, strict=True):
        refusal = judge(name, entry, request)
        if refusal is None:
            passed.append(name)
        else:
            (failed if refusal.resolvable else unresolvable)[name] = refusal.reason
        fits = refusal is None and entry is not None and entry.state is not None
        scores.append((name, score_node(entry.state, request.share, request.policy)
                       if fits and entry is not None and entry.state is not None else 0))
    if best_only and passed:
        score_of = dict(scores)
        best = max(score_of[name] for name in passed)
        passed = [name for name in passed if score_of[name] == best]
    return (encode_filter_result(args, FilterResult(passed=tuple(passed), failed=failed, unresolvable=unresolvable)),
            scores)


@pytest.mark.parametrize("best_only", [True, False], ids=["best", "fitting"])
@settings(max_examples=150, deadline=None)
@given(events=st.lists(event, max_size=25), asked=st.lists(st.integers(0, len(ASKED) - 1), min_size=1, max_size=3))
def test_answers_equal_judging_every_node_afresh(events: list[tuple[str, int, str, int, int]],
                                                 asked: list[int], best_only: bool) -> None:
    state = synced_state(*(node_record(name, 2) for name in NODES[:-1]))  # the last node is not cached at first
    decisions = Decisions(state, Policy.BINPACK, Metrics(), best_only=best_only)
    pods: dict[int, PodRecord] = {}

    def compare() -> None:
        for serial, which in enumerate(asked):
            pod = pod_record(f"new-{serial}", uid=f"uid-new-{serial}", annotations=ASKED[which])
            args = ExtenderArgs(pod=pod, node_names=NODES)
            expected_filter, expected_scores = reference(state, args, best_only=best_only)
            assert json.loads(decisions.filter_body(args)) == expected_filter
            passed = decisions.filter(args).passed
            assert list(passed) == expected_filter["NodeNames"]
            assert json.loads(decisions.prioritize_body(args)) == encode_priorities(expected_scores)
            assert decisions.prioritize(args) == expected_scores
            subset = ExtenderArgs(pod=pod, node_names=passed)
            assert json.loads(decisions.prioritize_body(subset)) == encode_priorities(
                [(name, score) for name, score in expected_scores if name in subset.node_names])

    compare()
    for step, (kind, key, node, gpu, which) in enumerate(events):
        if kind == "place":
            request, sm, mem = PLACED[which]
            record = pod_record(f"p{key}", uid=f"uid-{key}", node_name=node, phase="Running",
                                assignment=assignment(node, gpu, request=request, sm=sm, mem=mem, at_ms=step))
            pods[key] = record
            state.upsert_pod(record)
        elif kind == "delete" and key in pods:
            state.delete_pod(pods.pop(key))
        elif kind == "relist":
            state.replace_pods(list(pods.values()), state.begin_relist())
        elif kind == "drop-node":
            state.delete_node(node)
        elif kind == "readd-node":
            state.upsert_node(node_record(node, 2))
        compare()


def test_the_change_log_names_what_changed_and_gives_up_when_it_cannot_tell() -> None:
    state = synced_state(node_record("a"), node_record("b"))
    start, _ = state.generation_for("x")
    assert state.changed_entries(start) == (start, {})
    state.upsert_pod(pod_record("p", uid="u1", node_name="a", assignment=assignment("a")))
    generation, changed = state.changed_entries(start) or (0, {})
    assert generation == start + 1
    assert set(changed) == {"a"}
    assert changed["a"] is not None
    state.delete_node("b")
    assert state.changed_entries(start) == (start + 2, {"a": changed["a"], "b": None})
    state.replace_nodes([NodeRecord(name="a", inventory_text=node_record("a").inventory_text)])
    assert state.changed_entries(start) is None  # a relist: everything may have changed
    after, _ = state.generation_for("x")
    for serial in range(CHANGE_LOG + 1):
        state.upsert_pod(pod_record(f"q{serial}", uid=f"q{serial}", node_name="a",
                                    assignment=assignment("a", request=0, mem=1, at_ms=serial)))
    assert state.changed_entries(after) is None  # more changes than the log keeps


def test_a_pods_own_stale_assignment_is_left_out_and_not_remembered() -> None:
    full = pod_record("own", uid="uid-own", assignment=assignment("a", 0, request=1000, sm=100))
    state = synced_state(node_record("a", 1), pods=(full,))
    decisions = Decisions(state, Policy.BINPACK, Metrics())
    own = ExtenderArgs(pod=pod_record("own", uid="uid-own", annotations=share_annotations()), node_names=("a",))
    other = ExtenderArgs(pod=pod_record("other", uid="uid-other", annotations=share_annotations()), node_names=("a",))
    assert decisions.filter(own).passed == ("a",)  # its own unbound assignment does not count against it
    assert decisions.filter(other).passed == ()
    assert decisions.filter(own).passed == ("a",)
