"""The HTTP edge's Flask routes: the scheduler's verbs, ``/inspect``, the status endpoints, and JSON
answers for every error.

Each verb route reads a size-capped JSON body, decodes it with :mod:`~scheduler_extender.wire`,
calls its verb (:mod:`scheduler_extender.verbs`) and sends the answer; the lane in front
(:mod:`.lane`) answers well-formed verb requests before Flask, so these routes answer the rest.
Bad requests (not JSON, wrong content type, too large, wrong shape, unknown path or method) get a
4xx JSON body ``{"Error": ...}`` and a log line; an unexpected failure gets a 500 JSON body
without a traceback (that goes to the log).
"""

from __future__ import annotations

import json
import logging
import time
from typing import cast

from flask import Blueprint, Response, current_app, g, jsonify, request
from werkzeug.exceptions import BadRequest, HTTPException, NotFound, UnsupportedMediaType

from scheduler_extender import inspection, verbs, wire
from scheduler_extender.services import Services

log = logging.getLogger(__name__)
INSPECT_NAMES = 10  # node names an unknown-node answer lists
EXTENSION = "fastgshare_extender"  # where an app keeps its Services (app.extensions)

blueprint = Blueprint("extender", __name__)
# The read-only endpoints, also served alone on --metrics-listen (probes and Prometheus reach
# them over the pod network, while the verbs stay on the loopback address).
status = Blueprint("extender_status", __name__)


def _services() -> Services:
    return cast("Services", current_app.extensions[EXTENSION])


@blueprint.post("/filter")
def filter_nodes() -> Response:
    args = wire.decode_extender_args(_json_body())
    return Response(verbs.filter_nodes(args, _services().decisions), mimetype="application/json")


@blueprint.post("/prioritize")
def prioritize() -> Response:
    args = wire.decode_extender_args(_json_body())
    return Response(verbs.prioritize(args, _services().decisions), mimetype="application/json")


@blueprint.post("/bind")
def bind() -> Response:
    args = wire.decode_binding_args(_json_body())
    return Response(verbs.bind(args, _services().binder), mimetype="application/json")


@status.get("/healthz")
def healthz() -> Response:
    return jsonify({"status": "ok"})


@status.get("/readyz")
def readyz() -> tuple[Response, int]:
    if _services().state.synced:
        return jsonify({"status": "ready"}), 200
    return jsonify({"status": "not ready: the cache has not synced with the API server yet"}), 503


@status.get("/metrics")
def metrics() -> Response:
    body, content_type = _services().metrics.exposition()
    return Response(body, content_type=content_type)


@blueprint.get("/inspect")
def inspect() -> Response:
    services = _services()
    snapshot, node = services.state.snapshot(), request.args.get("node")
    if node is not None and node not in snapshot.nodes:
        known = sorted(snapshot.nodes)
        listed = ", ".join(known[:INSPECT_NAMES]) + (f" and {len(known) - INSPECT_NAMES} more"
                                                    if len(known) > INSPECT_NAMES else "")
        raise NotFound(f"node {node[:100]!r} is not in the extender's cache; the nodes it knows: {listed or 'none'} "
                       "(GET /inspect lists them all)")
    view = inspection.describe(snapshot, only_node=node)
    return jsonify({"policy": services.config.policy.value, "bindWaitSeconds": services.config.bind_wait_s,
                    "bindWindow": services.config.bind_window, "filterPasses": services.config.filter_passes,
                    **view})


def _json_body() -> object:
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(f'Content-Type must be application/json, got "{request.mimetype or "none"}"')
    data = request.get_data(cache=False)  # over MAX_CONTENT_LENGTH: 413
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as error:
        raise BadRequest(f"the body is not valid JSON: {error}") from None


# --- timing and errors (app-wide, so unknown paths are answered and timed too) ------------
@blueprint.before_app_request
def _start_timer() -> None:
    g.started = time.perf_counter()


@blueprint.after_app_request
def _observe(response: Response) -> Response:
    started = g.get("started")
    if started is not None:
        _services().metrics.request_seconds.labels(_verb()).observe(time.perf_counter() - started)
    return response


@blueprint.app_errorhandler(wire.WireError)
def _bad_shape(error: wire.WireError) -> tuple[Response, int]:
    return _rejected(400, f"malformed extender request: {error}")


@blueprint.app_errorhandler(HTTPException)
def _http_error(error: HTTPException) -> tuple[Response, int]:
    return _rejected(error.code or 400, error.description or error.name)


@blueprint.app_errorhandler(Exception)
def _unexpected(error: Exception) -> tuple[Response, int]:
    log.exception("internal error method=%s path=%s", request.method, request.path)
    _services().metrics.fail(_verb(), {"internal-error": 1})
    return jsonify({"Error": wire.internal_error_text(error)}), 500


def _rejected(status: int, message: str) -> tuple[Response, int]:
    log.warning("rejected request method=%s path=%s status=%d reason=%s", request.method, request.path, status,
                message)
    _services().metrics.fail(_verb(), {f"http-{status}": 1})
    return jsonify({"Error": wire.scheduler_text(message)}), status


def _verb() -> str:
    return request.url_rule.rule.lstrip("/") if request.url_rule is not None else "unknown"
