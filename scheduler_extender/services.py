"""What the extender's edges call: :class:`Services`, and :func:`build_services`, which wires them.

The cache (:class:`~scheduler_extender.state.ClusterState`), the filter and prioritize decisions,
the binder and the metrics, made from a cache and a :class:`~scheduler_extender.ports.KubePort`;
production (``main``) and tests wire them alike. This module knows no HTTP: the verbs
(:mod:`scheduler_extender.verbs`) take the services they need, and the HTTP edge
(:mod:`scheduler_extender.http`) takes a :class:`Services` whole.
"""

from __future__ import annotations

import attrs

from scheduler_extender.binder import Binder
from scheduler_extender.config import ExtenderConfig
from scheduler_extender.decisions import Decisions
from scheduler_extender.metrics import Metrics
from scheduler_extender.passes import FilterPasses
from scheduler_extender.ports import KubePort
from scheduler_extender.state import ClusterState


@attrs.frozen
class Services:
    """Everything the extender's HTTP edge needs."""

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
