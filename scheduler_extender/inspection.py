"""The ``/inspect`` view: per node, per GPU, what is committed and what is free, as JSON.

Built from a :class:`~scheduler_extender.state.Snapshot`, so it is one consistent picture.
Fractions are of the GPU's time x SM area (guaranteed time only); memory in bytes. A GPU's free
memory counts each pod's CUDA context reserve (``contextReserveBytes``, charged once per pod) as well
as its ``gpu_mem``, and each model on the GPU once (``models``: ``key``, ``bytes``, ``pods``, ``held``
by the node's store; ``modelMemoryBytes`` their sum); a pod that declares a model names it (``model``).
"""

from __future__ import annotations

from fastgshare.ledger import GpuLedger
from fastgshare.share import format_fraction
from scheduler_extender.nodes import NodeEntry
from scheduler_extender.placements import Placement
from scheduler_extender.state import Snapshot

PENDING = ("binding", "assigned", "bound")


def describe(snapshot: Snapshot, *, only_node: str | None = None) -> dict[str, object]:
    """The whole cache, or one node of it."""
    by_uid = {placement.uid: placement for placement in snapshot.placements}
    names = sorted(name for name in snapshot.nodes if only_node is None or name == only_node)
    return {
        "synced": snapshot.synced,
        "nodes": {name: _node(snapshot.nodes[name], by_uid, snapshot.waiting.get(name, [])) for name in names},
        "unplaced": sorted(
            (_pod(placement) | {"node": placement.node, "gpu": placement.gpu_uuid}
             for placement in snapshot.placements
             if not _is_on_ledger(placement, snapshot.nodes) and only_node in (None, placement.node)),
            key=lambda item: str(item["pod"])),
    }


def _node(entry: NodeEntry, by_uid: dict[str, Placement], waiting: list[str]) -> dict[str, object]:
    if entry.state is None:
        return {"problem": entry.problem, "gpus": [], "pendingBinds": [], "waitingBinds": waiting}
    placements = [by_uid[uid] for ledger in entry.state.ledgers.values() for uid in ledger.pods if uid in by_uid]
    return {
        "slotsPerGpu": entry.state.inventory.slots_per_gpu,
        "gpus": [_gpu(ledger, by_uid) for ledger in entry.state.ledgers.values()],
        "pendingBinds": sorted(p.pod_key for p in placements if p.status in PENDING),
        "waitingBinds": waiting,
    }


def _gpu(ledger: GpuLedger, by_uid: dict[str, Placement]) -> dict[str, object]:
    gpu = ledger.gpu
    layout = ledger.layout
    pod_models = ledger.pod_models
    pods = []
    for uid, share in ledger.pods.items():
        placement = by_uid.get(uid)
        rect = layout.get(uid)
        pods.append({
            **(_pod(placement) if placement is not None else {"pod": uid, "uid": uid, "status": "unknown"}),
            "request": format_fraction(share.request_permille),
            "limit": format_fraction(share.limit_permille),
            "smPercent": share.sm_percent,
            "memoryBytes": share.memory_bytes,
            "model": model.key if (model := pod_models.get(uid)) is not None else None,
            "rect": None if rect is None else {"time": [rect.x, rect.right], "sm": [rect.y, rect.top]},
        })
    return {
        "uuid": gpu.uuid, "index": gpu.index, "model": gpu.model, "healthy": gpu.healthy, "mps": gpu.mps_enabled,
        "memoryBytes": gpu.memory_bytes, "freeMemoryBytes": ledger.free_memory,
        "contextReserveBytes": gpu.context_reserve_bytes,
        "modelMemoryBytes": ledger.model_memory,
        "models": [{"key": usage.key, "bytes": usage.bytes, "pods": usage.pods, "held": usage.held}
                   for usage in ledger.models],
        "slots": ledger.slots, "freeSlots": ledger.free_slots,
        "areaUsed": round(ledger.area_fraction, 4), "areaFree": round(1 - ledger.area_fraction, 4),
        "overcommitted": ledger.overcommitted,
        "pods": sorted(pods, key=lambda item: str(item["pod"])),
    }


def _pod(placement: Placement) -> dict[str, object]:
    return {"pod": placement.pod_key, "uid": placement.uid, "status": placement.status,
            "assignedAtMs": placement.assigned_at_ms}


def _is_on_ledger(placement: Placement, nodes: dict[str, NodeEntry]) -> bool:
    entry = nodes.get(placement.node)
    return entry is not None and entry.state is not None and placement.gpu_uuid in entry.state.ledgers
