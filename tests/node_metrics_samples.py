"""A node agent's real ``/metrics`` text for one pod on one of two GPUs, built by the agent's own
collector from fixed inputs, for the tests of what reads it (inspect, the dashboard's metric names)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from device_plugin.allocation import NodePod
from device_plugin.arbiter.server import ArbiterUsage
from device_plugin.metrics import NodeMetrics
from fastgshare import keys
from fastgshare.codec import PodAssignment, encode_assignment
from fastgshare.inventory import NodeInventory
from fastgshare.usage import GpuUsage, PodUsage, UsageSnapshot
from tests.builders import GiB, make_gpu, make_share

NODE = "gpu-node-1"
POD = "team-a/resnet-7d9f8-abcde"


class _Pods:
    def __init__(self, records: list[NodePod]) -> None:
        self._records = records

    def snapshot(self) -> tuple[int, list[NodePod]]:
        return 1, self._records


def node_agent_exposition() -> str:
    """Pod ``team-a/resnet-7d9f8-abcde`` on GPU-0000 (0.3..0.5, 50 % SMs, 2 GiB): achieved 0.37,
    1 GiB held, 0.5 s throttled, 4 token waits, 0.02 less used than charged by the GPU's account;
    GPU-0000 busy 0.4; GPU-0001 idle."""
    assignment = PodAssignment(node_name=NODE, gpu_uuid="GPU-0000", gpu_index=0,
                               share=make_share(300, 500, 50, 2 * GiB), assigned_at_ms=1)
    namespace, name = POD.split("/")
    record = NodePod(uid="u1", namespace=namespace, name=name, node_name=NODE, phase="Running", resource_version="1",
                       annotations={keys.POD_ASSIGNMENT_ANNOTATION: encode_assignment(assignment)})
    usage = UsageSnapshot(window_s=10.0, pods=(PodUsage(
        pod=POD, gpu="GPU-0000", share=0.37, used_seconds_total=12.0, throttled_seconds_total=0.5,
        wait_bucket_counts=(0,) * 11 + (4,), wait_sum_seconds=0.04, wait_count=4),),
        gpus=(GpuUsage(gpu="GPU-0000", busy_share=0.4),))
    inventory = NodeInventory(node_name=NODE, gpus=(make_gpu(0), make_gpu(1)), slots_per_gpu=16)
    metrics = NodeMetrics(_Pods([record]), lambda: ArbiterUsage(usage=usage, memory_bytes={("GPU-0000", POD): GiB}),
                          lambda: inventory, lambda: {(namespace, name, "GPU-0000"): -0.02})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return generate_latest(registry).decode()
