"""The admission webhooks' HTTP edge (TLS, its own port): POST /validate (the validating webhook),
POST /mutate (the mutating one: our scheduler set on vGPU pods), GET /healthz.

The decisions are :mod:`scheduler_extender.admission`'s. The scheduler's verbs are not served here:
this port is reachable from the API server, the extender's own port only from inside its pod.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import BadRequest, HTTPException, UnsupportedMediaType

from scheduler_extender import admission
from scheduler_extender.config import DEFAULT_SYSTEM_WRITERS

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 * 2**20  # the API server sends at most ~3 MiB objects (etcd's limit), twice for updates


def create_webhook_app(system_writers: Collection[str] = DEFAULT_SYSTEM_WRITERS,
                       stored_node: admission.StoredNode | None = None) -> Flask:
    """The webhook's app; ``system_writers`` may write fastgshare's system annotations;
    ``stored_node`` reads a node as stored from the API server (see
    :mod:`scheduler_extender.admission`)."""
    writers = tuple(system_writers)
    app = Flask(__name__)
    app.config.update(MAX_CONTENT_LENGTH=MAX_BODY_BYTES)
    app.json.sort_keys = False  # type: ignore[attr-defined]

    @app.post("/validate")
    def validate() -> Response:
        try:
            answer = admission.review(_json_body(), system_writers=writers, stored_node=stored_node)
        except admission.ReviewError as error:
            raise BadRequest(str(error)) from None
        response = answer["response"]
        if isinstance(response, dict) and not response["allowed"]:
            log.info("admission denied: %s", response.get("status"))
        return jsonify(answer)

    @app.post("/mutate")
    def mutate() -> Response:
        try:
            answer = admission.mutate(_json_body())
        except admission.ReviewError as error:
            raise BadRequest(str(error)) from None
        response = answer["response"]
        if isinstance(response, dict) and ("patch" in response or "warnings" in response):
            log.info("admission mutated uid=%s patched=%s warnings=%s", response.get("uid"), "patch" in response,
                     response.get("warnings", []))
        return jsonify(answer)

    @app.get("/healthz")
    def healthz() -> Response:
        return jsonify({"status": "ok"})

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> tuple[Response, int]:
        log.warning("webhook rejected request path=%s status=%s reason=%s", request.path, error.code,
                    error.description)
        return jsonify({"error": error.description or error.name}), error.code or 400

    return app


def _json_body() -> object:
    """The request's JSON body, or the HTTP error saying why there is none."""
    if request.mimetype != "application/json":
        raise UnsupportedMediaType(f'Content-Type must be application/json, got "{request.mimetype or "none"}"')
    try:
        return json.loads(request.get_data(cache=False))
    except (ValueError, RecursionError) as error:
        raise BadRequest(f"the body is not valid JSON: {error}") from None
