"""A FaSTPod object, validated into what its pods must be.

:func:`parse_fastpod` takes the FaSTPod as the API returns it (a plain dict) and returns a
:class:`FaSTPodSpec`, or raises :class:`InvalidFaSTPod` listing every problem: the share
annotations (the core's parser names the annotation, the bad value and the allowed range), the
selector, the GPU-containers annotation and the podSpec. Nothing is created from an invalid
FaSTPod; the problems become the ``InvalidSpec`` condition and a Warning event.

The ``revision`` is a hash of everything a pod is built from that the user controls (the whole
podSpec, the labels and the annotations pods inherit); pods carrying another revision are
outdated and are replaced, one unavailable at a time, unless the time quota is all that differs
(:func:`revision_with_time_quota`): those are updated in place (see :mod:`.plan`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import attrs

from fastgshare import keys
from fastgshare.errors import FieldProblem, InvalidShareSpec
from fastgshare.share import ShareSpec, parse_share
from fastpod_crd_controller.errors import InvalidFaSTPod
from fastpod_crd_controller.selector import LabelSelector, parse_selector, valid_label_value

# Annotations a FaSTPod never hands down: kubectl's bookkeeping, and what other components
# write on pods and nodes for each other (a user must not be able to forge an assignment).
NOT_INHERITED = frozenset({
    "kubectl.kubernetes.io/last-applied-configuration",
    keys.FASTPOD_WOKEN_ANNOTATION,
    *keys.SYSTEM_POD_ANNOTATIONS,
    *keys.SYSTEM_NODE_ANNOTATIONS,
})

REASON_SHARE = "InvalidShareAnnotations"
REASON_SELECTOR = "InvalidSelector"
REASON_POD_SPEC = "InvalidPodSpec"


@attrs.frozen(kw_only=True)
class FaSTPodSpec:
    """What the pods of one valid FaSTPod must look like, and how many there must be."""

    namespace: str
    name: str
    uid: str
    replicas: int
    selector: LabelSelector
    pod_labels: Mapping[str, str]  # without the revision label, which the builder adds
    annotations: Mapping[str, str]  # inherited by every pod
    share: ShareSpec
    gpu_containers: tuple[str, ...]  # names of the containers that get a vgpu slot
    pod_spec: Mapping[str, Any]  # the user's podSpec, untouched
    revision: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def fastpod_key(fastpod: Mapping[str, Any]) -> str:
    metadata = fastpod.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def default_selector(name: str) -> dict[str, Any]:
    """The selector of a FaSTPod that has none: its pods by the controller's name label."""
    return {"matchLabels": {keys.FASTPOD_NAME_LABEL: name}}


def parse_fastpod(fastpod: Mapping[str, Any]) -> FaSTPodSpec:
    """Validate ``fastpod``; raises :class:`InvalidFaSTPod` naming every problem found."""
    metadata = fastpod.get("metadata") or {}
    spec = fastpod.get("spec") or {}
    name = str(metadata.get("name", ""))
    annotations = {str(k): v for k, v in (metadata.get("annotations") or {}).items()}
    share = _share(annotations)
    selector_problems: list[FieldProblem] = []
    selector, pod_labels = _selector_and_labels(name, metadata, spec, selector_problems)
    pod_spec = spec.get("podSpec")
    spec_problems = _pod_spec_problems(pod_spec)
    gpu_containers = _gpu_containers(annotations, pod_spec, spec_problems)
    share = _valid_share(share, selector_problems, spec_problems)
    pod_spec = pod_spec if isinstance(pod_spec, Mapping) else {}  # a Mapping: no podSpec problems
    inherited = {k: str(v) for k, v in annotations.items() if k not in NOT_INHERITED}
    return FaSTPodSpec(
        namespace=str(metadata.get("namespace", "")), name=name, uid=str(metadata.get("uid", "")),
        replicas=_replicas(spec), selector=selector, pod_labels=pod_labels, annotations=inherited,
        share=share, gpu_containers=gpu_containers, pod_spec=pod_spec,
        revision=revision(pod_spec, pod_labels, inherited),
    )


