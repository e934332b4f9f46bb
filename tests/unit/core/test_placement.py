"""Placement policies: GPU choice, node scores 0..10, refusal reasons, determinism."""

from __future__ import annotations

import pytest

from fastgshare.errors import InvalidPolicy
from fastgshare.inventory import NodeInventory
from fastgshare.ledger import NodeState
from fastgshare.placement import MAX_SCORE, Policy, choose_gpu, evaluate_node, parse_policy, score_node
from tests.builders import GiB, make_gpu, make_node, make_share


def _loaded_node(name: str = "node-a") -> NodeState:
    """GPU 0 half full in time x SM, GPU 1 a quarter full, GPU 2 empty."""
    node = make_node(name, gpus=3)
    node.ledger("GPU-0000").add("ns/x", make_share(request=500, sm=100))
    node.ledger("GPU-0001").add("ns/y", make_share(request=250, sm=100))
    return node


@pytest.mark.parametrize(("policy", "expected_index"), [(Policy.BINPACK, 0), (Policy.SPREAD, 2)])
def test_policy_picks_the_gpu(policy: Policy, expected_index: int) -> None:
    verdict = evaluate_node(_loaded_node(), make_share(request=200, sm=50), policy)
    assert verdict.choice is not None
    assert verdict.choice.index == expected_index


def test_binpack_skips_a_gpu_where_the_pod_does_not_fit() -> None:
    node = _loaded_node()
    verdict = evaluate_node(node, make_share(request=600, sm=100), Policy.BINPACK)
    assert verdict.choice is not None
    assert verdict.choice.index == 1
    assert [ledger.gpu.index for ledger, _ in verdict.refusals] == [0]


def test_best_effort_pods_are_packed_by_memory() -> None:
    node = make_node(gpus=2)
    node.ledger("GPU-0001").add("ns/m", make_share(request=0, limit=100, mem=8 * GiB))
    verdict = evaluate_node(node, make_share(request=0, limit=100, mem=GiB), Policy.BINPACK)
    assert verdict.choice is not None
    assert verdict.choice.index == 1
    assert verdict.choice.fill_after == pytest.approx(9 / 16)


def test_ties_go_to_the_lowest_gpu_index_and_repeat_exactly() -> None:
    share = make_share(request=300, sm=30)
    choices = {evaluate_node(make_node(gpus=4), share, policy).choice for policy in Policy for _ in range(3)}
    assert {choice.index for choice in choices if choice} == {0}


def test_choose_gpu_among_ledgers() -> None:
    node = _loaded_node()
    chosen = choose_gpu(node.ledgers.values(), make_share(request=200, sm=50))
    assert chosen is node.ledger("GPU-0000")
    assert choose_gpu(node.ledgers.values(), make_share(mem=100 * GiB)) is None
    assert choose_gpu([], make_share()) is None


@pytest.mark.parametrize(
    ("node", "share", "reason"),
    [
        pytest.param(NodeState(NodeInventory(node_name="cpu-only", gpus=())), make_share(),
                     "node has no GPUs in its inventory", id="no-gpus"),
        pytest.param(make_node(gpus=[make_gpu(0, mem=6 * GiB), make_gpu(1, mem=4 * GiB)]), make_share(mem=8 * GiB),
                     "needs 8 GiB of GPU memory, largest free 6 GiB", id="memory"),
        pytest.param(make_node(gpus=[make_gpu(0, healthy=False), make_gpu(1, healthy=False)]), make_share(),
                     "GPU 0, 1 unhealthy", id="unhealthy"),
    ],
)
def test_refusal_reasons_a_user_can_act_on(node: NodeState, share: object, reason: str) -> None:
    verdict = evaluate_node(node, share)  # type: ignore[arg-type]
    assert not verdict.fits
    assert verdict.reason == reason


def test_compute_refusal_names_sm_and_time() -> None:
    node = make_node(gpus=2)
    for uuid in node.ledgers:
        node.ledger(uuid).add(f"ns/{uuid}", make_share(request=700, sm=80))
    verdict = evaluate_node(node, make_share(request=600, sm=40))
    assert verdict.reason == "no GPU with 40 percent of its SMs free for 0.6 of the time"


def test_mixed_refusals_are_all_listed() -> None:
    node = make_node(gpus=[make_gpu(0, healthy=False), make_gpu(1, mps=False), make_gpu(2)], slots=1)
    node.ledger("GPU-0001").add("ns/a", make_share(request=0, limit=1))  # its only slot
    node.ledger("GPU-0002").add("ns/b", make_share(request=0, limit=1))
    assert evaluate_node(node, make_share()).reason == "GPU 0 unhealthy; GPU 1, 2 out of pod slots"


def test_non_mps_compute_refusal_uses_the_ledger_message() -> None:
    node = make_node(gpus=[make_gpu(0, mps=False)])
    node.ledger("GPU-0000").add("ns/a", make_share(request=700, sm=10))
    reason = evaluate_node(node, make_share(request=400, sm=10)).reason
    assert reason == "GPU 0 (no MPS, pods take turns) has less than 0.4 of the time free"


def test_scores_stay_within_0_and_10() -> None:
    for policy in Policy:
        for request, sm in [(1, 1), (200, 50), (1000, 100)]:
            score = score_node(_loaded_node(), make_share(request=request, sm=sm), policy)
            assert 0 <= score <= MAX_SCORE


def test_a_node_that_cannot_take_the_pod_scores_zero() -> None:
    assert score_node(_loaded_node(), make_share(mem=64 * GiB)) == 0


def test_binpack_prefers_fuller_nodes_and_spread_emptier_ones() -> None:
    full, empty = make_node("full"), make_node("empty")
    full.ledger("GPU-0000").add("ns/x", make_share(request=800, sm=100))
    share = make_share(request=200, sm=50)
    assert score_node(full, share, Policy.BINPACK) > score_node(empty, share, Policy.BINPACK)
    assert score_node(full, share, Policy.SPREAD) < score_node(empty, share, Policy.SPREAD)


def test_binpack_prefers_the_node_with_fewer_empty_gpus_when_fill_is_equal() -> None:
    busy = make_node("busy", gpus=2)
    busy.ledger("GPU-0000").add("ns/x", make_share(request=1000, sm=100))
    idle = make_node("idle", gpus=2)
    share = make_share(request=1000, sm=100)
    assert score_node(busy, share) > score_node(idle, share)


def test_perfect_fit_scores_10_with_binpack() -> None:
    node = make_node()
    node.ledger("GPU-0000").add("ns/x", make_share(request=500, sm=100))
    assert score_node(node, make_share(request=500, sm=100), Policy.BINPACK) == MAX_SCORE


@pytest.mark.parametrize(("text", "policy"), [("binpack", Policy.BINPACK), (" Spread ", Policy.SPREAD)])
def test_parse_policy(text: str, policy: Policy) -> None:
    assert parse_policy(text) is policy


def test_unknown_policy_names_the_allowed_values() -> None:
    with pytest.raises(InvalidPolicy, match='"best" is unknown; allowed: "binpack", "spread"'):
        parse_policy("best")
