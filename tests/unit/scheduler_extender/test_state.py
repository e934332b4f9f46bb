"""The cache's rules: what counts on a GPU, events older than a bind, relists, restarts, turns."""

from __future__ import annotations

import gc
import threading
import time
import weakref

import attrs
import pytest

from fastgshare.placement import Policy
from scheduler_extender.records import NodeRecord
from scheduler_extender.state import BindOutcome, ClusterState, ReservationRefused
from tests.builders import TEST_TRUST, make_share
from tests.unit.scheduler_extender.conftest import assignment, node_record, pod_record, synced_state

SHARE = make_share(request=400, limit=800, sm=50)


def pods_on(state: ClusterState, node: str, gpu: int = 0) -> list[str]:
    entry = state.snapshot().nodes[node]
    assert entry.state is not None
    return sorted(entry.state.ledgers[f"GPU-{node}-{gpu}"].pods)


def reserve(state: ClusterState, uid: str, node: str = "node-a") -> str:
    return state.reserve(uid=uid, pod_key=f"team-a/{uid}", node=node, share=SHARE, policy=Policy.BINPACK).gpu_uuid


def test_not_synced_until_nodes_and_pods_were_listed() -> None:
    state = ClusterState(bind_wait_s=0, trust=TEST_TRUST)
    assert not state.synced
    state.replace_nodes([node_record("node-a")])
    assert not state.synced
    with pytest.raises(ReservationRefused, match="not synced"):
        reserve(state, "u1")
    state.replace_pods([], state.begin_relist())
    assert state.synced


def test_assigned_pods_count_whether_bound_or_not() -> None:
    bound = pod_record("bound", uid="u1", node_name="node-a", assignment=assignment("node-a"))
    in_flight = pod_record("in-flight", uid="u2", assignment=assignment("node-a"))
    plain = pod_record("plain", uid="u3", node_name="node-a")
    state = synced_state(node_record("node-a"), pods=(bound, in_flight, plain))
    assert pods_on(state, "node-a") == ["u1", "u2"]
    assert state.sizes() == (1, 2)


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pods_free_their_share(phase: str) -> None:
    pod = pod_record("p", uid="u1", node_name="node-a", assignment=assignment("node-a"))
    state = synced_state(node_record("node-a"), pods=(pod,))
    state.upsert_pod(attrs.evolve(pod, phase=phase))
    assert pods_on(state, "node-a") == []


def test_deleted_pods_free_their_share_but_terminating_ones_still_count() -> None:
    pod = pod_record("p", uid="u1", node_name="node-a", assignment=assignment("node-a"))
    state = synced_state(node_record("node-a"), pods=(pod,))
    state.upsert_pod(attrs.evolve(pod, deleting=True))
    assert pods_on(state, "node-a") == ["u1"]
    state.delete_pod(pod)
    assert pods_on(state, "node-a") == []


def test_removed_or_changed_assignment_moves_the_share() -> None:
    pod = pod_record("p", uid="u1", assignment=assignment("node-a", 0))
    state = synced_state(node_record("node-a"), pods=(pod,))
    state.upsert_pod(pod_record("p", uid="u1", assignment=assignment("node-a", 1, at_ms=2_000)))
    assert (pods_on(state, "node-a", 0), pods_on(state, "node-a", 1)) == ([], ["u1"])
    state.upsert_pod(pod_record("p", uid="u1"))
    assert pods_on(state, "node-a", 1) == []


def test_unreadable_assignment_is_not_counted() -> None:
    pod = pod_record("p", uid="u1", annotations={"fastgshare/assignment": "{not json"})
    state = synced_state(node_record("node-a"), pods=(pod,))
    assert state.sizes() == (1, 0)


def test_pods_placed_before_their_node_appears_are_counted_when_it_does() -> None:
    state = synced_state(pods=(pod_record("p", uid="u1", assignment=assignment("node-a")),))
    state.upsert_node(node_record("node-a"))
    assert pods_on(state, "node-a") == ["u1"]


