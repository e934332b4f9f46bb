"""The parts of Pods and Nodes the extender reads, taken from their Kubernetes JSON.

Pods arrive as JSON twice: embedded in the scheduler's requests (``ExtenderArgs.Pod``) and
from the API server (list, watch, get). Both are ordinary v1 objects in camelCase, so one
function reads both; nothing else in the extender touches raw objects.

A pod's model (:attr:`PodRecord.model`) is read from its ``fastgshare/model`` annotation when the
record is made (:func:`fastgshare.model.pod_model`): None when it declares none or a malformed one
(filter and bind refuse a pending pod with a malformed one: :func:`model_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from fastgshare import keys
from fastgshare.model import InvalidModelSpec, ModelRef, parse_model_annotation, pod_model

FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


class RecordError(ValueError):
    """A Pod or Node JSON object lacks a field the extender needs, or has the wrong type."""


@attrs.frozen(kw_only=True)
class PodRecord:
    """One pod as the extender sees it."""

    uid: str
    namespace: str
    name: str
    node_name: str = ""  # spec.nodeName: empty until bound
    phase: str = "Pending"
    resource_version: str = ""
    annotations: Mapping[str, str] = attrs.field(factory=dict)
    deleting: bool = False  # metadata.deletionTimestamp is set
    # The model it declares (annotation fastgshare/model); None if none or malformed. Read from the
    # annotations when the record is made (also by attrs.evolve), never passed in.
    model: ModelRef | None = attrs.field(
        init=False, eq=False,
        default=attrs.Factory(lambda self: pod_model(self.annotations, self.namespace), takes_self=True))

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def assignment_text(self) -> str | None:
        """The extender's assignment payload, if the pod carries one."""
        return self.annotations.get(keys.POD_ASSIGNMENT_ANNOTATION)

    @property
    def allocated(self) -> bool:
        """The node agent has served the pod's Allocate."""
        return keys.POD_ALLOCATED_ANNOTATION in self.annotations

    @property
    def finished(self) -> bool:
        """Its containers have stopped for good: its GPU share is free again."""
        return self.phase in FINISHED_PHASES


def model_problem(record: PodRecord) -> str | None:
    """Why the pod's model annotation is malformed (the parser's line); None if it has none or a valid one."""
    text = record.annotations.get(keys.MODEL_ANNOTATION)
    if text is None or record.model is not None:
        return None
    try:
        parse_model_annotation(text, record.namespace)
    except InvalidModelSpec as error:
        return str(error)
    return None  # pragma: no cover - pod_model read it as valid


@attrs.frozen(kw_only=True)
class NodeRecord:
    """One node: its name and the node agent's inventory payload, if published."""

    name: str
    inventory_text: str | None = None


def pod_from_json(raw: object, where: str = "Pod") -> PodRecord:
    """Read a v1.Pod JSON object; :class:`RecordError` names the missing or bad field."""
    pod = _object(raw, where)
    metadata = _object(pod.get("metadata"), f"{where}.metadata")
    spec = _object(pod.get("spec") or {}, f"{where}.spec")
    status = _object(pod.get("status") or {}, f"{where}.status")
    return PodRecord(
        uid=_string(metadata, "uid", f"{where}.metadata", required=False),
        namespace=_string(metadata, "namespace", f"{where}.metadata"),
        name=_string(metadata, "name", f"{where}.metadata"),
        node_name=_string(spec, "nodeName", f"{where}.spec", required=False),
        phase=_string(status, "phase", f"{where}.status", required=False) or "Pending",
        resource_version=_string(metadata, "resourceVersion", f"{where}.metadata", required=False),
        annotations=_annotations(metadata, f"{where}.metadata.annotations"),
        deleting=metadata.get("deletionTimestamp") is not None,
    )


def node_from_json(raw: object, where: str = "Node") -> NodeRecord:
    """Read a v1.Node JSON object (name and inventory annotation)."""
    node = _object(raw, where)
    metadata = _object(node.get("metadata"), f"{where}.metadata")
    annotations = _annotations(metadata, f"{where}.metadata.annotations")
    return NodeRecord(name=_string(metadata, "name", f"{where}.metadata"),
                      inventory_text=annotations.get(keys.NODE_GPU_INFO_ANNOTATION))


def _object(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, dict):
        raise RecordError(f"{where} must be a JSON object, got {_json_type(value)}")
    return value


def _string(holder: Mapping[str, object], name: str, where: str, *, required: bool = True) -> str:
    value = holder.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise RecordError(f"{where}.{name} must be a non-empty string, got {_json_type(value)}")
    return value


def _annotations(metadata: Mapping[str, object], where: str) -> dict[str, str]:
    value = metadata.get("annotations") or {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise RecordError(f"{where} must be an object of strings")
    return dict(value)


def _json_type(value: object) -> str:
    if value == "":
        return "an empty string"
    names = {type(None): "null", bool: "boolean", int: "number", float: "number", str: "string",
             list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)
