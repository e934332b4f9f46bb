"""The HTTP server every service but the gateway puts on the pod network: the controllers' and the
node agent's ``/healthz`` and ``/metrics``, the extender's status port and its admission webhook
(TLS). Any pod can reach these ports, so none of them may be held by a client that connects and
then sends nothing, or sends slowly (issue 37: one idle connection stalled the webhook for 60 s;
400 idle connections to the agent's metrics were 400 threads).

How it holds:

- **One event loop thread** accepts, runs TLS handshakes (non-blocking, never in the accept path),
  and reads each request's head and body. Idle and slow clients cost a file descriptor, not a
  thread.
- **Deadlines, not per-read timeouts**: a TLS handshake must finish within ``handshake_timeout_s``;
  a connection with no request byte for ``idle_timeout_s`` (new or kept alive) is closed; once a
  request's first byte arrived, its whole head must within ``header_timeout_s`` and its body within
  ``body_timeout_s``. Trickling one byte at a time does not extend them.
- **A connection cap**: at ``max_connections``, a new connection closes the one that has waited
  longest without a complete request (so a flood of idle connections cannot lock out the kubelet's
  probe or Prometheus); when every connection has a request in progress, the new one is closed.
- **A fixed pool** of ``workers`` threads runs the WSGI app on complete requests and writes the
  answer (with ``write_timeout_s``). Threads: the loop plus the pool, whatever the clients do.

HTTP/1.1 with keep-alive, bodies only with ``Content-Length`` (``Transfer-Encoding``: 411), a head
over ``max_head_bytes``: 431, a body over ``max_body_bytes``: 413, a malformed head: 400; each of
these closes the connection. The scheduler's own verbs (loopback, few busy connections) have their
own listener, ``scheduler_extender.http.threaded``.
"""

from __future__ import annotations

import collections
import contextlib
import email.utils
import logging
import queue
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable
from io import BytesIO
from typing import Any
from urllib.parse import unquote_to_bytes

import attrs

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

RECV_BYTES = 64 * 1024
ACCEPTS_PER_WAKE = 64
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "date"})
_INTERNAL_ERROR = b'{"Error":"internal server error; see the server\'s log"}'


@attrs.frozen(kw_only=True)
class Limits:
    """What one client may hold of a server, and for how long."""

    max_connections: int = 256
    workers: int = 8
    handshake_timeout_s: float = 2.0
    idle_timeout_s: float = 30.0
    header_timeout_s: float = 5.0
    body_timeout_s: float = 10.0
    write_timeout_s: float = 10.0
    max_head_bytes: int = 16 * 1024
    max_body_bytes: int = 4 * 2**20


@attrs.define(eq=False)
class _Conn:
    sock: socket.socket
    peer: Any
    handshaking: bool
    since: float  # when the current wait began (accept, handshake done, answer sent)
    first_byte: float | None = None
    head_done: float | None = None
    buffer: bytearray = attrs.field(factory=bytearray)
    request: _Request | None = None
    busy: bool = False  # a worker holds it
    continue_sent: bool = False


@attrs.define
class _Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]
    length: int
    keep_alive: bool