def test_inventory_change_rebuilds_the_ledgers_with_the_pods() -> None:
    state = synced_state(node_record("node-a", 1), pods=(pod_record("p", uid="u1", assignment=assignment("node-a")),))
    state.upsert_node(node_record("node-a", 2))
    assert pods_on(state, "node-a") == ["u1"]
    assert len(state.snapshot().nodes["node-a"].state.ledgers) == 2  # type: ignore[union-attr]


def test_node_without_or_with_unreadable_inventory_has_a_reason() -> None:
    state = synced_state(NodeRecord(name="bare"), NodeRecord(name="broken", inventory_text="{}"))
    nodes = state.snapshot().nodes
    assert "no GPU inventory (annotation fastgshare/gpu_info)" in nodes["bare"].problem
    assert "unreadable" in nodes["broken"].problem


# --- binds and events --------------------------------------------------------------------
def test_reservation_counts_at_once_and_is_freed_when_released() -> None:
    state = synced_state(node_record("node-a", 1))
    reserve(state, "u1")
    assert pods_on(state, "node-a") == ["u1"]
    state.finish_bind("u1", "node-a", BindOutcome.RELEASED)
    assert pods_on(state, "node-a") == []


def test_second_bind_of_the_same_pod_is_refused_while_the_first_runs() -> None:
    state = synced_state(node_record("node-a"))
    reserve(state, "u1")
    with pytest.raises(ReservationRefused, match="already in progress"):
        reserve(state, "u1")


def test_reservation_refused_with_the_core_reason_when_nothing_fits() -> None:
    state = synced_state(node_record("node-a", 1))
    for uid in ("u1", "u2", "u3", "u4"):  # 0.4 x 50 %: two by two in the 1 x 100 % bin
        reserve(state, uid)
    with pytest.raises(ReservationRefused, match=r"no GPU with 50 percent of its SMs free for 0\.4 of the time"):
        reserve(state, "u5")


def test_events_older_than_the_bind_do_not_free_it() -> None:
    state = synced_state(node_record("node-a"))
    reserve(state, "u1")
    state.upsert_pod(pod_record("u1", uid="u1"))  # the pod as created, before our write
    assert pods_on(state, "node-a") == ["u1"]
    state.finish_bind("u1", "node-a", BindOutcome.BOUND)
    state.upsert_pod(pod_record("u1", uid="u1"))  # a late event, still from before our write
    assert pods_on(state, "node-a") == ["u1"]


def test_bound_pod_whose_write_came_back_is_freed_when_the_assignment_goes() -> None:
    state = synced_state(node_record("node-a"))
    reserve(state, "u1")
    state.stamp("u1", 5_000)
    state.upsert_pod(pod_record("u1", uid="u1", assignment=assignment("node-a", at_ms=5_000)))
    state.finish_bind("u1", "node-a", BindOutcome.BOUND)
    state.upsert_pod(pod_record("u1", uid="u1"))
    assert pods_on(state, "node-a") == []


def test_pod_deleted_during_its_bind_is_freed_when_the_bind_ends() -> None:
    state = synced_state(node_record("node-a"))
    reserve(state, "u1")
    state.delete_pod(pod_record("u1", uid="u1"))
    assert pods_on(state, "node-a") == ["u1"]
    state.finish_bind("u1", "node-a", BindOutcome.BOUND)
    assert pods_on(state, "node-a") == []


def test_relist_keeps_binds_in_flight_and_binds_it_cannot_know_yet() -> None:
    state = synced_state(node_record("node-a"))
    reserve(state, "u1")
    reserve(state, "u2")
    token = state.begin_relist()
    state.finish_bind("u2", "node-a", BindOutcome.BOUND)  # ended after the list began
    state.replace_pods([], token)
    assert pods_on(state, "node-a") == ["u1", "u2"]


