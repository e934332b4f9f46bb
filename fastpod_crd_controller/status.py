"""The FaSTPod's status, computed from its pods: counts, the selector, per-pod GPUs, conditions.

Pure: reconcile passes the cached FaSTPod, its pods and what it decided; the result is the
whole ``status`` object, written through the status subresource only when it differs from
the cached one. ``lastTransitionTime`` of a condition moves only when its status flips.

Conditions, as a Deployment's:

- ``Available``: every desired replica is ready (``MinimumReplicasAvailable``), else
  ``ReplicasUnavailable`` with the count;
- ``Progressing``: ``True`` while the controller works (``ScalingUp``, ``ScalingDown``,
  ``RollingUpdate``) or is done (``ReplicasUpToDate``); ``False`` when it cannot go on
  (``InvalidSpec``, ``FailedCreate``, ``FailedDelete``), with the reason in the message;
- ``InvalidSpec``: ``True`` with the parser's message (naming each annotation or field, the bad
  value and what is allowed) while the FaSTPod cannot be turned into pods; ``False`` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fastgshare.codec import decode_assignment
from fastgshare.errors import CodecError
from fastgshare.quantity import format_bytes
from fastpod_crd_controller import names
from fastpod_crd_controller.pods import PodInfo
from fastpod_crd_controller.selector import LabelSelector, parse_selector
from fastpod_crd_controller.spec import FaSTPodSpec, default_selector

UP_TO_DATE = "ReplicasUpToDate"
VALID = "Valid"


@attrs.frozen(kw_only=True)
class Outcome:
    """What reconcile found and did, for the conditions."""

    progress: str = ""  # the plan's reason, or "" when there was nothing to do
    progress_message: str = ""
    invalid_reason: str = ""  # set when the spec is invalid
    invalid_message: str = ""
    failure_reason: str = ""  # FailedCreate / FailedDelete: an API call failed
    failure_message: str = ""


def compute_status(fastpod: Mapping[str, Any], spec: FaSTPodSpec | None, pods: Sequence[PodInfo],
                   outcome: Outcome, now: str) -> dict[str, Any]:
    """The status ``fastpod`` should have; ``spec`` is ``None`` when the FaSTPod is invalid."""
    metadata, old = fastpod.get("metadata") or {}, fastpod.get("status") or {}
    active = sorted((pod for pod in pods if pod.active), key=lambda pod: pod.name)
    desired = spec.replicas if spec else int((fastpod.get("spec") or {}).get("replicas", 1))
    ready = sum(pod.ready for pod in active)
    status: dict[str, Any] = {
        "replicas": len(active),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "observedGeneration": metadata.get("generation", 0),
        "selector": _selector(spec, metadata, old),
        "pods": [pod_status(pod) for pod in active],
    }
    if spec is not None:
        status["updatedReplicas"] = sum(pod.revision == spec.revision for pod in active)
        status["revision"] = spec.revision
        status["memory"] = format_bytes(spec.share.memory_bytes)  # kubectl's Memory column
    conditions = [
        _available(desired, ready),
        _progressing(outcome),
        _condition(names.CONDITION_INVALID_SPEC, bool(outcome.invalid_reason),
                   outcome.invalid_reason or VALID, outcome.invalid_message),
    ]
    status["conditions"] = [_keep_transition_time(c, old.get("conditions") or [], now) for c in conditions]
    return status


def pod_status(pod: PodInfo) -> dict[str, Any]:
    """One pod's line: name, phase, readiness, and where the extender placed it."""
    line: dict[str, Any] = {"name": pod.name, "phase": pod.phase, "ready": pod.ready}
    if pod.node_name:
        line["node"] = pod.node_name
    if pod.assignment is not None:
        try:
            assignment = decode_assignment(pod.assignment)
        except CodecError:
            return line
        line["node"] = assignment.node_name
        line["gpu"] = assignment.gpu_uuid
        line["gpuIndex"] = assignment.gpu_index
    return line


def _selector(spec: FaSTPodSpec | None, metadata: Mapping[str, Any], old: Mapping[str, Any]) -> str:
    """The selector string for /scale; an invalid FaSTPod keeps the last valid one."""
    if spec is not None:
        return str(spec.selector)
    if old.get("selector"):
        return str(old["selector"])
    fallback: LabelSelector = parse_selector(default_selector(str(metadata.get("name", ""))), "", [])
    return str(fallback)


def _available(desired: int, ready: int) -> dict[str, Any]:
    if ready >= desired:
        return _condition(names.CONDITION_AVAILABLE, True, "MinimumReplicasAvailable",
                          f"{ready} of {desired} replicas ready")
    return _condition(names.CONDITION_AVAILABLE, False, "ReplicasUnavailable", f"{ready} of {desired} replicas ready")


def _progressing(outcome: Outcome) -> dict[str, Any]:
    if outcome.invalid_reason:
        return _condition(names.CONDITION_PROGRESSING, False, names.REASON_INVALID_SPEC,
                          "no pods are created or deleted until the spec is fixed (see InvalidSpec)")
    if outcome.failure_reason:
        return _condition(names.CONDITION_PROGRESSING, False, outcome.failure_reason, outcome.failure_message)
    if outcome.progress:
        return _condition(names.CONDITION_PROGRESSING, True, outcome.progress, outcome.progress_message)
    return _condition(names.CONDITION_PROGRESSING, True, UP_TO_DATE, "the pods match the spec")


def _condition(kind: str, true: bool, reason: str, message: str) -> dict[str, Any]:
    condition = {"type": kind, "status": "True" if true else "False", "reason": reason}
    if message:  # the v1.20 API server turns "" into null on update and then rejects it
        condition["message"] = message
    return condition


def _keep_transition_time(condition: dict[str, Any], old: Sequence[Mapping[str, Any]], now: str) -> dict[str, Any]:
    previous = next((c for c in old if c.get("type") == condition["type"]), None)
    same = previous is not None and previous.get("status") == condition["status"]
    time = previous.get("lastTransitionTime") if same and previous else None
    return {**condition, "lastTransitionTime": time or now}
