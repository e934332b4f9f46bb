"""The model store's two metric families on the node agent's /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from device_plugin.arbiter.server import ArbiterUsage
from device_plugin.metrics import NodeMetrics
from fastgshare.inventory import NodeInventory
from fastgshare.model import HeldModel
from fastgshare.usage import UsageSnapshot
from tests.unit.device_plugin.models.helpers import GPU_A, GPU_B


class _NoPods:
    def snapshot(self) -> tuple[int, list[object]]:
        return 1, []


class _Models:
    def held_models(self) -> dict[str, tuple[HeldModel, ...]]:
        return {GPU_A: (HeldModel(identity="1", key="team-a/fn/resnet", bytes=1000),
                        HeldModel(identity="2", key="team-a/fn/resnet", bytes=24)),  # a changed declaration
                GPU_B: (HeldModel(identity="3", key="team-b/bert/bert", bytes=7),)}

    def model_pods(self) -> dict[tuple[str, str], int]:
        return {(GPU_A, "team-a/fn/resnet"): 3, (GPU_B, "team-b/bert/bert"): 0}


def test_model_memory_and_pods_per_gpu_and_model() -> None:
    usage = ArbiterUsage(usage=UsageSnapshot(window_s=10.0, pods=(), gpus=()), memory_bytes={})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeMetrics(_NoPods(), lambda: usage, lambda: NodeInventory(node_name="n", gpus=()),  # type: ignore[arg-type]
                                  models=_Models()))
    text = generate_latest(registry).decode()
    assert f'fastgshare_gpu_model_memory_bytes{{gpu="{GPU_A}",model="team-a/fn/resnet"}} 1024.0' in text
    assert f'fastgshare_gpu_model_memory_bytes{{gpu="{GPU_B}",model="team-b/bert/bert"}} 7.0' in text
    assert f'fastgshare_gpu_model_pods{{gpu="{GPU_A}",model="team-a/fn/resnet"}} 3.0' in text
    assert f'fastgshare_gpu_model_pods{{gpu="{GPU_B}",model="team-b/bert/bert"}} 0.0' in text
