"""Packing a workload onto a fleet of identical GPUs."""

from __future__ import annotations

from fastgshare.fleet import expand, pack_fleet
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
