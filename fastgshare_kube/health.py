"""The services' health and metrics endpoint: ``/healthz`` (liveness) and ``/readyz`` (readiness) for
the kubelet's probes (200 while the check says so, else 503) and, where a service has them,
``/metrics`` for Prometheus. What the checks mean is the service's: the controllers count a standby
replica (not the leader) as healthy, and the leader while its watches and workers are alive; a
service that must not get traffic before its cache filled gives ``/readyz`` a check of its own
(``ready``), else ``/readyz`` answers as ``/healthz``. Served on the
``--health-address`` a service takes (:func:`~fastgshare_kube.process.parse_listen`), by
:class:`~fastgshare_kube.guarded_http.GuardedHttpServer`, which no idle or slow client can hold.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from fastgshare_kube.guarded_http import GuardedHttpServer, Limits
from fastgshare_kube.metrics_access import MetricsAccess, guard_metrics
from fastgshare_kube.process import parse_listen

log = logging.getLogger(__name__)

# Probes and scrapes are small and few: a handful of threads, and no one client can hold them
# (fastgshare_kube.guarded_http: deadlines on idle, slow heads and bodies; a connection cap).
LIMITS = Limits(max_connections=256, workers=4, idle_timeout_s=30.0, header_timeout_s=5.0, body_timeout_s=5.0,
                max_body_bytes=64 * 1024)


class HealthServer:
    """Serves ``GET /healthz`` from ``check``, ``/readyz`` from ``ready`` (default: ``check``) and
    ``GET /metrics`` from ``metrics`` (the text format and its content type) from a
    :class:`GuardedHttpServer` (``name``: its threads' name); with ``access``, ``/metrics`` only to
    whom it allows (:mod:`fastgshare_kube.metrics_access`)."""

    def __init__(self, host: str, port: int, check: Callable[[], bool],
                 metrics: Callable[[], tuple[bytes, str]] | None = None, *, limits: Limits = LIMITS,
                 access: MetricsAccess | None = None, ready: Callable[[], bool] | None = None,
                 name: str = "health") -> None:
        checks = {"/healthz": check, "/readyz": ready or check}

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ["PATH_INFO"]
            if environ["REQUEST_METHOD"] not in ("GET", "HEAD"):
                start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET, HEAD")])
                return [b"only GET\n"]
            if path == "/metrics" and metrics is not None:
                body, content_type = metrics()
                start_response("200 OK", [("Content-Type", content_type)])
                return [body]
            if path not in checks:
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"not found\n"]
            ok = checks[path]()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"unhealthy\n"]

        self._server = GuardedHttpServer(app if access is None or metrics is None else guard_metrics(app, access),
                                         host, port, name=name, limits=limits)

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def connections(self) -> int:
        return self._server.connections

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()


def start_health(address: str, check: Callable[[], bool],
                 metrics: Callable[[], tuple[bytes, str]] | None = None, *,
                 access: MetricsAccess | None = None) -> HealthServer | None:
    """A started :class:`HealthServer` on ``address`` (``HOST:PORT``, checked by the caller with
    :func:`~fastgshare_kube.process.parse_listen`); None when ``address`` is empty (off)."""
    if not address:
        return None
    where = parse_listen(address, "--health-address")
    server = HealthServer(where[0], where[1], check, metrics, access=access)
    server.start()
    return server
