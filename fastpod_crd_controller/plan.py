"""What to create and delete for one FaSTPod: scaling and rolling replacement, as pure functions.

- Only *active* pods count (not terminating, not finished), as for a ReplicaSet.
- Too many: delete the surplus in :func:`deletion_order`: outdated pods first, then unscheduled,
  then not-ready, then the newest.
- Too few: create the missing ones.
- Pods whose revision differs only in the time quota (``gpu_quota_request``/``gpu_quota_limit``)
  are updated in place (:func:`in_place_updates`): their annotations and revision label are
  patched, and the extender re-checks the change on the pod's GPU, so the running process keeps
  going. An SM or memory change cannot be applied to a running process (MPS's thread percentage
  and the hook's memory ledger are fixed when it starts), so it rolls the pods like any other.
- Outdated pods (another revision: the share or the podSpec changed) are replaced with at most
  one replica unavailable and no extra pod: outdated pods that are not ready cost no
  availability and go at once; a ready one goes only while every desired replica is ready,
  one at a time, each replaced in the same step. A new pod that never becomes ready stops the
  roll-out there, with the other old pods still serving: the plan is then empty but still a
  ``RollingUpdate``, with the number of outdated pods that wait (``Plan.waiting``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from fastpod_crd_controller.pods import PodInfo
from fastpod_crd_controller.spec import FaSTPodSpec, revision_with_time_quota

SCALING_UP = "ScalingUp"
SCALING_DOWN = "ScalingDown"
ROLLING_UPDATE = "RollingUpdate"


@attrs.frozen
class Plan:
    create: int = 0
    delete: tuple[PodInfo, ...] = ()
    reason: str = ""  # ScalingUp, ScalingDown, RollingUpdate, or "" when there is nothing to do
    waiting: int = 0  # outdated pods left until every replica is ready (a roll-out that must wait)

    @property
    def empty(self) -> bool:
        return self.create == 0 and not self.delete


def deletion_order(pods: Iterable[PodInfo], revision: str) -> list[PodInfo]:
    """``pods``, the first to delete first."""
    newest_first = sorted(pods, key=lambda pod: (pod.created, pod.name), reverse=True)
    return sorted(newest_first, key=lambda pod: (pod.revision == revision, pod.scheduled, pod.ready))


def plan(desired: int, pods: Sequence[PodInfo], revision: str) -> Plan:
    """The creates and deletes that move ``pods`` one safe step toward ``desired`` current pods."""
    active = [pod for pod in pods if pod.active]
    if len(active) > desired:
        return Plan(delete=tuple(deletion_order(active, revision)[:len(active) - desired]), reason=SCALING_DOWN)
    outdated = [pod for pod in active if pod.revision != revision]
    doomed = deletion_order((pod for pod in outdated if not pod.ready), revision)
    all_ready = len(active) == desired and all(pod.ready for pod in active)
    if not doomed and outdated and all_ready:
        doomed = deletion_order(outdated, revision)[:1]
    create = desired - (len(active) - len(doomed))
    if not doomed and not create and outdated:  # a roll-out waiting for its new pods to be ready
        return Plan(reason=ROLLING_UPDATE, waiting=len(outdated))
    reason = ROLLING_UPDATE if doomed else SCALING_UP if create else ""
    return Plan(create=create, delete=tuple(doomed), reason=reason)


def in_place_updates(pods: Sequence[PodInfo], spec: FaSTPodSpec) -> list[PodInfo]:
    """The active pods of another revision that differ from ``spec`` only in their time quota, by name
    (the order the controller patches them in, whatever order the cache holds them in)."""
    found: dict[tuple[str | None, str | None], str] = {}  # time quota -> the revision it gives
    updates = []
    for pod in pods:
        if not pod.active or pod.revision == spec.revision:
            continue
        if pod.time_quota not in found:
            found[pod.time_quota] = revision_with_time_quota(spec, pod.time_quota)
        if found[pod.time_quota] == pod.revision:
            updates.append(pod)
    return sorted(updates, key=lambda pod: pod.name)
