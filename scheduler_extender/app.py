"""The Flask application factory and the composition of the services the routes call.

:func:`build_services` wires the cache, the decisions, the binder and the metrics from a
cache and a :class:`~scheduler_extender.ports.KubePort`; production (``main``) and tests use
it alike. :func:`create_app` makes a fresh app around them: there is no module-level app.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
from flask import Flask

from fastgshare_kube.metrics_access import MetricsAccess, guard_metrics
from scheduler_extender import routes
from scheduler_extender.binder import Binder
from scheduler_extender.config import ExtenderConfig
from scheduler_extender.decisions import Decisions
from scheduler_extender.metrics import Metrics
from scheduler_extender.passes import FilterPasses
from scheduler_extender.ports import KubePort
from scheduler_extender.state import ClusterState
from scheduler_extender.verbs import VerbLane

EXTENSION = "fastgshare_extender"


@attrs.frozen
class Services:
    """Everything the routes need."""

    config: ExtenderConfig
    state: ClusterState
    decisions: Decisions
    binder: Binder
    metrics: Metrics


def build_services(config: ExtenderConfig, state: ClusterState, kube: KubePort) -> Services:
    metrics = Metrics()
    metrics.follow_cache(state.sizes)
    passes = FilterPasses()  # what filter passed, per pod: all that bind may bind
    return Services(
        config=config,
        state=state,
        decisions=Decisions(state, config.policy, metrics, passes, best_only=config.filter_passes == "best"),
        binder=Binder(state, kube, default_policy=config.policy, bind_wait_s=config.bind_wait_s, metrics=metrics,
                      passes=passes),
        metrics=metrics,
    )


def create_app(services: Services, settings: Mapping[str, object] | None = None) -> Flask:
    """A new app serving the extender endpoints; ``settings`` override Flask config (tests). The
    scheduler's verbs are answered in front of Flask by :class:`~scheduler_extender.verbs.VerbLane`."""
    app = Flask(__name__)
    app.config.update(MAX_CONTENT_LENGTH=services.config.max_body_bytes)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.config.update(settings or {})
    app.extensions[EXTENSION] = services
    app.register_blueprint(routes.blueprint)
    app.register_blueprint(routes.status)
    app.wsgi_app = VerbLane(services, app.wsgi_app)  # type: ignore[method-assign]
    return app


def create_status_app(services: Services, *, access: MetricsAccess | None = None) -> Flask:
    """Only /healthz, /readyz and /metrics: what may be served beyond the pod's loopback; with
    ``access``, /metrics only to whom it allows (:mod:`fastgshare_kube.metrics_access`)."""
    app = Flask(__name__)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions[EXTENSION] = services
    app.register_blueprint(routes.status)
    if access is not None:
        app.wsgi_app = guard_metrics(app.wsgi_app, access)  # type: ignore[method-assign,assignment]
    return app
