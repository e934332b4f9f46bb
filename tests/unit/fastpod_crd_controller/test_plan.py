"""Planning creates and deletes: scale down order, and rolling replacement with one unavailable."""

from __future__ import annotations

import attrs

from fastpod_crd_controller.plan import ROLLING_UPDATE, SCALING_DOWN, SCALING_UP, Plan, deletion_order, plan
from fastpod_crd_controller.pods import PodInfo

REV = "new"


def pod(name: str, *, rev: str = REV, node: str = "n1", ready: bool = True, created: str = "2026-01-01T00:00:00Z",
        deleting: bool = False, phase: str = "Running") -> PodInfo:
    return PodInfo(namespace="ns", name=name, uid=f"u-{name}", owner_uid="o", owner_name="f", revision=rev,
                   node_name=node, phase=phase, ready=ready, created=created, deleting=deleting)


def names(p: Plan) -> list[str]:
    return [victim.name for victim in p.delete]


def test_scale_up_creates_the_missing_pods() -> None:
    assert plan(3, [pod("a")], REV) == Plan(create=2, reason=SCALING_UP)


def test_nothing_to_do() -> None:
    result = plan(2, [pod("a"), pod("b")], REV)
    assert result.empty
    assert result.reason == ""


def test_scale_down_removes_unscheduled_then_not_ready_then_newest() -> None:
    pods = [
        pod("old-ready", created="2026-01-01T00:00:00Z"),
        pod("new-ready", created="2026-01-01T00:05:00Z"),
        pod("newest-ready", created="2026-01-01T00:09:00Z"),
        pod("not-ready", ready=False, created="2026-01-01T00:01:00Z"),
        pod("unscheduled-old", node="", ready=False, created="2026-01-01T00:00:00Z"),
        pod("unscheduled-new", node="", ready=False, created="2026-01-01T00:08:00Z"),
    ]
    assert names(plan(0, pods, REV)) == ["unscheduled-new", "unscheduled-old", "not-ready", "newest-ready",
                                         "new-ready", "old-ready"]
    result = plan(2, pods, REV)
    assert (names(result), result.create, result.reason) == (
        ["unscheduled-new", "unscheduled-old", "not-ready", "newest-ready"], 0, SCALING_DOWN)


def test_scale_down_takes_outdated_pods_first() -> None:
    pods = [pod("current-unscheduled", node="", ready=False), pod("outdated-ready", rev="old")]
    assert [p.name for p in deletion_order(pods, REV)] == ["outdated-ready", "current-unscheduled"]


def test_terminating_and_finished_pods_do_not_count() -> None:
    pods = [pod("a"), pod("gone", deleting=True), pod("done", phase="Succeeded"), pod("crashed", phase="Failed")]
    assert plan(2, pods, REV) == Plan(create=1, reason=SCALING_UP)


def test_outdated_pods_that_are_not_ready_are_replaced_at_once() -> None:
    pods = [pod("a", rev="old", ready=False, node=""), pod("b", rev="old", ready=False), pod("c", rev="old")]
    result = plan(3, pods, REV)
    assert (names(result), result.create, result.reason) == (["a", "b"], 2, ROLLING_UPDATE)


def test_a_ready_outdated_pod_goes_only_while_all_are_ready_one_at_a_time() -> None:
    pods = [pod("a", rev="old", created="2026-01-01T00:00:03Z"), pod("b", rev="old", created="2026-01-01T00:00:02Z"),
            pod("c", rev="old")]
    first = plan(3, pods, REV)
    assert (names(first), first.create, first.reason) == (["a"], 1, ROLLING_UPDATE)
    # a is gone, its replacement is not ready yet: one replica is unavailable, so wait.
    waiting = [pods[1], pods[2], pod("a2", ready=False)]
    assert plan(3, waiting, REV) == Plan(reason=ROLLING_UPDATE, waiting=2)  # still rolling, nothing to do now
    assert plan(3, waiting, REV).empty
    # the replacement is ready: the next outdated pod goes.
    ready_again = [*waiting[:2], attrs.evolve(waiting[2], ready=True)]
    assert names(plan(3, ready_again, REV)) == ["b"]


def test_missing_pods_are_created_before_any_ready_outdated_pod_goes() -> None:
    result = plan(3, [pod("a", rev="old"), pod("b", rev="old")], REV)
    assert result == Plan(create=1, reason=SCALING_UP)


def test_a_single_replica_is_replaced_in_one_step() -> None:
    result = plan(1, [pod("only", rev="old")], REV)
    assert (names(result), result.create) == (["only"], 1)
