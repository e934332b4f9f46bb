"""The scheduler's listener: a small HTTP/1.1 server for a WSGI app, one thread per connection.

kube-scheduler calls ``/filter`` and ``/prioritize`` for every pod on a few kept-alive
connections, with bodies of ~70 KB at 5,000 nodes, and waits for each answer. Cheroot (which
served the webhook and the status listener until issue 37; :mod:`.guarded` now uses
``fastgshare_kube.guarded_http``) hands every request
from its selector thread to a worker thread and back, reads through Python's pure-Python ``_pyio``
buffers, and writes the head and the body separately. Measured on loopback with a C client, the
same 70 KB request and 65 KB answer from a WSGI app that does nothing else: Cheroot 0.58–0.75 ms
p50 and 2.1–2.4 ms p99, a thread per connection that reads into one buffer and answers in one
write 0.09–0.10 ms and 0.45–0.57 ms. Here, the thread that read a request answers it and waits for
the next one on its connection.

What it speaks:

- HTTP/1.1, kept alive until the client sends ``Connection: close`` (or closes); HTTP/1.0 gets
  one answer and the connection closes. Pipelined requests are answered in order.
- A body only with ``Content-Length``. A request with ``Transfer-Encoding`` (a chunked upload) is
  answered 411 and its connection closed: without a length the next request cannot be found.
- ``Expect: 100-continue``: the interim ``100 Continue`` is sent when the app first reads the body.
- A request head over 64 KiB: 431; a malformed request line, header or ``Content-Length``: 400;
  another HTTP version: 505. Each closes the connection.
- Every answer goes out in one write, with its ``Content-Length`` (the length of what the app
  returned; a ``HEAD`` answer keeps the app's and sends no body) and a ``Date``.
- A body the app did not read is read and dropped when it is small (64 KiB), else the connection closes.
- A connection that sends nothing for ``idle_timeout_s`` (between requests or in the middle of one)
  is closed; once a request's first byte came, its whole head must within ``header_timeout_s`` and
  its body within ``body_timeout_s`` (deadlines: trickling bytes does not extend them). At most
  ``max_connections`` connections are served at once; more wait in the listen backlog until one
  ends. This listener is on the pod's loopback (only the scheduler reaches it); what faces the pod
  network is ``fastgshare_kube.guarded_http``.
- An app that raises gets a 500 with a JSON error and no traceback (that goes to the log).
- :meth:`~ThreadedHttpServer.stop` stops accepting, closes idle connections at once, and gives
  requests in progress up to 5 s to finish.

Header names with an underscore are dropped (``X_A`` and ``X-A`` would both become ``HTTP_X_A``),
as nginx and Cheroot do.
"""

from __future__ import annotations

import contextlib
import email.utils
import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import unquote_to_bytes

from fastgshare_kube.guarded_http import call_wsgi

log = logging.getLogger(__name__)

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

MAX_CONNECTIONS = 128
IDLE_TIMEOUT_S = 60.0
HEADER_TIMEOUT_S = 10.0  # from a request's first byte to the end of its head
BODY_TIMEOUT_S = 30.0  # from the end of the head to the end of the body (~70 KB from kube-scheduler)
STOP_GRACE_S = 5.0
BACKLOG = 128
MAX_HEAD_BYTES = 64 * 1024
DRAIN_MAX_BYTES = 64 * 1024
RECV_BYTES = 256 * 1024
PREALLOCATE_MAX_BYTES = 4 * 2**20  # a body up to this is read into one buffer of its size
LINGER_S = 1.0  # after the last answer, how long to read what the client still sends before closing
LINGER_MAX_BYTES = 2**20
_TOKEN = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "date"})
_NO_BODY_STATUS = frozenset({204, 304})


