"""What the extender serves around a :class:`~scheduler_extender.services.Services`.

:func:`create_app` is the Flask app ``--listen`` serves (the scheduler's verbs through the
:class:`~.lane.VerbLane`, the routes of :mod:`.routes` behind it; each call makes a fresh app, there
is no module-level app); :func:`status_server` is what ``--metrics-listen`` serves.
"""

from __future__ import annotations

from collections.abc import Mapping

from flask import Flask

from fastgshare_kube.health import HealthServer
from fastgshare_kube.metrics_access import MetricsAccess
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


def status_server(services: Services, host: str, port: int, *, access: MetricsAccess | None = None) -> HealthServer:
    """What ``--metrics-listen`` serves on the pod network, not started: ``/healthz``, ``/readyz``
    (200 once the cache has synced with the API server) and ``/metrics``, on the services' one health
    server (:class:`~fastgshare_kube.health.HealthServer`); with ``access``, ``/metrics`` only to
    whom it allows (:mod:`fastgshare_kube.metrics_access`). The verbs and ``/inspect`` stay on the
    loopback listener."""
    return HealthServer(host, port, lambda: True, services.metrics.exposition, ready=lambda: services.state.synced,
                        access=access, name="extender-status")
