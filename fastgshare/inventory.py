"""What GPUs a node has: the inventory the node agent discovers and publishes.

Each GPU carries its CUDA context reserve: the GPU memory every pod on it is charged next to its
``gpu_mem`` for what a CUDA context holds outside the pod's allocations (the agent's
``--context-reserve``; 0 where nothing is charged, as on the simulated GPU), and the models the
node's model store holds on it.

Also the compact GPU spec users and the simulated inventory use, ``"2x80GiB:132sm"``
(count, memory, SM count; an optional ``:mps`` or ``:nomps`` suffix, MPS on by default,
and an optional model name before ``=``: ``"V100=1x16GiB:80sm"``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

from fastgshare import keys
from fastgshare.errors import InvalidInventory
from fastgshare.model import HeldModel
from fastgshare.quantity import parse_bytes


def _held_tuple(models: Iterable[HeldModel]) -> tuple[HeldModel, ...]:
    return tuple(models)


@attrs.frozen(kw_only=True)
class GpuDevice:
    """One physical GPU as the node agent sees it."""

    uuid: str
    index: int
    model: str
    memory_bytes: int
    sm_count: int
    healthy: bool = True
    mps_enabled: bool = False
    context_reserve_bytes: int = 0  # charged per pod on this GPU, next to the pod's gpu_mem
    # The models the node's store holds on this GPU (fastgshare.model): charged once each, also in
    # the grace period after their last pod left.
    held_models: tuple[HeldModel, ...] = attrs.field(default=(), converter=_held_tuple)

    def __attrs_post_init__(self) -> None:
        problems = []
        if not self.uuid:
            problems.append("uuid must not be empty")
        if self.index < 0:
            problems.append(f"index must be >= 0, got {self.index}")
        if self.memory_bytes <= 0:
            problems.append(f"memory_bytes must be > 0, got {self.memory_bytes}")
        elif not 0 <= self.context_reserve_bytes < self.memory_bytes:
            problems.append(f"context_reserve_bytes must be >= 0 and less than memory_bytes "
                            f"({self.memory_bytes}), got {self.context_reserve_bytes}")
        if self.sm_count <= 0:
            problems.append(f"sm_count must be > 0, got {self.sm_count}")
        if problems:
            raise InvalidInventory(f"GPU {self.uuid or '?'}: " + "; ".join(problems))


def _gpu_tuple(gpus: Iterable[GpuDevice]) -> tuple[GpuDevice, ...]:
    return tuple(gpus)


@attrs.frozen(kw_only=True)
class NodeInventory:
    """The GPUs of one node and how many pod slots each healthy GPU offers."""

    node_name: str
    gpus: tuple[GpuDevice, ...] = attrs.field(converter=_gpu_tuple)
    slots_per_gpu: int = keys.DEFAULT_SLOTS_PER_GPU

    def __attrs_post_init__(self) -> None:
        if not self.node_name:
            raise InvalidInventory("node_name must not be empty")
        if self.slots_per_gpu < 1:
            raise InvalidInventory(f"slots_per_gpu must be >= 1, got {self.slots_per_gpu}")
        uuids = [gpu.uuid for gpu in self.gpus]
        if len(set(uuids)) != len(uuids):
            raise InvalidInventory(f"node {self.node_name}: duplicate GPU uuid in {uuids}")
        indexes = [gpu.index for gpu in self.gpus]
        if len(set(indexes)) != len(indexes):
            raise InvalidInventory(f"node {self.node_name}: duplicate GPU index in {indexes}")

    def gpu(self, uuid: str) -> GpuDevice | None:
        """The GPU with this uuid, if the node has it."""
        return next((gpu for gpu in self.gpus if gpu.uuid == uuid), None)

    @property
    def healthy_gpus(self) -> tuple[GpuDevice, ...]:
        return tuple(gpu for gpu in self.gpus if gpu.healthy)

    @property
    def advertised_slots(self) -> int:
        """The node's capacity of the ``fastgshare.caps.in.tum/vgpu`` resource."""
        return self.slots_per_gpu * len(self.healthy_gpus)


