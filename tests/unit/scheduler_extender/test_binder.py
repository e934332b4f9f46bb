"""Bind against an in-memory API: one write a pod, reads only when the cache lacks the pod, conflicts, failures,
no over-commit."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import attrs
import pytest

from fastgshare import keys
from fastgshare.codec import decode_assignment
from fastgshare.ledger import GpuLedger
from fastgshare.placement import Policy
from scheduler_extender.binder import Binder
from scheduler_extender.config import DEFAULT_BIND_WAIT_S, DEFAULT_BIND_WINDOW
from scheduler_extender.metrics import Metrics
from scheduler_extender.passes import FilterPasses
from scheduler_extender.ports import ApiFailure
from scheduler_extender.records import PodRecord
from scheduler_extender.state import ClusterState
from scheduler_extender.wire import BindingArgs
from tests.builders import make_gpu, share_annotations
from tests.unit.scheduler_extender.conftest import FakeKube, assignment, node_record, pod_record, synced_state

WRITTEN = (keys.POD_ASSIGNMENT_ANNOTATION, keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION)  # what a bind writes


class PassedEverywhere(FilterPasses):
    """As if every pod had passed the filter for every node (the gate has its own tests)."""

    def refusal(self, uid: str, node: str) -> str | None:
        return None


def binder(state: ClusterState, kube: FakeKube, *, bind_wait_s: float = 0.0,
           policy: Policy = Policy.BINPACK, passes: FilterPasses | None = None) -> Binder:
    kube.watch = state.upsert_pod
    return Binder(state, kube, default_policy=policy, bind_wait_s=bind_wait_s, metrics=Metrics(),
                  passes=passes if passes is not None else PassedEverywhere())


def bind_args(kube: FakeKube, name: str, node: str = "node-a") -> BindingArgs:
    pod = kube.pods[f"team-a/{name}"]
    return BindingArgs(pod_name=pod.name, pod_namespace=pod.namespace, pod_uid=pod.uid, node=node)


def test_bind_refuses_a_node_the_filter_did_not_pass_before_any_write(kube: FakeKube) -> None:
    """Issue 15, defect 10, at the binder: the gate comes before the reservation and every write."""
    state = synced_state(node_record("node-a", 2), node_record("node-b", 2))
    passes = FilterPasses()
    passes.record("u1", ["node-a"])
    kube.add(pod_record("p", uid="u1"))
    extender = binder(state, kube, passes=passes)
    assert extender.bind(bind_args(kube, "p", "node-b")) == (
        "fastgshare: pod team-a/p did not pass the fastgshare extender's filter for node node-b (it passed for: "
        "node-a); only nodes the filter passed may be bound")
    assert kube.actions == [("get", "team-a/p")]
    assert state.snapshot().placements == []
    assert extender.bind(bind_args(kube, "p", "node-a")) == ""
    assert kube.writes() == [("bind", "team-a/p", "node-a", *WRITTEN)]
    assert len(passes) == 0  # spent by the bind


def test_filter_passes_expire_and_stay_bounded() -> None:
    now = [0.0]
    passes = FilterPasses(ttl_s=10, max_pods=2, clock=lambda: now[0])
    passes.record("u1", ["node-a"])
    passes.record("u2", [f"node-{i:02}" for i in range(12)])
    assert passes.refusal("u1", "node-a") is None
    assert passes.refusal("u2", "node-x") == ("it passed for: node-00, node-01, node-02, node-03, node-04, node-05, "
                                              "node-06, node-07, node-08, node-09 and 2 more")
    passes.record("u3", [])
    assert len(passes) == 2
    assert passes.refusal("u1", "node-a") is not None  # the oldest went first
    assert passes.refusal("u3", "node-a") == "it passed for: no node"
    now[0] = 10.0
    assert "over 10 s ago" in (passes.refusal("u2", "node-00") or "")
    passes.record("u4", ["node-a"])
    assert len(passes) == 1  # the expired went


def test_bind_is_one_binding_that_carries_the_assignment(kube: FakeKube) -> None:
    """Issue 18: the assignment rides in the Binding's annotations (the API server copies them onto
    the pod in the same write); no separate patch."""
    state = synced_state(node_record("node-a", 2), now_ms=lambda: 1_700_000_000_000)
    kube.add(pod_record("p", uid="u1"))
    assert binder(state, kube).bind(bind_args(kube, "p")) == ""
    assert kube.actions == [("get", "team-a/p"), ("bind", "team-a/p", "node-a", *WRITTEN)]
    pod = kube.pods["team-a/p"]
    written = decode_assignment(pod.annotations[keys.POD_ASSIGNMENT_ANNOTATION])
    assert (pod.node_name, written.node_name, written.gpu_uuid, written.gpu_index) == (
        "node-a", "node-a", "GPU-node-a-0", 0)
    assert written.assigned_at_ms == 1_700_000_000_000
    assert (written.share.request_permille, written.share.limit_permille, written.share.sm_percent) == (400, 800, 50)
    assert [p.status for p in state.snapshot().placements] == ["bound"]


def test_bind_of_a_pod_the_watch_has_shown_makes_one_api_call(kube: FakeKube) -> None:
    """No GET when the cache has the pod, unbound, with the uid the scheduler named."""
    state = synced_state(node_record("node-a", 2))
    pod = kube.add(pod_record("p", uid="u1"))
    state.upsert_pod(pod)
    assert binder(state, kube).bind(bind_args(kube, "p")) == ""
    assert kube.actions == [("bind", "team-a/p", "node-a", *WRITTEN)]
    assert kube.pods["team-a/p"].node_name == "node-a"
    assert [p.status for p in state.snapshot().placements] == ["bound"]


def test_a_cached_pod_of_another_uid_is_read_from_the_api(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a", 2))
    state.upsert_pod(pod_record("p", uid="old"))
    kube.add(pod_record("p", uid="u1"))
    assert binder(state, kube).bind(bind_args(kube, "p")) == ""
    assert [a[0] for a in kube.actions] == ["get", "bind"]


def test_a_cached_pod_that_was_deleted_meanwhile_is_refused(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a", 2))
    state.upsert_pod(pod_record("p", uid="u1"))
    error = binder(state, kube).bind(BindingArgs(pod_name="p", pod_namespace="team-a", pod_uid="u1", node="node-a"))
    assert error == "fastgshare: pod team-a/p was deleted during the bind"
    assert state.sizes() == (1, 0)


def test_a_cached_pod_replaced_meanwhile_is_refused(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a", 2))
    state.upsert_pod(pod_record("p", uid="u1"))
    kube.add(pod_record("p", uid="u2"))
    error = binder(state, kube).bind(BindingArgs(pod_name="p", pod_namespace="team-a", pod_uid="u1", node="node-a"))
    assert error == "fastgshare: pod team-a/p was deleted or replaced during the bind"
    assert keys.POD_ASSIGNMENT_ANNOTATION not in kube.pods["team-a/p"].annotations
    assert state.sizes() == (1, 0)


def test_a_cached_pod_bound_elsewhere_meanwhile_is_refused(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a", 2))
    state.upsert_pod(kube.add(pod_record("p", uid="u1")))
    kube.pods["team-a/p"] = attrs.evolve(kube.pods["team-a/p"], node_name="node-b", resource_version="11")
    error = binder(state, kube).bind(bind_args(kube, "p"))
    assert error == "fastgshare: pod team-a/p was bound to node node-b meanwhile"
    assert [a[0] for a in kube.actions] == ["bind", "get"]
    assert keys.POD_ASSIGNMENT_ANNOTATION not in kube.pods["team-a/p"].annotations
    assert state.sizes() == (1, 0)


def test_binpack_fills_the_busier_gpu_spread_the_emptier(kube: FakeKube) -> None:
    busy = pod_record("busy", uid="u0", node_name="node-a", assignment=assignment("node-a", 1, request=300))
    for policy, gpu in ((Policy.BINPACK, "GPU-node-a-1"), (Policy.SPREAD, "GPU-node-a-0")):
        fake = FakeKube()
        fake.add(pod_record("p", uid="u1"))
        state = synced_state(node_record("node-a", 2), pods=(busy,))
        assert binder(state, fake, policy=policy).bind(bind_args(fake, "p")) == ""
        assert decode_assignment(fake.pods["team-a/p"].annotations[keys.POD_ASSIGNMENT_ANNOTATION]).gpu_uuid == gpu


def test_conflict_rereads_and_retries(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a"))
    kube.add(pod_record("p", uid="u1"))
    kube.conflicts_before_write = 2
    assert binder(state, kube).bind(bind_args(kube, "p")) == ""
    assert [a[0] for a in kube.actions] == ["get", "bind", "get", "bind", "get", "bind"]
    assert kube.pods["team-a/p"].node_name == "node-a"


def test_a_stale_cached_pod_is_read_again_after_the_conflict(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a"))
    state.upsert_pod(pod_record("p", uid="u1", resource_version="10"))
    kube.add(pod_record("p", uid="u1", resource_version="12"))
    assert binder(state, kube).bind(bind_args(kube, "p")) == ""
    assert [a[0] for a in kube.actions] == ["bind", "get", "bind"]
    assert keys.POD_ASSIGNMENT_ANNOTATION in kube.pods["team-a/p"].annotations


def test_share_changed_during_the_bind_is_refused_and_released(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a"))
    kube.add(pod_record("p", uid="u1"))
    original = binder(state, kube)
    stale = kube.pods["team-a/p"]
    kube.pods["team-a/p"] = attrs.evolve(stale, resource_version="11",
                                         annotations=share_annotations(request="0.7", limit="0.9"))
    kube.read_pod = lambda namespace, name: stale if not kube.actions else FakeKube.read_pod(kube, namespace, name)  # type: ignore[method-assign]
    error = original.bind(bind_args(kube, "p"))
    assert "share of pod team-a/p changed during the bind" in error
    assert state.sizes() == (1, 0)


def test_failed_binding_writes_nothing_and_frees_the_gpu(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a"))
    state.upsert_pod(kube.add(pod_record("p", uid="u1")))
    kube.binding_error = ApiFailure("HTTP 500: etcd timeout")
    error = binder(state, kube).bind(bind_args(kube, "p"))
    assert error == "fastgshare: binding pod team-a/p to node node-a failed: HTTP 500: etcd timeout"
    assert kube.actions == [("bind", "team-a/p", "node-a", *WRITTEN),
                            ("get", "team-a/p")]  # did it land anyway? no
    assert keys.POD_ASSIGNMENT_ANNOTATION not in kube.pods["team-a/p"].annotations
    assert state.sizes() == (1, 0)


def test_binding_that_failed_in_transit_but_took_effect_counts_as_bound(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a"))
    kube.add(pod_record("p", uid="u1"))
    real_bind = kube.create_binding

    def bind_then_time_out(pod: PodRecord, node: str, annotations: Mapping[str, str] | None = None) -> None:
        real_bind(pod, node, annotations)
        raise ApiFailure("API server unreachable: read timed out")

    kube.create_binding = bind_then_time_out  # type: ignore[method-assign]
    assert binder(state, kube).bind(bind_args(kube, "p")) == ""
    assert keys.POD_ASSIGNMENT_ANNOTATION in kube.pods["team-a/p"].annotations
    assert [p.status for p in state.snapshot().placements] == ["bound"]


def test_a_binding_that_landed_counts_only_with_this_binds_assignment(kube: FakeKube) -> None:
    """Bound to the node meanwhile by someone else (no assignment of this bind): not ours."""
    state = synced_state(node_record("node-a"))
    kube.add(pod_record("p", uid="u1"))
    real_bind = kube.create_binding

    def others_bind_then_time_out(pod: PodRecord, node: str, annotations: Mapping[str, str] | None = None) -> None:
        real_bind(pod, node, {keys.POD_ASSIGNMENT_ANNOTATION: "someone else's"})
        raise ApiFailure("API server unreachable: read timed out")

    kube.create_binding = others_bind_then_time_out  # type: ignore[method-assign]
    error = binder(state, kube).bind(bind_args(kube, "p"))
    assert error == ("fastgshare: binding pod team-a/p to node node-a failed: API server unreachable: read timed "
                     "out")
    assert state.sizes() == (1, 0)


def test_a_conflict_from_a_binding_that_landed_counts_as_bound(kube: FakeKube) -> None:
    """A retry (by the client or the network) of a Binding that took effect: 409, bound with our assignment."""
    state = synced_state(node_record("node-a"))
    kube.add(pod_record("p", uid="u1"))
    real_bind = kube.create_binding

    def bind_twice(pod: PodRecord, node: str, annotations: Mapping[str, str] | None = None) -> None:
        real_bind(pod, node, annotations)
        real_bind(pod, node, annotations)

    kube.create_binding = bind_twice  # type: ignore[method-assign]
    assert binder(state, kube).bind(bind_args(kube, "p")) == ""
    assert [p.status for p in state.snapshot().placements] == ["bound"]


def test_rebind_after_a_failed_attempt_replaces_the_stale_assignment(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a", 1))
    kube.add(pod_record("p", uid="u1", assignment=assignment("node-a", 0, request=1000, sm=100)))
    state.upsert_pod(kube.pods["team-a/p"])
    assert binder(state, kube).bind(bind_args(kube, "p")) == ""
    assert len(state.snapshot().placements) == 1


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        pytest.param(lambda kube: None, "pod team-a/p no longer exists", id="gone"),
        pytest.param(lambda kube: kube.add(pod_record("p", uid="other")), "was replaced", id="replaced"),
        pytest.param(lambda kube: kube.add(pod_record("p", uid="u1", node_name="node-b")),
                     "already bound to node node-b", id="bound-elsewhere"),
        pytest.param(lambda kube: kube.add(pod_record("p", uid="u1", annotations={})),
                     "fastgshare/gpu_mem: is required", id="no-share"),
    ],
)
def test_refusals_say_why(kube: FakeKube, setup: object, message: str) -> None:
    state = synced_state(node_record("node-a"))
    setup(kube)  # type: ignore[operator]
    error = binder(state, kube).bind(BindingArgs(pod_name="p", pod_namespace="team-a", pod_uid="u1", node="node-a"))
    assert message in error
    assert error.startswith("fastgshare: ")
    assert state.sizes() == (1, 0)


def test_no_room_names_the_node_and_the_reason(kube: FakeKube) -> None:
    state = synced_state(node_record("node-a", 1), pods=(
        pod_record("full", uid="u0", node_name="node-a", assignment=assignment("node-a", 0, request=1000, sm=100)),))
    kube.add(pod_record("p", uid="u1"))
    assert binder(state, kube).bind(bind_args(kube, "p")) == (
        "fastgshare: node node-a: no GPU with 50 percent of its SMs free for 0.4 of the time")


def test_retried_bind_of_a_pod_we_already_bound_succeeds_without_writes(kube: FakeKube) -> None:
    kube.add(pod_record("p", uid="u1", node_name="node-a", assignment=assignment("node-a")))
    assert binder(synced_state(node_record("node-a")), kube).bind(bind_args(kube, "p")) == ""
    assert kube.actions == [("get", "team-a/p")]


def test_retried_bind_the_watch_has_not_shown_bound_yet_reads_the_pod(kube: FakeKube) -> None:
    """The cache still shows the pod pending, but a bind of ours bound it: the API is asked, not the cache."""
    state = synced_state(node_record("node-a"))
    subject = binder(state, kube)
    kube.watch = None  # the watch lags
    pending = kube.add(pod_record("p", uid="u1"))
    state.upsert_pod(pending)
    assert subject.bind(bind_args(kube, "p")) == ""
    assert state.pending_pod("team-a/p", "u1") is None
    kube.actions.clear()
    assert subject.bind(bind_args(kube, "p")) == ""
    assert kube.actions == [("get", "team-a/p")]


def bind_first_then_start_second(kube: FakeKube, bind_wait_s: float, bind_window: int = 1) -> threading.Thread:
    """Bind pod "first" to node-a, then start binding "second" there on a thread (returned)."""
    state = synced_state(node_record("node-a"), bind_wait_s=bind_wait_s, bind_window=bind_window)
    subject = binder(state, kube, bind_wait_s=bind_wait_s)
    for name in ("first", "second"):
        kube.add(pod_record(name, uid=f"u-{name}"))
    assert subject.bind(bind_args(kube, "first")) == ""
    second = threading.Thread(target=subject.bind, args=(bind_args(kube, "second"),))
    second.start()
    return second


def test_bind_waits_for_the_previous_pod_on_the_node_to_be_allocated(kube: FakeKube) -> None:
    second = bind_first_then_start_second(kube, bind_wait_s=30)
    second.join(0.2)
    assert second.is_alive()
    assert not kube.pods["team-a/second"].node_name
    kube.mark_allocated("team-a/first")
    second.join(5)
    assert kube.pods["team-a/second"].node_name == "node-a"


@pytest.mark.parametrize(("bind_wait_s", "bind_window"), [(DEFAULT_BIND_WAIT_S, DEFAULT_BIND_WINDOW), (0, 1)],
                         ids=["default-window", "no-wait"])
def test_by_default_a_bind_does_not_wait_for_the_previous_pod_on_the_node(kube: FakeKube, bind_wait_s: float,
                                                                          bind_window: int) -> None:
    """Issue 18: Allocate is exact without the extender's pacing, so binds to a node no longer go
    one at a time: the default window holds several (with the old window of 1, the second bind
    waited 5 s for "first" to be allocated); with no bind wait there are no turns at all."""
    second = bind_first_then_start_second(kube, bind_wait_s=bind_wait_s, bind_window=bind_window)
    second.join(3)
    assert not second.is_alive()
    assert kube.pods["team-a/second"].node_name == "node-a"
    assert keys.POD_ALLOCATED_ANNOTATION not in kube.pods["team-a/first"].annotations  # never allocated


@pytest.mark.parametrize("watched", [False, True], ids=["read", "cached"])
def test_concurrent_binds_never_over_commit_a_gpu(kube: FakeKube, watched: bool) -> None:
    """60 binds of 0.3 x 40 % pods race for 4 GPUs (room for 3 x 2 each by area and SM)."""
    gpus = [make_gpu(i, uuid=f"GPU-node-a-{i}") for i in range(2)]
    state = synced_state(node_record("node-a", gpus), node_record("node-b", 2))
    subject = binder(state, kube)
    names = [f"p{i}" for i in range(60)]
    for name in names:
        pod = kube.add(pod_record(name, annotations=share_annotations(request="0.3", limit="0.3", sm="40", mem="1Gi")))
        if watched:
            state.upsert_pod(pod)
    with ThreadPoolExecutor(max_workers=12) as pool:
        errors = list(pool.map(lambda n: subject.bind(bind_args(kube, n, "node-a" if int(n[1:]) % 2 else "node-b")),
                               names))
    bound = [pod for pod in kube.pods.values() if pod.node_name]
    assert len(bound) == sum(1 for e in errors if not e) == 24  # 4 GPUs x (3 columns x 2 rows)
    by_gpu: dict[str, GpuLedger] = {}
    for pod in bound:
        written = decode_assignment(pod.annotations[keys.POD_ASSIGNMENT_ANNOTATION])
        ledger = by_gpu.setdefault(written.gpu_uuid, GpuLedger(make_gpu(written.gpu_index, uuid=written.gpu_uuid)))
        ledger.add(pod.key, written.share)  # raises if the GPU would be over-committed
    assert all("no GPU with 40 percent of its SMs free for 0.3 of the time" in e for e in errors if e)
