"""Model sharing's vocabulary: a function's model, its one-line validation, and its per-pod annotation.

A FaSTFunc may state its model (``spec.model``: ``name``, ``bytes``, ``source.path``). The function
controller writes it on the function's pods as :data:`fastgshare.keys.MODEL_ANNOTATION`; the node's
model store loads the weights once per GPU and the pods map them through CUDA IPC. Every ledger that
counts GPU memory charges one model's bytes once per GPU however many of its pods run there
(:func:`charged_models`).

Identity: a model is one function's (its namespace, its function, its name) with the size and source
it declared; two declarations that differ in any part are two models, loaded and charged apart, so a
pod can never map another function's weights, nor a forged annotation another's copy.

The source is a path relative to the node's model directory (the store's ``--model-dir``): never
absolute, never through ``..``, so a FaSTFunc can name only files the node's administrator put there.

Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from fastgshare import keys
from fastgshare.errors import FastGShareError, FieldProblem
from fastgshare.quantity import BYTES_HELP, parse_bytes

MAX_MODEL_BYTES: Final = 1 << 40  # 1 TiB: more than any GPU holds
MAX_PATH_LENGTH: Final = 1024
_NAME = re.compile(r"[a-z0-9]([-a-z0-9._]{0,61}[a-z0-9])?")
_PATH_PART = re.compile(r"[A-Za-z0-9._+@=-]+")
NAME_HELP: Final = ("allowed: a lower-case name of 1-63 letters, digits, '-', '.' or '_', "
                    "starting and ending alphanumeric")
PATH_HELP: Final = ("allowed: a relative path under the node's model directory: parts of letters, digits and ._+@=-, "
                    "joined by '/', no '..', no leading '/'")


class InvalidModelSpec(FastGShareError):
    """A model declaration (FaSTFunc ``spec.model`` or the pod annotation) has bad fields; all are named."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(problem) for problem in self.problems))


@attrs.frozen(kw_only=True)
class ModelSpec:
    """What a function declares: the model's name, its size in bytes, its file under the model directory."""

    name: str
    bytes: int
    path: str

    def to_spec(self) -> dict[str, object]:
        """The FaSTFunc ``spec.model`` document."""
        return {"name": self.name, "bytes": self.bytes, "source": {"path": self.path}}


@attrs.frozen(kw_only=True)
class ModelRef:
    """One function's model as the pods, the store and the ledgers know it (hashable: the identity)."""

    namespace: str
    function: str
    spec: ModelSpec

    @property
    def key(self) -> str:
        """``namespace/function/name``: how logs, metrics and ``inspect`` name it."""
        return f"{self.namespace}/{self.function}/{self.spec.name}"

    @property
    def bytes(self) -> int:
        return self.spec.bytes

    @property
    def identity(self) -> str:
        """Every part of the declaration, as one string: equal iff the models are the same (the store's key)."""
        return json.dumps(self.to_wire(), sort_keys=True, separators=(",", ":"))

    def to_wire(self) -> dict[str, object]:
        """The store's protocol form."""
        return {"namespace": self.namespace, "function": self.function, "name": self.spec.name,
                "bytes": self.spec.bytes, "path": self.spec.path}


@attrs.frozen(kw_only=True)
class HeldModel:
    """A model the node's store holds on one GPU (published in the node inventory): charged while held,
    also during the grace period after its last pod left."""

    identity: str  # ModelRef.identity
    key: str  # ModelRef.key, for people
    bytes: int


def charged_model_bytes(pod_models: Iterable[ModelRef | None], held: Iterable[HeldModel] = ()) -> int:
    """One GPU's model memory: each distinct model its pods declare or its store holds, counted once."""
    charged = {model.identity: model.bytes for model in pod_models if model is not None}
    for model in held:
        charged.setdefault(model.identity, model.bytes)
    return sum(charged.values())


