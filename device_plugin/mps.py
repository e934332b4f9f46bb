"""Whether each GPU has MPS now, and what a change of it means: the node agent's MPS decisions.

Pure (no I/O, no clock, no threads); :mod:`device_plugin.mps_watch` looks at the pipe directory and
carries the decisions out.

- A GPU has MPS while the MPS control daemon runs (its ``control`` pipe is in ``--mps-pipe-dir``)
  and the GPU allows it: every real GPU does (the one daemon serves them all); a simulated GPU
  does unless its spec says ``:nomps``.
- A change is the GPUs whose MPS started and those whose MPS stopped; each is one Normal Event on
  the Node.
- A pod whose SM partition cannot be applied (its assignment gives it less than the whole GPU,
  on a GPU without MPS) gets one Warning: once per pod for each time its GPU is without MPS. The
  pod is forgotten when MPS returns on its GPU (a second loss warns again) or when it leaves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from device_plugin.allocation import NodePod
from fastgshare import keys
from fastgshare.inventory import GpuDevice

REASON_MPS_STARTED = "MPSStarted"
REASON_MPS_STOPPED = "MPSStopped"
REASON_PARTITION_NOT_APPLIED = "SMPartitionNotApplied"
_FINISHED = ("Succeeded", "Failed")


def with_mps(gpus: Iterable[GpuDevice], allowed: Mapping[str, bool], daemon_running: bool) -> tuple[GpuDevice, ...]:
    """``gpus`` with ``mps_enabled`` as it is now: the daemon runs and the GPU allows MPS
    (``allowed`` by uuid; a GPU not named there allows it)."""
    return tuple(attrs.evolve(gpu, mps_enabled=daemon_running and allowed.get(gpu.uuid, True)) for gpu in gpus)


@attrs.frozen
class MpsChange:
    """GPUs (uuids, in order) whose MPS started and whose MPS stopped."""

    started: tuple[str, ...] = ()
    stopped: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.started or self.stopped)


def mps_change(before: Mapping[str, bool], after: Mapping[str, bool]) -> MpsChange:
    """What changed between two maps of GPU uuid -> MPS on (GPUs in both only)."""
    both = [uuid for uuid in after if uuid in before]
    return MpsChange(started=tuple(u for u in both if after[u] and not before[u]),
                     stopped=tuple(u for u in both if before[u] and not after[u]))


def node_events(change: MpsChange, control_pipe: str) -> list[tuple[str, str]]:
    """The Node's events for ``change``: (reason, message), one per direction that happened."""
    events = []
    if change.started:
        events.append((REASON_MPS_STARTED, f"fastgshare: the MPS control daemon is running ({control_pipe}): "
                                           f"SM partitions are applied on GPU {', '.join(change.started)}"))
    if change.stopped:
        events.append((REASON_MPS_STOPPED, f"fastgshare: the MPS control daemon is gone ({control_pipe} is "
                                           f"missing): GPU {', '.join(change.stopped)} runs without SM partitions, "
                                           "one pod at a time"))
    return events


def partition_unapplied(pod: NodePod, mps: Mapping[str, bool]) -> bool:
    """True if ``pod`` is on this node's GPU without MPS with less than the whole GPU's SMs."""
    assignment = pod.assignment
    return (assignment is not None and assignment.share.sm_percent < keys.SM_UNITS
            and not mps.get(assignment.gpu_uuid, True) and pod.phase not in _FINISHED and not pod.deleting)


def unapplied_message(pod: NodePod) -> str:
    assignment = pod.assignment
    assert assignment is not None
    return (f"fastgshare: this pod's SM partition ({assignment.share.sm_percent}% of the SMs) is not applied on GPU "
            f"{assignment.gpu_uuid}: MPS is not running there, so its kernels may use every SM and the arbiter "
            "runs the GPU's pods one at a time; it is applied to containers started after MPS returns")


class UnappliedPartitions:
    """Which pods were warned that their SM partition is not applied (pod uid -> GPU uuid)."""

    def __init__(self) -> None:
        self._warned: dict[str, str] = {}

    def check(self, pods: Iterable[NodePod], mps: Mapping[str, bool], *,
              known: Iterable[str] | None = None) -> list[tuple[NodePod, str]]:
        """The Warnings to write now for ``pods`` (each once): pods whose partition cannot be
        applied and that were not warned since their GPU last had MPS. ``mps``: GPU uuid -> MPS
        on. ``known``: the uids of every pod still on the node (warned pods not among them are
        forgotten); None keeps them."""
        if known is not None:
            present = set(known)
            self._warned = {uid: gpu for uid, gpu in self._warned.items() if uid in present}
        self._warned = {uid: gpu for uid, gpu in self._warned.items() if not mps.get(gpu, True)}
        warnings = []
        for pod in pods:
            if partition_unapplied(pod, mps) and pod.uid not in self._warned:
                assert pod.assignment is not None
                self._warned[pod.uid] = pod.assignment.gpu_uuid
                warnings.append((pod, unapplied_message(pod)))
        return warnings
