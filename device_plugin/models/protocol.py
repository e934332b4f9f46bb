"""The model store's two wire formats, parsed and answered: one JSON line each way, one request a
connection, lines of at most :data:`MAX_LINE` bytes (design: /work/scratch/model-design.md, "Wire
formats"; docs/node-agent.md "Model store").

Pod -> agent (``model.sock``)::

    {"op": "open", "model": "<name or empty>"}
    -> {"ok": true, "handle": "<128 lower-case hex>", "bytes": N, "model": "<ns/fn/name>"}
    -> {"ok": false, "error": "<one line: what is wrong and how to fix it>"}

Agent -> worker (``<state dir>/model-store/<gpu uuid>.sock``)::

    {"op": "load", "identity": I, "key": K, "bytes": N, "path": "<absolute file>"}
        -> {"ok": true, "handle": H, "bytes": N}
    {"op": "free", "identity": I} -> {"ok": true}
    {"op": "list"} -> {"ok": true, "pid": P, "models": [{"identity", "key", "bytes", "handle"}]}

Every refusal of bad input is one line naming the field, the value and what is allowed. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

import attrs

MAX_LINE: Final = 4096  # bytes of one request or answer line, newline included
LIST_LINE_LIMIT: Final = 1 << 20  # a worker's list answer may name many models; the agent alone reads it
TIMEOUT_S: Final = 5.0  # to send a request or an answer line
HANDLE_BYTES: Final = 64  # CU_IPC_HANDLE_SIZE
_HANDLE = re.compile(r"[0-9a-f]{128}")
MAX_IDENTITY: Final = 3000  # a ModelRef.identity: its parts are bounded (names, a 1024-byte path)


class ProtocolError(ValueError):
    """A line that is not a request (or answer) of the protocol; the message is one line."""


@attrs.frozen
class OpenRequest:
    """A pod asks for its model's handle; ``model`` empty means the pod's own. ``pod`` is the
    pod key a trusted-env client names (tests without pods only; ignored otherwise)."""

    model: str
    pod: str | None = None


@attrs.frozen
class LoadRequest:
    identity: str
    key: str
    bytes: int
    path: str


@attrs.frozen
class FreeRequest:
    identity: str


@attrs.frozen
class ListRequest:
    pass


WorkerRequest = LoadRequest | FreeRequest | ListRequest


@attrs.frozen
class WorkerModel:
    """A model a worker holds, as ``list`` answers it."""

    identity: str
    key: str
    bytes: int
    handle: str


def decode_line(raw: bytes, limit: int = MAX_LINE) -> dict[str, object]:
    """One line (its newline optional) as a JSON object."""
    if len(raw) > limit:
        raise ProtocolError(f"the line has {len(raw)} bytes; allowed: at most {limit}, newline included")
    text = raw.rstrip(b"\n")
    if b"\n" in text:
        raise ProtocolError("one JSON object on one line is allowed, the line has several")
    try:
        document = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ProtocolError(f"the line is not JSON: {_shown(text)}; allowed: one JSON object") from None
    if not isinstance(document, dict):
        raise ProtocolError(f"the line is {_shown(text)}; allowed: a JSON object")
    return document


def encode_line(document: Mapping[str, object], limit: int = MAX_LINE) -> bytes:
    """``document`` as one compact JSON line (longer than ``limit`` is a bug of the sender; only a
    worker's ``list`` answer, read by the agent alone, may be longer than :data:`MAX_LINE`)."""
    line = json.dumps(document, separators=(",", ":"), sort_keys=True).encode() + b"\n"
    if len(line) > limit:
        raise ProtocolError(f"a line of {len(line)} bytes; allowed: at most {limit}")
    return line


def error(message: str) -> dict[str, object]:
    """A refusal: ``message`` on one line."""
    return {"ok": False, "error": " ".join(message.split())}


def parse_open_request(document: Mapping[str, object]) -> OpenRequest:
    """A pod's request; :class:`ProtocolError` naming the field otherwise."""
    _only(document, {"op", "model", "pod"}, "request")
    op = document.get("op")
    if op != "open":
        raise ProtocolError(f"request field op: {op!r}; allowed: \"open\"")
    model = document.get("model", "")
    if model is None:
        model = ""
    if not isinstance(model, str) or len(model) > 253:
        raise ProtocolError(f"request field model: {_shown(model)}; allowed: the model's name, or \"\" for the "
                            "pod's own")
    pod = document.get("pod")
    if pod is not None and (not isinstance(pod, str) or not 0 < len(pod) <= 317):
        raise ProtocolError(f"request field pod: {_shown(pod)}; allowed: a pod key namespace/name")
    return OpenRequest(model=model, pod=pod)


def parse_worker_request(document: Mapping[str, object]) -> WorkerRequest:
    """The agent's request to a worker; :class:`ProtocolError` naming the field otherwise."""
    op = document.get("op")
    if op == "list":
        _only(document, {"op"}, "list request")
        return ListRequest()
    if op == "free":
        _only(document, {"op", "identity"}, "free request")
        return FreeRequest(_identity(document.get("identity")))
    if op == "load":
        _only(document, {"op", "identity", "key", "bytes", "path"}, "load request")
        size, key, path = document.get("bytes"), document.get("key"), document.get("path")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ProtocolError(f"load request field bytes: {_shown(size)}; allowed: a positive integer")
        if not isinstance(key, str) or not 0 < len(key) <= 400:
            raise ProtocolError(f"load request field key: {_shown(key)}; allowed: namespace/function/name")
        if not isinstance(path, str) or not path.startswith("/") or "\0" in path or len(path) > 2048:
            raise ProtocolError(f"load request field path: {_shown(path)}; allowed: an absolute file path")
        return LoadRequest(identity=_identity(document.get("identity")), key=key, bytes=size, path=path)
    raise ProtocolError(f"request field op: {_shown(op)}; allowed: \"load\", \"free\", \"list\"")


def load_request(request: LoadRequest) -> dict[str, object]:
    return {"op": "load", "identity": request.identity, "key": request.key, "bytes": request.bytes,
            "path": request.path}


def parse_handle(value: object, where: str = "handle") -> str:
    """A CUipcMemHandle as 128 lower-case hex digits."""
    if not isinstance(value, str) or not _HANDLE.fullmatch(value):
        raise ProtocolError(f"{where}: {_shown(value)}; allowed: 128 lower-case hex digits (a CUipcMemHandle)")
    return value


def parse_answer(document: Mapping[str, object]) -> Mapping[str, object]:
    """An answer: the document if ``ok`` is true; :class:`AnswerRefused` with the peer's line if false."""
    ok = document.get("ok")
    if ok is True:
        return document
    if ok is False:
        message = document.get("error")
        raise AnswerRefused(message if isinstance(message, str) and message else "refused without a reason")
    raise ProtocolError(f"answer field ok: {_shown(ok)}; allowed: true or false")


class AnswerRefused(Exception):
    """The peer answered ``ok: false``; the message is its line."""


def parse_load_answer(document: Mapping[str, object], expected_bytes: int) -> str:
    """A worker's answer to ``load``: the handle."""
    answer = parse_answer(document)
    if answer.get("bytes") != expected_bytes:
        raise ProtocolError(f"load answer field bytes: {_shown(answer.get('bytes'))}; expected {expected_bytes}")
    return parse_handle(answer.get("handle"), "load answer field handle")


def parse_list_answer(document: Mapping[str, object]) -> tuple[int, tuple[WorkerModel, ...]]:
    """A worker's answer to ``list``: its pid and what it holds."""
    answer = parse_answer(document)
    pid, models = answer.get("pid"), answer.get("models")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        raise ProtocolError(f"list answer field pid: {_shown(pid)}; allowed: a process id")
    if not isinstance(models, list):
        raise ProtocolError(f"list answer field models: {_shown(models)}; allowed: a list")
    held = []
    for position, entry in enumerate(models):
        where = f"list answer field models[{position}]"
        if not isinstance(entry, dict):
            raise ProtocolError(f"{where}: {_shown(entry)}; allowed: an object")
        size, key = entry.get("bytes"), entry.get("key")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ProtocolError(f"{where}.bytes: {_shown(size)}; allowed: a positive integer")
        if not isinstance(key, str) or not key:
            raise ProtocolError(f"{where}.key: {_shown(key)}; allowed: namespace/function/name")
        held.append(WorkerModel(identity=_identity(entry.get("identity")), key=key, bytes=size,
                                handle=parse_handle(entry.get("handle"), f"{where}.handle")))
    return pid, tuple(held)


def open_answer(handle: str, size: int, key: str) -> dict[str, object]:
    return {"ok": True, "handle": handle, "bytes": size, "model": key}


def _identity(value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_IDENTITY:
        raise ProtocolError(f"request field identity: {_shown(value)}; allowed: a model identity "
                            f"(fastgshare.model.ModelRef.identity, at most {MAX_IDENTITY} characters)")
    return value


def _only(document: Mapping[str, object], allowed: set[str], what: str) -> None:
    unknown = sorted(set(document) - allowed)
    if unknown:
        raise ProtocolError(f"{what} field {unknown[0]}: unknown; allowed: {', '.join(sorted(allowed))}")


def _shown(value: object) -> str:
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