def test_relist_that_began_after_a_bind_ended_is_the_truth() -> None:
    state = synced_state(node_record("node-a"))
    reserve(state, "u1")
    state.finish_bind("u1", "node-a", BindOutcome.BOUND)
    state.replace_pods([], state.begin_relist())  # the pod was deleted; its DELETED event was missed
    assert pods_on(state, "node-a") == []


def test_restart_rebuilds_everything_from_the_api() -> None:
    pods = tuple(pod_record(f"p{i}", uid=f"u{i}", node_name="node-a", assignment=assignment("node-a", i % 2))
                 for i in range(4))
    state = synced_state(node_record("node-a"), pods=pods)
    assert pods_on(state, "node-a", 0) == ["u0", "u2"]
    assert pods_on(state, "node-a", 1) == ["u1", "u3"]


# --- turns ---------------------------------------------------------------------------------
class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def bound_unallocated(state: ClusterState, uid: str, at_ms: int) -> None:
    state.upsert_pod(pod_record(uid, uid=uid, node_name="node-a", assignment=assignment("node-a", at_ms=at_ms)))


def waiting_for_turn(state: ClusterState, uid: str) -> tuple[threading.Thread, list[bool]]:
    """Start ``uid``'s wait for its turn on node-a on a thread; check it is still waiting. The
    list gets wait_turn's answer when it returns."""
    got: list[bool] = []
    waiter = threading.Thread(target=lambda: got.append(state.wait_turn(uid, "node-a", 30)))
    waiter.start()
    time.sleep(0.05)
    assert not got
    return waiter, got


def test_turn_waits_for_the_previous_pod_to_be_allocated() -> None:
    clock = Clock()
    state = synced_state(node_record("node-a"), bind_wait_s=30, now_ms=clock)
    bound_unallocated(state, "u0", clock.ms)
    reserve(state, "u1")
    waiter, got = waiting_for_turn(state, "u1")
    state.upsert_pod(pod_record("u0", uid="u0", node_name="node-a", assignment=assignment("node-a", at_ms=clock.ms),
                                allocated=True))
    waiter.join(5)
    assert got == [True]


def test_turn_does_not_wait_for_pods_assigned_longer_ago_than_the_bind_wait() -> None:
    clock = Clock()
    state = synced_state(node_record("node-a"), bind_wait_s=5, now_ms=clock)
    bound_unallocated(state, "u0", clock.ms - 6_000)  # e.g. left by an extender before a restart
    reserve(state, "u1")
    assert state.wait_turn("u1", "node-a", 0.01)


def test_turn_gives_up_after_its_timeout() -> None:
    clock = Clock()
    state = synced_state(node_record("node-a"), bind_wait_s=30, now_ms=clock)
    bound_unallocated(state, "u0", clock.ms)
    reserve(state, "u1")
    assert not state.wait_turn("u1", "node-a", 0.05)


def test_turns_on_one_node_are_taken_in_arrival_order_one_writer_at_a_time() -> None:
    state = synced_state(node_record("node-a"), bind_wait_s=5)
    for uid in ("u1", "u2"):
        reserve(state, uid)
    order: list[str] = []
    def take_second_turn() -> None:
        state.wait_turn("u2", "node-a", 5)
        order.append("u2")

    second = threading.Thread(target=take_second_turn)
    second.start()
    time.sleep(0.05)
    assert state.wait_turn("u1", "node-a", 5)
    order.append("u1")
    time.sleep(0.05)
    assert order == ["u1"]  # u2 waits while u1 writes
    state.finish_bind("u1", "node-a", BindOutcome.BOUND)
    second.join(5)
    assert order == ["u1", "u2"]
    assert "node-a" not in state.snapshot().waiting


