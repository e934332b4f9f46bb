"""What share a pod has, and on which GPU: the arbiter's view of the extender's assignments.

:class:`AssignmentShares` reads the node agent's pod cache (the assignment annotation of
each pod bound to this node); :class:`StaticShares` is a table for the standalone arbiter
(demo, benchmarks, tests, ``fastgshare run``), replaced whole when it reloads its file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs

from device_plugin.allocation import NodePod
from fastgshare.arbitration import TimeShare


@attrs.frozen
class PodShare:
    gpu_uuid: str
    time: TimeShare
    memory_bytes: int


class ShareBook(Protocol):
    def by_pod(self, pod_key: str) -> PodShare | None: ...

    def pod_of_uid(self, uid: str) -> str | None: ...

    def ready(self) -> bool:
        """False while the book cannot know every pod yet (the agent's pod cache is still loading):
        the arbiter then also believes what it saved before a restart."""
        ...


class StaticShares:
    """A table ``pod key -> share``, replaced whole (:meth:`replace`)."""

    def __init__(self, shares: Mapping[str, PodShare]) -> None:
        self._shares = dict(shares)

    def replace(self, shares: Mapping[str, PodShare]) -> None:
        """Serve ``shares`` from now on (the standalone arbiter reloading its file); registered pods
        take a changed share through :meth:`ArbiterServer.refresh_shares`, as the node agent's do."""
        self._shares = dict(shares)

    def by_pod(self, pod_key: str) -> PodShare | None:
        return self._shares.get(pod_key)

    def pod_of_uid(self, uid: str) -> str | None:
        return None

    def ready(self) -> bool:
        return True


class PodSnapshot(Protocol):
    def snapshot(self) -> tuple[int, list[NodePod]]: ...

    def wait_synced(self, timeout_s: float) -> bool: ...


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

    def ready(self) -> bool:
        return self._pods.wait_synced(0)


class DeferredShares:
    """A book the node agent fills in once it has its pod cache (:meth:`attach`), so the arbiter can
    listen before the agent has reached the API server; until then it knows no pod and is not ready."""

    def __init__(self) -> None:
        self._book: ShareBook | None = None

    def attach(self, book: ShareBook) -> None:
        self._book = book

    def by_pod(self, pod_key: str) -> PodShare | None:
        return self._book.by_pod(pod_key) if self._book is not None else None

    def pod_of_uid(self, uid: str) -> str | None:
        return self._book.pod_of_uid(uid) if self._book is not None else None

    def ready(self) -> bool:
        return self._book is not None and self._book.ready()


def share_of(pod: NodePod) -> PodShare | None:
    """The share the pod's assignment gives it, or None without a readable assignment (the record
    decoded it once, when it was made)."""
    assignment = pod.assignment
    if assignment is None:
        return None
    share = assignment.share
    return PodShare(assignment.gpu_uuid, TimeShare(share.request_permille, share.limit_permille, share.sm_percent),
                    share.memory_bytes)
