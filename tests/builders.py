"""Small builders for test values, so test bodies state only what matters to them."""

from __future__ import annotations

from fastgshare import keys
from fastgshare.assignment_signature import AssignmentTrust, sign
from fastgshare.codec import PodAssignment, encode_assignment
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.ledger import NodeState
from fastgshare.share import ShareSpec

GiB = 2**30


def make_share(request: int = 400, limit: int | None = None, sm: int = 50, mem: int = GiB) -> ShareSpec:
    """A share in the core's units: request/limit in permille, SM in percent, memory bytes."""
    return ShareSpec(request_permille=request, limit_permille=limit if limit is not None else max(request, 1),
                     sm_percent=sm, memory_bytes=mem)


def make_gpu(index: int = 0, *, mem: int = 16 * GiB, sms: int = 80, healthy: bool = True,
             mps: bool = True, uuid: str | None = None) -> GpuDevice:
    return GpuDevice(uuid=uuid or f"GPU-{index:04d}", index=index, model="Tesla V100", memory_bytes=mem,
                     sm_count=sms, healthy=healthy, mps_enabled=mps)


def make_node(name: str = "node-a", gpus: int | list[GpuDevice] = 1,
              slots: int = keys.DEFAULT_SLOTS_PER_GPU) -> NodeState:
    devices = [make_gpu(i) for i in range(gpus)] if isinstance(gpus, int) else gpus
    return NodeState(NodeInventory(node_name=name, gpus=tuple(devices), slots_per_gpu=slots))


def share_annotations(request: str | None = "0.4", limit: str | None = "0.8", sm: str | None = "50",
                      mem: str | None = "1073741824") -> dict[str, str]:
    """The four user annotations; pass ``None`` to leave one out."""
    values = {keys.GPU_QUOTA_REQUEST: request, keys.GPU_QUOTA_LIMIT: limit,
              keys.GPU_SM_PARTITION: sm, keys.GPU_MEM: mem}
    return {key: value for key, value in values.items() if value is not None}

# The assignment key every test's extender and node agent share (fastgshare.assignment_signature).
TEST_ASSIGNMENT_KEY = b"fastgshare-test-assignment-key-0123456789abcdef"
TEST_TRUST = AssignmentTrust(TEST_ASSIGNMENT_KEY)


def signed_annotations(pod_uid: str, assignment: PodAssignment) -> dict[str, str]:
    """The assignment annotation and the extender's signature for it on pod ``pod_uid`` (test key)."""
    return {keys.POD_ASSIGNMENT_ANNOTATION: encode_assignment(assignment),
            keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION: sign(TEST_ASSIGNMENT_KEY, pod_uid, assignment)}
