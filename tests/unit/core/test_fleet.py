"""Packing a workload onto a fleet of identical GPUs."""

from __future__ import annotations

import pytest

from fastgshare.fleet import SharedModel, expand, pack_fleet
from fastgshare.gpu_models import gpu_model_spec
from fastgshare.placement import Policy
from fastgshare.workload import WorkloadItem
from tests.builders import GiB, make_share

PAPER = [
    WorkloadItem(name="resnet", count=4, share=make_share(request=400, limit=800, sm=12, mem=3 * GiB // 2)),
    WorkloadItem(name="rnnt", count=2, share=make_share(request=400, limit=800, sm=24, mem=3 * GiB // 2)),
    WorkloadItem(name="bert", count=2, share=make_share(request=600, limit=1000, sm=50, mem=5 * GiB // 2)),
]


def test_paper_workload_packs_onto_one_v100() -> None:
    placement = pack_fleet(expand(PAPER), gpu_model_spec("V100-16GB"))
    assert len(placement.gpus) == 1
    assert len(placement.gpus[0].pods) == 8
    assert placement.unplaced == ()


def test_expand_names_replicas() -> None:
    assert [key for key, _ in expand(PAPER[2:])] == ["bert-0", "bert-1"]


def test_new_gpus_open_only_when_needed() -> None:
    pods = [(f"p{i}", make_share(request=600, sm=60)) for i in range(3)]
    assert len(pack_fleet(pods, gpu_model_spec("V100-16GB")).gpus) == 3


def test_memory_bounds_the_packing() -> None:
    pods = [(f"p{i}", make_share(request=100, sm=10, mem=6 * GiB)) for i in range(4)]
    assert len(pack_fleet(pods, gpu_model_spec("V100-16GB")).gpus) == 2


def test_slots_bound_the_packing() -> None:
    pods = [(f"p{i}", make_share(request=0, limit=100, mem=1)) for i in range(5)]
    assert len(pack_fleet(pods, gpu_model_spec("V100-16GB"), slots_per_gpu=2).gpus) == 3


def test_pods_larger_than_a_gpu_are_reported_not_placed() -> None:
    placement = pack_fleet([("huge", make_share(mem=40 * GiB)), ("ok", make_share())], gpu_model_spec("T4"))
    assert len(placement.gpus) == 1
    assert placement.unplaced == (("huge", "does not fit an empty GPU: needs 40 GiB, GPU 0 has 16 GiB free"),)


def test_spread_uses_no_fewer_gpus_than_needed_and_is_deterministic() -> None:
    first = pack_fleet(expand(PAPER), gpu_model_spec("V100-16GB"), policy=Policy.SPREAD)
    second = pack_fleet(expand(PAPER), gpu_model_spec("V100-16GB"), policy=Policy.SPREAD)
    assert [dict(g.layout) for g in first.gpus] == [dict(g.layout) for g in second.gpus]


def test_arrival_order_is_kept_when_asked() -> None:
    pods = [("small", make_share(request=100, sm=10)), ("big", make_share(request=1000, sm=100))]
    placement = pack_fleet(pods, gpu_model_spec("T4"), largest_first=False)
    assert [sorted(g.pods) for g in placement.gpus] == [["small"], ["big"]]
    assert [sorted(g.pods) for g in pack_fleet(pods, gpu_model_spec("T4")).gpus] == [["big"], ["small"]]


def test_pods_of_one_model_hold_its_weights_once_per_gpu() -> None:
    # 4 GiB pods of which 3 GiB are the model's weights: without sharing 4 fit a 16 GiB GPU, with it
    # the first brings 4 GiB and each next one needs 1 GiB (13 of them, the slots permitting)
    pods = [(f"vit-{i}", make_share(request=50, sm=5, mem=4 * GiB)) for i in range(13)]
    gpu = gpu_model_spec("V100-16GB")
    assert len(pack_fleet(pods, gpu).gpus) == 4
    shared = pack_fleet(pods, gpu, models={key: SharedModel("vit", 3 * GiB) for key, _ in pods}, slots_per_gpu=16)
    assert len(shared.gpus) == 1
    assert shared.gpus[0].used_memory == 3 * GiB + 13 * GiB
    assert shared.unplaced == ()


def test_each_gpu_gets_its_own_copy_and_other_models_are_not_shared() -> None:
    gpu = gpu_model_spec("V100-16GB")
    pods = [(f"a-{i}", make_share(request=400, sm=100, mem=4 * GiB)) for i in range(4)]
    pods += [(f"b-{i}", make_share(request=100, sm=10, mem=4 * GiB)) for i in range(2)]
    models = {key: SharedModel(key[0], 3 * GiB) for key, _ in pods}
    placement = pack_fleet(pods, gpu, models=models)
    # a's pods: 2 per GPU by time (SM 100), each GPU holding a's weights once: 4 + 1 GiB, then b: 4 + 1
    assert [sorted(g.pods) for g in placement.gpus] == [["a-0", "a-1", "b-0", "b-1"], ["a-2", "a-3"]]
    assert [g.used_memory for g in placement.gpus] == [10 * GiB, 5 * GiB]


def test_a_pod_prefers_a_gpu_that_holds_its_model() -> None:
    gpu = gpu_model_spec("V100-16GB")
    pods = [("a-0", make_share(request=300, sm=100, mem=4 * GiB)),
            ("b-0", make_share(request=800, sm=100, mem=4 * GiB)),
            ("a-1", make_share(request=100, sm=100, mem=4 * GiB))]
    models = {"a-0": SharedModel("a", 2 * GiB), "a-1": SharedModel("a", 2 * GiB)}
    plain = pack_fleet(pods, gpu, largest_first=False)  # binpack alone: the fuller GPU
    assert [sorted(g.pods) for g in plain.gpus] == [["a-0"], ["a-1", "b-0"]]
    placement = pack_fleet(pods, gpu, models=models, largest_first=False)
    assert [sorted(g.pods) for g in placement.gpus] == [["a-0", "a-1"], ["b-0"]]
    assert placement.gpus[0].used_memory == 6 * GiB


def test_weights_not_smaller_than_the_pod_are_refused() -> None:
    with pytest.raises(ValueError, match="weights_bytes"):
        pack_fleet([("a", make_share(mem=GiB))], gpu_model_spec("T4"), models={"a": SharedModel("a", GiB)})
