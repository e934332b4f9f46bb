"""The validating admission webhook's decision: an AdmissionReview in, an AdmissionReview out.

Four rules, in this order:

1. **Only our components write our annotations.** On Pods and Nodes (create and update), setting,
   changing or removing one of ``keys.SYSTEM_POD_ANNOTATIONS`` / ``keys.SYSTEM_NODE_ANNOTATIONS``
   (the assignment, its signature, ``allocated``, the node inventory) is refused unless the request's
   user (``request.userInfo.username``) is one of the system writers (the extender's ``--system-writers``:
   its own and the node agent's service accounts). Cluster admins are refused too: the message names
   the annotations, the user and who may write them. An update compares ``object`` with ``oldObject``,
   so a user relabelling a pod that carries an assignment is not refused. Some API servers (1.20.2,
   the cluster tier's) send node updates whose ``oldObject`` is the new object itself; when the two
   are identical the node as stored is read (``stored_node``) and stands for ``oldObject`` in
   rules 1 and 2.
2. **The node agent changes nothing but our annotations.** Its ServiceAccount may patch any pod
   and its node (RBAC cannot narrow that to one node's pods), so a stolen agent token is answered
   here: an update by a confined writer (``confined_writers``: the node agent's service account)
   that changes anything of a Pod or Node but the system annotations (labels, other annotations,
   owners, finalizers, the spec) is refused, naming what it changed; so is any create. The
   ``status`` (a subresource the webhook does not see) and the server's own bookkeeping
   (``resourceVersion``, ``managedFields``, ``generation``) are not compared.
3. **Invalid shares are refused when they are applied**, with the messages ``fastgshare check``
   prints: both come from the core's :func:`fastgshare.workload.manifest_shares`. Judged are FaSTPods
   (create and update) and Pods (create; on update only the problems the update brings: a pod admitted
   while the webhook was down can still be patched, and the extender's live share path re-checks
   every valid share edit against the GPU's room) that carry a share or request the vGPU resource.

   A Pod that asks for the vGPU resource and names another scheduler than ours is not refused for
   that (the mutating webhook warns instead: :mod:`fastgshare.scheduler_routing`); one that names
   the default scheduler is, as the mutating webhook should have set ours before this one runs.
4. **Malformed models are refused** (model sharing, :mod:`fastgshare.model`): a FaSTFunc whose
   ``spec.model`` :func:`fastgshare.model.parse_model_spec` refuses (create; on update only the
   problems the update brings, so a function admitted while the webhook was down can still be
   deleted, relabelled, or fixed), and a FaSTPod or Pod whose ``fastgshare/model`` annotation
   :func:`fastgshare.model.parse_model_annotation` refuses (judged with its share, as rule 3 judges
   it). Each problem is one line naming the field, the value and what is allowed. The rest of a
   FaSTFunc is the function controller's to validate (its ``InvalidSpec`` condition).

Anything else is allowed untouched. Kubernetes' own schema is the API server's to check, not ours.

The mutating webhook (:func:`mutate`) answers Pod creates only, by the rule of
:mod:`fastgshare.scheduler_routing`: a pod asking for the vGPU resource with the default scheduler
gets a JSONPatch setting ``spec.schedulerName`` to ours, one naming another scheduler a warning and
no change; everything is allowed (refusing is the validating webhook's part).

Both ``admission.k8s.io/v1`` and ``v1beta1`` reviews are answered, in the version asked. A
request that is not an AdmissionReview gets :class:`ReviewError` (the HTTP edge answers 400).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from fastgshare import keys, scheduler_routing
from fastgshare.errors import FastGShareError
from fastgshare.model import InvalidModelSpec, parse_model_annotation, parse_model_spec
from fastgshare.workload import manifest_shares
from scheduler_extender.config import DEFAULT_SYSTEM_WRITERS

REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_MESSAGE = 2000  # characters of the denial the user sees
MAX_USER_CHARS = 253  # of the user name quoted in a denial
JUDGED = {keys.FASTPOD_KIND: ("CREATE", "UPDATE"), "Pod": ("CREATE", "UPDATE"),
          keys.FASTFUNC_KIND: ("CREATE", "UPDATE")}
# Kinds whose update is refused only for the problems it brings (those oldObject has not).
_NEW_PROBLEMS_ONLY = ("Pod", keys.FASTFUNC_KIND)
# The annotations only the system writers may set, change or remove, per kind.
SYSTEM_ANNOTATIONS = {"Pod": keys.SYSTEM_POD_ANNOTATIONS, "Node": keys.SYSTEM_NODE_ANNOTATIONS}
SYSTEM_KEYS = frozenset((*keys.SYSTEM_POD_ANNOTATIONS, *keys.SYSTEM_NODE_ANNOTATIONS))
GUARDED_OPERATIONS = ("CREATE", "UPDATE")
# Who may write the system annotations and nothing else of a Pod or Node (rule 2).
CONFINED_WRITERS = (f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.NODE_AGENT_SERVICE_ACCOUNT}",)
# Fields the API server keeps itself, and the status (a subresource): not compared by rule 2.
_UNCOMPARED_FIELDS = frozenset({"status", "apiVersion", "kind"})
_UNCOMPARED_METADATA = frozenset({"resourceVersion", "managedFields", "generation", "annotations"})
# A node as stored, by name (None: not found or unreadable; then oldObject is used).
StoredNode = Callable[[str], Mapping[str, object] | None]


class ReviewError(ValueError):
    """The body is not an AdmissionReview request; the message says what is wrong."""


def review(body: object, *, system_writers: Collection[str] = DEFAULT_SYSTEM_WRITERS,
           stored_node: StoredNode | None = None,
           confined_writers: Collection[str] = CONFINED_WRITERS) -> dict[str, Any]:
    """The AdmissionReview answering ``body``; ``system_writers`` may write the system annotations,
    ``confined_writers`` nothing else."""
    version, request = _review_request(body)
    request = _with_stored_node(request, stored_node)
    forbidden = (judge_system_writes(request, system_writers)
                 or judge_confined_writes(request, confined_writers))
    problems = forbidden or judge(request)
    response: dict[str, object] = {"uid": request["uid"], "allowed": not problems}
    if problems:
        response["status"] = {"code": 403, "reason": "Forbidden" if forbidden else "Invalid", "message": problems}
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def mutate(body: object) -> dict[str, Any]:
    """The mutating webhook's AdmissionReview answering ``body``: always allowed; a JSONPatch setting
    ``spec.schedulerName`` or a warning where :func:`fastgshare.scheduler_routing.route` says so."""
    version, request = _review_request(body)
    response: dict[str, object] = {"uid": request["uid"], "allowed": True}
    document = request.get("object")
    spec = document.get("spec") if isinstance(document, Mapping) else None
    if _kind(request) == "Pod" and request.get("operation") == "CREATE" and isinstance(spec, Mapping):
        routing = scheduler_routing.route(spec)
        if routing.route is scheduler_routing.Route.SET:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(scheduler_patch()).encode()).decode()
        elif routing.warning:
            response["warnings"] = [routing.warning]
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def scheduler_patch() -> list[dict[str, str]]:
    """The JSONPatch naming our scheduler (``add`` replaces a member that is there, RFC 6902)."""
    return [{"op": "add", "path": "/spec/schedulerName", "value": keys.SCHEDULER_NAME}]


def _review_request(body: object) -> tuple[str, Mapping[str, object]]:
    """The review's apiVersion and request, or :class:`ReviewError` saying what is wrong."""
    if not isinstance(body, Mapping) or body.get("kind") != "AdmissionReview":
        raise ReviewError('expected an AdmissionReview object ("kind": "AdmissionReview")')
    version = body.get("apiVersion")
    if not isinstance(version, str) or version not in REVIEW_VERSIONS:
        raise ReviewError(f"apiVersion {str(version)[:100]!r} is not supported; allowed: {', '.join(REVIEW_VERSIONS)}")
    request = body.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ReviewError("request.uid is required")
    return version, request


