"""Properties of the cache under any sequence of binds, outcomes and pod events.

- the ledgers always hold exactly the placements (no share leaks, none is lost);
- shares reserved by binds never over-commit a GPU: replaying them into fresh ledgers, without
  ``force``, always succeeds.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fastgshare.ledger import GpuLedger
from fastgshare.placement import Policy
from scheduler_extender.state import BindOutcome, ClusterState, ReservationRefused
from tests.builders import make_share
from tests.unit.scheduler_extender.conftest import node_record, pod_record, synced_state

NODES = ("node-a", "node-b")
SHARES = (make_share(request=300, limit=300, sm=40), make_share(request=600, limit=600, sm=60),
          make_share(request=0, limit=500, sm=100, mem=3 * 2**30), make_share(request=500, limit=500, sm=100))

operation = st.one_of(
    st.tuples(st.just("reserve"), st.integers(0, 7), st.sampled_from(NODES), st.integers(0, len(SHARES) - 1)),
    st.tuples(st.just("finish"), st.integers(0, 7), st.sampled_from(list(BindOutcome))),
    st.tuples(st.just("delete"), st.integers(0, 7)),
    st.tuples(st.just("relist")),
)


def check(state: ClusterState) -> None:
    snapshot = state.snapshot()
    placed = {(p.node, p.gpu_uuid, p.uid) for p in snapshot.placements}
    held = {(name, uuid, uid) for name, entry in snapshot.nodes.items() if entry.state is not None
            for uuid, ledger in entry.state.ledgers.items() for uid in ledger.pods}
    assert held == placed
    fresh: dict[str, GpuLedger] = {}
    for name, entry in snapshot.nodes.items():
        assert entry.state is not None
        for uuid, ledger in entry.state.ledgers.items():
            fresh[uuid] = GpuLedger(ledger.gpu, ledger.slots)
            assert not ledger.overcommitted, name
    for placement in sorted(snapshot.placements, key=lambda p: (p.assigned_at_ms, p.uid)):
        fresh[placement.gpu_uuid].add(placement.uid, placement.share)  # raises on over-commit


@given(st.lists(operation, max_size=40))
def test_binds_and_events_keep_ledgers_exact_and_within_budget(operations: list[tuple[object, ...]]) -> None:
    state = synced_state(*(node_record(name, 1, slots=4, mem=8 * 2**30) for name in NODES))
    running: dict[str, str] = {}  # uid -> node of binds in flight
    for op in operations:
        uid = f"u{op[1]}" if len(op) > 1 else ""
        if op[0] == "reserve" and uid not in running:
            try:
                state.reserve(uid=uid, pod_key=f"ns/{uid}", node=str(op[2]), share=SHARES[int(str(op[3]))],
                              policy=Policy.BINPACK)
                running[uid] = str(op[2])
            except ReservationRefused:
                pass
        elif op[0] == "finish" and uid in running:
            state.finish_bind(uid, running.pop(uid), op[2])  # type: ignore[arg-type]
        elif op[0] == "delete":
            state.delete_pod(pod_record(uid, uid=uid, namespace="ns"))
        elif op[0] == "relist":
            state.replace_pods([], state.begin_relist())
        check(state)
