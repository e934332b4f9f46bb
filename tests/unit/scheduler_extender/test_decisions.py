"""Filter and prioritize: reasons a user can act on, resolvable or not, policies and overrides."""

from __future__ import annotations

import pytest

from fastgshare import keys
from fastgshare.placement import Policy
from scheduler_extender.decisions import Decisions, InvalidRequest, pod_request
from scheduler_extender.metrics import Metrics
from scheduler_extender.records import NodeRecord
from scheduler_extender.state import ClusterState
from scheduler_extender.wire import ExtenderArgs
from tests.builders import TEST_TRUST, make_gpu, share_annotations
from tests.unit.scheduler_extender.conftest import GiB, assignment, node_record, pod_record, synced_state


def args(pod_annotations: dict[str, str] | None = None, *names: str, uid: str = "uid-new") -> ExtenderArgs:
    return ExtenderArgs(pod=pod_record("new", uid=uid, annotations=pod_annotations), node_names=names)


def decisions(state: ClusterState, policy: Policy = Policy.BINPACK) -> Decisions:
    return Decisions(state, policy, Metrics())


def test_pod_request_reads_share_and_policy_override() -> None:
    pod = pod_record("p", annotations={**share_annotations(), keys.SCHEDULING_POLICY_ANNOTATION: "Spread"})
    request = pod_request(pod, Policy.BINPACK)
    assert request.policy is Policy.SPREAD
    assert (request.share.request_permille, request.share.sm_percent) == (400, 50)


def test_invalid_policy_annotation_names_the_key_and_the_allowed_values() -> None:
    pod = pod_record("p", annotations={**share_annotations(), keys.SCHEDULING_POLICY_ANNOTATION: "tetris"})
    with pytest.raises(InvalidRequest, match='fastgshare/scheduling_policy: placement policy "tetris" is unknown; '
                                             'allowed: "binpack", "spread"'):
        pod_request(pod, Policy.BINPACK)


def test_invalid_share_fails_every_node_unresolvably_with_the_parser_message() -> None:
    result = decisions(synced_state(node_record("a"), node_record("b"))).filter(
        args(share_annotations(request="0.9", limit="0.5"), "a", "b"))
    assert result.passed == ()
    assert set(result.unresolvable) == {"a", "b"}
    assert "fastgshare/gpu_quota_request" in result.unresolvable["a"]
    assert "request <= limit" in result.unresolvable["a"]


def test_filter_before_the_cache_synced_is_an_error() -> None:
    result = decisions(ClusterState(bind_wait_s=0, trust=TEST_TRUST)).filter(args(None, "a"))
    assert "has not synced" in result.error


def test_filter_passes_nodes_with_room_and_explains_the_others() -> None:
    full = tuple(pod_record(f"p{i}", uid=f"u{i}", node_name="full", assignment=assignment("full", 0, request=1000,
                                                                                           sm=100, at_ms=i))
                 for i in range(1))
    state = synced_state(node_record("free"), node_record("full", 1), NodeRecord(name="bare"), pods=full)
    result = decisions(state).filter(args(None, "free", "full", "bare", "ghost"))
    assert result.passed == ("free",)
    assert result.failed == {
        "full": "no GPU with 50 percent of its SMs free for 0.4 of the time",
        "ghost": "node ghost is not in the fastgshare extender's cache yet",
    }
    assert set(result.unresolvable) == {"bare"}
    assert "no GPU inventory" in result.unresolvable["bare"]


def test_memory_shortfall_names_need_and_largest_free() -> None:
    taken = pod_record("big", uid="u1", assignment=assignment("a", 0, request=100, sm=10, mem=10 * GiB))
    state = synced_state(node_record("a", 1), pods=(taken,))
    result = decisions(state).filter(args(share_annotations(mem=str(8 * GiB)), "a"))
    assert result.failed == {"a": "needs 8 GiB of GPU memory, largest free 6 GiB"}


def test_pod_that_fits_no_empty_gpu_is_unresolvable() -> None:
    state = synced_state(node_record("a", 2))
    result = decisions(state).filter(args(share_annotations(mem=str(40 * GiB)), "a"))
    assert result.unresolvable == {"a": "needs 40 GiB of GPU memory, largest free 16 GiB"}