def _with_stored_node(request: Mapping[str, object], stored_node: StoredNode | None) -> Mapping[str, object]:
    """``request``, with the node as stored for its ``oldObject`` where the API server sent the new
    object there (a node update whose two objects are identical)."""
    document, old = request.get("object"), request.get("oldObject")
    if (stored_node is None or _kind(request) != "Node" or request.get("operation") != "UPDATE"
            or not isinstance(document, Mapping) or old != document):
        return request
    name = _display_name(document, request)
    stored = stored_node(name) if name else None
    return request if stored is None else {**request, "oldObject": stored}


def judge_system_writes(request: Mapping[str, object], system_writers: Collection[str]) -> str:
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
    writes = [f"{_verb(before.get(key), after.get(key))} {key}" for key in guarded
              if before.get(key) != after.get(key)]
    if not writes:
        return ""
    shown = user if len(user) <= MAX_USER_CHARS else user[:MAX_USER_CHARS] + "..."
    return _bounded(f"fastgshare: {kind}/{_display_name(document, request)}: user {json.dumps(shown)} may not "
                    f"{', '.join(writes)}: only {', '.join(system_writers)} write fastgshare's system annotations")


def judge_confined_writes(request: Mapping[str, object], confined_writers: Collection[str]) -> str:
    """Empty unless a confined writer creates a Pod or Node, or changes one beyond the system annotations."""
    kind = _kind(request)
    guarded = SYSTEM_ANNOTATIONS.get(kind or "", ())
    user_info = request.get("userInfo")
    user = user_info.get("username") if isinstance(user_info, Mapping) else None
    operation = request.get("operation")
    if not guarded or user not in confined_writers or operation not in GUARDED_OPERATIONS:
        return ""
    document, old = request.get("object"), request.get("oldObject")
    if not isinstance(document, Mapping):
        return ""
    label = f"fastgshare: {kind}/{_display_name(document, request)}: user {json.dumps(user)} may change only " \
            f"fastgshare's annotations ({', '.join(guarded)})"
    if operation == "CREATE" or not isinstance(old, Mapping):
        return _bounded(f"{label}; it may not create a {kind}")
    changed = _changed_fields(old, document, guarded)
    return _bounded(f"{label}; it changed {', '.join(changed)}") if changed else ""


