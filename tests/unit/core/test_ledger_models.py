"""Model sharing in the ledger and the placement policies: a model is charged once per GPU while any
pod of it is there or the store holds it; refusals name the model when it is the reason; the
policies prefer a GPU that holds the pod's model (binpack first, spread among equal loads)."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from fastgshare.errors import LedgerError
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.ledger import GpuLedger, NodeState, Rejection
from fastgshare.model import HeldModel, ModelRef, ModelSpec, charged_model_bytes
from fastgshare.placement import Policy, choose_gpu, evaluate_node, model_bonus, score_node
from tests.builders import GiB, make_gpu, make_node, make_share

MiB = 2**20


def model(function: str = "vit-fn", size: int = 4 * GiB, name: str = "vit", namespace: str = "ns") -> ModelRef:
    return ModelRef(namespace=namespace, function=function, spec=ModelSpec(name=name, bytes=size, path=f"{name}.bin"))


VIT = model()
BERT = model("bert-fn", 2 * GiB, "bert")


def held(ref: ModelRef) -> HeldModel:
    return HeldModel(identity=ref.identity, key=ref.key, bytes=ref.bytes)


def small(mem: int = GiB) -> object:
    return make_share(request=100, sm=20, mem=mem)


def test_four_pods_of_one_model_charge_it_once() -> None:
    ledger = GpuLedger(make_gpu(mem=16 * GiB))
    for index in range(4):
        ledger.add(f"ns/vit-{index}", make_share(request=100, sm=20, mem=GiB), model=VIT)
    assert ledger.model_memory == 4 * GiB
    assert ledger.committed_memory == 4 * GiB + 4 * GiB  # four gpu_mem, one model
    assert ledger.free_memory == 8 * GiB
    (usage,) = ledger.models
    assert (usage.key, usage.bytes, usage.pods, usage.held) == ("ns/vit-fn/vit", 4 * GiB, 4, False)


def test_a_fifth_pod_fits_where_without_sharing_it_would_not() -> None:
    # 16 GiB GPU, 300 MiB context reserve, pods of 1 GiB own memory and a 2 GiB model.
    gpu = attrs.evolve(make_gpu(mem=16 * GiB), context_reserve_bytes=300 * MiB)
    weights = model(size=2 * GiB)
    share = make_share(request=100, sm=20, mem=GiB)
    shared, unshared = GpuLedger(gpu), GpuLedger(gpu)
    whole = make_share(request=100, sm=20, mem=3 * GiB)  # without sharing each pod holds its own weights
    for index in range(4):
        shared.add(f"ns/p{index}", share, model=weights)
        unshared.add(f"ns/p{index}", whole)
    assert shared.check(share, weights).ok
    fit = unshared.check(whole)
    assert fit.rejection is Rejection.MEMORY
    assert fit.message == "needs 3 GiB + 300 MiB context reserve, GPU 0 has 2.828 GiB free"
    shared.add("ns/p4", share, model=weights)
    assert shared.model_memory == 2 * GiB
    assert shared.free_memory == 16 * GiB - 2 * GiB - 5 * (GiB + 300 * MiB)


def test_the_first_pod_brings_its_model_and_the_refusal_names_it() -> None:
    ledger = GpuLedger(make_gpu(mem=8 * GiB))
    ledger.add("ns/other", make_share(request=100, sm=20, mem=4 * GiB))
    assert ledger.memory_charge(make_share(mem=GiB), VIT) == 5 * GiB
    fit = ledger.check(make_share(request=100, sm=20, mem=GiB), VIT)
    assert fit.rejection is Rejection.MEMORY
    assert fit.message == "needs 1 GiB + model ns/vit-fn/vit 4 GiB (not on this GPU yet), GPU 0 has 4 GiB free"
    with pytest.raises(LedgerError, match="model ns/vit-fn/vit 4 GiB"):
        ledger.add("ns/vit-0", make_share(request=100, sm=20, mem=GiB), model=VIT)


def test_a_model_the_store_holds_is_charged_without_pods_and_costs_its_pods_nothing_more() -> None:
    gpu = attrs.evolve(make_gpu(mem=8 * GiB), held_models=(held(VIT),))
    ledger = GpuLedger(gpu)
    assert ledger.model_memory == 4 * GiB
    assert ledger.free_memory == 4 * GiB
    assert ledger.holds_model(VIT)
    assert not ledger.holds_model(BERT)
    assert ledger.memory_charge(make_share(mem=GiB), VIT) == GiB
    ledger.add("ns/vit-0", make_share(request=100, sm=20, mem=GiB), model=VIT)
    assert ledger.model_memory == 4 * GiB
    assert [(u.key, u.pods, u.held) for u in ledger.models] == [("ns/vit-fn/vit", 1, True)]
    ledger.remove("ns/vit-0")
    assert ledger.model_memory == 4 * GiB  # still held by the store (grace period)
    assert [(u.key, u.pods, u.held) for u in ledger.models] == [("ns/vit-fn/vit", 0, True)]


def test_removal_keeps_the_model_while_a_pod_of_it_remains() -> None:
    ledger = GpuLedger(make_gpu())
    ledger.add("ns/a", make_share(request=100, sm=20), model=VIT)
    ledger.add("ns/b", make_share(request=100, sm=20), model=VIT)
    ledger.add("ns/c", make_share(request=100, sm=20), model=BERT)
    assert ledger.model_memory == 6 * GiB
    ledger.remove("ns/a")
    assert ledger.model_memory == 6 * GiB
    ledger.remove("ns/b")
    assert ledger.model_memory == 2 * GiB
    assert not ledger.holds_model(VIT)
    ledger.remove("ns/c")
    assert (ledger.model_memory, ledger.committed_memory, ledger.models) == (0, 0, ())


def test_models_are_told_apart_by_identity_not_by_name() -> None:
    ledger = GpuLedger(make_gpu())
    ledger.add("ns/a", make_share(request=100, sm=20), model=VIT)
    other_function = model("other-fn")  # same model name and size, another function
    other_size = model(size=3 * GiB)
    assert not ledger.holds_model(other_function)
    assert not ledger.holds_model(other_size)
    ledger.add("ns/b", make_share(request=100, sm=20), model=other_function)
    assert ledger.model_memory == 8 * GiB


def test_copies_and_summaries_follow_the_models() -> None:
    ledger = GpuLedger(make_gpu())
    ledger.add("ns/a", make_share(request=100, sm=20), model=VIT)
    plain = GpuLedger(make_gpu())
    plain.add("ns/a", make_share(request=100, sm=20))
    assert ledger.summary_id != plain.summary_id  # a check of a VIT pod differs on them
    clone = ledger.copy()
    clone.remove("ns/a")
    assert ledger.model_memory == 4 * GiB
    assert clone.model_memory == 0
    assert ledger.pod_models == {"ns/a": VIT}


def test_a_node_without_held_models_is_the_node_once_every_grace_period_ran_out() -> None:
    gpu = attrs.evolve(make_gpu(mem=8 * GiB), held_models=(held(VIT),))
    inventory = NodeInventory(node_name="n", gpus=(gpu,))
    assert NodeState(inventory).ledgers[gpu.uuid].model_memory == 4 * GiB
    assert NodeState(inventory, held_models=False).ledgers[gpu.uuid].model_memory == 0


# --- placement ------------------------------------------------------------------------------------
def node_with(*gpus: GpuDevice) -> NodeState:
    return make_node("n", list(gpus))


def test_binpack_takes_the_gpu_holding_the_model_before_a_fuller_one() -> None:
    node = node_with(make_gpu(0), make_gpu(1))
    node.ledgers["GPU-0000"].add("ns/vit-0", make_share(request=100, sm=20), model=VIT)
    node.ledgers["GPU-0001"].add("ns/big", make_share(request=600, sm=60))
    share = make_share(request=100, sm=20)
    assert evaluate_node(node, share, Policy.BINPACK).choice.uuid == "GPU-0001"  # no model: the fuller GPU
    choice = evaluate_node(node, share, Policy.BINPACK, VIT).choice
    assert choice is not None
    assert (choice.uuid, choice.holds_model) == ("GPU-0000", True)
    chosen = choose_gpu(node.ledgers.values(), share, Policy.BINPACK, VIT)
    assert chosen is not None
    assert chosen.gpu.uuid == "GPU-0000"


def test_a_pod_of_a_held_model_goes_to_the_gpu_holding_it_when_both_fit_under_either_policy() -> None:
    for policy in Policy:
        node = node_with(make_gpu(0), attrs.evolve(make_gpu(1), held_models=(held(VIT),)))
        choice = evaluate_node(node, make_share(request=100, sm=20), policy, VIT).choice
        assert choice is not None, policy
        assert choice.uuid == "GPU-0001", policy


def test_spread_still_spreads_pods_of_different_models_and_of_one_model() -> None:
    node = node_with(make_gpu(0), make_gpu(1))
    placed = []
    for index, ref in enumerate([VIT, BERT, VIT, BERT]):
        share = make_share(request=100, sm=20)
        choice = evaluate_node(node, share, Policy.SPREAD, ref).choice
        assert choice is not None
        node.ledgers[choice.uuid].add(f"ns/p{index}", share, model=ref)
        placed.append(choice.uuid)
    assert placed[:2] == ["GPU-0000", "GPU-0001"]  # two models: one GPU each
    # equal loads: the third (VIT) and fourth (BERT) each join their model's GPU
    assert placed[2:] == ["GPU-0000", "GPU-0001"]


def test_spread_prefers_the_emptier_gpu_over_the_one_holding_the_model() -> None:
    node = node_with(make_gpu(0), make_gpu(1))
    node.ledgers["GPU-0000"].add("ns/vit-0", make_share(request=400, sm=50), model=VIT)
    choice = evaluate_node(node, make_share(request=100, sm=20), Policy.SPREAD, VIT).choice
    assert choice is not None
    assert choice.uuid == "GPU-0001"


def test_binpack_scores_a_node_holding_the_model_higher_by_its_share_of_the_gpu() -> None:
    holding, other = node_with(make_gpu(0)), node_with(make_gpu(0))
    holding.ledgers["GPU-0000"].add("ns/vit-0", make_share(request=100, sm=20), model=VIT)
    other.ledgers["GPU-0000"].add("ns/bert-0", make_share(request=100, sm=20), model=BERT)
    share = make_share(request=100, sm=20)
    base = score_node(other, share, Policy.BINPACK, VIT)
    assert model_bonus(VIT, holding.ledgers["GPU-0000"]) == 3  # 4 of 16 GiB: 2.5 points, rounded
    assert score_node(holding, share, Policy.BINPACK, VIT) == min(10, base + 3)
    assert score_node(holding, share, Policy.SPREAD, VIT) == score_node(other, share, Policy.SPREAD, VIT)


def test_the_node_refusal_names_the_model_and_where_it_is_missing() -> None:
    node = node_with(make_gpu(0, mem=8 * GiB), make_gpu(1, mem=8 * GiB))
    node.ledgers["GPU-0000"].add("ns/x", make_share(request=100, sm=20, mem=6 * GiB))
    node.ledgers["GPU-0001"].add("ns/y", make_share(request=100, sm=20, mem=6 * GiB))
    verdict = evaluate_node(node, make_share(request=100, sm=20, mem=GiB), Policy.BINPACK, VIT)
    assert verdict.reason == ("needs 1 GiB of GPU memory + model ns/vit-fn/vit 4 GiB (on none of them yet), "
                              "largest free 2 GiB")
    node.ledgers["GPU-0001"].add("ns/vit-0", make_share(request=100, sm=20, mem=512 * MiB), model=VIT, force=True)
    verdict = evaluate_node(node, make_share(request=100, sm=20, mem=GiB), Policy.BINPACK, VIT)
    assert verdict.reason == ("needs 1 GiB of GPU memory + model ns/vit-fn/vit 4 GiB (not yet on GPU 0), "
                              "largest free 2 GiB")


# --- the counts stay exact under any history ----------------------------------------------------------
MODELS = [VIT, BERT, model("small-fn", 512 * MiB, "small")]


class ModelLedgerMachine(RuleBasedStateMachine):
    """Adding and removing pods of a few models (one of them held by the store): the ledger's model
    memory is always :func:`charged_model_bytes` of its pods' models and the held ones."""

    pods = Bundle("pods")

    def __init__(self) -> None:
        super().__init__()
        self.ledger = GpuLedger(attrs.evolve(make_gpu(mem=80 * GiB), held_models=(held(MODELS[2]),)), slots=64)
        self.models: dict[str, ModelRef | None] = {}
        self.count = 0

    @rule(target=pods, which=st.sampled_from([0, 1, 2, None]), mem=st.sampled_from([MiB, GiB]))
    def add(self, which: int | None, mem: int) -> str:
        key = f"ns/p{self.count}"
        self.count += 1
        ref = MODELS[which] if which is not None else None
        self.ledger.add(key, make_share(request=0, limit=100, sm=10, mem=mem), model=ref, force=True)
        self.models[key] = ref
        return key

    @rule(key=consumes(pods))
    def remove(self, key: str) -> None:
        self.ledger.remove(key)
        del self.models[key]

    @invariant()
    def charged_once(self) -> None:
        expected = charged_model_bytes(self.models.values(), self.ledger.gpu.held_models)
        assert self.ledger.model_memory == expected
        assert sum(u.bytes for u in self.ledger.models) == expected
        assert self.ledger.committed_memory == self.ledger.used_memory + expected
        for ref in MODELS:
            pods = sum(1 for other in self.models.values() if other == ref)
            assert self.ledger.holds_model(ref) == (pods > 0 or ref is MODELS[2])


TestModelLedger = ModelLedgerMachine.TestCase