def test_unhealthy_gpus_are_unresolvable() -> None:
    sick = node_record("a", [make_gpu(0, healthy=False, uuid="GPU-a-0")])
    result = decisions(synced_state(sick)).filter(args(None, "a"))
    assert result.unresolvable == {"a": "GPU 0 unhealthy"}


def test_pods_own_stale_assignment_does_not_count_against_it() -> None:
    own = pod_record("new", uid="uid-new", assignment=assignment("a", 0, request=1000, sm=100))
    state = synced_state(node_record("a", 1), pods=(own,))
    assert decisions(state).filter(args(None, "a", uid="uid-new")).passed == ("a",)
    assert decisions(state).filter(args(None, "a", uid="someone-else")).failed


def half_full_and_empty() -> ClusterState:
    busy = pod_record("busy", uid="u1", node_name="busy", assignment=assignment("busy", 0, request=500, sm=100))
    return synced_state(node_record("busy", 1), node_record("idle", 1), pods=(busy,))


def test_binpack_prefers_the_fuller_node_spread_the_emptier() -> None:
    binpack = dict(decisions(half_full_and_empty()).prioritize(args(None, "busy", "idle")))
    spread = dict(decisions(half_full_and_empty(), Policy.SPREAD).prioritize(args(None, "busy", "idle")))
    assert binpack["busy"] > binpack["idle"]
    assert spread["busy"] < spread["idle"]
    assert all(0 <= score <= 10 for score in [*binpack.values(), *spread.values()])


def test_policy_annotation_overrides_the_default_when_scoring() -> None:
    spread_pod = {**share_annotations(), keys.SCHEDULING_POLICY_ANNOTATION: "spread"}
    scores = dict(decisions(half_full_and_empty()).prioritize(args(spread_pod, "busy", "idle")))
    assert scores["busy"] < scores["idle"]


def test_prioritize_scores_zero_for_unknown_nodes_and_invalid_requests() -> None:
    state = half_full_and_empty()
    assert decisions(state).prioritize(args(None, "ghost")) == [("ghost", 0)]
    assert decisions(state).prioritize(args({}, "idle")) == [("idle", 0)]


def test_filter_counts_verdicts_and_reasons_in_the_metrics() -> None:
    metrics = Metrics()
    state = synced_state(node_record("a"), NodeRecord(name="bare"))
    Decisions(state, Policy.BINPACK, metrics).filter(args(None, "a", "bare"))
    assert metrics.decisions.labels("filter", "passed")._value.get() == 1
    assert metrics.failures.labels("filter", "no-inventory")._value.get() == 1


def filled_nodes() -> ClusterState:
    """Three nodes of one GPU: ``half`` and ``also-half`` hold the same pod's share, ``empty`` none."""
    pods = tuple(pod_record(f"p-{name}", uid=f"u-{name}", node_name=name,
                            assignment=assignment(name, 0, request=500, sm=50, at_ms=1))
                 for name in ("half", "also-half"))
    return synced_state(node_record("empty", 1), node_record("half", 1), node_record("also-half", 1), pods=pods)


def test_filter_passes_only_the_nodes_the_policy_scores_best_and_counts_the_others() -> None:
    metrics = Metrics()
    result = Decisions(filled_nodes(), Policy.BINPACK, metrics).filter(
        args(share_annotations(request="0.2", limit="0.4", sm="50"), "empty", "half", "also-half"))
    assert result.passed == ("half", "also-half")  # tied for binpack's best: the scheduler's plugins pick
    assert (result.failed, result.unresolvable) == ({}, {})  # the outscored node is left out, not failed
    assert metrics.decisions.labels("filter", "outscored")._value.get() == 1
    spread = Decisions(filled_nodes(), Policy.SPREAD, Metrics()).filter(
        args(share_annotations(request="0.2", limit="0.4", sm="50"), "empty", "half", "also-half"))
    assert spread.passed == ("empty",)


def test_filter_passing_every_fitting_node_leaves_the_ranking_to_prioritize() -> None:
    chooser = Decisions(filled_nodes(), Policy.BINPACK, Metrics(), best_only=False)
    request = args(share_annotations(request="0.2", limit="0.4", sm="50"), "empty", "half", "also-half")
    assert chooser.filter(request).passed == ("empty", "half", "also-half")
    scores = dict(chooser.prioritize(request))
    assert scores["half"] == scores["also-half"] > scores["empty"]
