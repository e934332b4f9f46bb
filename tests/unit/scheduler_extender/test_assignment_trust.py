"""Issue 37 item 2 / issue 42 items 1-2 at the extender: only assignments it signed count."""

from __future__ import annotations

import logging

import attrs
import pytest

from fastgshare import keys
from fastgshare.codec import decode_assignment
from fastgshare.placement import Policy
from scheduler_extender.binder import Binder
from scheduler_extender.metrics import Metrics
from scheduler_extender.passes import FilterPasses
from scheduler_extender.wire import BindingArgs
from tests.builders import TEST_TRUST, GiB
from tests.unit.scheduler_extender.conftest import FakeKube, assignment, node_record, pod_record, synced_state


def ledger_pods(state: object, node: str = "node-a", gpu: int = 0) -> list[str]:
    entry = state.snapshot().nodes[node]  # type: ignore[attr-defined]
    return sorted(entry.state.ledgers[f"GPU-{node}-{gpu}"].pods)


def test_a_forged_pending_pod_counts_for_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 42 row 3: a never-scheduled pod with a forged assignment filled the GPU."""
    ghost = pod_record("ghost", uid="g1", assignment=assignment("node-a", mem=16 * GiB), signed=False)
    state = synced_state(node_record("node-a", 1), pods=(ghost,))
    assert ledger_pods(state) == []
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            state.upsert_pod(attrs.evolve(ghost, resource_version="11"))
    assert ledger_pods(state) == []
    assert sum("g1" in r.getMessage() and "not counted" in r.getMessage() for r in caplog.records) == 1
    state.reserve(uid="u2", pod_key="team-a/next", node="node-a", share=assignment("node-a").share,
                  policy=Policy.BINPACK)  # the GPU has room


def test_a_signature_for_another_pod_or_node_counts_for_nothing() -> None:
    real = pod_record("real", uid="u1", node_name="node-a", assignment=assignment("node-a"))
    copied = attrs.evolve(real, uid="u2", name="copy")  # the whole annotation set, copied to another pod
    moved = attrs.evolve(real, uid="u3", name="moved", node_name="node-b",
                         annotations={**real.annotations})  # bound elsewhere
    state = synced_state(node_record("node-a", 1), node_record("node-b", 1), pods=(real, copied, moved))
    assert ledger_pods(state) == ["u1"]
    assert ledger_pods(state, "node-b") == []


def test_a_forged_rewrite_of_a_running_pods_assignment_is_ignored() -> None:
    """Issue 42 row 2: the running pod keeps the share the extender placed, on the ledger too."""
    pod = pod_record("p", uid="u1", node_name="node-a", assignment=assignment("node-a", request=400))
    state = synced_state(node_record("node-a", 1), pods=(pod,))
    forged = pod_record("p", uid="u1", node_name="node-a", assignment=assignment("node-a", request=1000, sm=100),
                        signed=False, resource_version="11")
    state.upsert_pod(forged)
    held = {p.uid: p.share for p in state.snapshot().placements}
    assert held == {"u1": assignment("node-a", request=400).share}
    state.replace_pods([forged], state.begin_relist())  # a relist keeps it too
    assert {p.uid: p.share for p in state.snapshot().placements} == {"u1": assignment("node-a", request=400).share}
    assert ledger_pods(state) == ["u1"]


def test_bind_writes_a_signature_that_verifies_for_the_pod_and_node() -> None:
    kube = FakeKube()
    state = synced_state(node_record("node-a", 1))
    kube.watch = state.upsert_pod
    passes = FilterPasses()
    passes.record("u1", ["node-a"])
    kube.add(pod_record("p", uid="u1"))
    binder = Binder(state, kube, default_policy=Policy.BINPACK, bind_wait_s=0, metrics=Metrics(), passes=passes)
    assert binder.bind(BindingArgs(pod_name="p", pod_namespace="team-a", pod_uid="u1", node="node-a")) == ""
    bound = kube.pods["team-a/p"]
    written = decode_assignment(bound.annotations[keys.POD_ASSIGNMENT_ANNOTATION])
    assert TEST_TRUST.problem(bound.annotations[keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION], pod_uid="u1",
                              node_name="node-a", assignment=written) is None
    assert ledger_pods(state) == ["u1"]
