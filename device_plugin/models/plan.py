"""Which models each GPU of the node needs, and when a model no pod needs any more is freed.

A GPU needs a model while a live pod on this node (not deleting, not finished) carries an
assignment on that GPU the agent trusts and a valid ``fastgshare/model`` annotation
(:func:`fastgshare.model.pod_model`). A model the store holds that no such pod needs is freed
once it has been unneeded for the grace period (``--model-grace-seconds``), so scaling down and up
again does not reload it; a pod asking for it again (:meth:`Retention.touch`) starts the clock over.

Pure: the pods come in as records, the time as a number.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import attrs

from fastgshare.codec import PodAssignment
from fastgshare.model import ModelRef, pod_model

FINISHED_PHASES = ("Succeeded", "Failed")

Slot = tuple[str, str]  # (GPU uuid, ModelRef.identity)


class PodRecord(Protocol):
    """The parts of a pod record (:class:`device_plugin.allocation.NodePod`) the plan reads."""

    @property
    def uid(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def node_name(self) -> str: ...

    @property
    def phase(self) -> str: ...

    @property
    def deleting(self) -> bool: ...

    @property
    def annotations(self) -> Mapping[str, str]: ...

    @property
    def assignment(self) -> PodAssignment | None: ...


@attrs.frozen
class Need:
    """One model a GPU needs, and the pods (uids) that need it."""

    model: ModelRef
    pods: frozenset[str]


def assigned_gpu(pod: PodRecord, node_name: str) -> str | None:
    """The GPU a live pod on ``node_name`` is assigned (trusted), else None."""
    if pod.node_name != node_name or pod.deleting or pod.phase in FINISHED_PHASES or pod.assignment is None:
        return None
    if pod.assignment.node_name != node_name:
        return None
    return pod.assignment.gpu_uuid


def models_needed(pods: Iterable[PodRecord], node_name: str) -> dict[str, dict[str, Need]]:
    """GPU uuid -> model identity -> the model and the pods that need it on that GPU."""
    found: dict[str, dict[str, tuple[ModelRef, set[str]]]] = {}
    for pod in pods:
        gpu = assigned_gpu(pod, node_name)
        model = pod_model(pod.annotations, pod.namespace) if gpu is not None else None
        if gpu is None or model is None:
            continue
        entry = found.setdefault(gpu, {}).setdefault(model.identity, (model, set()))
        entry[1].add(pod.uid)
    return {gpu: {identity: Need(model, frozenset(uids)) for identity, (model, uids) in models.items()}
            for gpu, models in found.items()}


def needed_slots(needs: Mapping[str, Mapping[str, Need]]) -> set[Slot]:
    return {(gpu, identity) for gpu, models in needs.items() for identity in models}


class Retention:
    """When each held model stopped being needed, and which are due to be freed (not thread-safe:
    the store calls it under its lock)."""

    def __init__(self, grace_s: float) -> None:
        if grace_s < 0:
            raise ValueError(f"--model-grace-seconds {grace_s}: allowed: 0 or more seconds")
        self.grace_s = grace_s
        self._since: dict[Slot, float] = {}

    def touch(self, slot: Slot) -> None:
        """A pod asked for the model just now: the grace period starts over when it is unneeded again."""
        self._since.pop(slot, None)

    def due(self, held: Iterable[Slot], needed: set[Slot], now: float) -> list[Slot]:
        """The held models to free now: unneeded for at least the grace period. Models unneeded since
        this call start their clock here."""
        held = set(held)
        for slot in list(self._since):
            if slot not in held:
                del self._since[slot]
        due = []
        for slot in sorted(held):
            if slot in needed:
                self._since.pop(slot, None)
                continue
            since = self._since.setdefault(slot, now)
            if now - since >= self.grace_s:
                due.append(slot)
        return due

    def unneeded_since(self, slot: Slot) -> float | None:
        return self._since.get(slot)

    def forget(self, slot: Slot) -> None:
        self._since.pop(slot, None)
