"""The validating admission webhook's decision: an AdmissionReview in, an AdmissionReview out.

Invalid shares are refused when they are applied, with the messages ``fastgshare check`` prints:
both come from the core's :func:`fastgshare.workload.manifest_shares`. Judged are FaSTPods
(create and update) and Pods (create) that carry a share or request the vGPU resource; anything
else is allowed untouched. Kubernetes' own schema is the API server's to check, not ours.

Both ``admission.k8s.io/v1`` and ``v1beta1`` reviews are answered, in the version asked. A
request that is not an AdmissionReview gets :class:`ReviewError` (the HTTP edge answers 400).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastgshare import keys
from fastgshare.errors import FastGShareError
from fastgshare.workload import manifest_shares

REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
MAX_MESSAGE = 2000  # characters of the denial the user sees
JUDGED = {keys.FASTPOD_KIND: ("CREATE", "UPDATE"), "Pod": ("CREATE",)}


class ReviewError(ValueError):
    """The body is not an AdmissionReview request; the message says what is wrong."""


def review(body: object) -> dict[str, Any]:
    """The AdmissionReview answering ``body``."""
    if not isinstance(body, Mapping) or body.get("kind") != "AdmissionReview":
        raise ReviewError('expected an AdmissionReview object ("kind": "AdmissionReview")')
    version = body.get("apiVersion")
    if version not in REVIEW_VERSIONS:
        raise ReviewError(f"apiVersion {str(version)[:100]!r} is not supported; allowed: {', '.join(REVIEW_VERSIONS)}")
    request = body.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        raise ReviewError("request.uid is required")
    problems = judge(request)
    response: dict[str, object] = {"uid": request["uid"], "allowed": not problems}
    if problems:
        response["status"] = {"code": 403, "reason": "Invalid", "message": problems}
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def judge(request: Mapping[str, object]) -> str:
    """Empty when the object may be admitted, else the denial: what ``fastgshare check`` says."""
    kind_info = request.get("kind")
    kind = kind_info.get("kind") if isinstance(kind_info, Mapping) else None
    operation = request.get("operation")
    if not isinstance(kind, str) or operation not in JUDGED.get(kind, ()):
        return ""
    document = request.get("object")
    if not isinstance(document, Mapping):
        return ""
    document = {**document, "kind": kind}  # the API server always sends it; be sure
    label = f"{kind}/{_display_name(document, request)}"
    try:
        problems = [str(problem) for found in manifest_shares(document) for problem in found.all_problems]
    except FastGShareError as error:
        problems = [str(error)]
    if not problems:
        return ""
    message = f"fastgshare: {label}: " + "; ".join(problems)
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE - 3] + "..."


def _display_name(document: Mapping[str, object], request: Mapping[str, object]) -> str:
    metadata = document.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    name = metadata.get("name") or request.get("name") or (f"{metadata.get('generateName')}*"
                                                            if metadata.get("generateName") else "")
    return str(name)[:253]