def parse_model_spec(document: object, field: str = "spec.model") -> ModelSpec:
    """``spec.model`` checked: raises :class:`InvalidModelSpec` naming each bad field, its value and what is allowed."""
    if not isinstance(document, Mapping):
        raise InvalidModelSpec([FieldProblem(field, document, "must be an object with name, bytes and source.path")])
    problems: list[FieldProblem] = []
    unknown = sorted(set(document) - {"name", "bytes", "source"})
    for key in unknown:
        problems.append(FieldProblem(f"{field}.{key}", document[key], "unknown field; allowed: name, bytes, source"))
    name = _name(document.get("name"), f"{field}.name", problems)
    size = _size(document.get("bytes"), f"{field}.bytes", problems)
    source = document.get("source")
    path: str | None = None
    if not isinstance(source, Mapping):
        problems.append(FieldProblem(f"{field}.source", source, "must be an object with path"))
    else:
        for key in sorted(set(source) - {"path"}):
            problems.append(FieldProblem(f"{field}.source.{key}", source[key], "unknown field; allowed: path"))
        path = _path(source.get("path"), f"{field}.source.path", problems)
    if problems or name is None or size is None or path is None:
        raise InvalidModelSpec(problems)
    return ModelSpec(name=name, bytes=size, path=path)


def model_annotation(function: str, spec: ModelSpec) -> str:
    """The pod annotation's value (compact JSON, keys sorted: equal specs give equal text)."""
    return json.dumps({"function": function, "name": spec.name, "bytes": spec.bytes, "path": spec.path},
                      sort_keys=True, separators=(",", ":"))


def parse_model_annotation(text: object, namespace: str) -> ModelRef:
    """The model a pod in ``namespace`` declares; raises :class:`InvalidModelSpec` on a bad annotation."""
    field = "annotation fastgshare/model"
    try:
        document = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise InvalidModelSpec([FieldProblem(field, text, 'must be JSON {"function", "name", "bytes", "path"}')])
    problems: list[FieldProblem] = []
    for key in sorted(set(document) - {"function", "name", "bytes", "path"}):
        problems.append(FieldProblem(f"{field}.{key}", document[key],
                                     "unknown field; allowed: function, name, bytes, path"))
    function = document.get("function")
    if not isinstance(function, str) or not function or len(function) > 253:
        problems.append(FieldProblem(f"{field}.function", function, "must be the function's name"))
    name = _name(document.get("name"), f"{field}.name", problems)
    size = _size(document.get("bytes"), f"{field}.bytes", problems)
    path = _path(document.get("path"), f"{field}.path", problems)
    if problems or name is None or size is None or path is None or not isinstance(function, str):
        raise InvalidModelSpec(problems)
    return ModelRef(namespace=namespace, function=function, spec=ModelSpec(name=name, bytes=size, path=path))


def pod_model(annotations: Mapping[str, str], namespace: str) -> ModelRef | None:
    """The model a pod declares, None if none or if its annotation is malformed (admission refuses those)."""
    text = annotations.get(keys.MODEL_ANNOTATION)
    if text is None:
        return None
    try:
        return parse_model_annotation(text, namespace)
    except InvalidModelSpec:
        return None


def charged_models(models: Iterable[ModelRef | None]) -> dict[ModelRef, int]:
    """The distinct models among one GPU's pods, each with its bytes: what the GPU holds once."""
    return {model: model.bytes for model in models if model is not None}


def _name(value: object, field: str, problems: list[FieldProblem]) -> str | None:
    if isinstance(value, str) and _NAME.fullmatch(value):
        return value
    problems.append(FieldProblem(field, value, f"{value!r}; {NAME_HELP}"))
    return None


def _size(value: object, field: str, problems: list[FieldProblem]) -> int | None:
    size: int | None = None
    if isinstance(value, bool):
        size = None
    elif isinstance(value, int):
        size = value if value > 0 else None
    elif isinstance(value, str):
        size = parse_bytes(value)
    if size is None or size > MAX_MODEL_BYTES:
        problems.append(FieldProblem(field, value, f"{value!r}; allowed: {BYTES_HELP}, at most 1Ti"))
        return None
    return size


def _path(value: object, field: str, problems: list[FieldProblem]) -> str | None:
    if (isinstance(value, str) and 0 < len(value) <= MAX_PATH_LENGTH and not value.startswith("/")
            and all(_PATH_PART.fullmatch(part) and part not in (".", "..") for part in value.split("/"))):
        return value
    problems.append(FieldProblem(field, value, f"{value!r}; {PATH_HELP}"))
    return None