class _Refused(Exception):
    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class GuardedHttpServer:
    """``app`` on ``host:port`` (port 0 picks one; see :attr:`port`), over TLS with ``ssl_context``;
    bound at construction, served from :meth:`start` until :meth:`stop`."""

    def __init__(self, app: WsgiApp, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None,
                 name: str = "http", limits: Limits | None = None) -> None:
        self._app = app
        self._name = name
        self._tls = ssl_context
        self.limits = limits or Limits()
        host = host or "0.0.0.0"
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self._listener = socket.create_server((host, port), family=family, backlog=128)
        self._listener.setblocking(False)
        self._address = self._listener.getsockname()
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._returned: collections.deque[tuple[_Conn, bool]] = collections.deque()
        self._jobs: queue.SimpleQueue[_Conn | None] = queue.SimpleQueue()
        self._conns: set[_Conn] = set()
        self._stopping = False
        self._loop = threading.Thread(target=self._run_loop, name=name, daemon=True)
        self._workers = [threading.Thread(target=self._work, name=f"{name}-worker", daemon=True)
                         for _ in range(self.limits.workers)]

    @property
    def host(self) -> str:
        return str(self._address[0])

    @property
    def port(self) -> int:
        return int(self._address[1])

    @property
    def connections(self) -> int:
        """Connections open now (served, waiting or in a handshake)."""
        return len(self._conns)

    def start(self) -> None:
        for worker in self._workers:
            worker.start()
        self._loop.start()

    def stop(self) -> None:
        """Stop accepting, close every connection, let requests in progress finish (5 s at most)."""
        self._stopping = True
        self._wake()
        if self._loop.is_alive():
            self._loop.join(timeout=5)
        self._listener.close()
        for _ in self._workers:
            self._jobs.put(None)
        deadline = time.monotonic() + 5
        for worker in self._workers:
            if worker.is_alive():
                worker.join(timeout=max(0.0, deadline - time.monotonic()))
        for conn in list(self._conns):
            self._close(conn)
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    # --- the loop ------------------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")

    def _run_loop(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stopping:
                for key, events in self._selector.select(timeout=self._next_deadline()):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._on_ready(key.data, events)
                self._take_back()
                self._expire()
        except Exception:  # the loop must say why it ended
            log.exception("%s: the server loop stopped", self._name)
        finally:
            self._listener.close()
            for conn in list(self._conns):
                if not conn.busy:
                    self._close(conn)

    def _next_deadline(self) -> float:
        now = time.monotonic()
        deadlines = [self._deadline(c) for c in self._conns if not c.busy]
        return max(0.0, min(deadlines) - now) if deadlines else 1.0

    def _deadline(self, conn: _Conn) -> float:
        limits = self.limits
        if conn.handshaking:
            return conn.since + limits.handshake_timeout_s
        if conn.head_done is not None:
            return conn.head_done + limits.body_timeout_s
        if conn.first_byte is not None:
            return conn.first_byte + limits.header_timeout_s
        return conn.since + limits.idle_timeout_s

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._conns if not c.busy and self._deadline(c) <= now]:
            log.debug("%s: closing %s (%s)", self._name, conn.peer, self._phase(conn))
            self._close(conn)

    @staticmethod
    def _phase(conn: _Conn) -> str:
        if conn.handshaking:
            return "TLS handshake too slow"
        if conn.head_done is not None:
            return "request body too slow"
        return "request head too slow" if conn.first_byte is not None else "idle"

    def _accept(self) -> None:
        for _ in range(ACCEPTS_PER_WAKE):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as error:  # out of file descriptors: leave the rest in the backlog
                log.warning("%s: accept failed (%s)", self._name, error)
                return
            if len(self._conns) >= self.limits.max_connections and not self._evict():
                sock.close()
                continue
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            handshaking = False
            if self._tls is not None:
                try:
                    sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError) as error:
                    log.debug("%s: TLS setup failed for %s: %s", self._name, peer, error)
                    sock.close()
                    continue
                handshaking = True
            conn = _Conn(sock=sock, peer=peer, handshaking=handshaking, since=time.monotonic())
            self._conns.add(conn)
            self._selector.register(sock, selectors.EVENT_READ, conn)
            if handshaking:
                self._handshake(conn)

    def _evict(self) -> bool:
        """Close the connection that has waited longest without a complete request; False if none."""
        waiting = [c for c in self._conns if not c.busy]
        if not waiting:
            return False
        self._close(min(waiting, key=lambda c: c.since))
        return True

    def _on_ready(self, conn: _Conn, events: int) -> None:
        if conn not in self._conns or conn.busy:
            return
        if conn.handshaking:
            self._handshake(conn)
            return
        self._read(conn)

    def _handshake(self, conn: _Conn) -> None:
        assert isinstance(conn.sock, ssl.SSLSocket)
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return
        except (OSError, ValueError) as error:
            log.debug("%s: TLS handshake with %s failed: %s", self._name, conn.peer, error)
            self._close(conn)
            return
        conn.handshaking = False
        conn.since = time.monotonic()
        self._selector.modify(conn.sock, selectors.EVENT_READ, conn)
        self._read(conn)

    def _read(self, conn: _Conn) -> None:
        try:
            while True:
                chunk = conn.sock.recv(RECV_BYTES)
                if not chunk:
                    self._close(conn)
                    return
                conn.buffer += chunk
                if len(conn.buffer) > self.limits.max_head_bytes + self.limits.max_body_bytes:
                    break
                if not (isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending()):
                    break
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            pass
        except OSError as error:
            log.debug("%s: connection from %s ended: %s", self._name, conn.peer, error)
            self._close(conn)
            return
        self._advance(conn)

    def _advance(self, conn: _Conn) -> None:
        """Parse what arrived; hand a complete request to a worker."""
        if conn.buffer and conn.first_byte is None:
            conn.first_byte = time.monotonic()
        try:
            if conn.request is None:
                end = conn.buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(conn.buffer) > self.limits.max_head_bytes:
                        raise _Refused("431 Request Header Fields Too Large",
                                       f"the request line and headers are over {self.limits.max_head_bytes} bytes")
                    return
                if end > self.limits.max_head_bytes:
                    raise _Refused("431 Request Header Fields Too Large",
                                   f"the request line and headers are over {self.limits.max_head_bytes} bytes")
                conn.request = _parse_head(bytes(conn.buffer[:end]), self.limits.max_body_bytes)
                del conn.buffer[:end + 4]
                conn.head_done = time.monotonic()
            request = conn.request
            if len(conn.buffer) < request.length:
                if request.headers.get("HTTP_EXPECT", "").lower() == "100-continue" and not conn.continue_sent:
                    conn.continue_sent = True
                    with contextlib.suppress(OSError):
                        conn.sock.send(b"HTTP/1.1 100 Continue\r\n\r\n")
                return
        except _Refused as refused:
            self._refuse(conn, refused)
            return
        conn.busy = True
        self._selector.unregister(conn.sock)
        self._jobs.put(conn)

    def _refuse(self, conn: _Conn, refused: _Refused) -> None:
        body = _error_body(str(refused))
        head = (f"HTTP/1.1 {refused.status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n").encode()
        with contextlib.suppress(OSError, ValueError):
            conn.sock.send(head + body)
        self._close(conn)

    def _take_back(self) -> None:
        while self._returned:
            conn, keep = self._returned.popleft()
            conn.busy = False
            if not keep or self._stopping:
                self._close(conn)
                continue
            conn.request, conn.head_done, conn.continue_sent = None, None, False
            conn.since, conn.first_byte = time.monotonic(), None
            try:
                conn.sock.setblocking(False)
                self._selector.register(conn.sock, selectors.EVENT_READ, conn)
            except (OSError, ValueError):
                self._close(conn)
                continue
            self._advance(conn)  # a pipelined request may be here already

    def _close(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()

    # --- the workers ---------------------------------------------------------------------------
    def _work(self) -> None:
        while (conn := self._jobs.get()) is not None:
            keep = False
            try:
                keep = self._serve(conn)
            except Exception as error:  # a peer gone while we answered: nothing more to do
                log.debug("%s: answering %s failed: %s", self._name, conn.peer, error)
            self._returned.append((conn, keep))
            self._wake()

    def _serve(self, conn: _Conn) -> bool:
        request = conn.request
        assert request is not None
        body = bytes(conn.buffer[:request.length])
        del conn.buffer[:request.length]
        status, headers, chunks = self._call_app(conn, request, body)
        keep = request.keep_alive and not self._stopping
        lines = [f"HTTP/1.1 {status}"]
        lines += [f"{k}: {v}" for k, v in headers if k.lower() not in _HOP_BY_HOP]
        payload = b"" if request.method == "HEAD" else b"".join(chunks)
        lines.append(f"Content-Length: {len(b''.join(chunks))}")
        lines.append(f"Date: {email.utils.formatdate(usegmt=True)}")
        if not keep:
            lines.append("Connection: close")
        conn.sock.settimeout(self.limits.write_timeout_s)
        conn.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace") + payload)
        return keep

    def _call_app(self, conn: _Conn, request: _Request, body: bytes) -> tuple[str, list[tuple[str, str]], list[bytes]]:
        path, _, query = request.target.partition("?")
        if "://" in path:  # absolute form: http://host/path
            path = "/" + path.split("://", 1)[1].partition("/")[2]
        path = unquote_to_bytes(path).decode("latin-1")
        environ: dict[str, Any] = {
            "REQUEST_METHOD": request.method, "SCRIPT_NAME": "", "PATH_INFO": path, "QUERY_STRING": query,
            "RAW_URI": request.target, "REQUEST_URI": request.target, "SERVER_PROTOCOL": request.version,
            "REMOTE_ADDR": str(conn.peer[0]), "REMOTE_PORT": str(conn.peer[1]),
            "SERVER_NAME": self.host, "SERVER_PORT": str(self.port),
            "wsgi.version": (1, 0), "wsgi.url_scheme": "https" if self._tls else "http",
            "wsgi.input": BytesIO(body), "wsgi.errors": sys.stderr, "wsgi.multithread": True,
            "wsgi.multiprocess": False, "wsgi.run_once": False, "wsgi.input_terminated": True,
            **request.headers,
        }
        return call_wsgi(self._app, environ, name=self._name)


def call_wsgi(app: WsgiApp, environ: dict[str, Any], *, name: str,
              passthrough: tuple[type[BaseException], ...] = ()) -> tuple[str, list[tuple[str, str]], list[bytes]]:
    """One request through a WSGI ``app``: (status, headers, body chunks), collected whole (nothing is
    sent before the app returns; a later ``start_response`` replaces an earlier one). An app that
    fails, or returns without calling ``start_response``, is a 500 and one log line naming ``name``;
    exceptions of ``passthrough`` (the connection's own, raised through ``wsgi.input``) propagate.
    Both of our servers use it: this one and ``scheduler_extender.http.threaded``."""
    started: list[Any] = []
    chunks: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
        started[:] = [status, headers]
        return chunks.append

    try:
        result = app(environ, start_response)
        try:
            chunks.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        if not started:
            raise RuntimeError("the WSGI app returned without calling start_response")
    except passthrough:
        raise
    except Exception:
        log.exception("%s: the app failed on %s %s", name, environ.get("REQUEST_METHOD"), environ.get("RAW_URI"))
        return "500 Internal Server Error", [("Content-Type", "application/json")], [_INTERNAL_ERROR]
    return str(started[0]), list(started[1]), chunks


def _parse_head(head: bytes, max_body: int) -> _Request:
    lines = head.lstrip(b"\r\n").split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise _Refused("400 Bad Request", "the request line is not METHOD TARGET HTTP-VERSION")
    method, target, version = (part.decode("latin-1") for part in parts)
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _Refused("505 HTTP Version Not Supported", f"{version} is not served; HTTP/1.1 and 1.0 are")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or b" " in name:
            raise _Refused("400 Bad Request", "a header line is not NAME: VALUE")
        if b"_" in name:  # X_A and X-A would both be HTTP_X_A: dropped, as nginx does
            continue
        key = name.decode("latin-1").upper().replace("-", "_")
        key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"
        text = value.strip(b" \t").decode("latin-1")
        headers[key] = f"{headers[key]},{text}" if key in headers and key != "CONTENT_LENGTH" else text
    if "HTTP_TRANSFER_ENCODING" in headers:
        raise _Refused("411 Length Required", "a body needs Content-Length (Transfer-Encoding is not served)")
    length_text = headers.get("CONTENT_LENGTH", "0") or "0"
    if not (length_text.isascii() and length_text.isdigit()):
        raise _Refused("400 Bad Request", f"Content-Length {length_text!r} is not a length in bytes")
    if int(length_text) > max_body:
        raise _Refused("413 Content Too Large", f"a body of {length_text} bytes is over {max_body}")
    connection = {token.strip().lower() for token in headers.get("HTTP_CONNECTION", "").split(",")}
    keep_alive = version == "HTTP/1.1" and "close" not in connection
    return _Request(method=method, target=target, version=version, headers=headers, length=int(length_text),
                    keep_alive=keep_alive)


def _error_body(reason: str) -> bytes:
    return ('{"Error":"' + reason.replace("\\", "\\\\").replace('"', '\\"') + '"}').encode()