class _BadRequest(Exception):
    """A request this server answers itself with ``status`` and then closes the connection."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class _Closed(Exception):
    """The peer closed the connection in the middle of a request."""


class ThreadedHttpServer:
    """``app`` on ``host:port`` (port 0 picks a free one; see :attr:`port`); bound at construction."""

    def __init__(self, app: WsgiApp, host: str, port: int, *, name: str = "extender-http",
                 max_connections: int = MAX_CONNECTIONS, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 header_timeout_s: float = HEADER_TIMEOUT_S, body_timeout_s: float = BODY_TIMEOUT_S) -> None:
        self._app = app
        self._name = name
        self._idle_timeout_s = idle_timeout_s
        self._header_timeout_s = header_timeout_s
        self._body_timeout_s = body_timeout_s
        host = host or "0.0.0.0"
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        self._listener = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self._address = self._listener.getsockname()
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()  # guards _stopping and every connection's idle flag
        self._stopping = False
        self._connections: set[_Connection] = set()
        self._accepter = threading.Thread(target=self._accept_loop, name=name, daemon=True)
        self._date = _DateHeader()

    @property
    def host(self) -> str:
        return str(self._address[0])

    @property
    def port(self) -> int:
        return int(self._address[1])

    def start(self) -> None:
        self._accepter.start()

    def stop(self) -> None:
        """Stop accepting, close idle connections, let requests in progress finish (5 s at most)."""
        with self._lock:
            self._stopping = True
            connections = list(self._connections)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        if self._accepter.is_alive():
            self._accepter.join(timeout=STOP_GRACE_S)
        self._listener.close()
        for connection in connections:
            if connection.idle:  # set under the lock: it will not start another request
                connection.shut()
        deadline = time.monotonic() + STOP_GRACE_S
        for connection in connections:
            connection.thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for connection in connections:
            if connection.thread.is_alive():
                connection.shut()
                connection.thread.join(timeout=1)

    # --- accepting ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while True:
            while not self._slots.acquire(timeout=0.5):
                if self._stopping:
                    return
            try:
                sock, peer = self._listener.accept()
            except OSError as error:
                self._slots.release()
                if self._stopping:
                    return
                log.warning("%s: accept failed (%s); retrying in 0.1 s", self._name, error)
                time.sleep(0.1)  # out of file descriptors: connections wait in the backlog meanwhile
                continue
            with self._lock:
                if self._stopping:
                    sock.close()
                    self._slots.release()
                    return
                connection = _Connection(self, sock, peer)
                self._connections.add(connection)
            connection.thread.start()

    def _ended(self, connection: _Connection) -> None:
        with self._lock:
            self._connections.discard(connection)
        self._slots.release()

    def _begin_wait(self, connection: _Connection) -> bool:
        """Mark ``connection`` idle before it waits for a request; False once the server stops."""
        with self._lock:
            connection.idle = not self._stopping
            return connection.idle

    def _end_wait(self, connection: _Connection) -> None:
        with self._lock:
            connection.idle = False


class _Connection:
    """One client connection: its requests, one after another, on its own thread."""

    def __init__(self, server: ThreadedHttpServer, sock: socket.socket, peer: Any) -> None:
        self.server = server
        self.sock = sock
        self.peer = peer
        self.idle = False
        self.thread = threading.Thread(target=self._run, name=f"{server._name}-connection", daemon=True)
        self._reader = _Reader(sock, server._idle_timeout_s)

    def shut(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def _run(self) -> None:
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock.settimeout(self.server._idle_timeout_s)
            while self.server._begin_wait(self) and self._serve_one():
                pass
        except (OSError, _Closed) as error:  # a reset, a timeout, a peer gone mid-request: nothing to answer
            log.debug("%s: connection from %s ended: %s", self.server._name, self.peer, error)
        finally:
            self._linger()
            with contextlib.suppress(OSError):
                self.sock.close()
            self.server._ended(self)

    def _linger(self) -> None:
        """Close our side, then read what the client still sends (1 s, 1 MiB at most): closing with
        unread input would reset the connection and could destroy the answer the client has not read."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
            self.sock.settimeout(LINGER_S)
            deadline, drained = time.monotonic() + LINGER_S, 0
            while drained < LINGER_MAX_BYTES and time.monotonic() < deadline:
                chunk = self.sock.recv(RECV_BYTES)
                if not chunk:
                    break
                drained += len(chunk)

    def _serve_one(self) -> bool:
        """Read one request and answer it; whether the connection stays open for another."""
        try:
            try:
                head = self._reader.head(MAX_HEAD_BYTES, self.server._header_timeout_s)
            finally:
                self.server._end_wait(self)
            if head is None:
                return False
            self._reader.deadline = time.monotonic() + self.server._body_timeout_s
            request = _parse_head(head)
        except _BadRequest as error:
            self._send(error.status, [("Content-Type", "application/json")],
                       _error_body(str(error)), keep_alive=False, head_only=False)
            return False
        keep_alive = request.keep_alive
        body = _Body(self._reader, request.content_length,
                     self._send_continue if request.expects_continue else None)
        status, headers, chunks = self._call_app(request, body)
        if body.remaining:
            if body.remaining <= DRAIN_MAX_BYTES and not body.awaiting_continue:
                body.read()
            else:
                keep_alive = False
        keep_alive = keep_alive and not body.truncated and not self.server._stopping
        self._reader.deadline = None
        self._send(status, headers, b"".join(chunks), keep_alive=keep_alive, head_only=request.method == "HEAD")
        return keep_alive

    def _call_app(self, request: _Request, body: _Body) -> tuple[str, list[tuple[str, str]], list[bytes]]:
        return call_wsgi(self.server._app, self._environ(request, body), name=self.server._name,
                         passthrough=(_Closed, OSError))

    def _environ(self, request: _Request, body: _Body) -> dict[str, Any]:
        environ: dict[str, Any] = {
            "REQUEST_METHOD": request.method, "SCRIPT_NAME": "", "PATH_INFO": request.path,
            "QUERY_STRING": request.query, "RAW_URI": request.target, "REQUEST_URI": request.target,
            "SERVER_PROTOCOL": request.version, "REMOTE_ADDR": str(self.peer[0]), "REMOTE_PORT": str(self.peer[1]),
            "wsgi.version": (1, 0), "wsgi.url_scheme": "http", "wsgi.input": body, "wsgi.errors": sys.stderr,
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
            "wsgi.input_terminated": True,
        }
        environ["SERVER_NAME"], environ["SERVER_PORT"] = self.server.host, str(self.server.port)
        environ.update(request.environ_headers)
        return environ

    def _send(self, status: str, headers: list[tuple[str, str]], body: bytes, *, keep_alive: bool,
              head_only: bool) -> None:
        code = int(status[:3]) if status[:3].isdigit() else 500
        lines = [f"HTTP/1.1 {status}"]
        length = None
        for name, value in headers:
            lowered = name.lower()
            if lowered == "content-length" and head_only:
                length = value
            if lowered not in _HOP_BY_HOP:
                lines.append(f"{name}: {value}")
        if code not in _NO_BODY_STATUS:
            lines.append(f"Content-Length: {length if length is not None else len(body)}")
        lines.append(f"Date: {self.server._date.now()}")
        if not keep_alive:
            lines.append("Connection: close")
        payload = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="replace")  # PEP 3333: latin-1
        self.sock.settimeout(self.server._idle_timeout_s)
        if not head_only and code not in _NO_BODY_STATUS:
            payload += body
        self.sock.sendall(payload)

    def _send_continue(self) -> None:
        self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")