def _changed_fields(old: Mapping[str, object], new: Mapping[str, object], guarded: Collection[str]) -> list[str]:
    """What differs between ``old`` and ``new`` but the system annotations and what rule 2 does not compare."""
    changed = [key for key in sorted(set(old) | set(new))
               if key not in _UNCOMPARED_FIELDS and key != "metadata" and old.get(key) != new.get(key)]
    old_meta, new_meta = (document.get("metadata") for document in (old, new))
    old_meta = old_meta if isinstance(old_meta, Mapping) else {}
    new_meta = new_meta if isinstance(new_meta, Mapping) else {}
    changed += [f"metadata.{key}" for key in sorted(set(old_meta) | set(new_meta))
                if key not in _UNCOMPARED_METADATA and old_meta.get(key) != new_meta.get(key)]
    old_notes, new_notes = _annotations(old), _annotations(new)
    changed += [f"metadata.annotations[{key}]" for key in sorted(set(old_notes) | set(new_notes))
                if key not in guarded and old_notes.get(key) != new_notes.get(key)]
    return changed


def judge(request: Mapping[str, object]) -> str:
    """Empty when the object's share and model may be admitted, else the denial: what ``fastgshare
    check`` says of the share, and each model problem.

    On a pod or FaSTFunc update only the problems the update brings count (those of ``object`` that
    ``oldObject`` has not).
    """
    kind = _kind(request)
    operation = request.get("operation")
    if kind is None or operation not in JUDGED.get(kind, ()):
        return ""
    document = request.get("object")
    if not isinstance(document, Mapping):
        return ""
    problems = _problems(document, kind)
    if problems and kind in _NEW_PROBLEMS_ONLY and operation == "UPDATE":
        old = request.get("oldObject")
        already = set(_problems(old, kind)) if isinstance(old, Mapping) else set(problems)
        problems = [problem for problem in problems if problem not in already]
    if not problems:
        return ""
    return _bounded(f"fastgshare: {kind}/{_display_name(document, request)}: " + "; ".join(problems))


def _problems(document: Mapping[str, object], kind: str) -> list[str]:
    """Everything rules 3 and 4 refuse ``document`` for."""
    if kind == keys.FASTFUNC_KIND:
        return _fastfunc_problems(document)
    return [*_share_problems(document, kind), *_model_annotation_problems(document)]


def _fastfunc_problems(document: Mapping[str, object]) -> list[str]:
    """The problems of a FaSTFunc's ``spec.model`` (none without one)."""
    spec = document.get("spec")
    model = spec.get("model") if isinstance(spec, Mapping) else None
    if model is None:
        return []
    try:
        parse_model_spec(model, "spec.model")
    except InvalidModelSpec as error:
        return [str(problem) for problem in error.problems]
    return []


def _model_annotation_problems(document: Mapping[str, object]) -> list[str]:
    """The problems of a Pod's or FaSTPod's ``fastgshare/model`` annotation (none without one)."""
    annotations = _annotations(document)
    if keys.MODEL_ANNOTATION not in annotations:
        return []
    metadata = document.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    try:
        parse_model_annotation(annotations[keys.MODEL_ANNOTATION], str(namespace or ""))
    except InvalidModelSpec as error:
        return [str(problem) for problem in error.problems]
    return []


def _share_problems(document: Mapping[str, object], kind: str) -> list[str]:
    """The share's problems; the system annotations are the first rule's, not the share's."""
    document = {**document, "kind": kind}  # the API server always sends it; be sure
    annotations = _annotations(document)
    if any(key in annotations for key in SYSTEM_KEYS):
        metadata = document.get("metadata")
        assert isinstance(metadata, Mapping)
        document["metadata"] = {**metadata, "annotations": {key: value for key, value in annotations.items()
                                                            if key not in SYSTEM_KEYS}}
    # Another scheduler named on a Pod is the mutating webhook's warning, not a refusal.
    spec = document.get("spec")
    foreign = (kind == "Pod" and isinstance(spec, Mapping)
               and scheduler_routing.route(spec).route is scheduler_routing.Route.WARN)
    try:
        return [str(problem) for found in manifest_shares(document) for problem in found.all_problems
                if not (foreign and problem.field == "spec.schedulerName")]
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