def test_a_window_lets_that_many_pods_of_a_node_wait_for_its_agent_and_no_more() -> None:
    """Issue 18: with a window of 3, two pods bound and not allocated and one being written leave
    no room; the fourth bind writes once one of them is allocated, or once the oldest's wait ran out."""
    clock = Clock()
    state = synced_state(node_record("node-a"), bind_wait_s=5, bind_window=3, now_ms=clock)
    bound_unallocated(state, "u0", clock.ms - 1_000)
    bound_unallocated(state, "u1", clock.ms)
    for uid in ("u2", "u3"):
        reserve(state, uid)
    assert state.wait_turn("u2", "node-a", 0.01)  # 2 waiting for the agent: room for one more
    assert not state.wait_turn("u3", "node-a", 0.05)  # u2 writing: full
    state.finish_bind("u3", "node-a", BindOutcome.RELEASED)
    reserve(state, "u3")
    state.upsert_pod(pod_record("u0", uid="u0", node_name="node-a",
                                assignment=assignment("node-a", at_ms=clock.ms - 1_000), allocated=True))
    assert state.wait_turn("u3", "node-a", 0.01)  # u0 allocated: room again
    state.finish_bind("u3", "node-a", BindOutcome.RELEASED)
    bound_unallocated(state, "u0", clock.ms - 1_000)  # (as if it had not been marked)
    reserve(state, "u3")
    clock.ms += 4_000  # u0 assigned 5 s ago: it no longer counts; u1 still does
    assert state.wait_turn("u3", "node-a", 0.01)


def test_a_full_window_opens_when_the_oldest_wait_runs_out() -> None:
    clock = Clock()
    state = synced_state(node_record("node-a"), bind_wait_s=5, bind_window=2, now_ms=clock)
    bound_unallocated(state, "u0", clock.ms - 4_000)
    bound_unallocated(state, "u1", clock.ms - 1_000)
    reserve(state, "u2")
    waiter, got = waiting_for_turn(state, "u2")
    clock.ms += 1_000  # u0's 5 s are over: the waiter's timed wait (1 ms, as the clock was) sees it
    waiter.join(5)
    assert got == [True]


def test_without_a_bind_wait_binds_on_one_node_take_no_turns() -> None:
    """A bind writes at once, whoever else is writing to the node or was bound there and not
    allocated yet; none is listed as waiting."""
    clock = Clock()
    state = synced_state(node_record("node-a"), bind_wait_s=0, now_ms=clock)
    bound_unallocated(state, "u0", clock.ms)
    for uid in ("u1", "u2"):
        reserve(state, uid)
    assert state.snapshot().waiting == {}
    assert state.wait_turn("u1", "node-a", 0)
    assert state.wait_turn("u2", "node-a", 0)  # while u1 writes
    for uid in ("u1", "u2"):
        state.finish_bind(uid, "node-a", BindOutcome.BOUND)
    assert sorted(p.uid for p in state.snapshot().placements if p.node == "node-a") == ["u0", "u1", "u2"]


def test_turns_on_different_nodes_do_not_wait_for_each_other() -> None:
    state = synced_state(node_record("node-a"), node_record("node-b"), bind_wait_s=5)
    reserve(state, "u1", "node-a")
    reserve(state, "u2", "node-b")
    assert state.wait_turn("u1", "node-a", 1)
    assert state.wait_turn("u2", "node-b", 0.01)