class _Request:
    __slots__ = ("content_length", "environ_headers", "expects_continue", "keep_alive", "method", "path", "query",
                 "target", "version")

    def __init__(self, method: str, target: str, version: str, headers: dict[str, str]) -> None:
        self.method, self.target, self.version = method, target, version
        path = target
        if "://" in path.split("?", 1)[0]:  # absolute form: http://host/path
            path = "/" + path.split("://", 1)[1].partition("/")[2]
        path, _, self.query = path.partition("?")
        self.path = unquote_to_bytes(path).decode("latin-1")
        if "HTTP_TRANSFER_ENCODING" in headers:
            raise _BadRequest("411 Length Required", "a body needs Content-Length (Transfer-Encoding is not served)")
        length_text = headers.get("CONTENT_LENGTH", "")
        if length_text and not (length_text.isascii() and length_text.isdigit()):  # not '²': int() refuses it
            raise _BadRequest("400 Bad Request", f"Content-Length {length_text!r} is not a length in bytes")
        self.content_length = int(length_text) if length_text else 0
        connection = {token.strip().lower() for token in headers.get("HTTP_CONNECTION", "").split(",")}
        self.keep_alive = version == "HTTP/1.1" and "close" not in connection
        self.expects_continue = (headers.get("HTTP_EXPECT", "").lower() == "100-continue"
                                 and version == "HTTP/1.1" and self.content_length > 0)
        self.environ_headers = headers


def _parse_head(head: bytes) -> _Request:
    lines = head.lstrip(b"\r\n").split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1]:
        raise _BadRequest("400 Bad Request", "the request line is not METHOD TARGET HTTP-VERSION")
    method, target, version = (part.decode("latin-1") for part in parts)
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise _BadRequest("505 HTTP Version Not Supported", f"{version} is not served; HTTP/1.1 and 1.0 are")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not _TOKEN.fullmatch(name):
            raise _BadRequest("400 Bad Request", "a header line is not NAME: VALUE")
        if b"_" in name:
            continue
        key = name.decode("latin-1").upper().replace("-", "_")
        key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else f"HTTP_{key}"
        text = value.strip(b" \t").decode("latin-1")
        if key in headers:
            if key == "CONTENT_LENGTH":
                if headers[key] != text:
                    raise _BadRequest("400 Bad Request", "the request has two different Content-Length headers")
                continue
            text = f"{headers[key]},{text}"
        headers[key] = text
    return _Request(method, target, version, headers)


