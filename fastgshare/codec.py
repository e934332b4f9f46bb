"""Versioned JSON payloads that components write into annotations for each other.

- the node inventory (node annotation ``fastgshare/gpu_info``), written by the node agent; a GPU's
  ``contextReserveBytes`` (the CUDA context reserve) came after version 1 was out: it is optional,
  0 when missing (inventories of older agents), so the version stays 1 and older extenders still
  read newer inventories (without charging the reserve);
- the pod assignment (pod annotation ``fastgshare/assignment``), written by the extender's
  bind and read by the node agent's Allocate.

Every payload is an object with ``"version"``. Decoders accept exactly the versions they
know and raise :class:`CodecError` naming the field for anything malformed; a payload from a
newer release is refused with a message that says so, never half-read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import attrs

from fastgshare.errors import CodecError, FastGShareError
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.jsontext import load_bounded
from fastgshare.model import HeldModel
from fastgshare.share import ShareSpec

INVENTORY_VERSION = 1
ASSIGNMENT_VERSION = 1
MAX_PAYLOAD_BYTES = 256 * 1024  # annotations are limited to 256 KiB in total

T = TypeVar("T")


@attrs.frozen(kw_only=True)
class PodAssignment:
    """The GPU the extender chose for a pod, and the share it committed there."""

    node_name: str
    gpu_uuid: str
    gpu_index: int
    share: ShareSpec
    assigned_at_ms: int  # wall-clock ms since the epoch, from the writer's clock


# --- node inventory ----------------------------------------------------------------------
def encode_node_inventory(inventory: NodeInventory) -> str:
    return _dump({
        "version": INVENTORY_VERSION,
        "node": inventory.node_name,
        "slotsPerGpu": inventory.slots_per_gpu,
        "gpus": [
            {
                "uuid": gpu.uuid,
                "index": gpu.index,
                "model": gpu.model,
                "memoryBytes": gpu.memory_bytes,
                "smCount": gpu.sm_count,
                "healthy": gpu.healthy,
                "mps": gpu.mps_enabled,
                "contextReserveBytes": gpu.context_reserve_bytes,
                **({"heldModels": [{"identity": held.identity, "key": held.key, "bytes": held.bytes}
                                   for held in gpu.held_models]} if gpu.held_models else {}),
            }
            for gpu in inventory.gpus
        ],
    })


def decode_node_inventory(text: str) -> NodeInventory:
    what = "node inventory"
    payload = _load(text, what, INVENTORY_VERSION)
    gpus_raw = _field(payload, "gpus", list, what)
    gpus = tuple(_decode_gpu(raw, f"{what} gpus[{position}]") for position, raw in enumerate(gpus_raw))
    return _build(what, lambda: NodeInventory(
        node_name=_field(payload, "node", str, what),
        gpus=gpus,
        slots_per_gpu=_field(payload, "slotsPerGpu", int, what),
    ))


def _decode_gpu(raw: object, where: str) -> GpuDevice:
    if not isinstance(raw, dict):
        raise CodecError(f"{where}: expected an object, got {type(raw).__name__}")
    return _build(where, lambda: GpuDevice(
        uuid=_field(raw, "uuid", str, where),
        index=_field(raw, "index", int, where),
        model=_field(raw, "model", str, where),
        memory_bytes=_field(raw, "memoryBytes", int, where),
        sm_count=_field(raw, "smCount", int, where),
        healthy=_field(raw, "healthy", bool, where),
        mps_enabled=_field(raw, "mps", bool, where),
        context_reserve_bytes=_optional_field(raw, "contextReserveBytes", int, where, 0),
        held_models=_decode_held_models(_optional_field(raw, "heldModels", list, where, []), where),
    ))


def _decode_held_models(raw: list[object], where: str) -> tuple[HeldModel, ...]:
    held = []
    for position, entry in enumerate(raw):
        at = f"{where} heldModels[{position}]"
        if not isinstance(entry, dict):
            raise CodecError(f"{at}: expected an object, got {type(entry).__name__}")
        size = _field(entry, "bytes", int, at)
        if size <= 0:
            raise CodecError(f"{at}: bytes must be > 0, got {size}")
        held.append(HeldModel(identity=_field(entry, "identity", str, at), key=_field(entry, "key", str, at),
                              bytes=size))
    return tuple(held)


# --- pod assignment ----------------------------------------------------------------------
def encode_assignment(assignment: PodAssignment) -> str:
    share = assignment.share
    return _dump({
        "version": ASSIGNMENT_VERSION,
        "node": assignment.node_name,
        "gpuUuid": assignment.gpu_uuid,
        "gpuIndex": assignment.gpu_index,
        "share": {
            "requestPermille": share.request_permille,
            "limitPermille": share.limit_permille,
            "smPercent": share.sm_percent,
            "memoryBytes": share.memory_bytes,
        },
        "assignedAtMs": assignment.assigned_at_ms,
    })


def decode_assignment(text: str) -> PodAssignment:
    what = "pod assignment"
    payload = _load(text, what, ASSIGNMENT_VERSION)
    raw_share = _field(payload, "share", dict, what)
    where = f"{what} share"
    share = _build(where, lambda: ShareSpec(
        request_permille=_field(raw_share, "requestPermille", int, where),
        limit_permille=_field(raw_share, "limitPermille", int, where),
        sm_percent=_field(raw_share, "smPercent", int, where),
        memory_bytes=_field(raw_share, "memoryBytes", int, where),
    ))
    return _build(what, lambda: PodAssignment(
        node_name=_nonempty(_field(payload, "node", str, what), "node", what),
        gpu_uuid=_nonempty(_field(payload, "gpuUuid", str, what), "gpuUuid", what),
        gpu_index=_field(payload, "gpuIndex", int, what),
        share=share,
        assigned_at_ms=_field(payload, "assignedAtMs", int, what),
    ))


# --- shared plumbing ---------------------------------------------------------------------
def _dump(payload: dict[str, object]) -> str:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True)


def _load(text: object, what: str, known_version: int) -> dict[str, object]:
    if not isinstance(text, str):
        raise CodecError(f"{what}: expected a JSON string, got {type(text).__name__}")
    payload = load_bounded(text, what, MAX_PAYLOAD_BYTES, CodecError)
    if not isinstance(payload, dict):
        raise CodecError(f"{what}: expected a JSON object, got {type(payload).__name__}")
    version = _field(payload, "version", int, what)
    if version > known_version:
        raise CodecError(f"{what}: version {version} is newer than this release understands "
                         f"({known_version}); upgrade fastgshare on this component")
    if version < 1:
        raise CodecError(f"{what}: version {version} is invalid; allowed: 1..{known_version}")
    return payload


def _field(payload: dict[str, object], name: str, kind: type[T], what: str) -> T:
    if name not in payload:
        raise CodecError(f"{what}: field {name!r} is missing")
    value = payload[name]
    # bool is a subclass of int in Python; JSON true is not a number here.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CodecError(f"{what}: field {name!r} must be {kind.__name__}, got "
                         f"{type(value).__name__}")
    return value


def _optional_field(payload: dict[str, object], name: str, kind: type[T], what: str, default: T) -> T:
    """A field added after its payload's version was out: ``default`` when missing, else checked as
    :func:`_field` does."""
    return _field(payload, name, kind, what) if name in payload else default


def _nonempty(value: str, name: str, what: str) -> str:
    if not value:
        raise CodecError(f"{what}: field {name!r} must not be empty")
    return value


def _build(what: str, make: Callable[[], T]) -> T:
    """Run a constructor, turning the domain's validation errors into :class:`CodecError`."""
    try:
        return make()
    except CodecError:
        raise
    except (FastGShareError, ValueError) as error:
        raise CodecError(f"{what}: {error}") from None