def slot_device_id(gpu_uuid: str, slot: int) -> str:
    """The kubelet device ID of one slot of a GPU: ``"<uuid>::<slot>"``."""
    return f"{gpu_uuid}{keys.SLOT_ID_SEPARATOR}{slot}"


def parse_slot_device_id(device_id: str) -> tuple[str, int]:
    """``(gpu uuid, slot)`` of a slot device ID; :class:`InvalidInventory` if it is not one."""
    uuid, separator, slot = device_id.rpartition(keys.SLOT_ID_SEPARATOR)
    if not separator or not uuid or not slot.isdigit():
        raise InvalidInventory(f'device ID "{device_id}" is not of the form <gpu uuid>::<slot>')
    return uuid, int(slot)


@attrs.frozen(kw_only=True)
class GpuSpec:
    """A parsed GPU spec string: ``count`` identical GPUs."""

    count: int
    model: str
    memory_bytes: int
    sm_count: int
    mps_enabled: bool = True

    def devices(self, uuid_prefix: str = "GPU-fake", first_index: int = 0) -> tuple[GpuDevice, ...]:
        """``count`` devices with deterministic uuids ``<prefix>-<index>``."""
        return tuple(
            GpuDevice(
                uuid=f"{uuid_prefix}-{index}",
                index=index,
                model=self.model,
                memory_bytes=self.memory_bytes,
                sm_count=self.sm_count,
                mps_enabled=self.mps_enabled,
            )
            for index in range(first_index, first_index + self.count)
        )


GPU_SPEC_HELP = (
    '[MODEL=]COUNTxMEMORY:SMsm[:mps|:nomps], e.g. "2x80GiB:132sm" or "V100=1x16Gi:80sm:nomps"'
)
_GPU_SPEC = re.compile(
    r"(?:(?P<model>[A-Za-z0-9][A-Za-z0-9._-]*)=)?(?P<count>[0-9]+)x(?P<memory>[0-9.]+[A-Za-z]*?)(?:B)?"
    r":(?P<sm>[0-9]+)sm(?::(?P<mps>mps|nomps))?"
)


def parse_gpu_spec(text: str) -> GpuSpec:
    """Parse ``[MODEL=]COUNTxMEMORY:SMsm[:mps|:nomps]`` (memory ``80GiB``, ``80Gi`` or bytes)."""
    match = _GPU_SPEC.fullmatch(text.strip())
    if match is None:
        raise InvalidInventory(f'GPU spec "{text}" is malformed; allowed: {GPU_SPEC_HELP}')
    count, sm = int(match["count"]), int(match["sm"])
    memory = parse_bytes(match["memory"])
    if count < 1 or sm < 1 or memory is None:
        raise InvalidInventory(
            f'GPU spec "{text}": count and SM count must be >= 1 and memory a positive byte '
            f"quantity; allowed: {GPU_SPEC_HELP}"
        )
    model = match["model"] or f"simulated-{match['memory']}"
    return GpuSpec(count=count, model=model, memory_bytes=memory, sm_count=sm,
                   mps_enabled=match["mps"] != "nomps")


GPU_LABEL_HELP = 'COUNTxMEMORY_SMsm[_mps|_nomps] (a GPU spec with "_" for ":"), e.g. "2x16GiB_80sm"'


def gpu_spec_from_label(value: str) -> str:
    """The GPU spec a node label carries (label values cannot hold ":" or "="); raises
    :class:`InvalidInventory` naming the label's form if it is not one."""
    if not value or ":" in value or "=" in value:
        raise InvalidInventory(f'"{value}" is not a GPU spec label value; allowed: {GPU_LABEL_HELP}')
    spec = value.replace("_", ":")
    try:
        parse_gpu_spec(spec)
    except InvalidInventory:
        raise InvalidInventory(f'"{value}" is not a GPU spec label value; allowed: {GPU_LABEL_HELP}') from None
    return spec