def test_pending_pods_are_kept_as_the_watch_last_showed_them_until_bound_finished_or_gone() -> None:
    """What bind reads instead of a GET (issue 18): unbound pods, by key and uid."""
    waiting, finished = pod_record("w", uid="u1"), pod_record("f", uid="u2", phase="Failed")
    bound = pod_record("b", uid="u3", node_name="node-a")
    state = synced_state(node_record("node-a"), pods=(waiting, finished, bound))
    assert state.pending_pod("team-a/w", "u1") == waiting
    assert state.pending_pod("team-a/w", "other") is None  # replaced: ask the API
    assert state.pending_pod("team-a/f", "u2") is None
    assert state.pending_pod("team-a/b", "u3") is None
    newer = attrs.evolve(waiting, resource_version="11", annotations={})
    state.upsert_pod(newer)
    assert state.pending_pod("team-a/w", "u1") == newer
    state.upsert_pod(attrs.evolve(newer, node_name="node-a"))
    assert state.pending_pod("team-a/w", "u1") is None
    second = pod_record("s", uid="u4")
    state.upsert_pod(second)
    state.delete_pod(pod_record("s", uid="u-earlier"))  # a late delete of an earlier pod of that name
    assert state.pending_pod("team-a/s", "u4") == second
    state.upsert_pod(attrs.evolve(second, deleting=True))
    assert state.pending_pod("team-a/s", "u4") is None
    state.upsert_pod(second)
    state.delete_pod(second)
    assert state.pending_pod("team-a/s", "u4") is None
    state.replace_pods([second], state.begin_relist())
    assert state.pending_pod("team-a/s", "u4") == second
    assert state.pending_pod("team-a/w", "u1") is None


def test_a_pending_pod_in_a_bind_of_ours_or_bound_by_one_is_not_served_from_the_cache() -> None:
    """The watch may not show our Binding yet: bind then asks the API server."""
    state = synced_state(node_record("node-a"), pods=(pod_record("u1", uid="u1"),))
    reserve(state, "u1")
    assert state.pending_pod("team-a/u1", "u1") is None  # binding now
    state.finish_bind("u1", "node-a", BindOutcome.BOUND)
    assert state.pending_pod("team-a/u1", "u1") is None  # bound, the watch not there yet
    reserve(state, "u2")
    state.upsert_pod(pod_record("u2", uid="u2"))
    state.finish_bind("u2", "node-a", BindOutcome.RELEASED)
    assert state.pending_pod("team-a/u2", "u2") is not None  # that bind failed: nothing written


def test_a_large_relist_freezes_its_cache_and_the_next_one_frees_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Collections skip a large cluster's cache; a later relist still frees the old one, cycles too."""
    monkeypatch.setattr("scheduler_extender.state.COLLECT_AFTER_RELIST_NODES", 2)
    state = ClusterState(bind_wait_s=0, trust=TEST_TRUST)
    state.replace_nodes([node_record("node-a"), node_record("node-b")])

    class Cycle:
        """Stands in for a part of the old cache that only the cycle collector can free."""

    cycle = Cycle()
    cycle.self = cycle  # type: ignore[attr-defined]
    gone = weakref.ref(cycle)
    try:
        state.replace_pods([], state.begin_relist())
        frozen = gc.get_freeze_count()
        assert frozen > 0
        del cycle  # garbage from here on, but frozen: an ordinary collection keeps it
        gc.collect()
        assert gone() is not None
        state.replace_pods([], state.begin_relist())
        assert gone() is None
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_a_queue_of_binds_on_one_node_wakes_only_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty binds queued on one node (binpack puts most binds on one node) take their turns in
    order, each woken when the one before it finishes, without every change waking all of them
    (one condition for all of them: 104 checks of a turn for these 20 binds; now 20)."""
    state = synced_state(node_record("node-a", gpus=8), bind_wait_s=5)
    uids = [f"u{n}" for n in range(20)]
    for uid in uids:
        reserve(state, uid)
    checks = 0
    gate = state._gate

    def counting_gate(node: str, uid: str) -> float | None:
        nonlocal checks
        checks += 1
        return gate(node, uid)

    monkeypatch.setattr(state, "_gate", counting_gate)
    order: list[str] = []
    results: list[bool] = []

    def bind(uid: str) -> None:
        results.append(state.wait_turn(uid, "node-a", 30))
        order.append(uid)
        state.finish_bind(uid, "node-a", BindOutcome.RELEASED)  # nothing for the next to wait for

    threads = [threading.Thread(target=bind, args=(uid,)) for uid in uids[1:]]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # all of them wait
    checks = 0
    bind(uids[0])
    for thread in threads:
        thread.join(10)
    assert results == [True] * 20
    assert order == uids
    assert checks <= 3 * len(uids), checks
