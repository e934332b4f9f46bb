"""Packing a whole workload onto as few GPUs of one model as the ledger allows.

Pods are taken largest first (time x SM area, then memory, then SM height) or in arrival
order; each goes to the open GPU the placement policy prefers, and a new GPU is opened only when none fits. This is
what ``fastgshare pack`` prints and what ``bench/packing.py`` measures.
"""

from __future__ import annotations

from collections.abc import Iterable

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
) -> FleetPlacement:
    """Place every pod on GPUs like ``gpu``, opening as few as this greedy order needs.

    ``largest_first=False`` keeps the given order, as a scheduler that sees pods arrive
    one at a time must.
    """
    ordered = list(pods)
    if largest_first:
        ordered.sort(key=lambda pod: (-pod[1].area, -pod[1].memory_bytes, -pod[1].sm_percent, pod[0]))
    ledgers: list[GpuLedger] = []
    unplaced: list[tuple[str, str]] = []
    for key, share in ordered:
        ledger = choose_gpu(ledgers, share, policy)
        if ledger is None:
            fresh = GpuLedger(gpu.devices(uuid_prefix="GPU", first_index=len(ledgers))[0],
                              slots_per_gpu)
            fit = fresh.check(share)
            if not fit.ok:
                unplaced.append((key, f"does not fit an empty GPU: {fit.message}"))
                continue
            ledgers.append(fresh)
            ledger = fresh
        ledger.add(key, share)
    return FleetPlacement(tuple(ledgers), tuple(unplaced))
