"""Serving the webhook (TLS) and the status listener over HTTP on a background thread, and stopping cleanly.

The scheduler's listener (``--listen``) is :mod:`.threaded_http`, built for its few busy
connections; these two face the pod network: the API server's webhook calls and the probes and
Prometheus. A production WSGI server, Cheroot (CherryPy's), in this one process, so every request
sees the one in-memory cache the watches feed (a multi-process server would split it). A fixed
pool of worker threads serves the requests; kept-alive connections wait in Cheroot's selector, not
in a thread, between requests, so idle clients cost no thread.
HTTP/1.1 keep-alive, and ``TCP_NODELAY`` on the listening socket (accepted sockets inherit it):
headers and body leave in separate writes, and without it Nagle's algorithm holds the body
until the client's delayed ACK (up to 40 ms per answer). TLS (the webhook) is Python's ``ssl``
with the context we pass, so a certificate reloaded by :mod:`.tls` is served at once. Request
logging is ours (metrics and the routes' log lines): there is no access log.
"""

from __future__ import annotations

import logging
import ssl
import threading
from typing import Any

from cheroot import wsgi
from cheroot.ssl.builtin import BuiltinSSLAdapter
from flask import Flask

log = logging.getLogger(__name__)

THREADS = 32  # webhook calls and probes; the scheduler's verbs are served by threaded_http.py
BACKLOG = 128
IDLE_TIMEOUT_S = 60  # a kept-alive connection with no request for this long is closed


class _ContextAdapter(BuiltinSSLAdapter):
    """Cheroot's TLS adapter over an :class:`ssl.SSLContext` we built (not over file names)."""

    def __init__(self, context: ssl.SSLContext) -> None:  # not the base's: it would load files
        self.certificate = self.private_key = self.certificate_chain = self.ciphers = None
        self.private_key_password = None
        self.context = context
        self._server_env: dict[str, Any] = {}


class HttpServer:
    """The app on ``host:port`` (port 0 picks a free one; see :attr:`port`), over TLS with ``ssl_context``."""

    def __init__(self, app: Flask, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                 name: str = "extender-http", threads: int = THREADS) -> None:
        self._server = wsgi.Server((host, port), app, numthreads=threads, request_queue_size=BACKLOG,
                                   timeout=IDLE_TIMEOUT_S, shutdown_timeout=5, server_name=name)
        if ssl_context is not None:
            self._server.ssl_adapter = _ContextAdapter(ssl_context)
        self._server.prepare()  # binds now: the port is known, and a busy port fails here
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)

    @property
    def host(self) -> str:
        return str(self._server.bind_addr[0])

    @property
    def port(self) -> int:
        return int(self._server.bind_addr[1])

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (if started) and close the listening socket."""
        self._server.stop()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _serve(self) -> None:
        try:
            self._server.serve()
        except Exception:  # the server thread must say why it ended
            log.exception("HTTP server %s stopped", self._server.server_name)
