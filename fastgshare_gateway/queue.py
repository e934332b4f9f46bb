"""Asynchronous invocations' queued message: its format, the subject it goes to, and the header rules.

Pure (no I/O, no clock, no server): the HTTP edge (:mod:`fastgshare_gateway.http`) builds an
:class:`AsyncRequest` from ``POST /async-function/<name>[.<namespace>][/rest]``, :func:`encode` turns it
into a JetStream message's data, and the queue worker (``fastgshare-queue-worker``) reads it back with
:func:`decode`. :mod:`fastgshare_gateway.jetstream` is the adapter that stores it.

The message (version 1): one line of JSON (``v``, ``callId``, ``function``, ``namespace``, ``method``,
``path``, ``query``, ``headers`` as ``[name, value]`` pairs, ``callbackUrl`` or null, ``queuedAt`` in
Unix seconds), a newline, then the request body's bytes unchanged (no base64: a 1 MiB body stays
1 MiB). Its subject is ``<stream>.<namespace>.<name>`` (:func:`subject`), so the stream's per-subject
counts are the per-function queue depth. Its ``Nats-Msg-Id`` is the call id: the same call stored twice
within the stream's duplicate window is stored once.

Header rules, as OpenFaaS's gateway and queue-worker have them: the caller's headers are kept but for
hop-by-hop ones, ``Host``, ``Content-Length``, ``X-Callback-Url``, ``X-Call-Id`` (given on its own) and
credentials (``Authorization``, ``Proxy-Authorization``: they do not rest in the queue; the worker sends
its own). ``X-Call-Id`` is the caller's when it is a UUID, else a fresh one. ``X-Callback-Url`` must be
an absolute ``http``/``https`` URL. The callback carries the function's answer headers (but hop-by-hop
and ``Content-Length``), ``X-Call-Id``, ``X-Function-Name`` (``<name>.<namespace>``),
``X-Function-Status`` (the function's status code; 503 when it could not be reached),
``X-Duration-Seconds`` (the last attempt's) and ``X-Fastgshare-Attempts``.
"""

from __future__ import annotations

import argparse
import json
import re
import urllib.parse
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

import attrs

VERSION = 1
DEFAULT_STREAM = "fastgshare-async"  # --async-stream of the gateway and the queue worker
DUPLICATE_WINDOW_S = 120.0  # the same X-Call-Id stored twice within this is stored once
STREAM_MAX_BYTES = 1 << 30  # the stream refuses new messages past this (the gateway answers 503)
CALLBACK_HEADER = "X-Callback-Url"
CALL_ID_HEADER = "X-Call-Id"
DROPPED_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length", "authorization", "x-callback-url", "x-call-id"})
ANSWER_DROPPED = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "content-length", "x-call-id", "x-function-status", "x-function-name",
    "x-duration-seconds", "x-fastgshare-attempts"})
_STREAM_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TOKEN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # a Kubernetes name: one subject token, no dots


class QueueUnavailable(Exception):
    """The stream cannot take or give messages now (the gateway answers 503); the message is one line."""


class TooLarge(Exception):
    """The message is over what the NATS server accepts (its ``max_payload``; the gateway answers 413)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes to store, the NATS server's max_payload is {limit}")
        self.size, self.limit = size, limit


class Publisher(Protocol):
    """Where the HTTP edge stores async requests (:class:`fastgshare_gateway.jetstream.AsyncQueue`)."""

    async def publish(self, request: AsyncRequest) -> bool:
        """Store ``request`` durably; True when this call id was stored already. :class:`TooLarge`,
        :class:`QueueUnavailable` when not stored."""
        ...


class BadMessage(ValueError):
    """A message that is no version-1 async request; the message says what is wrong."""


@attrs.frozen
class AsyncRequest:
    call_id: str
    function: str
    namespace: str
    method: str
    path: str  # below the function: "" or "rest/of/path"
    query: str  # the raw query string, without "?"
    headers: tuple[tuple[str, str], ...]
    body: bytes
    callback_url: str | None
    queued_at: float  # Unix seconds

    @property
    def label(self) -> str:
        """``<name>.<namespace>``: the metrics' ``function_name`` and the callback's ``X-Function-Name``."""
        return f"{self.function}.{self.namespace}"


def stream_problem(name: str) -> str | None:
    """None if ``name`` can be a JetStream stream name (and a subject token), else one line."""
    if _STREAM_NAME.match(name):
        return None
    return f"--async-stream {name!r}: allowed 1 to 64 of A-Z a-z 0-9 _ - (e.g. {DEFAULT_STREAM})"


def stream_argument(text: str) -> str:
    """``text`` as the value of ``--async-stream`` (an argparse type, shared by the gateway and
    the queue worker)."""
    if problem := stream_problem(text):
        raise argparse.ArgumentTypeError(problem.removeprefix("--async-stream "))
    return text


def nats_url_argument(text: str) -> str:
    """``text`` as the value of ``--nats-url`` (an argparse type, shared by the gateway and the
    queue worker)."""
    if not text.startswith(("nats://", "tls://")) or len(text) <= len("nats://"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a NATS URL; allowed: nats://HOST:PORT or tls://HOST:PORT "
                                         "(e.g. nats://nats.fastgshare-system:4222)")
    return text


def subject(stream: str, namespace: str, name: str) -> str:
    """The subject a function's async requests go to: ``<stream>.<namespace>.<name>``."""
    for what, token in (("namespace", namespace), ("function", name)):
        if not _TOKEN.match(token):
            raise ValueError(f"{what} {token!r} is not a Kubernetes name (a-z, 0-9, '-')")
    return f"{stream}.{namespace}.{name}"


