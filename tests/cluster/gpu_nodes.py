"""Fake GPU nodes for the cluster tier: Node objects that look like a node agent has run.

No kubelet backs them: capacity, allocatable and the Ready condition are written through the
status subresource, the not-ready taints the API server adds on creation are removed, and the
node carries the ``fastgshare/gpu_info`` inventory annotation encoded by the core's codec, so
the real kube-scheduler (and our extender) treat them as schedulable GPU nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import kubernetes.client

from fastgshare import keys
from fastgshare.codec import encode_node_inventory
from fastgshare.inventory import GpuDevice, NodeInventory

GiB = 2**30
NOT_READY_TAINT_KEYS = frozenset({"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"})


def fake_gpus(node_name: str, count: int, *, model: str = "Tesla V100", memory_bytes: int = 16 * GiB,
              sm_count: int = 80, mps_enabled: bool = True) -> tuple[GpuDevice, ...]:
    """``count`` identical healthy GPUs with uuids unique to the node."""
    return tuple(
        GpuDevice(uuid=f"GPU-{node_name}-{index}", index=index, model=model, memory_bytes=memory_bytes,
                  sm_count=sm_count, mps_enabled=mps_enabled)
        for index in range(count)
    )


def create_gpu_node(api_client: kubernetes.client.ApiClient, name: str, gpus: int | Sequence[GpuDevice],
                    slots_per_gpu: int = keys.DEFAULT_SLOTS_PER_GPU, *,
                    labels: Mapping[str, str] | None = None, cpu: str = "8", memory: str = "32Gi",
                    pods: str = "110") -> kubernetes.client.V1Node:
    """Create a Ready, untainted node advertising ``slots_per_gpu`` vGPU slots per healthy GPU.

    ``gpus`` is a count of :func:`fake_gpus` or the devices themselves. Returns the node as
    the API server has it after the status update.
    """
    devices = fake_gpus(name, gpus) if isinstance(gpus, int) else tuple(gpus)
    inventory = NodeInventory(node_name=name, gpus=devices, slots_per_gpu=slots_per_gpu)
    core = kubernetes.client.CoreV1Api(api_client)
    core.create_node(kubernetes.client.V1Node(metadata=kubernetes.client.V1ObjectMeta(
        name=name,
        labels={"kubernetes.io/hostname": name, **(labels or {})},
        annotations={keys.NODE_GPU_INFO_ANNOTATION: encode_node_inventory(inventory)},
    )))

    resources = {"cpu": cpu, "memory": memory, "pods": pods, keys.VGPU_RESOURCE: str(inventory.advertised_slots)}
    now = datetime.now(UTC).replace(microsecond=0).isoformat()
    node: kubernetes.client.V1Node = core.patch_node_status(name, {"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "fake GPU node of the cluster test tier",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }],
    }})

    taints = node.spec.taints or []
    kept = [api_client.sanitize_for_serialization(taint) for taint in taints
            if taint.key not in NOT_READY_TAINT_KEYS]
    if len(kept) != len(taints):
        # JSON patch with a test on resourceVersion: "add" replaces the list whether or not it exists.
        node = core.patch_node(name, [
            {"op": "test", "path": "/metadata/resourceVersion", "value": node.metadata.resource_version},
            {"op": "add", "path": "/spec/taints", "value": kept},
        ])
    return node
