"""A pod's place on a GPU as the extender's cache records it, and how it is read from a pod.

A :class:`Placement` comes from the API (the pod's ``fastgshare/assignment`` annotation) or from
a bind of ours in progress; its flags say how far the pod has come (binding, assigned, bound,
allocated) and whether the API has shown our write yet.
"""

from __future__ import annotations

import logging

import attrs

from fastgshare.codec import PodAssignment, decode_assignment
from fastgshare.errors import CodecError
from fastgshare.share import ShareSpec
from scheduler_extender.records import PodRecord

log = logging.getLogger(__name__)


@attrs.define(kw_only=True)
class Placement:
    """A pod's share committed on one GPU, from the API (its assignment) or from a bind of ours."""

    uid: str
    pod_key: str
    node: str
    gpu_uuid: str
    gpu_index: int
    share: ShareSpec
    assigned_at_ms: int
    bound: bool = False
    allocated: bool = False
    in_flight: bool = False  # a bind of ours is writing it
    seen: bool = True  # the API has shown this assignment
    done_seq: int = 0  # when our bind of it ended, on the cache's own counter
    gone: bool = False  # the pod was deleted or finished while our bind ran
    share_pending: bool = False  # a live share change of ours is being written, or the API has not shown it yet

    def matches(self, assignment: PodAssignment) -> bool:
        return (assignment.node_name, assignment.gpu_uuid, assignment.assigned_at_ms) == (
            self.node, self.gpu_uuid, self.assigned_at_ms)

    @property
    def status(self) -> str:
        """``binding``, ``assigned`` (not bound yet), ``bound`` (awaiting the node agent) or ``allocated``."""
        if self.in_flight:
            return "binding"
        if not self.bound:
            return "assigned"
        return "allocated" if self.allocated else "bound"


def pod_assignment(record: PodRecord) -> PodAssignment | None:
    """The pod's assignment, or None if it has none or one that cannot be read (logged)."""
    text = record.assignment_text
    if text is None:
        return None
    try:
        return decode_assignment(text)
    except CodecError as error:
        log.warning("pod=%s unreadable assignment, not counted: %s", record.key, error)
        return None


def placement_of(record: PodRecord, assignment: PodAssignment) -> Placement:
    """The placement the API shows for a pod."""
    return Placement(uid=record.uid, pod_key=record.key, node=assignment.node_name, gpu_uuid=assignment.gpu_uuid,
                     gpu_index=assignment.gpu_index, share=assignment.share,
                     assigned_at_ms=assignment.assigned_at_ms, bound=bool(record.node_name),
                     allocated=record.allocated)


def same_assignment(a: Placement, b: Placement) -> bool:
    """Both name the same write: node, GPU and time."""
    return (a.node, a.gpu_uuid, a.assigned_at_ms) == (b.node, b.gpu_uuid, b.assigned_at_ms)


def placement_from_api(record: PodRecord) -> Placement | None:
    """What a listed pod holds: its assignment's share, unless it has finished."""
    if record.finished:
        return None
    assignment = pod_assignment(record)
    return placement_of(record, assignment) if assignment is not None else None
