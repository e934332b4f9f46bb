"""Builders of pod records with extender assignments, shared by node-agent tests."""

from __future__ import annotations

from device_plugin.allocation import NodePod, vetted
from fastgshare import keys
from fastgshare.assignment_signature import AssignmentTrust
from fastgshare.codec import PodAssignment, encode_assignment
from fastgshare.share import share_annotations
from tests.builders import TEST_TRUST, make_share, signed_annotations


def assignment(node: str, gpu_uuid: str, gpu_index: int = 0, at_ms: int = 1_000, sm: int = 50) -> PodAssignment:
    return PodAssignment(node_name=node, gpu_uuid=gpu_uuid, gpu_index=gpu_index,
                         share=make_share(request=300, limit=600, sm=sm), assigned_at_ms=at_ms)


def pod_record(name: str, node: str, *, assigned: PodAssignment | None = None, allocated: bool = False,
               containers: tuple[str, ...] = ("main",), phase: str = "Pending", namespace: str = "team-a",
               raw_assignment: str | None = None, controller: str | None = None, signed: bool = True,
               own: dict[str, str] | None = None, trust: AssignmentTrust = TEST_TRUST) -> NodePod:
    """A pod as the node agent's cache holds it, vetted with ``trust``: its share annotations are
    ``own`` (default: the assignment's share), its ``assigned`` assignment signed with the test key
    unless ``signed`` is False (a forgery)."""
    uid = f"uid-{name}"
    annotations = dict(own) if own is not None else (share_annotations(assigned.share) if assigned else {})
    if assigned is not None:
        annotations.update(signed_annotations(uid, assigned) if signed
                           else {keys.POD_ASSIGNMENT_ANNOTATION: encode_assignment(assigned)})
    if raw_assignment is not None:
        annotations[keys.POD_ASSIGNMENT_ANNOTATION] = raw_assignment
    if allocated:
        annotations[keys.POD_ALLOCATED_ANNOTATION] = "2026-11-29T00:00:00+00:00"
    return vetted(NodePod(uid=uid, namespace=namespace, name=name, node_name=node, phase=phase,
                            resource_version="1", annotations=annotations, gpu_containers=containers,
                            controller=controller), trust)