def subjects(stream: str) -> str:
    """The stream's subjects: every function of every namespace."""
    return f"{stream}.>"


def function_of(stream: str, subject_: str) -> tuple[str, str] | None:
    """``(namespace, name)`` of a subject :func:`subject` made, None for any other."""
    prefix, dot, rest = subject_.partition(".")
    namespace, dot2, name = rest.partition(".")
    if prefix != stream or not dot or not dot2 or not namespace or not name or "." in name:
        return None
    return namespace, name


def call_id(sent: str | None) -> str:
    """The caller's ``X-Call-Id`` if it is a UUID (in its canonical form), else a fresh random one."""
    if sent:
        try:
            return str(uuid.UUID(sent.strip()))
        except ValueError:
            pass
    return str(uuid.uuid4())


def callback_problem(url: str) -> str | None:
    """None if ``url`` is an absolute http(s) URL with a host, else one line naming it."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        parts.port  # noqa: B018 -- raises on a port that is no number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        return (f"{CALLBACK_HEADER}: {url[:200]!r} is not an absolute http(s) URL; allowed: "
                "http[s]://HOST[:PORT][/path], e.g. http://receiver.example:8000/done")
    return None


def kept_headers(headers: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The caller's headers stored with the request (:data:`DROPPED_HEADERS` left out), in order."""
    return tuple((name, value) for name, value in headers if name.lower() not in DROPPED_HEADERS)


def callback_headers(request: AsyncRequest, status: int, duration_s: float, attempts: int,
                     answer_headers: Iterable[tuple[str, str]] = ()) -> list[tuple[str, str]]:
    """The headers of the callback's POST: the function's answer headers, then OpenFaaS's own."""
    kept = [(name, value) for name, value in answer_headers if name.lower() not in ANSWER_DROPPED]
    return [*kept, (CALL_ID_HEADER, request.call_id), ("X-Function-Name", request.label),
            ("X-Function-Status", str(status)), ("X-Duration-Seconds", f"{duration_s:.6f}"),
            ("X-Fastgshare-Attempts", str(attempts))]


def encode(request: AsyncRequest) -> bytes:
    head = {"v": VERSION, "callId": request.call_id, "function": request.function, "namespace": request.namespace,
            "method": request.method, "path": request.path, "query": request.query,
            "headers": [list(pair) for pair in request.headers], "callbackUrl": request.callback_url,
            "queuedAt": request.queued_at}
    return json.dumps(head, separators=(",", ":"), ensure_ascii=True).encode() + b"\n" + request.body


def _field(head: Mapping[str, Any], name: str, kind: type) -> Any:
    value = head.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BadMessage(f"field {name!r}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def decode(data: bytes) -> AsyncRequest:
    """The request :func:`encode` wrote; :class:`BadMessage` for anything else."""
    line, newline, body = data.partition(b"\n")
    if not newline:
        raise BadMessage("no header line (no newline)")
    try:
        head = json.loads(line)
    except ValueError as error:
        raise BadMessage(f"header line is no JSON: {error}") from None
    if not isinstance(head, dict):
        raise BadMessage("header line is no JSON object")
    if head.get("v") != VERSION:
        raise BadMessage(f"version {head.get('v')!r}; this worker reads version {VERSION}")
    headers = _field(head, "headers", list)
    if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(s, str) for s in p) for p in headers):
        raise BadMessage("field 'headers': expected [name, value] string pairs")
    callback = head.get("callbackUrl")
    if callback is not None and not isinstance(callback, str):
        raise BadMessage(f"field 'callbackUrl': expected a string or null, got {type(callback).__name__}")
    queued = head.get("queuedAt")
    if not isinstance(queued, int | float) or isinstance(queued, bool):
        raise BadMessage(f"field 'queuedAt': expected a number, got {type(queued).__name__}")
    return AsyncRequest(call_id=_field(head, "callId", str), function=_field(head, "function", str),
                        namespace=_field(head, "namespace", str), method=_field(head, "method", str),
                        path=_field(head, "path", str), query=_field(head, "query", str),
                        headers=tuple((n, v) for n, v in headers), body=body, callback_url=callback,
                        queued_at=float(queued))
