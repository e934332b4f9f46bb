"""Workloads described as data: share entries with counts, or Kubernetes manifests.

Two shapes are understood, both as already-parsed YAML/JSON (this module reads no files):

- a *workload list*: ``[{"name": "resnet", "count": 4, "annotations": {<the four share
  annotations>}}, ...]`` (``count`` defaults to 1);
- Kubernetes objects: a ``FaSTPod`` (``spec.replicas`` copies, default 1), a ``Pod``, a
  workload with a pod template (``Deployment``, ``ReplicaSet``, ``StatefulSet``, ``Job``,
  ``DaemonSet``), or a ``List`` of those. Its share is read from the object's annotations
  (the pod template's for templated workloads).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from fastgshare import keys
from fastgshare.errors import InvalidShareSpec, InvalidWorkload
from fastgshare.share import ShareSpec, has_share_annotations, parse_share

TEMPLATED_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "Job", "DaemonSet")


@attrs.frozen(kw_only=True)
class ManifestShare:
    """The share of one manifest object; ``share`` is ``None`` when ``error`` says why."""

    kind: str
    name: str
    replicas: int
    share: ShareSpec | None = None
    error: InvalidShareSpec | None = None
    skipped: str = ""  # non-empty: the object asks for no GPU share, and why we think so


@attrs.frozen(kw_only=True)
class WorkloadItem:
    name: str
    count: int
    share: ShareSpec


def parse_workload_list(data: object) -> tuple[WorkloadItem, ...]:
    """Validate a workload list; every entry's problems are reported in one error."""
    if not isinstance(data, list) or not data:
        raise InvalidWorkload("a workload list must be a non-empty list of entries "
                              '{"name": ..., "count": N, "annotations": {...}}')
    items, problems = [], []
    for position, entry in enumerate(data):
        where = f"entry {position}"
        if not isinstance(entry, dict):
            problems.append(f"{where}: must be a mapping with name, count and annotations")
            continue
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            problems.append(f"{where}: 'name' must be a non-empty string")
            continue
        where = f"entry {position} ({name})"
        count = entry.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            problems.append(f"{where}: 'count' must be an integer >= 1, got {count!r}")
            continue
        annotations = entry.get("annotations")
        if not isinstance(annotations, dict):
            problems.append(f"{where}: 'annotations' must be a mapping of the share annotations")
            continue
        try:
            items.append(WorkloadItem(name=name, count=count, share=parse_share(annotations)))
        except InvalidShareSpec as error:
            problems.append(f"{where}: {error}")
    if problems:
        raise InvalidWorkload("invalid workload: " + "; ".join(problems))
    return tuple(items)


def manifest_shares(document: object) -> list[ManifestShare]:
    """The share of every object in one YAML document (a ``List`` yields several)."""
    if not isinstance(document, dict):
        raise InvalidWorkload(f"expected a Kubernetes object (a mapping), got {type(document).__name__}")
    kind = document.get("kind")
    if kind == "List":
        items = document.get("items")
        if not isinstance(items, list):
            raise InvalidWorkload("a List must have an 'items' list")
        return [share for item in items for share in manifest_shares(item)]
    if not isinstance(kind, str) or not kind:
        raise InvalidWorkload("object has no 'kind'")
    name = _name(document)
    if kind == keys.FASTPOD_KIND:
        spec = _mapping(document.get("spec"))
        replicas = spec.get("replicas", 1)
        return [_share_of(kind, name, replicas, _annotations(document), required=True)]
    if kind == "Pod":
        return [_share_of(kind, name, 1, _annotations(document),
                          required=_requests_vgpu(_mapping(document.get("spec"))))]
    if kind in TEMPLATED_KINDS:
        spec = _mapping(document.get("spec"))
        template = _mapping(spec.get("template"))
        replicas = spec.get("replicas", 1) if kind != "DaemonSet" else 1
        return [_share_of(kind, name, replicas, _annotations(template),
                          required=_requests_vgpu(_mapping(template.get("spec"))))]
    return [ManifestShare(kind=kind, name=name, replicas=0,
                          skipped=f"{kind} objects carry no GPU share")]


def _share_of(kind: str, name: str, replicas: object, annotations: Mapping[str, object],
              *, required: bool) -> ManifestShare:
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise InvalidWorkload(f"{kind} {name}: spec.replicas must be an integer >= 0, got {replicas!r}")
    if not required and not has_share_annotations(annotations):
        return ManifestShare(kind=kind, name=name, replicas=replicas,
                             skipped=f"no {keys.ANNOTATION_PREFIX} share annotations and no "
                                     f"{keys.VGPU_RESOURCE} request")
    try:
        return ManifestShare(kind=kind, name=name, replicas=replicas, share=parse_share(annotations))
    except InvalidShareSpec as error:
        return ManifestShare(kind=kind, name=name, replicas=replicas, error=error)


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _name(document: Mapping[str, object]) -> str:
    metadata = _mapping(document.get("metadata"))
    name = metadata.get("name") or metadata.get("generateName")
    return name if isinstance(name, str) else "<unnamed>"


def _annotations(document: Mapping[str, object]) -> Mapping[str, object]:
    return _mapping(_mapping(document.get("metadata")).get("annotations"))


def _requests_vgpu(pod_spec: Mapping[str, object]) -> bool:
    containers = pod_spec.get("containers")
    for container in containers if isinstance(containers, list) else []:
        resources = _mapping(_mapping(container).get("resources"))
        for section in ("limits", "requests"):
            if keys.VGPU_RESOURCE in _mapping(resources.get(section)):
                return True
    return False
