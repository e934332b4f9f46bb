"""What share a pod has, and on which GPU: the arbiter's view of the extender's assignments.

:class:`AssignmentShares` reads the node agent's pod cache (the assignment annotation of
each pod bound to this node); :class:`StaticShares` is a fixed table for the standalone
arbiter (demo, benchmarks, tests).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs

from device_plugin.allocation import PodRecord
from fastgshare import keys
from fastgshare.arbitration import TimeShare
from fastgshare.codec import decode_assignment
from fastgshare.errors import CodecError


@attrs.frozen
class PodShare:
    gpu_uuid: str
    time: TimeShare
    memory_bytes: int


class ShareBook(Protocol):
    def by_pod(self, pod_key: str) -> PodShare | None: ...

    def pod_of_uid(self, uid: str) -> str | None: ...


class StaticShares:
    """A fixed table ``pod key -> share``."""

    def __init__(self, shares: Mapping[str, PodShare]) -> None:
        self._shares = dict(shares)

    def by_pod(self, pod_key: str) -> PodShare | None:
        return self._shares.get(pod_key)

    def pod_of_uid(self, uid: str) -> str | None:
        return None


class PodSnapshot(Protocol):
    def snapshot(self) -> tuple[int, list[PodRecord]]: ...


class AssignmentShares:
    """Shares from the assignments of the pods in the node agent's watch cache."""

    def __init__(self, pods: PodSnapshot) -> None:
        self._pods = pods

    def by_pod(self, pod_key: str) -> PodShare | None:
        for pod in self._pods.snapshot()[1]:
            if pod.key == pod_key:
                return share_of(pod)
        return None

    def pod_of_uid(self, uid: str) -> str | None:
        return next((pod.key for pod in self._pods.snapshot()[1] if pod.uid == uid), None)


def share_of(pod: PodRecord) -> PodShare | None:
    """The share the pod's assignment gives it, or None without a readable assignment."""
    text = pod.annotations.get(keys.POD_ASSIGNMENT_ANNOTATION)
    if text is None:
        return None
    try:
        assignment = decode_assignment(text)
    except CodecError:
        return None
    share = assignment.share
    return PodShare(assignment.gpu_uuid, TimeShare(share.request_permille, share.limit_permille, share.sm_percent),
                    share.memory_bytes)
