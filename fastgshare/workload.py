"""Workloads described as data: share entries with counts, or Kubernetes manifests.

Two shapes are understood, both as already-parsed YAML/JSON (this module reads no files):

- a *workload list*: ``[{"name": "resnet", "count": 4, "annotations": {<the four share
  annotations>}}, ...]`` (``count`` defaults to 1);
- Kubernetes objects: a ``FaSTPod`` (``spec.replicas`` copies, default 1), a ``Pod``, a
  workload with a pod template (``Deployment``, ``ReplicaSet``, ``StatefulSet``, ``Job``,
  ``DaemonSet``), or a ``List`` of those. Its share is read from the object's annotations
  (the pod template's for templated workloads).

Besides the share, :func:`manifest_shares` reports what would make the share go unread: a
FaSTPod without ``spec.podSpec``, a Pod or pod template with a share but no container limited
to the vGPU resource or another scheduler than ours, and unknown ``fastgshare/`` annotations
(with the nearest known key). The schema of the Kubernetes objects themselves is not checked
here (that needs the API's schemas: see ``fastgshare_cli.schema``).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from fastgshare import keys
from fastgshare.errors import FieldProblem, InvalidShareSpec, InvalidWorkload
from fastgshare.share import ShareSpec, has_share_annotations, parse_share, unknown_annotations

TEMPLATED_KINDS = ("Deployment", "ReplicaSet", "StatefulSet", "Job", "DaemonSet")
WORKLOAD_KIND = "workload"  # an entry of a workload list
POD_SPEC_HELP = "a PodSpec with at least one container"


@attrs.frozen(kw_only=True)
class ManifestShare:
    """The share of one manifest object; ``share`` is ``None`` when ``error`` says why."""

    kind: str
    name: str
    replicas: int
    share: ShareSpec | None = None
    error: InvalidShareSpec | None = None
    problems: tuple[FieldProblem, ...] = ()  # outside the share: what would make it go unread
    skipped: str = ""  # non-empty: the object asks for no GPU share, and why we think so

    @property
    def valid(self) -> bool:
        return self.error is None and not self.problems

    @property
    def all_problems(self) -> tuple[FieldProblem, ...]:
        """The share's problems, then the manifest's."""
        return (*(self.error.problems if self.error else ()), *self.problems)


@attrs.frozen(kw_only=True)
class WorkloadItem:
    name: str
    count: int
    share: ShareSpec


def parse_workload_list(data: object) -> tuple[WorkloadItem, ...]:
    """Validate a workload list; every entry's problems are reported in one error."""
    problems = []
    items = []
    for position, found in enumerate(workload_list_shares(data)):
        if found.share is not None:
            items.append(WorkloadItem(name=found.name, count=found.replicas, share=found.share))
            continue
        where = f"entry {position}" + (f" ({found.name})" if found.name else "")
        problems.append(f"{where}: {found.error if found.error is not None else found.skipped}")
    if problems:
        raise InvalidWorkload("invalid workload: " + "; ".join(problems))
    return tuple(items)


def workload_list_shares(data: object) -> list[ManifestShare]:
    """Each entry of a workload list as a :class:`ManifestShare` of kind ``workload``; an entry that
    is malformed has no share and says why in ``skipped``."""
    if not isinstance(data, list) or not data:
        raise InvalidWorkload("a workload list must be a non-empty list of entries "
                              '{"name": ..., "count": N, "annotations": {...}}')
    return [_workload_entry(entry) for entry in data]


def _workload_entry(entry: object) -> ManifestShare:
    if not isinstance(entry, dict):
        return ManifestShare(kind=WORKLOAD_KIND, name="", replicas=0,
                             skipped="must be a mapping with name, count and annotations")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        return ManifestShare(kind=WORKLOAD_KIND, name="", replicas=0, skipped="'name' must be a non-empty string")
    count = entry.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        return ManifestShare(kind=WORKLOAD_KIND, name=name, replicas=0,
                             skipped=f"'count' must be an integer >= 1, got {count!r}")
    annotations = entry.get("annotations")
    if not isinstance(annotations, dict):
        return ManifestShare(kind=WORKLOAD_KIND, name=name, replicas=count,
                             skipped="'annotations' must be a mapping of the share annotations")
    try:
        return ManifestShare(kind=WORKLOAD_KIND, name=name, replicas=count, share=parse_share(annotations),
                             problems=tuple(unknown_annotations(annotations)))
    except InvalidShareSpec as error:
        return ManifestShare(kind=WORKLOAD_KIND, name=name, replicas=count, error=error,
                             problems=tuple(unknown_annotations(annotations)))


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
        found = _share_of(kind, name, replicas, _annotations(document), required=True)
        return [attrs.evolve(found, problems=(*found.problems, *_fastpod_problems(document)))]
    if kind == "Pod":
        return [_share_of(kind, name, 1, _annotations(document), pod_spec=_mapping(document.get("spec")),
                          where="spec")]
    if kind in TEMPLATED_KINDS:
        spec = _mapping(document.get("spec"))
        template = _mapping(spec.get("template"))
        replicas = spec.get("replicas", 1) if kind != "DaemonSet" else 1
        return [_share_of(kind, name, replicas, _annotations(template), pod_spec=_mapping(template.get("spec")),
                          where="spec.template.spec")]
    return [ManifestShare(kind=kind, name=name, replicas=0,
                          skipped=f"{kind} objects carry no GPU share")]