def revision(pod_spec: Mapping[str, Any], labels: Mapping[str, Any], annotations: Mapping[str, str]) -> str:
    """A short, stable hash of what pods are built from (key order does not matter)."""
    text = json.dumps({"podSpec": pod_spec, "labels": labels, "annotations": annotations}, sort_keys=True,
                      separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


TIME_QUOTA_KEYS = (keys.GPU_QUOTA_REQUEST, keys.GPU_QUOTA_LIMIT)


def revision_with_time_quota(spec: FaSTPodSpec, time_quota: tuple[str | None, str | None]) -> str:
    """The revision ``spec`` would have with ``time_quota`` (request and limit annotations, None:
    absent) in place of its own: a pod carrying it differs from ``spec`` in its time quota only."""
    annotations = {key: value for key, value in spec.annotations.items() if key not in TIME_QUOTA_KEYS}
    annotations.update({key: value for key, value in zip(TIME_QUOTA_KEYS, time_quota, strict=True)
                        if value is not None})
    return revision(spec.pod_spec, spec.pod_labels, annotations)


def time_quota_of(spec: FaSTPodSpec) -> tuple[str | None, str | None]:
    """The FaSTPod's own time quota annotations, as its pods carry them."""
    request, limit = (spec.annotations.get(key) for key in TIME_QUOTA_KEYS)
    return request, limit


def _replicas(spec: Mapping[str, Any]) -> int:
    value = spec.get("replicas", 1)  # the CRD's schema defaults it to 1 and keeps it >= 0
    return value if isinstance(value, int) and value >= 0 else 1


def _share(annotations: Mapping[str, object]) -> ShareSpec | InvalidShareSpec:
    try:
        return parse_share(annotations)
    except InvalidShareSpec as error:
        return error


def _valid_share(share: ShareSpec | InvalidShareSpec, selector_problems: list[FieldProblem],
                 spec_problems: list[FieldProblem]) -> ShareSpec:
    """``share`` if nothing is wrong, else :class:`InvalidFaSTPod` with every problem, share first."""
    if isinstance(share, ShareSpec) and not selector_problems and not spec_problems:
        return share
    share_problems: list[FieldProblem | str] = []
    if isinstance(share, InvalidShareSpec):
        share_problems = list(share.problems) or [str(share)]
    reason = REASON_SHARE if share_problems else REASON_SELECTOR if selector_problems else REASON_POD_SPEC
    raise InvalidFaSTPod(reason, [*share_problems, *selector_problems, *spec_problems])


def _selector_and_labels(name: str, metadata: Mapping[str, Any], spec: Mapping[str, Any],
                         problems: list[FieldProblem]) -> tuple[LabelSelector, dict[str, Any]]:
    """The selector and the labels pods get: the FaSTPod's, the selector's matchLabels, the name label."""
    if not valid_label_value(name):
        problems.append(FieldProblem("metadata.name", name, "must be at most 63 characters, as it becomes the "
                                     f"value of the pods' {keys.FASTPOD_NAME_LABEL} label"))
        return LabelSelector(), {}
    selector = parse_selector(spec.get("selector") or default_selector(name), "spec.selector", problems)
    pod_labels = {**(metadata.get("labels") or {}), **selector.match_labels, keys.FASTPOD_NAME_LABEL: name}
    _check_labels(selector, pod_labels, problems)
    return selector, pod_labels


def _check_labels(selector: LabelSelector, pod_labels: Mapping[str, Any], problems: list[FieldProblem]) -> None:
    bad = [key for key, value in pod_labels.items() if not valid_label_value(value)]
    if bad:
        problems.append(FieldProblem("metadata.labels", bad, f"values of {', '.join(bad)} are not label values"))
    elif not selector.matches(pod_labels):
        shown = ",".join(f"{k}={v}" for k, v in sorted(pod_labels.items()))
        problems.append(FieldProblem("spec.selector", str(selector),
                                     f'"{selector}" does not select the labels the pods get ({shown}); the pods '
                                     "get the FaSTPod's labels, spec.selector.matchLabels and "
                                     f"{keys.FASTPOD_NAME_LABEL}"))


def _pod_spec_problems(pod_spec: object) -> list[FieldProblem]:
    if not isinstance(pod_spec, Mapping):
        return [FieldProblem("spec.podSpec", pod_spec, "is required: a Pod spec (containers, volumes, ...)")]
    problems = []
    containers = pod_spec.get("containers")
    if not isinstance(containers, list) or not containers:
        problems.append(FieldProblem("spec.podSpec.containers", containers, "must list at least one container"))
    elif not all(isinstance(c, Mapping) and isinstance(c.get("name"), str) and c["name"] for c in containers):
        problems.append(FieldProblem("spec.podSpec.containers", containers, "every container needs a name"))
    if pod_spec.get("nodeName"):
        problems.append(FieldProblem("spec.podSpec.nodeName", pod_spec["nodeName"],
                                     f"must not be set: pods are placed by the {keys.SCHEDULER_NAME} scheduler "
                                     "(use nodeSelector or affinity to restrict the nodes)"))
    return problems


def _gpu_containers(annotations: Mapping[str, object], pod_spec: object,
                    problems: list[FieldProblem]) -> tuple[str, ...]:
    if problems or not isinstance(pod_spec, Mapping):
        return ()
    existing = [str(c["name"]) for c in pod_spec["containers"]]
    raw = annotations.get(keys.GPU_CONTAINERS_ANNOTATION)
    if raw is None:
        return tuple(existing)
    listed = [part.strip() for part in str(raw).split(",") if part.strip()]
    unknown = [name for name in listed if name not in existing]
    if not listed or unknown:
        what = f"names no container: {', '.join(unknown)}" if unknown else "is empty"
        problems.append(FieldProblem(keys.GPU_CONTAINERS_ANNOTATION, raw,
                                     f'"{raw}" {what}; allowed: comma-separated names of '
                                     f"spec.podSpec.containers ({', '.join(existing)})"))
        return ()
    return tuple(dict.fromkeys(listed))
