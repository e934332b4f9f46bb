"""Live share changes in the extender: judged on the pod's GPU, written as its assignment, reported once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import pytest

from fastgshare import keys
from fastgshare.codec import decode_assignment
from fastgshare.inventory import GpuDevice
from fastgshare.ledger import GpuLedger
from scheduler_extender.records import PodRecord
from scheduler_extender.resharing import ShareChange, ShareChangeRefused, judge_change, most_request_that_fits
from scheduler_extender.share_changes import (
    REASON_CHANGED,
    REASON_REFUSED,
    REASON_WOKEN_WITHOUT_REQUEST,
    ShareChanges,
    asks_for_change,
)
from scheduler_extender.state import ClusterState
from tests.builders import TEST_TRUST, make_gpu, make_share, share_annotations
from tests.unit.scheduler_extender.conftest import FakeKube, assignment, node_record, pod_record, synced_state
from tests.unit.scheduler_extender.test_binder import bind_args, binder

GiB = 2**30


def gpu() -> GpuDevice:
    return make_gpu(0, uuid="GPU-node-a-0")


# --- the pure judgement ----------------------------------------------------------------------
def test_a_limit_only_change_or_a_lower_request_always_fits_even_on_a_full_gpu() -> None:
    ledger = GpuLedger(gpu())
    ledger.add("other", make_share(request=1000, limit=1000, sm=100), force=True)  # nothing left at all
    judge_change(make_share(request=400, limit=600), make_share(request=400, limit=300 + 100), ledger)
    judge_change(make_share(request=400, limit=600), make_share(request=200, limit=600), ledger)


def test_a_higher_request_that_fits_is_allowed() -> None:
    ledger = GpuLedger(gpu())
    ledger.add("other", make_share(request=500, sm=100))
    judge_change(make_share(request=300, limit=600), make_share(request=500, limit=600), ledger)


def test_a_higher_request_that_does_not_fit_says_the_key_the_value_and_what_is_left() -> None:
    ledger = GpuLedger(gpu())
    ledger.add("other", make_share(request=700, sm=100))
    with pytest.raises(ShareChangeRefused) as refused:
        judge_change(make_share(request=100, limit=600), make_share(request=900, limit=1000), ledger)
    message = str(refused.value)
    assert f"{keys.GPU_QUOTA_REQUEST} 0.9 does not fit GPU 0 (GPU-node-a-0)" in message
    assert "at most 0.3 of the time is free for it at 50 % SM" in message
    assert "the share stays time 0.1..0.6" in message


def test_the_room_left_is_searched_between_the_old_and_the_new_request() -> None:
    ledger = GpuLedger(gpu())
    ledger.add("other", make_share(request=650, sm=100))
    assert most_request_that_fits(ledger, make_share(request=100), make_share(request=900, limit=900)) == 350


@pytest.mark.parametrize(("wanted", "field", "why"), [
    (make_share(request=400, limit=600, sm=60), keys.GPU_SM_PARTITION, "SM percentage is fixed when the process"),
    (make_share(request=400, limit=600, mem=2 * GiB), keys.GPU_MEM, "memory limit is fixed when the process"),
])
def test_sm_or_memory_changes_on_a_running_pod_are_refused_with_why(wanted: Any, field: str, why: str) -> None:
    with pytest.raises(ShareChangeRefused) as refused:
        judge_change(make_share(request=400, limit=600), wanted, GpuLedger(gpu()))
    assert field in str(refused.value)
    assert why in str(refused.value)
    assert "a FaSTPod rolls its pods" in str(refused.value)


# --- the cache -------------------------------------------------------------------------------
def running(name: str, uid: str, *, request: int = 400, limit: int = 800, sm: int = 50,
            annotations: dict[str, str] | None = None, at_ms: int = 1_000) -> PodRecord:
    placed = attrs.evolve(assignment("node-a", request=request, sm=sm, at_ms=at_ms),
                          share=make_share(request=request, limit=limit, sm=sm))
    return pod_record(name, uid=uid, node_name="node-a", assignment=placed, allocated=True, annotations=annotations)


def ledger_share(state: ClusterState, uid: str) -> Any:
    entry = state.snapshot().nodes["node-a"]
    assert entry.state is not None
    return entry.state.ledgers["GPU-node-a-0"].pods[uid]


def one_gpu_state(*pods: PodRecord) -> ClusterState:
    return synced_state(node_record("node-a", gpus=1), pods=pods)


def test_a_change_is_taken_on_the_ledger_before_it_is_written_and_reverted_if_not_written() -> None:
    state = one_gpu_state(running("p", "u1"))
    wanted = make_share(request=600, limit=800)
    start = state.begin_share_change("u1", wanted)
    assert start is not None
    assert start.old == make_share(request=400, limit=800)
    assert ledger_share(state, "u1") == wanted
    assert state.begin_share_change("u1", make_share(request=700, limit=800)) is None  # one change at a time
    state.end_share_change(start, written=False)
    assert ledger_share(state, "u1") == start.old


def test_while_a_written_change_is_pending_events_with_the_old_share_change_nothing() -> None:
    """Also issue 42, item 2 (a replay with the webhook down): once our write came back, the pod's
    first assignment, validly signed but older, written back again is not followed."""
    pod = running("p", "u1")
    state = one_gpu_state(pod)
    wanted = make_share(request=600, limit=800)
    start = state.begin_share_change("u1", wanted)
    assert start is not None
    state.end_share_change(start, written=True)
    state.upsert_pod(attrs.evolve(pod, phase="Running"))  # an event from before our write: old share
    assert ledger_share(state, "u1") == wanted
    state.replace_pods([pod], state.begin_relist())  # a list from before our write
    assert ledger_share(state, "u1") == wanted
    shown = running("p", "u1", request=600, at_ms=start.assigned_at_ms)
    state.upsert_pod(shown)  # our write comes back
    state.upsert_pod(pod)  # now the API shows the older assignment again (a replay): it is not followed
    assert ledger_share(state, "u1") == wanted


def test_a_change_is_stamped_later_than_the_assignment_it_replaces_and_reverted_with_it() -> None:
    """Issue 42, item 2: the signature covers the time, so a replayed older assignment is told apart."""
    pod = running("p", "u1")
    state = one_gpu_state(pod)
    start = state.begin_share_change("u1", make_share(request=600, limit=800))
    assert start is not None
    assert start.assigned_at_ms > 1_000
    state.end_share_change(start, written=False)  # not written: the pod's own assignment holds again
    state.upsert_pod(attrs.evolve(pod, phase="Running"))
    assert ledger_share(state, "u1") == make_share(request=400, limit=800)
    later = state.begin_share_change("u1", make_share(request=500, limit=800))
    assert later is not None
    assert later.old_assigned_at_ms == 1_000


def test_a_refused_change_leaves_the_ledger_alone() -> None:
    state = one_gpu_state(running("p", "u1", request=400, sm=100), running("q", "u2", request=500, sm=100))
    with pytest.raises(ShareChangeRefused, match=r"0\.6 does not fit"):
        state.begin_share_change("u1", make_share(request=600, limit=800, sm=100))
    assert ledger_share(state, "u1") == make_share(request=400, limit=800, sm=100)


def test_pods_being_bound_or_not_yet_bound_are_left_to_bind() -> None:
    unbound = pod_record("p", uid="u1", assignment=assignment("node-a"))
    state = one_gpu_state(unbound)
    assert state.begin_share_change("u1", make_share(request=600, limit=800)) is None


# --- carrying it out -------------------------------------------------------------------------
class Events:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, str]] = []

    def event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        self.sent.append((obj["metadata"]["name"], kind, reason, message))


@attrs.define
class Rig:
    state: ClusterState
    kube: FakeKube
    events: Events
    changes: ShareChanges

    def edit(self, key: str, **values: str) -> PodRecord:
        """A user's kubectl annotate: the pod's annotations change and the watch reports it."""
        current = self.kube.pods[key]
        annotations = {**current.annotations}
        names = {"request": keys.GPU_QUOTA_REQUEST, "limit": keys.GPU_QUOTA_LIMIT, "sm": keys.GPU_SM_PARTITION,
                 "mem": keys.GPU_MEM}
        annotations.update({names[name]: value for name, value in values.items()})
        version = str(int(current.resource_version) + 1)
        updated = attrs.evolve(current, annotations=annotations, resource_version=version)
        self.kube.pods[key] = updated
        self.watch(updated)
        return updated

    def watch(self, pod: PodRecord) -> None:
        self.state.upsert_pod(pod)
        self.changes.notice(pod)

    def share_of(self, key: str) -> Any:
        return decode_assignment(self.kube.pods[key].annotations[keys.POD_ASSIGNMENT_ANNOTATION]).share


def rig(*pods: PodRecord) -> Rig:
    state = one_gpu_state(*pods)
    kube = FakeKube()
    for pod in pods:
        kube.add(pod)
    events = Events()
    result = Rig(state, kube, events, ShareChanges(state, kube, events))
    kube.watch = result.watch
    return result


def test_lowering_a_running_pods_limit_rewrites_its_assignment_and_says_so() -> None:
    pod = running("p", "u1", request=300, limit=600, annotations=share_annotations(request="0.3", limit="0.6"))
    r = rig(pod)
    before = decode_assignment(pod.annotations[keys.POD_ASSIGNMENT_ANNOTATION])
    r.edit(pod.key, limit="0.3")
    r.changes.run_pending()
    after = decode_assignment(r.kube.pods[pod.key].annotations[keys.POD_ASSIGNMENT_ANNOTATION])
    assert after.share == make_share(request=300, limit=300)
    assert (after.node_name, after.gpu_uuid) == (before.node_name, before.gpu_uuid)
    assert after.assigned_at_ms > before.assigned_at_ms  # later than the one it replaces (a replay is told apart)
    assert [(reason, kind) for _, kind, reason, _ in r.events.sent] == [(REASON_CHANGED, "Normal")]
    assert "from request 0.3 limit 0.6 to request 0.3 limit 0.3" in r.events.sent[0][3]
    assert ledger_share(r.state, "u1") == make_share(request=300, limit=300)
    assert not asks_for_change(r.kube.pods[pod.key], TEST_TRUST)
    signature = r.kube.pods[pod.key].annotations[keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION]
    assert TEST_TRUST.problem(signature, pod_uid="u1", node_name=after.node_name, assignment=after) is None


def test_a_request_past_what_the_gpu_has_is_refused_once_and_the_share_stays() -> None:
    other = running("q", "u2", request=700, sm=100, annotations=share_annotations(request="0.7", sm="100"))
    pod = running("p", "u1", request=200, limit=800, sm=100,
                  annotations=share_annotations(request="0.2", limit="0.8", sm="100"))
    r = rig(other, pod)
    r.edit(pod.key, request="0.6")
    r.changes.run_pending()
    r.watch(attrs.evolve(r.kube.pods[pod.key], phase="Running"))  # the same change seen again
    r.changes.run_pending()
    assert r.share_of(pod.key) == make_share(request=200, limit=800, sm=100)
    assert len(r.events.sent) == 1
    name, kind, reason, message = r.events.sent[0]
    assert (name, kind, reason) == ("p", "Warning", REASON_REFUSED)
    assert f"{keys.GPU_QUOTA_REQUEST} 0.6 does not fit GPU 0" in message
    assert "at most 0.3 of the time is free" in message
    r.edit(pod.key, request="0.7")  # another change: reported again
    r.changes.run_pending()
    assert [reason for _, _, reason, _ in r.events.sent] == [REASON_REFUSED, REASON_REFUSED]
    r.edit(pod.key, request="0.3")  # one that fits
    r.changes.run_pending()
    assert r.share_of(pod.key) == make_share(request=300, limit=800, sm=100)
    assert r.events.sent[-1][2] == REASON_CHANGED


def test_an_sm_edit_or_an_invalid_edit_is_refused_with_why() -> None:
    pod = running("p", "u1", annotations=share_annotations())
    r = rig(pod)
    r.edit(pod.key, sm="70")
    r.changes.run_pending()
    r.edit(pod.key, sm="50", limit="0.2")  # below the request
    r.changes.run_pending()
    assert r.share_of(pod.key) == make_share(request=400, limit=800)
    messages = [message for _, _, _, message in r.events.sent]
    assert len(messages) == 2
    assert keys.GPU_SM_PARTITION in messages[0]
    assert "fixed when the process starts" in messages[0]
    assert keys.GPU_QUOTA_LIMIT in messages[1]


def test_a_concurrent_edit_during_the_write_is_not_lost() -> None:
    pod = running("p", "u1", request=300, limit=600, annotations=share_annotations(request="0.3", limit="0.6"))
    r = rig(pod)
    r.edit(pod.key, limit="0.5")
    r.kube.watch = None  # the second edit lands before the worker writes; the watch has not told us yet
    r.edit(pod.key, limit="0.4")
    r.kube.watch = r.watch
    r.changes.process(attrs.evolve(r.kube.pods[pod.key], annotations={
        **r.kube.pods[pod.key].annotations, keys.GPU_QUOTA_LIMIT: "0.5"}, resource_version="1"))  # stale record
    r.changes.run_pending()
    assert r.share_of(pod.key) == make_share(request=300, limit=400)


def test_pods_that_are_not_bound_or_finished_are_not_changes() -> None:
    assert not asks_for_change(pod_record("p", annotations=share_annotations(request="0.5")), TEST_TRUST)
    done = running("p", "u1", annotations=share_annotations(request="0.5"))
    assert asks_for_change(done, TEST_TRUST)
    assert not asks_for_change(attrs.evolve(done, phase="Succeeded"), TEST_TRUST)


# --- parked pods (request and limit 0) ---------------------------------------------------------
def parked(name: str, uid: str, *, sm: int = 100) -> PodRecord:
    """A running pod parked at request 0 limit 0: it holds its memory and gets no GPU time."""
    return running(name, uid, request=0, limit=0, sm=sm, annotations=share_annotations(request="0", limit="0",
                                                                                         sm=str(sm)))


def test_a_parked_pods_wake_that_fits_is_an_ordinary_change() -> None:
    ledger = GpuLedger(gpu())
    ledger.add("other", make_share(request=500, sm=100))
    wanted = make_share(request=400, limit=400, sm=100)
    assert judge_change(make_share(request=0, limit=0, sm=100), wanted, ledger) == ShareChange(wanted)


def test_a_parked_pods_wake_that_does_not_fit_gets_request_0_and_the_new_limit() -> None:
    ledger = GpuLedger(gpu())
    ledger.add("other", make_share(request=800, sm=100))
    change = judge_change(make_share(request=0, limit=0, sm=100), make_share(request=400, limit=600, sm=100), ledger)
    assert change.share == make_share(request=0, limit=600, sm=100)
    assert change.short_of is not None
    assert f"{keys.GPU_QUOTA_REQUEST} 0.4 does not fit GPU 0 (GPU-node-a-0)" in change.short_of
    assert "at most 0.2 of the time is free for it at 100 % SM" in change.short_of
    ledger.add("more", make_share(request=200, sm=100))  # now no time at all is left
    change = judge_change(make_share(request=0, limit=0, sm=100), make_share(request=400, limit=600, sm=100), ledger)
    assert change.share == make_share(request=0, limit=600, sm=100)
    assert "no time is free for it at 100 % SM" in (change.short_of or "")


def test_only_a_parked_pod_is_woken_without_its_request() -> None:
    ledger = GpuLedger(gpu())
    ledger.add("other", make_share(request=800, sm=100))
    with pytest.raises(ShareChangeRefused, match=r"the share stays time 0\.\.0\.6"):  # best effort, not parked
        judge_change(make_share(request=0, limit=600, sm=100), make_share(request=400, limit=600, sm=100), ledger)


def test_a_parked_pod_woken_with_room_gets_its_share_as_an_ordinary_change() -> None:
    other = running("q", "u2", request=500, sm=100, annotations=share_annotations(request="0.5", sm="100"))
    pod = parked("p", "u1")
    r = rig(other, pod)
    assert ledger_share(r.state, "u1") == make_share(request=0, limit=0, sm=100)
    r.edit(pod.key, request="0.4", limit="0.4")
    r.changes.run_pending()
    assert r.share_of(pod.key) == make_share(request=400, limit=400, sm=100)
    assert [(reason, kind) for _, kind, reason, _ in r.events.sent] == [(REASON_CHANGED, "Normal")]
    assert "from request 0 limit 0 to request 0.4 limit 0.4" in r.events.sent[0][3]


def test_a_parked_pod_woken_without_room_runs_at_request_0_and_its_new_limit_until_the_request_fits() -> None:
    other = running("q", "u2", request=800, sm=100, annotations=share_annotations(request="0.8", sm="100"))
    pod = parked("p", "u1")
    r = rig(other, pod)
    r.edit(pod.key, request="0.4", limit="0.4")
    r.changes.run_pending()
    woken = r.kube.pods[pod.key]
    written = decode_assignment(woken.annotations[keys.POD_ASSIGNMENT_ANNOTATION])
    assert written.share == make_share(request=0, limit=400, sm=100)
    assert (written.node_name, written.gpu_uuid) == ("node-a", "GPU-node-a-0")
    signature = woken.annotations[keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION]
    assert TEST_TRUST.problem(signature, pod_uid="u1", node_name="node-a", assignment=written) is None
    assert (woken.annotations[keys.GPU_QUOTA_REQUEST], woken.annotations[keys.GPU_QUOTA_LIMIT]) == ("0.4", "0.4")
    assert ledger_share(r.state, "u1") == make_share(request=0, limit=400, sm=100)
    [(name, kind, reason, message)] = r.events.sent
    assert (name, kind, reason) == ("p", "Warning", REASON_WOKEN_WITHOUT_REQUEST)
    assert message.startswith(f"pod team-a/p woken without its request: {keys.GPU_QUOTA_REQUEST} 0.4 does not fit "
                              "GPU 0 (GPU-node-a-0)")
    assert "at most 0.2 of the time is free for it at 100 % SM" in message
    assert "it runs with request 0 limit 0.4" in message
    assert asks_for_change(woken, TEST_TRUST)  # the request is still asked for
    r.watch(attrs.evolve(woken, phase="Running"))  # the same change seen again: tried, not reported again
    r.changes.run_pending()
    assert r.share_of(pod.key) == make_share(request=0, limit=400, sm=100)
    assert len(r.events.sent) == 1
    r.edit(pod.key, request="0.3")  # another edit: retried, refused like any raise that does not fit
    r.changes.run_pending()
    assert r.share_of(pod.key) == make_share(request=0, limit=400, sm=100)
    assert [reason for _, _, reason, _ in r.events.sent] == [REASON_WOKEN_WITHOUT_REQUEST, REASON_REFUSED]
    assert "the share stays time 0..0.4" in r.events.sent[-1][3]
    r.state.delete_pod(other)  # room freed; the pod's next update retries the change
    r.watch(attrs.evolve(r.kube.pods[pod.key], phase="Running"))
    r.changes.run_pending()
    assert r.share_of(pod.key) == make_share(request=300, limit=400, sm=100)
    assert r.events.sent[-1][2] == REASON_CHANGED
    assert not asks_for_change(r.kube.pods[pod.key], TEST_TRUST)


def test_a_partial_wake_survives_a_concurrent_edit_of_another_annotation() -> None:
    other = running("q", "u2", request=800, sm=100, annotations=share_annotations(request="0.8", sm="100"))
    pod = parked("p", "u1")
    r = rig(other, pod)
    asked = r.edit(pod.key, request="0.4", limit="0.4")
    r.kube.pods[pod.key] = attrs.evolve(asked, annotations={**asked.annotations, "team": "vision"},
                                        resource_version=str(int(asked.resource_version) + 1))  # unseen by the watch
    r.changes.process(asked)  # a conflict: re-read, still asks for the same share, written in this one go
    assert r.share_of(pod.key) == make_share(request=0, limit=400, sm=100)
    assert [reason for _, _, reason, _ in r.events.sent] == [REASON_WOKEN_WITHOUT_REQUEST]
    r.changes.run_pending()
    assert [reason for _, _, reason, _ in r.events.sent] == [REASON_WOKEN_WITHOUT_REQUEST]


def test_a_parked_pod_binds_on_memory_alone_even_to_a_gpu_full_in_time(kube: FakeKube) -> None:
    full = pod_record("full", uid="u0", node_name="node-a", assignment=assignment("node-a", request=1000, sm=100))
    state = synced_state(node_record("node-a", 1), pods=(full,))
    kube.add(pod_record("p", uid="u1", annotations=share_annotations(request="0", limit="0", sm="100")))
    assert binder(state, kube).bind(bind_args(kube, "p")) == ""
    written = decode_assignment(kube.pods["team-a/p"].annotations[keys.POD_ASSIGNMENT_ANNOTATION])
    assert (written.gpu_uuid, written.share) == ("GPU-node-a-0", make_share(request=0, limit=0, sm=100))
    entry = state.snapshot().nodes["node-a"]
    assert entry.state is not None
    ledger = entry.state.ledgers["GPU-node-a-0"]
    assert ledger.used_area == 1000 * 100  # the full pod's rectangle alone: the parked pod has none
    assert ledger.committed_memory >= 2 * GiB  # both pods' memory


def test_a_parked_pod_still_needs_its_memory(kube: FakeKube) -> None:
    full = pod_record("full", uid="u0", node_name="node-a",
                      assignment=assignment("node-a", request=100, sm=100, mem=16 * GiB))
    state = synced_state(node_record("node-a", 1), pods=(full,))
    kube.add(pod_record("p", uid="u1", annotations=share_annotations(request="0", limit="0")))
    error = binder(state, kube).bind(bind_args(kube, "p"))
    assert error.startswith("fastgshare: node node-a: ")
    assert "memory" in error
    assert keys.POD_ASSIGNMENT_ANNOTATION not in kube.pods["team-a/p"].annotations
