"""Hostile clients for the HTTP limit tests: idle connections, slow heads, and raising the file limit."""

from __future__ import annotations

import contextlib
import resource
import socket
import ssl
import threading
from collections.abc import Iterator


def raise_file_limit(wanted: int) -> None:
    """Raise the soft limit on open files to ``wanted`` (not above the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard) if hard != resource.RLIM_INFINITY else wanted,
                                                    hard))


@contextlib.contextmanager
def flood(port: int, *, idle: int, slow: int, tls: ssl.SSLContext | None = None) -> Iterator[list[socket.socket]]:
    """``idle`` connections that send nothing (not even a TLS hello) and ``slow`` ones that trickle a
    request head one byte every 0.2 s (over TLS when ``tls``), open while the block runs."""
    sockets: list[socket.socket] = []
    stop = threading.Event()
    try:
        for _ in range(idle):
            sockets.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        slow_sockets = []
        for _ in range(slow):
            sock = socket.create_connection(("127.0.0.1", port), timeout=5)
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname="localhost")
            sockets.append(sock)
            slow_sockets.append(sock)

        def trickle() -> None:
            head = b"POST /validate HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 10_000
            for byte in head:
                if stop.wait(0.2):
                    return
                for sock in slow_sockets:
                    with contextlib.suppress(OSError):
                        sock.send(bytes([byte]))

        thread = threading.Thread(target=trickle, name="slow-heads", daemon=True)
        thread.start()
        yield sockets
    finally:
        stop.set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