def _share_of(kind: str, name: str, replicas: object, annotations: Mapping[str, object], *,
              required: bool = False, pod_spec: Mapping[str, object] | None = None,
              where: str = "") -> ManifestShare:
    """The share; for a Pod or a pod template (``pod_spec`` at ``where``) also its wiring."""
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
        raise InvalidWorkload(f"{kind} {name}: spec.replicas must be an integer >= 0, got {replicas!r}")
    required = required or (pod_spec is not None and _requests_vgpu(pod_spec))
    if not required and not has_share_annotations(annotations):
        return ManifestShare(kind=kind, name=name, replicas=replicas,
                             skipped=f"no {keys.ANNOTATION_PREFIX} share annotations and no "
                                     f"{keys.VGPU_RESOURCE} request")
    problems = [*unknown_annotations(annotations), *(_wiring_problems(pod_spec, where) if pod_spec is not None
                                                     else ())]
    try:
        return ManifestShare(kind=kind, name=name, replicas=replicas, share=parse_share(annotations),
                             problems=tuple(problems))
    except InvalidShareSpec as error:
        return ManifestShare(kind=kind, name=name, replicas=replicas, error=error, problems=tuple(problems))


def _wiring_problems(pod_spec: Mapping[str, object], where: str) -> list[FieldProblem]:
    """Why a share on this pod would be ignored: no vGPU limit, or a scheduler that is not ours."""
    problems = []
    if not _limits_vgpu(pod_spec):
        problems.append(FieldProblem(
            f"{where}.containers", None,
            f"no container has a limit of {keys.VGPU_RESOURCE}, so the share is ignored; allowed: "
            f"resources.limits {{{keys.VGPU_RESOURCE}: 1}} on the GPU container"))
    problems.extend(_scheduler_problems(pod_spec, where, default_is_ours=False))
    return problems


def _scheduler_problems(pod_spec: Mapping[str, object], where: str, *, default_is_ours: bool) -> list[FieldProblem]:
    scheduler = pod_spec.get("schedulerName")
    if scheduler == keys.SCHEDULER_NAME or (scheduler is None and default_is_ours):
        return []
    what = ("not set (the default scheduler ignores the share)" if scheduler is None
            else f"{scheduler!r} (only {keys.SCHEDULER_NAME} places pods by their share)")
    return [FieldProblem(f"{where}.schedulerName", scheduler, f"{what}; allowed: {keys.SCHEDULER_NAME}")]


def _fastpod_problems(document: Mapping[str, object]) -> list[FieldProblem]:
    """A FaSTPod's own shape: the controller builds its pods from ``spec.podSpec``."""
    spec = document.get("spec")
    if not isinstance(spec, dict):
        return [FieldProblem("spec", spec, f"is required; allowed: a mapping with podSpec ({POD_SPEC_HELP})")]
    pod_spec = spec.get("podSpec")
    if not isinstance(pod_spec, dict):
        return [FieldProblem("spec.podSpec", pod_spec, f"is required; allowed: {POD_SPEC_HELP}")]
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        return [FieldProblem("spec.podSpec.containers", containers, f"is required; allowed: {POD_SPEC_HELP}")]
    # The controller sets schedulerName when the podSpec has none.
    return _scheduler_problems(pod_spec, "spec.podSpec", default_is_ours=True)


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, dict) else {}


def _name(document: Mapping[str, object]) -> str:
    metadata = _mapping(document.get("metadata"))
    name = metadata.get("name") or metadata.get("generateName")
    return name if isinstance(name, str) else "<unnamed>"


def _annotations(document: Mapping[str, object]) -> Mapping[str, object]:
    return _mapping(_mapping(document.get("metadata")).get("annotations"))


def _requests_vgpu(pod_spec: Mapping[str, object]) -> bool:
    return _has_vgpu(pod_spec, ("limits", "requests"))


def _limits_vgpu(pod_spec: Mapping[str, object]) -> bool:
    return _has_vgpu(pod_spec, ("limits",))  # an extended resource must be in the limits


def _has_vgpu(pod_spec: Mapping[str, object], sections: tuple[str, ...]) -> bool:
    containers = pod_spec.get("containers")
    for container in containers if isinstance(containers, list) else []:
        resources = _mapping(_mapping(container).get("resources"))
        if any(keys.VGPU_RESOURCE in _mapping(resources.get(section)) for section in sections):
            return True
    return False