class _Reader:
    """What the connection received and has not used yet, and more from the socket on demand."""

    def __init__(self, sock: socket.socket, idle_timeout_s: float) -> None:
        self._sock = sock
        self._buffer = bytearray()
        self._idle_timeout_s = idle_timeout_s
        self.deadline: float | None = None  # monotonic time by which the current head or body must be in

    def _wait(self) -> None:
        """Set the socket's timeout for the next receive: the idle timeout, cut to the deadline."""
        if self.deadline is None:
            self._sock.settimeout(self._idle_timeout_s)
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request's head or body came too slowly")
        self._sock.settimeout(min(self._idle_timeout_s, left))

    def _recv(self, size: int) -> bytes:
        self._wait()
        return self._sock.recv(size)

    def head(self, limit: int, header_timeout_s: float) -> bytes | None:
        """The next request's head (without its blank line); None if the peer closed between requests.
        Once its first byte is here, the rest must come within ``header_timeout_s``."""
        searched = 0
        self.deadline = time.monotonic() + header_timeout_s if self._buffer.strip() else None
        while True:
            end = self._buffer.find(b"\r\n\r\n", max(0, searched - 3))
            if end > limit:
                raise _BadRequest("431 Request Header Fields Too Large",
                                  f"the request line and headers are over {limit} bytes")
            if end >= 0:
                head = bytes(self._buffer[:end])
                del self._buffer[:end + 4]
                return head
            if len(self._buffer) > limit:
                raise _BadRequest("431 Request Header Fields Too Large",
                                  f"the request line and headers are over {limit} bytes")
            searched = len(self._buffer)
            chunk = self._recv(RECV_BYTES)
            if not chunk:
                if self._buffer.strip():
                    raise _Closed("the connection closed in the middle of a request head")
                return None
            if self.deadline is None and chunk.strip():
                self.deadline = time.monotonic() + header_timeout_s
            self._buffer += chunk

    def exactly(self, count: int) -> bytes:
        """``count`` bytes, fewer only if the peer closed first."""
        if len(self._buffer) >= count:
            data = bytes(self._buffer[:count])
            del self._buffer[:count]
            return data
        if count - len(self._buffer) > PREALLOCATE_MAX_BYTES:  # memory only for what arrives, not what is claimed
            while len(self._buffer) < count and (chunk := self._recv(min(RECV_BYTES, count - len(self._buffer)))):
                self._buffer += chunk
            data = bytes(self._buffer[:count])
            del self._buffer[:count]
            return data
        out = bytearray(count)
        have = len(self._buffer)
        out[:have] = self._buffer
        self._buffer.clear()
        view = memoryview(out)
        while have < count:
            self._wait()
            received = self._sock.recv_into(view[have:])
            if received == 0:
                break
            have += received
        view.release()
        return bytes(out[:have]) if have < count else bytes(out)

    def line(self, limit: int) -> bytes:
        """Up to and including the next newline, at most ``limit`` bytes."""
        while True:
            end = self._buffer.find(b"\n", 0, limit)
            if end >= 0 or len(self._buffer) >= limit:
                size = end + 1 if end >= 0 else limit
                data = bytes(self._buffer[:size])
                del self._buffer[:size]
                return data
            chunk = self._recv(RECV_BYTES)
            if not chunk:
                data = bytes(self._buffer)
                self._buffer.clear()
                return data
            self._buffer += chunk


class _Body:
    """``wsgi.input``: the request's body, never past its ``Content-Length``."""

    def __init__(self, reader: _Reader, length: int, send_continue: Callable[[], None] | None) -> None:
        self._reader = reader
        self.remaining = length
        self.truncated = False  # the peer closed before the whole body came
        self._send_continue = send_continue

    @property
    def awaiting_continue(self) -> bool:
        """The client waits for ``100 Continue`` before it sends the body."""
        return self._send_continue is not None

    def read(self, size: int | None = -1) -> bytes:
        wanted = self._start(size)
        data = self._reader.exactly(wanted) if wanted else b""
        self._account(data, wanted)
        return data

    def readline(self, size: int | None = -1) -> bytes:
        wanted = self._start(size)
        data = self._reader.line(wanted) if wanted else b""
        self._account(data, len(data) if data.endswith(b"\n") or len(data) == wanted else wanted)
        return data

    def readlines(self, hint: int = -1) -> list[bytes]:
        lines, total = [], 0
        while line := self.readline():
            lines.append(line)
            total += len(line)
            if 0 < hint <= total:
                break
        return lines

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line

    def _start(self, size: int | None) -> int:
        """How many bytes a read of ``size`` may take; sends ``100 Continue`` before the first."""
        wanted = self.remaining if size is None or size < 0 else min(size, self.remaining)
        if wanted and self._send_continue is not None:
            send, self._send_continue = self._send_continue, None
            send()
        return wanted

    def _account(self, data: bytes, wanted: int) -> None:
        self.remaining -= len(data)
        if len(data) < wanted:
            self.truncated = True
            self.remaining = 0


class _DateHeader:
    """The ``Date`` header's value, formatted once a second."""

    def __init__(self) -> None:
        self._second = -1
        self._text = ""

    def now(self) -> str:
        second = int(time.time())
        if second != self._second:
            self._text, self._second = email.utils.formatdate(second, usegmt=True), second
        return self._text


def _error_body(reason: str) -> bytes:
    return ('{"Error":"' + reason.replace("\\", "\\\\").replace('"', '\\"') + '"}').encode()
