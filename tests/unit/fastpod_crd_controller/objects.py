"""Builders of FaSTPod and pod dicts as the API serves them, so tests state only what matters."""

from __future__ import annotations

import copy
from typing import Any

from fastgshare import keys
from fastpod_crd_controller.spec import parse_fastpod
from tests.builders import share_annotations

NAMESPACE = "team-a"
UID = "uid-web"
CONTAINER = {"name": "server", "image": "registry.example/resnet:1"}


def fastpod(name: str = "web", *, replicas: int | None = 3, annotations: dict[str, str] | None = None,
            pod_spec: dict[str, Any] | None = None, selector: dict[str, Any] | None = None,
            labels: dict[str, str] | None = None, uid: str = UID, generation: int = 1,
            status: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> dict[str, Any]:
    """A FaSTPod with a valid share and one container unless told otherwise."""
    spec: dict[str, Any] = {"podSpec": pod_spec if pod_spec is not None else {"containers": [dict(CONTAINER)]}}
    if replicas is not None:
        spec["replicas"] = replicas
    if selector is not None:
        spec["selector"] = selector
    metadata: dict[str, Any] = {
        "name": name, "namespace": namespace, "uid": uid, "generation": generation, "resourceVersion": "7",
        "annotations": share_annotations() if annotations is None else annotations,
    }
    if labels:
        metadata["labels"] = labels
    obj = {"apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND, "metadata": metadata, "spec": spec}
    if status is not None:
        obj["status"] = status
    return obj


def current_revision(obj: dict[str, Any]) -> str:
    return parse_fastpod(obj).revision


def pod(name: str, owner: dict[str, Any] | None = None, *, revision: str | None = None, node: str = "",
        ready: bool = False, phase: str = "Pending", created: str = "2026-01-01T00:00:00Z", deleting: bool = False,
        assignment: str | None = None, uid: str | None = None) -> dict[str, Any]:
    """A pod owned by ``owner`` (a FaSTPod dict), of its current revision unless told otherwise."""
    owner = owner if owner is not None else fastpod()
    metadata: dict[str, Any] = {
        "name": name, "namespace": owner["metadata"]["namespace"], "uid": uid or f"uid-{name}",
        "creationTimestamp": created,
        "labels": {keys.FASTPOD_NAME_LABEL: owner["metadata"]["name"],
                   keys.REVISION_LABEL: revision if revision is not None else current_revision(owner)},
        "ownerReferences": [{"apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND, "controller": True,
                             "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]}],
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:10:00Z"
    if assignment is not None:
        metadata["annotations"] = {keys.POD_ASSIGNMENT_ANNOTATION: assignment}
    status: dict[str, Any] = {"phase": phase}
    if ready:
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    return {"metadata": metadata, "spec": {"nodeName": node} if node else {}, "status": status}


def with_annotations(obj: dict[str, Any], **changes: str | None) -> dict[str, Any]:
    """A copy of ``obj`` with annotations changed (``None`` removes one); keys use ``__`` for ``/``."""
    result = copy.deepcopy(obj)
    annotations = result["metadata"].setdefault("annotations", {})
    for key, value in changes.items():
        real = key.replace("__", "/")
        if value is None:
            annotations.pop(real, None)
        else:
            annotations[real] = value
    return result
