"""A pod's place on a GPU as the extender's cache records it, and how it is read from a pod.

A :class:`Placement` comes from the API (the pod's ``fastgshare/assignment`` annotation) or from
a bind of ours in progress; its flags say how far the pod has come (binding, assigned, bound,
allocated) and whether the API has shown our write yet. An assignment from the API counts only
if it carries our signature for that pod and node (:mod:`fastgshare.assignment_signature`):
anyone who may patch a pod can write the annotation, and a forged one must not take a GPU's room.
"""

from __future__ import annotations

import attrs

from fastgshare import keys
from fastgshare.assignment_signature import AssignmentTrust
from fastgshare.codec import PodAssignment, decode_assignment
from fastgshare.errors import CodecError
from fastgshare.model import ModelRef
from fastgshare.share import ShareSpec
from scheduler_extender.records import PodRecord


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
    model: ModelRef | None = None  # the model the pod declares (charged once per GPU); fixed while it is placed

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


@attrs.frozen
class ReadAssignment:
    """A pod's assignment as read: ``assignment`` if it is readable and ours, else ``problem`` says why
    (both None: the pod carries none)."""

    assignment: PodAssignment | None = None
    problem: str | None = None


def read_assignment(record: PodRecord, trust: AssignmentTrust) -> ReadAssignment:
    """The pod's assignment if it is readable and signed by us for this pod (its uid) and its node
    (the one it is bound to; for a pod not bound yet, the one the assignment names)."""
    text = record.assignment_text
    if text is None:
        return ReadAssignment()
    try:
        assignment = decode_assignment(text)
    except CodecError as error:
        return ReadAssignment(problem=f"unreadable: {error}")
    problem = trust.problem(record.annotations.get(keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION), pod_uid=record.uid,
                            node_name=record.node_name or assignment.node_name, assignment=assignment)
    return ReadAssignment(problem=problem) if problem is not None else ReadAssignment(assignment)


def pod_assignment(record: PodRecord, trust: AssignmentTrust) -> PodAssignment | None:
    """The pod's assignment, or None if it has none or one that is unreadable or not ours."""
    return read_assignment(record, trust).assignment


def placement_of(record: PodRecord, assignment: PodAssignment) -> Placement:
    """The placement the API shows for a pod."""
    return Placement(uid=record.uid, pod_key=record.key, node=assignment.node_name, gpu_uuid=assignment.gpu_uuid,
                     gpu_index=assignment.gpu_index, share=assignment.share,
                     assigned_at_ms=assignment.assigned_at_ms, bound=bool(record.node_name),
                     allocated=record.allocated, model=record.model)


def same_assignment(a: Placement, b: Placement) -> bool:
    """Both name the same write: node, GPU and time."""
    return (a.node, a.gpu_uuid, a.assigned_at_ms) == (b.node, b.gpu_uuid, b.assigned_at_ms)


def placement_from_api(record: PodRecord, assignment: PodAssignment | None) -> Placement | None:
    """What a listed pod holds: its (trusted) assignment's share, unless it has finished."""
    if record.finished or assignment is None:
        return None
    return placement_of(record, assignment)
