"""The scheduler's three verbs served by a bare WSGI app in front of Flask: the hot path without a framework.

kube-scheduler calls ``/filter`` and ``/prioritize`` for every pod it places and ``/bind`` for every
pod it binds. Through Flask's request and response machinery (contexts, hooks, header objects) a
warm filter at 5,000 nodes took the extender 2.0 ms, answered here 1.2 ms (p50, bench.extender_latency's
cluster). :class:`VerbLane` answers a well-formed verb request itself: the same decoding
(:mod:`scheduler_extender.wire`), the same verb functions (:mod:`scheduler_extender.verbs`), the
same answers, the same latency metric. It parses the body with orjson (that 70 KB body: 0.22 ms,
against 0.46 ms with ``json``); a body orjson refuses goes to Flask, whose ``json`` decides (it
accepts ``NaN``, which orjson refuses). An integer beyond 64 bits orjson reads as a float; the
scheduler sends none (its objects are Go structs of int64s).

Everything else goes to the Flask app unchanged: other paths and methods, bodies of unknown or
too large length, a content type other than JSON, and any body that does not decode (bad JSON,
the wrong shape): for those the lane hands Flask the body it read, so the answers and log
lines of :mod:`.routes` stay the only ones. A failure inside a verb is answered here as the
routes answer it: 500 with a JSON error and no traceback, which goes to the log.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from scheduler_extender import verbs, wire
from scheduler_extender.services import Services

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
JSON = "application/json"


class VerbLane:
    """WSGI middleware: well-formed ``POST /filter``, ``/prioritize`` and ``/bind`` answered
    directly, every other request passed to ``app`` (see the module docstring)."""

    def __init__(self, services: Services, app: WsgiApp) -> None:
        self._services = services
        self._app = app
        self._max_body = services.config.max_body_bytes
        decisions, binder = services.decisions, services.binder
        self._verbs: dict[str, tuple[str, Callable[[object], bytes]]] = {
            "/filter": ("filter", lambda body: verbs.filter_nodes(wire.decode_extender_args(body), decisions)),
            "/prioritize": ("prioritize", lambda body: verbs.prioritize(wire.decode_extender_args(body), decisions)),
            "/bind": ("bind", lambda body: verbs.bind(wire.decode_binding_args(body), binder)),
        }

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        verb = self._verbs.get(environ.get("PATH_INFO", ""))
        if verb is None or environ.get("REQUEST_METHOD") != "POST" or _mimetype(environ) != JSON:
            return self._app(environ, start_response)
        length = _content_length(environ)
        if length is None or length > self._max_body:
            return self._app(environ, start_response)  # chunked, or over the limit: Flask's 413
        started = time.perf_counter()
        name, answer = verb
        raw = environ["wsgi.input"].read(length) if length else b""
        try:
            payload = orjson.loads(raw)
        except orjson.JSONDecodeError:  # Flask's json decides: its answer, or NaN and big numbers it accepts
            return self._by_flask(environ, start_response, raw)
        try:
            body = answer(payload)
        except wire.WireError:
            return self._by_flask(environ, start_response, raw)
        except Exception as error:  # any failure is answered, and logged with its traceback
            log.exception("internal error method=POST path=%s", environ.get("PATH_INFO"))
            self._services.metrics.fail(name, {"internal-error": 1})
            status, body = "500 INTERNAL SERVER ERROR", _dumps({"Error": wire.internal_error_text(error)})
        else:
            status = "200 OK"
        self._services.metrics.request_seconds.labels(name).observe(time.perf_counter() - started)
        return _respond(start_response, status, body)

    def _by_flask(self, environ: dict[str, Any], start_response: Callable[..., Any], raw: bytes) -> Iterable[bytes]:
        """Let the routes answer a body the lane could not decode (their error, their log line)."""
        environ["wsgi.input"] = io.BytesIO(raw)
        return self._app(environ, start_response)


def _mimetype(environ: dict[str, Any]) -> str:
    return str(environ.get("CONTENT_TYPE", "")).split(";", 1)[0].strip().lower()


def _content_length(environ: dict[str, Any]) -> int | None:
    text = environ.get("CONTENT_LENGTH") or ""
    if not text.isdigit() or environ.get("HTTP_TRANSFER_ENCODING"):
        return None
    return int(text)


def _respond(start_response: Callable[..., Any], status: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", JSON), ("Content-Length", str(len(body)))])
    return [body]


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
