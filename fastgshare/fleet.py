"""Packing a whole workload onto as few GPUs of one model as the ledger allows.

Pods are taken largest first (time x SM area, then memory, then SM height) or in arrival
order; each goes to the open GPU the placement policy prefers, and a new GPU is opened only when none fits. This is
what ``fastgshare pack`` prints and what ``bench/packing.py`` measures.

With ``models`` (model sharing), the pods of one model on one GPU hold its weights once: the
first pod of a model on a GPU is charged its whole ``gpu_mem`` (it brings the weights), each
next one its ``gpu_mem`` less the weights; a pod goes to a GPU that already holds its model when
one fits it (the placement policy choosing among those), else as without sharing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from fastgshare import keys
from fastgshare.inventory import GpuSpec
from fastgshare.ledger import GpuLedger
from fastgshare.placement import DEFAULT_POLICY, Policy, choose_gpu
from fastgshare.share import ShareSpec
from fastgshare.workload import WorkloadItem


@attrs.frozen
class FleetPlacement:
    """The GPUs opened (each with its pods) and the pods no empty GPU could take."""

    gpus: tuple[GpuLedger, ...]
    unplaced: tuple[tuple[str, str], ...]  # (pod key, reason)


@attrs.frozen
class SharedModel:
    """A model whose weights the pods of one GPU share: its name and the weights' size in bytes."""

    name: str
    weights_bytes: int


def expand(items: Iterable[WorkloadItem]) -> list[tuple[str, ShareSpec]]:
    """One ``(pod key, share)`` per replica: ``resnet-0``, ``resnet-1``, ..."""
    return [(f"{item.name}-{i}", item.share) for item in items for i in range(item.count)]


def pack_fleet(
    pods: Iterable[tuple[str, ShareSpec]],
    gpu: GpuSpec,
    *,
    slots_per_gpu: int = keys.DEFAULT_SLOTS_PER_GPU,
    policy: Policy = DEFAULT_POLICY,
    largest_first: bool = True,
    models: Mapping[str, SharedModel] | None = None,
) -> FleetPlacement:
    """Place every pod on GPUs like ``gpu``, opening as few as this greedy order needs.

    ``largest_first=False`` keeps the given order, as a scheduler that sees pods arrive
    one at a time must. ``models`` maps pod keys to the model whose weights they share
    (pods not in it share nothing); the weights must be smaller than each such pod's ``gpu_mem``.
    """
    models = models or {}
    ordered = list(pods)
    for key, share in ordered:
        model = models.get(key)
        if model is not None and not 0 <= model.weights_bytes < share.memory_bytes:
            raise ValueError(f"pod {key}: weights_bytes of model {model.name} must be in 0..{share.memory_bytes - 1} "
                             f"(less than the pod's gpu_mem), got {model.weights_bytes}")
    if largest_first:
        ordered.sort(key=lambda pod: (-pod[1].area, -pod[1].memory_bytes, -pod[1].sm_percent, pod[0]))
    ledgers: list[GpuLedger] = []
    held: dict[str, set[str]] = {}  # GPU uuid -> the models whose weights it holds
    unplaced: list[tuple[str, str]] = []
    for key, share in ordered:
        model = models.get(key)
        if model is not None:  # a GPU that holds the weights takes the pod's memory less them
            sharing = [g for g in ledgers if model.name in held[g.gpu.uuid]]
            reduced = attrs.evolve(share, memory_bytes=share.memory_bytes - model.weights_bytes)
            ledger = choose_gpu(sharing, reduced, policy)
            if ledger is not None:
                ledger.add(key, reduced)
                continue
        ledger = choose_gpu(ledgers, share, policy)
        if ledger is None:
            fresh = GpuLedger(gpu.devices(uuid_prefix="GPU", first_index=len(ledgers))[0],
                              slots_per_gpu)
            fit = fresh.check(share)
            if not fit.ok:
                unplaced.append((key, f"does not fit an empty GPU: {fit.message}"))
                continue
            ledgers.append(fresh)
            held[fresh.gpu.uuid] = set()
            ledger = fresh
        ledger.add(key, share)
        if model is not None:
            held[ledger.gpu.uuid].add(model.name)
    return FleetPlacement(tuple(ledgers), tuple(unplaced))
