"""Serving the webhook (TLS) and the status listener on a background thread, and stopping cleanly.

The scheduler's listener (``--listen``) is :mod:`.threaded`, built for its few busy loopback
connections; these two face the pod network: the API server's webhook calls, the probes and
Prometheus, and anything else a pod sends. Both are :class:`fastgshare_kube.guarded_http.GuardedHttpServer`
(the one server every service uses there): TLS handshakes run in its event loop, never in the
accept path, with a 2 s deadline; idle, slow-header and slow-body connections are closed on
deadlines; connections are capped (the longest-waiting one makes room) and a fixed pool of
threads runs the app, in this one process so every request sees the one in-memory cache the
watches feed. TLS (the webhook) is Python's ``ssl`` with the context we pass, so a certificate
reloaded by :mod:`.tls` is served at once. Request logging is ours (metrics and the routes' log
lines): there is no access log.
"""

from __future__ import annotations

import ssl

from flask import Flask

from fastgshare_kube.guarded_http import GuardedHttpServer, Limits

WORKERS = 16  # webhook calls and probes; the scheduler's verbs are served by threaded.py
MAX_CONNECTIONS = 256
HANDSHAKE_TIMEOUT_S = 2.0
IDLE_TIMEOUT_S = 30.0  # the API server keeps webhook connections alive between calls
HEADER_TIMEOUT_S = 5.0
BODY_TIMEOUT_S = 5.0  # an AdmissionReview is small; the API server waits at most timeoutSeconds (3 s)
MAX_BODY_BYTES = 8 * 2**20  # AdmissionReviews carry whole objects (a node's status can be large)
LIMITS = Limits(max_connections=MAX_CONNECTIONS, workers=WORKERS, handshake_timeout_s=HANDSHAKE_TIMEOUT_S,
                idle_timeout_s=IDLE_TIMEOUT_S, header_timeout_s=HEADER_TIMEOUT_S, body_timeout_s=BODY_TIMEOUT_S,
                max_body_bytes=MAX_BODY_BYTES)


class HttpServer(GuardedHttpServer):
    """The app on ``host:port`` (port 0 picks a free one; see :attr:`port`), over TLS with ``ssl_context``."""

    def __init__(self, app: Flask, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                 name: str = "extender-http", limits: Limits = LIMITS) -> None:
        super().__init__(app, host, port, ssl_context=ssl_context, name=name, limits=limits)
