"""The autoscaler's fit check: new pods are placed on the free GPU space as the extender keeps it;
a configuration that fits nowhere is replaced by the next most efficient ones that do, and what
nothing covers is created anyway; a vertical step counts only where every pod may grow in place."""

from __future__ import annotations

import math

import attrs

from fastgshare.autoscaling import GpuBudget, options
from fastgshare.codec import PodAssignment
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.profile import ProfilePoint, Slo
from fastgshare.scaling_fit import FreeSpace, can_raise_in_place, fit_additions
from fastgshare.share import ShareSpec

GiB = 2**30
SLO = Slo(percentile=95, latency_ms=100)


def point(quota: float, sm: int, rps: float, memory: int) -> ProfilePoint:
    return ProfilePoint(quota_request=quota, quota_limit=quota, sm_partition=sm, memory_bytes=memory, max_rps=rps,
                        p95_ms=20)


USABLE = options([point(0.5, 50, 40, 6 * GiB), point(0.2, 24, 12, 2 * GiB)], SLO, GpuBudget(memory_bytes=16 * GiB))
BY_KEY = {o.point.key: o for o in USABLE}


def share_of(option: object) -> ShareSpec:
    p = option.point  # type: ignore[attr-defined]
    return ShareSpec(request_permille=round(p.quota_request * 1000), limit_permille=round(p.quota_limit * 1000),
                     sm_percent=p.sm_partition, memory_bytes=p.memory_bytes)


def node(name: str, gpus: int, *, mps: bool = True) -> NodeInventory:
    return NodeInventory(node_name=name, gpus=tuple(
        GpuDevice(uuid=f"{name}-gpu{i}", index=i, model="V100-16GB", memory_bytes=16 * GiB, sm_count=80,
                  mps_enabled=mps) for i in range(gpus)))


def on(gpu: str, share: ShareSpec) -> PodAssignment:
    return PodAssignment(node_name=gpu.split("-", maxsplit=1)[0], gpu_uuid=gpu, gpu_index=0, share=share,
                         assigned_at_ms=0)


def test_pods_that_fit_are_added_as_planned() -> None:
    space = FreeSpace.of([node("a", 2)], [])
    fitted = fit_additions({"q50-s50": 3}, USABLE, space, share_of)
    assert (dict(fitted.additions), fitted.unplaced) == ({"q50-s50": 3}, 0)


def test_a_configuration_that_fits_nowhere_is_replaced_by_the_next_that_fits() -> None:
    # 60 % of the GPU's time on all its SMs is taken: no 0.5 x 50 % rectangle fits, 0.2 x 24 % ones do
    big = ShareSpec(request_permille=600, limit_permille=600, sm_percent=100, memory_bytes=2 * GiB)
    space = FreeSpace.of([node("a", 1)], [("ns/other", on("a-gpu0", big))])
    fitted = fit_additions({"q50-s50": 1}, USABLE, space, share_of)
    small = math.ceil(BY_KEY["q50-s50"].capacity_rps / BY_KEY["q20-s24"].capacity_rps)
    assert (dict(fitted.additions), fitted.unplaced) == ({"q20-s24": small}, 0)
    assert space.ledgers["a-gpu0"].pods.keys() == {"ns/other"}  # the caller's space is not changed
    # 12 GiB taken as well: two small pods fit (4 GiB), too few for 40 req/s: the planned pod is made
    crowded = FreeSpace.of([node("a", 1)], [("ns/other", on("a-gpu0", attrs.evolve(big, memory_bytes=12 * GiB)))])
    assert (dict((short := fit_additions({"q50-s50": 1}, USABLE, crowded, share_of)).additions), short.unplaced) \
        == ({"q50-s50": 1}, 1)


def test_what_nothing_covers_is_created_as_planned_and_counted() -> None:
    full = ShareSpec(request_permille=1000, limit_permille=1000, sm_percent=100, memory_bytes=16 * GiB)
    space = FreeSpace.of([node("a", 1)], [("ns/whole", on("a-gpu0", full))])
    fitted = fit_additions({"q50-s50": 2}, USABLE, space, share_of)
    assert (dict(fitted.additions), fitted.unplaced) == ({"q50-s50": 2}, 2)


def test_unhealthy_gpus_and_pods_of_unknown_gpus_are_left_out() -> None:
    sick = NodeInventory(node_name="b", gpus=(GpuDevice(uuid="b-gpu0", index=0, model="V100-16GB",
                                                         memory_bytes=16 * GiB, sm_count=80, healthy=False),))
    space = FreeSpace.of([sick, node("a", 1)], [("ns/p", on("z-gpu9", share_of(BY_KEY["q20-s24"])))])
    assert set(space.ledgers) == {"a-gpu0"}
    assert space.pod_gpus == {}


def test_a_vertical_step_counts_only_where_every_pod_may_grow_on_its_gpu() -> None:
    small = share_of(BY_KEY["q20-s24"])
    raised = ShareSpec(request_permille=600, limit_permille=600, sm_percent=24, memory_bytes=2 * GiB)
    roomy = FreeSpace.of([node("a", 2)], [("ns/p1", on("a-gpu0", small)), ("ns/p2", on("a-gpu1", small))])
    assert can_raise_in_place(["ns/p1", "ns/p2"], raised, roomy)
    stacked = FreeSpace.of([node("a", 1)], [("ns/p1", on("a-gpu0", small)), ("ns/p2", on("a-gpu0", small))])
    assert can_raise_in_place(["ns/p1", "ns/p2"], raised, stacked)  # with MPS: two 24 % rows of 0.6
    shared = FreeSpace.of([node("a", 1, mps=False)], [("ns/p1", on("a-gpu0", small)),
                                                     ("ns/p2", on("a-gpu0", small))])
    assert not can_raise_in_place(["ns/p1", "ns/p2"], raised, shared)  # without MPS: 0.6 + 0.6 of the time
    assert not can_raise_in_place(["ns/unbound"], raised, roomy)
