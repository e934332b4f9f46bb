"""The validating admission webhook's decision: an AdmissionReview in, an AdmissionReview out.

Two rules, in this order:

1. **Only our components write our annotations.** On Pods and Nodes (create and update), setting,
   changing or removing one of ``keys.SYSTEM_POD_ANNOTATIONS`` / ``keys.SYSTEM_NODE_ANNOTATIONS``
   (the assignment, its signature, ``allocated``, the node inventory) is refused unless the request's
   user (``request.userInfo.username``) is one of the system writers (the extender's ``--system-writers``:
   its own and the node agent's service accounts). Cluster admins are refused too: the message names
   the annotations, the user and who may write them. An update compares ``object`` with ``oldObject``,
   so a user relabelling a pod that carries an assignment is not refused. Some API servers (1.20.2,
   the cluster tier's) send node updates whose ``oldObject`` is the new object itself; when the two
   are identical the node's stored annotations are read (``stored_node_annotations``) instead.
2. **Invalid shares are refused when they are applied**, with the messages ``fastgshare check``
   prints: both come from the core's :func:`fastgshare.workload.manifest_shares`. Judged are FaSTPods
   (create and update) and Pods (create; on update only the problems the update brings: a pod admitted
   while the webhook was down can still be patched, and the extender's live share path re-checks
   every valid share edit against the GPU's room) that carry a share or request the vGPU resource.

Anything else is allowed untouched. Kubernetes' own schema is the API server's to check, not ours.

Both ``admission.k8s.io/v1`` and ``v1beta1`` reviews are answered, in the version asked. A
request that is not an AdmissionReview gets :class:`ReviewError` (the HTTP edge answers 400).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from fastgshare import keys
from fastgshare.errors import FastGShareError
from fastgshare.workload import manifest_shares
from scheduler_extender.config import DEFAULT_SYSTEM_WRITERS

REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_MESSAGE = 2000  # characters of the denial the user sees
MAX_USER_CHARS = 253  # of the user name quoted in a denial
JUDGED = {keys.FASTPOD_KIND: ("CREATE", "UPDATE"), "Pod": ("CREATE", "UPDATE")}
# The annotations only the system writers may set, change or remove, per kind.
SYSTEM_ANNOTATIONS = {"Pod": keys.SYSTEM_POD_ANNOTATIONS, "Node": keys.SYSTEM_NODE_ANNOTATIONS}
SYSTEM_KEYS = frozenset((*keys.SYSTEM_POD_ANNOTATIONS, *keys.SYSTEM_NODE_ANNOTATIONS))
GUARDED_OPERATIONS = ("CREATE", "UPDATE")
# A node's stored annotations by name (None: not found or unreadable; then oldObject is used).
NodeAnnotations = Callable[[str], Mapping[str, object] | None]


class ReviewError(ValueError):
    """The body is not an AdmissionReview request; the message says what is wrong."""


def review(body: object, *, system_writers: Collection[str] = DEFAULT_SYSTEM_WRITERS,
           stored_node_annotations: NodeAnnotations | None = None) -> dict[str, Any]:
    """The AdmissionReview answering ``body``; ``system_writers`` may write the system annotations."""
    if not isinstance(body, Mapping) or body.get("kind") != "AdmissionReview":
        raise ReviewError('expected an AdmissionReview object ("kind": "AdmissionReview")')
    version = body.get("apiVersion")
    if version not in REVIEW_VERSIONS:
        raise ReviewError(f"apiVersion {str(version)[:100]!r} is not supported; allowed: {', '.join(REVIEW_VERSIONS)}")
    request = body.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ReviewError("request.uid is required")
    forbidden = judge_system_writes(request, system_writers, stored_node_annotations)
    problems = forbidden or judge(request)
    response: dict[str, object] = {"uid": request["uid"], "allowed": not problems}
    if problems:
        response["status"] = {"code": 403, "reason": "Forbidden" if forbidden else "Invalid", "message": problems}
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def judge_system_writes(request: Mapping[str, object], system_writers: Collection[str],
                        stored_node_annotations: NodeAnnotations | None = None) -> str:
    """Empty unless someone not in ``system_writers`` sets, changes or removes a system annotation."""
    kind = _kind(request)
    guarded = SYSTEM_ANNOTATIONS.get(kind or "", ())
    document = request.get("object")
    if not guarded or request.get("operation") not in GUARDED_OPERATIONS or not isinstance(document, Mapping):
        return ""
    user_info = request.get("userInfo")
    user = user_info.get("username") if isinstance(user_info, Mapping) else None
    user = user if isinstance(user, str) else ""
    if user in system_writers:
        return ""
    # An update without oldObject (the API server always sends one) is judged as if all were new.
    old = request.get("oldObject") if request.get("operation") == "UPDATE" else None
    before, after = _annotations(old), _annotations(document)
    if kind == "Node" and old == document and after and stored_node_annotations is not None:
        name = _display_name(document, request)
        stored = stored_node_annotations(name) if name else None
        before = stored if stored is not None else before
    writes = [f"{_verb(before.get(key), after.get(key))} {key}" for key in guarded
              if before.get(key) != after.get(key)]
    if not writes:
        return ""
    shown = user if len(user) <= MAX_USER_CHARS else user[:MAX_USER_CHARS] + "..."
    return _bounded(f"fastgshare: {kind}/{_display_name(document, request)}: user {json.dumps(shown)} may not "
                    f"{', '.join(writes)}: only {', '.join(system_writers)} write fastgshare's system annotations")


def judge(request: Mapping[str, object]) -> str:
    """Empty when the object's share may be admitted, else the denial: what ``fastgshare check`` says.

    On a pod update only the problems the update brings count (those of ``object`` that
    ``oldObject`` has not).
    """
    kind = _kind(request)
    operation = request.get("operation")
    if kind is None or operation not in JUDGED.get(kind, ()):
        return ""
    document = request.get("object")
    if not isinstance(document, Mapping):
        return ""
    problems = _share_problems(document, kind)
    if problems and kind == "Pod" and operation == "UPDATE":
        old = request.get("oldObject")
        already = set(_share_problems(old, kind)) if isinstance(old, Mapping) else set(problems)
        problems = [problem for problem in problems if problem not in already]
    if not problems:
        return ""
    return _bounded(f"fastgshare: {kind}/{_display_name(document, request)}: " + "; ".join(problems))


def _share_problems(document: Mapping[str, object], kind: str) -> list[str]:
    """The share's problems; the system annotations are the first rule's, not the share's."""
    document = {**document, "kind": kind}  # the API server always sends it; be sure
    annotations = _annotations(document)
    if any(key in annotations for key in SYSTEM_KEYS):
        metadata = document.get("metadata")
        assert isinstance(metadata, Mapping)
        document["metadata"] = {**metadata, "annotations": {key: value for key, value in annotations.items()
                                                            if key not in SYSTEM_KEYS}}
    try:
        return [str(problem) for found in manifest_shares(document) for problem in found.all_problems]
    except FastGShareError as error:
        return [str(error)]


def _kind(request: Mapping[str, object]) -> str | None:
    kind_info = request.get("kind")
    kind = kind_info.get("kind") if isinstance(kind_info, Mapping) else None
    return kind if isinstance(kind, str) else None


def _annotations(document: object) -> Mapping[str, object]:
    metadata = document.get("metadata") if isinstance(document, Mapping) else None
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def _verb(before: object, after: object) -> str:
    return "set" if before is None else "remove" if after is None else "change"


def _bounded(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 3] + "..."


def _display_name(document: Mapping[str, object], request: Mapping[str, object]) -> str:
    metadata = document.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = metadata.get("name") or request.get("name") or (f"{metadata.get('generateName')}*"
                                                            if metadata.get("generateName") else "")
    return str(name)[:253]
