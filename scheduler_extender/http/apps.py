"""The extender's two Flask apps around a :class:`~scheduler_extender.services.Services`.

:func:`create_app` is what ``--listen`` serves (the scheduler's verbs through the
:class:`~.lane.VerbLane`, the routes of :mod:`.routes` behind it); :func:`create_status_app` is
what ``--metrics-listen`` serves. Each call makes a fresh app: there is no module-level app.
"""

from __future__ import annotations

from collections.abc import Mapping

from flask import Flask

from fastgshare_kube.metrics_access import MetricsAccess, guard_metrics
from scheduler_extender.http import routes
from scheduler_extender.http.lane import VerbLane
from scheduler_extender.services import Services


def create_app(services: Services, settings: Mapping[str, object] | None = None) -> Flask:
    """A new app serving the extender endpoints; ``settings`` override Flask config (tests). The
    scheduler's verbs are answered in front of Flask by :class:`~.lane.VerbLane`."""
    app = Flask(__name__)
    app.config.update(MAX_CONTENT_LENGTH=services.config.max_body_bytes)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.config.update(settings or {})
    app.extensions[routes.EXTENSION] = services
    app.register_blueprint(routes.blueprint)
    app.register_blueprint(routes.status)
    app.wsgi_app = VerbLane(services, app.wsgi_app)  # type: ignore[method-assign]
    return app


def create_status_app(services: Services, *, access: MetricsAccess | None = None) -> Flask:
    """Only /healthz, /readyz and /metrics: what may be served beyond the pod's loopback; with
    ``access``, /metrics only to whom it allows (:mod:`fastgshare_kube.metrics_access`)."""
    app = Flask(__name__)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions[routes.EXTENSION] = services
    app.register_blueprint(routes.status)
    if access is not None:
        app.wsgi_app = guard_metrics(app.wsgi_app, access)  # type: ignore[method-assign,assignment]
    return app
