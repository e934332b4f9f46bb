"""Serving the app over HTTP on a background thread, and stopping it cleanly.

Werkzeug's threaded WSGI server, speaking HTTP/1.1 so the scheduler's pooled connections are
kept alive; one thread per connection. Request logging is ours (metrics and the routes'
log lines), so the per-request access log is off.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading

from flask import Flask
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

log = logging.getLogger(__name__)


class _Handler(WSGIRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body leave in separate writes; without this, Nagle's algorithm holds the
        # body until the client's delayed ACK of the headers (up to 40 ms per answer).
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """No access log: every request is timed in the metrics instead."""


class HttpServer:
    """The app on ``host:port`` (port 0 picks a free one; see :attr:`port`), over TLS with ``ssl_context``."""

    def __init__(self, app: Flask, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                 name: str = "extender-http") -> None:
        self._server: BaseWSGIServer = make_server(host, port, app, threaded=True, request_handler=_Handler,
                                                   ssl_context=ssl_context)
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)

    @property
    def host(self) -> str:
        return str(self._server.server_address[0])

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (if started) and close the listening socket."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()
