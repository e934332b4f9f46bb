"""The services' health and metrics endpoint: ``/healthz`` and ``/readyz`` for the kubelet's probes
(200 while the process is sound, else 503) and, where a service has them, ``/metrics`` for
Prometheus. What "sound" means is the service's: the controllers count a standby replica (not the
leader) as healthy, and the leader while its watches and workers are alive. Served on the
``--health-address`` a service takes (:func:`parse_address`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)


class HealthServer:
    """Serves ``GET /healthz`` (and ``/readyz``) from ``check`` and ``GET /metrics`` from
    ``metrics`` (the text format and its content type) in a daemon thread."""

    def __init__(self, host: str, port: int, check: Callable[[], bool],
                 metrics: Callable[[], tuple[bytes, str]] | None = None) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server calls
                if self.path == "/metrics" and metrics is not None:
                    body, content_type = metrics()
                    self.send_response(200)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if self.path not in ("/healthz", "/readyz"):
                    self.send_error(404)
                    return
                ok = check()
                self.send_response(200 if ok else 503)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok\n" if ok else b"unhealthy\n")

            def log_message(self, format: str, *args: object) -> None:
                log.debug("health %s", format % args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="health", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def parse_address(text: str) -> tuple[str, int] | None:
    """``HOST:PORT`` as (host, port); None if it is not that."""
    host, _, port = text.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def start_health(address: str, check: Callable[[], bool],
                 metrics: Callable[[], tuple[bytes, str]] | None = None) -> HealthServer | None:
    """A started :class:`HealthServer` on ``address`` (``HOST:PORT``, checked by the caller with
    :func:`parse_address`); None when ``address`` is empty (off)."""
    where = parse_address(address) if address else None
    if where is None:
        return None
    server = HealthServer(where[0], where[1], check, metrics)
    server.start()
    return server
