"""Model sharing in the extender: pod records carry their model, the cache charges each model once
per GPU (pods of it and the store's held models), filter/prioritize/bind prefer the GPU holding
the pod's model, a share change keeps it, a malformed model annotation is refused like a
malformed share, and ``/inspect`` lists the models."""

from __future__ import annotations

import attrs
import pytest

from fastgshare import keys
from fastgshare.model import HeldModel, ModelRef, ModelSpec, model_annotation
from fastgshare.placement import Policy
from scheduler_extender.binder import Binder
from scheduler_extender.decisions import Decisions, InvalidRequest, pod_request
from scheduler_extender.inspection import describe
from scheduler_extender.metrics import Metrics
from scheduler_extender.records import PodRecord, model_problem, pod_from_json
from scheduler_extender.state import ClusterState
from scheduler_extender.wire import BindingArgs, ExtenderArgs
from tests.builders import make_gpu, make_share, share_annotations
from tests.unit.scheduler_extender.conftest import (
    FakeKube,
    GiB,
    assignment,
    node_record,
    pod_json,
    pod_record,
    synced_state,
)
from tests.unit.scheduler_extender.test_binder import PassedEverywhere

VIT_SPEC = ModelSpec(name="vit", bytes=4 * GiB, path="vit.bin")
VIT = ModelRef(namespace="team-a", function="vit-fn", spec=VIT_SPEC)
BERT = ModelRef(namespace="team-a", function="bert-fn", spec=ModelSpec(name="bert", bytes=4 * GiB, path="b.bin"))


def annotations(ref: ModelRef | None, mem: int = GiB, **share: str) -> dict[str, str]:
    values = share_annotations(mem=str(mem), **share)
    if ref is not None:
        values[keys.MODEL_ANNOTATION] = model_annotation(ref.function, ref.spec)
    return values


def placed(name: str, node: str, gpu: int, ref: ModelRef | None, *, mem: int = GiB, request: int = 100,
           at_ms: int = 1_000) -> PodRecord:
    """A bound pod of ``ref`` the API shows on ``node``'s GPU ``gpu``."""
    return pod_record(name, uid=f"uid-{name}", node_name=node, annotations=annotations(ref, mem),
                      assignment=assignment(node, gpu, request=request, sm=20, mem=mem, at_ms=at_ms))


def new_pod(ref: ModelRef | None, mem: int = GiB, uid: str = "uid-new", **share: str) -> PodRecord:
    return pod_record("new", uid=uid, annotations=annotations(ref, mem, **share))


def decisions(state: ClusterState, policy: Policy = Policy.BINPACK) -> Decisions:
    return Decisions(state, policy, Metrics())


def ledger(state: ClusterState, node: str, gpu: int = 0):  # type: ignore[no-untyped-def]
    entry = state.snapshot().nodes[node]
    assert entry.state is not None
    return entry.state.ledgers[f"GPU-{node}-{gpu}"]


# --- records ----------------------------------------------------------------------------------
def test_a_pod_record_carries_the_model_its_annotation_declares_in_its_namespace() -> None:
    pod = pod_from_json(pod_json(new_pod(VIT)))
    assert pod.model == VIT
    assert pod_record("plain").model is None
    assert pod_request(pod, Policy.BINPACK).model == VIT


def test_a_malformed_model_annotation_is_no_model_on_the_record_and_refused_by_filter_with_the_parser_line() -> None:
    bad = pod_record("bad", annotations={**share_annotations(), keys.MODEL_ANNOTATION: '{"function": "f"}'})
    assert bad.model is None
    problem = model_problem(bad)
    assert problem is not None
    assert "annotation fastgshare/model.name" in problem
    with pytest.raises(InvalidRequest) as refused:
        pod_request(bad, Policy.BINPACK)
    assert str(refused.value) == problem
    result = decisions(synced_state(node_record("a"), node_record("b"))).filter(
        ExtenderArgs(pod=bad, node_names=("a", "b")))
    assert result.passed == ()
    assert result.unresolvable == {"a": problem, "b": problem}


# --- the cache's memory charge ----------------------------------------------------------------------
def test_four_pods_of_one_model_charge_it_once_and_a_fifth_fits_where_unshared_it_would_not() -> None:
    gpu = attrs.evolve(make_gpu(0, mem=10 * GiB, uuid="GPU-a-0"), context_reserve_bytes=0)
    shared = tuple(placed(f"vit-{i}", "a", 0, VIT, at_ms=i + 1) for i in range(4))
    state = synced_state(node_record("a", [gpu]), pods=shared)
    assert (ledger(state, "a").model_memory, ledger(state, "a").free_memory) == (4 * GiB, 2 * GiB)
    assert decisions(state).filter(ExtenderArgs(pod=new_pod(VIT), node_names=("a",))).passed == ("a",)
    # without sharing each pod carries its weights in its own gpu_mem: 4 x 5 GiB do not even fit twice
    unshared = synced_state(node_record("a", [gpu]), pods=tuple(
        placed(f"own-{i}", "a", 0, None, mem=5 * GiB, at_ms=i + 1) for i in range(2)))
    result = decisions(unshared).filter(ExtenderArgs(pod=new_pod(None, mem=5 * GiB), node_names=("a",)))
    assert result.failed == {"a": "needs 5 GiB of GPU memory, largest free 0 B"}


