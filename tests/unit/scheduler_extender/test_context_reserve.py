"""The extender charges each pod its GPU's CUDA context reserve next to its ``gpu_mem`` (issue 36
item 3): filter refuses with the reserve named, and ``/inspect`` shows it."""

from __future__ import annotations

import attrs

from fastgshare.placement import Policy
from scheduler_extender import inspection
from scheduler_extender.decisions import Decisions
from scheduler_extender.metrics import Metrics
from scheduler_extender.records import NodeRecord
from scheduler_extender.wire import ExtenderArgs
from tests.builders import make_gpu, share_annotations
from tests.unit.scheduler_extender.conftest import GiB, assignment, node_record, pod_record, synced_state

MiB = 2**20


def reserving_node(reserve: int = 300 * MiB) -> NodeRecord:
    gpu = attrs.evolve(make_gpu(0, uuid="GPU-a-0"), context_reserve_bytes=reserve)
    return node_record("a", [gpu])


def test_twelve_one_gib_pods_fill_a_16_gib_gpu_with_a_300_mib_reserve_and_the_thirteenth_hears_why() -> None:
    placed = tuple(pod_record(f"p{i}", uid=f"u{i}", node_name="a",
                              assignment=assignment("a", 0, request=50, sm=100, mem=GiB, at_ms=i + 1))
                   for i in range(12))
    state = synced_state(reserving_node(), pods=placed)
    pod = pod_record("new", uid="uid-new", annotations=share_annotations(request="0.05", limit="0.05", sm="100",
                                                                         mem=str(GiB)))
    result = Decisions(state, Policy.BINPACK, Metrics()).filter(ExtenderArgs(pod=pod, node_names=("a",)))
    assert result.passed == ()
    assert result.failed == {"a": "needs 1 GiB of GPU memory + 300 MiB context reserve, largest free 496 MiB"}

    gpu = inspection.describe(state.snapshot())["nodes"]["a"]["gpus"][0]  # type: ignore[index]
    assert (gpu["contextReserveBytes"], gpu["freeMemoryBytes"]) == (300 * MiB, 496 * MiB)


def test_without_a_reserve_the_same_pod_fits() -> None:
    placed = tuple(pod_record(f"p{i}", uid=f"u{i}", node_name="a",
                              assignment=assignment("a", 0, request=50, sm=100, mem=GiB, at_ms=i + 1))
                   for i in range(12))
    state = synced_state(reserving_node(0), pods=placed)
    pod = pod_record("new", uid="uid-new", annotations=share_annotations(request="0.05", limit="0.05", sm="100",
                                                                         mem=str(GiB)))
    result = Decisions(state, Policy.BINPACK, Metrics()).filter(ExtenderArgs(pod=pod, node_names=("a",)))
    assert result.passed == ("a",)
