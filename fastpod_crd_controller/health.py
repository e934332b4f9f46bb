"""``/healthz`` for the kubelet's liveness probe: 200 while the process is sound, else 503.

A standby replica (not the leader) is healthy; the leader is healthy while its watches and
workers are alive. Off unless ``--health-address`` is given.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

log = logging.getLogger(__name__)


class HealthServer:
    """Serves ``GET /healthz`` (and ``/readyz``) from ``check`` in a daemon thread."""

    def __init__(self, host: str, port: int, check: Callable[[], bool]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # the name http.server calls
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