def test_the_refusal_names_the_model_when_it_is_the_reason() -> None:
    gpu = make_gpu(0, mem=8 * GiB, uuid="GPU-a-0")
    state = synced_state(node_record("a", [gpu]), pods=(placed("other", "a", 0, BERT),))
    result = decisions(state).filter(ExtenderArgs(pod=new_pod(VIT), node_names=("a",)))
    assert result.failed == {
        "a": "needs 1 GiB of GPU memory + model team-a/vit-fn/vit 4 GiB (on none of them yet), largest free 3 GiB"}


def test_models_the_store_holds_are_charged_and_their_pods_fit_in_what_is_left() -> None:
    held = HeldModel(identity=VIT.identity, key=VIT.key, bytes=VIT.bytes)
    gpu = attrs.evolve(make_gpu(0, mem=6 * GiB, uuid="GPU-a-0"), held_models=(held,))
    state = synced_state(node_record("a", [gpu]))
    assert ledger(state, "a").free_memory == 2 * GiB
    fits = decisions(state).filter(ExtenderArgs(pod=new_pod(VIT, mem=2 * GiB), node_names=("a",)))
    assert fits.passed == ("a",)
    other = decisions(state).filter(ExtenderArgs(pod=new_pod(BERT, mem=GiB, uid="uid-other"), node_names=("a",)))
    assert other.failed == {"a": "needs 1 GiB of GPU memory + model team-a/bert-fn/bert 4 GiB (on none of them "
                                 "yet), largest free 2 GiB"}


def test_a_pod_leaving_frees_its_model_only_with_the_last_pod_of_it() -> None:
    pods = (placed("vit-0", "a", 0, VIT, at_ms=1), placed("vit-1", "a", 0, VIT, at_ms=2))
    state = synced_state(node_record("a", 1), pods=pods)
    state.delete_pod(pods[0])
    assert ledger(state, "a").model_memory == 4 * GiB
    state.delete_pod(pods[1])
    assert ledger(state, "a").model_memory == 0


# --- preferring the GPU that holds the model ----------------------------------------------------------
def test_bind_reserves_the_gpu_holding_the_model_before_a_fuller_one() -> None:
    state = synced_state(node_record("a", 2), pods=(placed("vit-0", "a", 0, VIT, at_ms=1),
                                                     placed("big", "a", 1, None, request=600, at_ms=2)))
    kube = FakeKube()
    kube.watch = state.upsert_pod
    pod = kube.add(new_pod(VIT))
    binder = Binder(state, kube, default_policy=Policy.BINPACK, bind_wait_s=0.0, metrics=Metrics(),
                    passes=PassedEverywhere())
    assert binder.bind(BindingArgs(pod_name=pod.name, pod_namespace=pod.namespace, pod_uid=pod.uid, node="a")) == ""
    assert ledger(state, "a", 0).pod_models.get(pod.uid) == VIT
    assert ledger(state, "a", 0).model_memory == 4 * GiB


def test_filter_and_prioritize_prefer_the_node_holding_the_model_under_binpack() -> None:
    state = synced_state(node_record("holds", 1), node_record("other", 1),
                         pods=(placed("vit-0", "holds", 0, VIT, at_ms=1), placed("bert-0", "other", 0, BERT, at_ms=2)))
    request = ExtenderArgs(pod=new_pod(VIT), node_names=("holds", "other"))
    assert decisions(state).filter(request).passed == ("holds",)
    scores = dict(decisions(state).prioritize(request))
    assert scores["holds"] > scores["other"]
    # a pod of neither model sees the two nodes alike
    neutral = ExtenderArgs(pod=new_pod(None, uid="uid-plain"), node_names=("holds", "other"))
    assert decisions(state).filter(neutral).passed == ("holds", "other")


def test_spread_still_spreads_a_functions_pods_over_emptier_nodes() -> None:
    state = synced_state(node_record("holds", 1), node_record("empty", 1),
                         pods=(placed("vit-0", "holds", 0, VIT, request=400),))
    request = ExtenderArgs(pod=new_pod(VIT), node_names=("holds", "empty"))
    assert decisions(state, Policy.SPREAD).filter(request).passed == ("empty",)


# --- share changes, relists and /inspect -----------------------------------------------------------
def test_a_share_change_keeps_the_pods_model_on_the_ledger() -> None:
    pod = placed("vit-0", "a", 0, VIT)
    state = synced_state(node_record("a", 1), pods=(pod,))
    start = state.begin_share_change(pod.uid, make_share(request=300, limit=800, sm=20, mem=GiB))
    assert start is not None
    after = ledger(state, "a")
    assert after.pod_models == {pod.uid: VIT}
    assert after.model_memory == 4 * GiB
    state.replace_pods([pod], state.begin_relist())
    assert ledger(state, "a").model_memory == 4 * GiB


def test_inspect_lists_each_gpus_models_and_each_pods_model() -> None:
    state = synced_state(node_record("a", 1), pods=(placed("vit-0", "a", 0, VIT, at_ms=1),
                                                     placed("vit-1", "a", 0, VIT, at_ms=2),
                                                     placed("plain", "a", 0, None, at_ms=3)))
    (gpu,) = describe(state.snapshot())["nodes"]["a"]["gpus"]  # type: ignore[index]
    assert gpu["models"] == [{"key": "team-a/vit-fn/vit", "bytes": 4 * GiB, "pods": 2, "held": False}]
    assert gpu["modelMemoryBytes"] == 4 * GiB
    assert gpu["freeMemoryBytes"] == 16 * GiB - 3 * GiB - 4 * GiB
    assert sorted((p["pod"], p["model"]) for p in gpu["pods"]) == [
        ("team-a/plain", None), ("team-a/vit-0", "team-a/vit-fn/vit"), ("team-a/vit-1", "team-a/vit-fn/vit")]
