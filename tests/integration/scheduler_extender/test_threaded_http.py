"""The scheduler's HTTP/1.1 listener, :mod:`scheduler_extender.http.threaded`, over real sockets.

One test (or one parametrized family) per promise in that module's docstring: keep-alive and
HTTP/1.0, pipelining, bodies that come in pieces, ``Expect: 100-continue``, the answers it gives
itself (411, 431, 400, 505, 500, each with a JSON body), unread bodies, ``HEAD``, ``Date``, the idle
timeout, the header and path rules of the WSGI environ, ``max_connections``, :meth:`stop`, and
clients that vanish mid-request.

The server runs a small WSGI app defined here (:class:`App`) that echoes what it was given as
JSON, plus routes that raise, that do not read the body, or that hold a request until the test
releases it. Where the exact bytes matter the client is a raw socket (:class:`Wire`); elsewhere it
is :mod:`http.client`. A thread of the server that dies of an uncaught exception fails the test.
"""

from __future__ import annotations

import email.utils
import http.client
import json
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from scheduler_extender.http.threaded import ThreadedHttpServer

pytestmark = pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")

WAIT_S = 10.0  # the longest a client waits for what should come: only a failing test waits it out
SERVER_IDLE_S = 30.0  # the idle timeout of servers whose tests are not about it
SHORT_IDLE_S = 0.3  # ... and of those whose tests are
LIMIT = 64 * 1024  # the largest request head, and the largest unread body that is drained
SECRET = "kaboom-7f3a"  # in the exceptions the app raises: must never reach a client

StartResponse = Callable[..., Any]
StartServer = Callable[..., ThreadedHttpServer]
Connect = Callable[[ThreadedHttpServer], "Wire"]


# --- the app -------------------------------------------------------------------------------------

CANNED: dict[str, tuple[list[tuple[str, str]], list[bytes]]] = {
    "/ignore": ([("Content-Type", "text/plain")], [b"ignored"]),
    "/fixed": ([("Content-Type", "text/plain"), ("Content-Length", "11")], [b"hello world"]),
    "/wrong-length": ([("Content-Type", "text/plain"), ("Content-Length", "999")], [b"sh", b"ort"]),
    "/not-latin-1": ([("Content-Type", "text/plain"), ("X-Name", "caf\u00e9 \u2603")], [b"sent"]),
}


class App:
    """A WSGI app routed on ``PATH_INFO``; any path not listed echoes the request.

    ``/boom`` raises; ``/boom-late`` raises while its body is iterated; ``/no-start`` never calls
    ``start_response``; ``/ignore`` answers ``ignored`` without reading the body; ``/fixed`` answers
    ``hello world`` with its own ``Content-Length``; ``/wrong-length`` claims 999 bytes and sends 5;
    ``/not-latin-1`` sends a header value outside latin-1; ``/hold`` sets :attr:`held` and waits
    for :attr:`release` before it echoes.
    """

    def __init__(self) -> None:
        self.held = threading.Event()
        self.release = threading.Event()

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        route = environ["PATH_INFO"]
        if route == "/boom":
            raise RuntimeError(SECRET)
        if route == "/boom-late":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return self._fail_midway()
        if route == "/no-start":
            return [b"never started"]
        if route in CANNED:  # answered without reading the body
            headers, chunks = CANNED[route]
            start_response("200 OK", headers)
            return chunks
        if route == "/hold":
            self.held.set()
            self.release.wait(WAIT_S)
        return self._echo(environ, start_response)

    @staticmethod
    def _fail_midway() -> Iterator[bytes]:
        yield b"partial"
        raise RuntimeError(SECRET)

    @staticmethod
    def _echo(environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        body = environ["wsgi.input"].read()
        echoed = {
            "method": environ["REQUEST_METHOD"], "path": environ["PATH_INFO"], "query": environ["QUERY_STRING"],
            "remote_port": int(environ["REMOTE_PORT"]), "body": body.decode("latin-1"),
            "headers": {key: value for key, value in environ.items()
                        if key.startswith("HTTP_") or key in ("CONTENT_TYPE", "CONTENT_LENGTH")},
        }
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps(echoed).encode()]


# --- a raw client --------------------------------------------------------------------------------

@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        """The header's one value (None when absent); sent twice is a failure."""
        values = [value for key, value in self.headers if key.lower() == name.lower()]
        assert len(values) <= 1, f"{name} sent {len(values)} times: {values}"
        return values[0] if values else None

    def json(self) -> Any:
        return json.loads(self.body)


class Wire:
    """A raw client connection: bytes out, answers parsed back by their exact framing."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""

    @property
    def local_port(self) -> int:
        return int(self.sock.getsockname()[1])

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def exactly(self, count: int) -> bytes:
        while len(self._buffer) < count:
            self._fill()
        data, self._buffer = self._buffer[:count], self._buffer[count:]
        return data

    def response(self, *, head_only: bool = False) -> Response:
        """The next answer; ``head_only`` for a ``HEAD`` (its ``Content-Length`` announces no body)."""
        while b"\r\n\r\n" not in self._buffer:
            self._fill()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, status, _reason = status_line.split(" ", 2)
        assert version == "HTTP/1.1", status_line
        headers = [(name.strip(), value.strip()) for name, _, value in (line.partition(":") for line in lines)]
        response = Response(int(status), headers, b"")
        if not head_only and response.status >= 200 and response.status not in (204, 304):
            length = response.header("Content-Length")
            assert length is not None, f"an answer without Content-Length: {head!r}"
            response.body = self.exactly(int(length))
        return response

    def expect_closed(self) -> None:
        """The server closes the connection (FIN or reset) and sends nothing more first."""
        assert self._buffer == b"", f"unexpected bytes: {self._buffer!r}"
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            return
        except TimeoutError:
            pytest.fail(f"the connection is still open after {self.sock.gettimeout()} s")
        assert data == b"", f"unexpected bytes: {data!r}"

    def close(self) -> None:
        self.sock.close()

    def _fill(self) -> None:
        data = self.sock.recv(256 * 1024)
        if not data:
            raise EOFError(f"the server closed the connection; unparsed: {self._buffer!r}")
        self._buffer += data


def request(method: str = "GET", target: str = "/echo", *, body: bytes = b"",
            headers: Sequence[tuple[str, str]] = (), version: str = "HTTP/1.1") -> bytes:
    """A request's bytes; ``Content-Length`` is added for a non-empty body."""
    lines = [f"{method} {target} {version}", "Host: test"]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def assert_error_answer_and_close(wire: Wire, status: int) -> None:
    """An answer the server gives itself: ``status``, a JSON error, ``Connection: close``, then closed."""
    response = wire.response()
    assert response.status == status
    assert response.header("Content-Type") == "application/json"
    assert response.header("Connection") == "close"
    error = response.json()["Error"]
    assert isinstance(error, str)
    assert error
    wire.expect_closed()


def time_until_closed(wire: Wire) -> float:
    started = time.monotonic()
    wire.expect_closed()
    return time.monotonic() - started


# --- fixtures ------------------------------------------------------------------------------------

@pytest.fixture
def app() -> App:
    return App()


@pytest.fixture
def start_server(app: App) -> Iterator[StartServer]:
    """Starts servers of ``app`` on 127.0.0.1 (port 0 unless given); stops them all at the end."""
    servers: list[ThreadedHttpServer] = []

    def start(*, port: int = 0, idle_timeout_s: float = SERVER_IDLE_S, **options: Any) -> ThreadedHttpServer:
        server = ThreadedHttpServer(app, "127.0.0.1", port, name="test-http", idle_timeout_s=idle_timeout_s,
                                    **options)
        servers.append(server)
        server.start()
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.stop()  # a second stop (after a test's own) does nothing


@pytest.fixture
def server(start_server: StartServer) -> ThreadedHttpServer:
    return start_server()


@pytest.fixture
def connect() -> Iterator[Connect]:
    """Opens raw connections to a server; closes them all at the end."""
    wires: list[Wire] = []

    def open_wire(server: ThreadedHttpServer) -> Wire:
        wire = Wire(socket.create_connection((server.host, server.port), timeout=WAIT_S))
        wires.append(wire)
        return wire

    try:
        yield open_wire
    finally:
        for wire in wires:
            wire.close()


@pytest.fixture
def wire(server: ThreadedHttpServer, connect: Connect) -> Wire:
    return connect(server)


# --- connections: keep-alive, HTTP/1.0, pipelining -----------------------------------------------

def test_two_requests_share_one_kept_alive_connection(server: ThreadedHttpServer) -> None:
    connection = http.client.HTTPConnection(server.host, server.port, timeout=WAIT_S)
    try:
        ports = []
        for body in (b"first", b"second"):
            connection.request("POST", "/echo", body=body)
            response = connection.getresponse()
            assert response.status == 200
            assert response.getheader("Connection") is None
            echoed = json.loads(response.read())
            assert echoed["body"] == body.decode()
            ports.append(echoed["remote_port"])
        assert connection.sock is not None  # http.client would have reconnected (a new port) had it closed
        assert ports == [connection.sock.getsockname()[1]] * 2
    finally:
        connection.close()


def test_pipelined_requests_are_answered_in_order(wire: Wire) -> None:
    wire.send(request("POST", "/first", body=b"one") + request("GET", "/second?n=2")
              + request("POST", "/third", body=b"three"))
    answers = [wire.response().json() for _ in range(3)]
    assert [(answer["method"], answer["path"], answer["query"], answer["body"]) for answer in answers] == [
        ("POST", "/first", "", "one"), ("GET", "/second", "n=2", ""), ("POST", "/third", "", "three")]
    assert {answer["remote_port"] for answer in answers} == {wire.local_port}


def test_a_body_that_arrives_in_pieces_is_read_whole(wire: Wire) -> None:
    body = bytes(range(256)) * 40
    data = request("POST", "/echo", body=body)
    for start in range(0, len(data), 2000):
        wire.send(data[start:start + 2000])
        time.sleep(0.05)
    assert wire.response().json()["body"].encode("latin-1") == body
    wire.send(request("GET", "/after"))  # and the connection is still in step
    assert wire.response().json()["path"] == "/after"


@pytest.mark.parametrize(("version", "headers"), [
    ("HTTP/1.1", [("Connection", "close")]),
    ("HTTP/1.1", [("Connection", "Keep-Alive, CLOSE")]),
    ("HTTP/1.0", []),
    ("HTTP/1.0", [("Connection", "keep-alive")]),
], ids=["1.1-close", "1.1-close-among-tokens", "1.0", "1.0-keep-alive"])
def test_close_and_http_1_0_get_one_answer_then_the_connection_closes(
        wire: Wire, version: str, headers: list[tuple[str, str]]) -> None:
    wire.send(request("POST", "/echo", body=b"last", headers=headers, version=version)
              + request("GET", "/never-answered"))
    response = wire.response()
    assert response.status == 200
    assert response.json()["body"] == "last"
    assert response.header("Connection") == "close"
    wire.expect_closed()


# --- answers the server gives itself -------------------------------------------------------------

def test_a_chunked_upload_gets_411_and_the_connection_closes(wire: Wire) -> None:
    wire.send(request("POST", "/echo", headers=[("Transfer-Encoding", "chunked")]) + b"5\r\nhello\r\n0\r\n\r\n")
    assert_error_answer_and_close(wire, 411)


def test_a_head_over_64_kib_gets_431(wire: Wire) -> None:
    wire.send(request("GET", "/echo", headers=[("X-Pad", "a" * (LIMIT + 100))]))
    assert_error_answer_and_close(wire, 431)


def test_a_head_over_64_kib_without_its_end_gets_431(wire: Wire) -> None:
    wire.send(b"GET /echo HTTP/1.1\r\nX-Pad: " + b"a" * (LIMIT + 100))
    assert_error_answer_and_close(wire, 431)


def test_a_head_just_under_64_kib_is_served(wire: Wire) -> None:
    wire.send(request("GET", "/echo", headers=[("X-Pad", "a" * (LIMIT - 1000))]))
    assert len(wire.response().json()["headers"]["HTTP_X_PAD"]) == LIMIT - 1000


@pytest.mark.parametrize("line", [
    b"GET /echo", b"GET /echo HTTP/1.1 extra", b"GET  /echo HTTP/1.1", b"G(T /echo HTTP/1.1", b"\x16\x03\x01 tls",
], ids=["two-parts", "four-parts", "double-space", "bad-method", "binary"])
def test_a_malformed_request_line_gets_400(wire: Wire, line: bytes) -> None:
    wire.send(line + b"\r\nHost: test\r\n\r\n")
    assert_error_answer_and_close(wire, 400)


@pytest.mark.parametrize("header", [b"NoColonHere", b"Bad Name: x", b"X-A : x", b" folded: continuation"],
                         ids=["no-colon", "space-in-name", "space-before-colon", "obs-fold"])
def test_a_malformed_header_line_gets_400(wire: Wire, header: bytes) -> None:
    wire.send(b"GET /echo HTTP/1.1\r\nHost: test\r\n" + header + b"\r\n\r\n")
    assert_error_answer_and_close(wire, 400)


@pytest.mark.parametrize("value", ["abc", "-1", "+5", "5.0", "0x5", "5, 5", "\u00b2"],
                         ids=["word", "negative", "plus", "decimal", "hex", "list", "superscript-two"])
def test_a_content_length_that_is_not_a_length_gets_400(wire: Wire, value: str) -> None:
    wire.send(request("POST", "/echo", headers=[("Content-Length", value)]) + b"hello")
    assert_error_answer_and_close(wire, 400)


def test_two_different_content_lengths_get_400(wire: Wire) -> None:
    wire.send(request("POST", "/echo", headers=[("Content-Length", "5"), ("Content-Length", "6")]) + b"hello!")
    assert_error_answer_and_close(wire, 400)


def test_the_same_content_length_twice_is_served(wire: Wire) -> None:
    wire.send(request("POST", "/echo", headers=[("Content-Length", "5"), ("content-length", "5")]) + b"hello")
    assert wire.response().json()["body"] == "hello"


@pytest.mark.parametrize("version", ["HTTP/2.0", "HTTP/3"])
def test_another_http_version_gets_505(wire: Wire, version: str) -> None:
    wire.send(request("GET", "/echo", version=version))
    assert_error_answer_and_close(wire, 505)


@pytest.mark.parametrize("route", ["/boom", "/boom-late", "/no-start"])
def test_an_app_that_fails_gets_500_and_the_connection_serves_on(wire: Wire, route: str) -> None:
    wire.send(request("POST", route, body=b"unread"))
    response = wire.response()
    assert response.status == 500
    assert response.header("Content-Type") == "application/json"
    assert response.header("Connection") is None
    assert response.json()["Error"]
    for leak in (SECRET, "Traceback", "RuntimeError", "partial", "never started"):
        assert leak not in response.body.decode()
    wire.send(request("POST", "/echo", body=b"next"))
    assert wire.response().json() | {"headers": None} == {
        "method": "POST", "path": "/echo", "query": "", "body": "next", "remote_port": wire.local_port,
        "headers": None}


# --- Expect: 100-continue ------------------------------------------------------------------------

def test_expect_100_continue_gets_the_interim_answer_before_the_body_is_sent(wire: Wire) -> None:
    wire.send(request("POST", "/echo", headers=[("Content-Length", "5"), ("Expect", "100-continue")]))
    assert wire.exactly(len(b"HTTP/1.1 100 Continue\r\n\r\n")) == b"HTTP/1.1 100 Continue\r\n\r\n"
    wire.send(b"hello")
    response = wire.response()
    assert response.status == 200
    assert response.json()["body"] == "hello"
    wire.send(request("GET", "/after"))  # kept alive
    assert wire.response().json()["path"] == "/after"


def test_expect_100_continue_to_an_app_that_does_not_read_gets_no_interim_answer_and_closes(wire: Wire) -> None:
    wire.send(request("POST", "/ignore", headers=[("Content-Length", "5"), ("Expect", "100-continue")]))
    response = wire.response()
    assert (response.status, response.body) == (200, b"ignored")
    assert response.header("Connection") == "close"  # the client never sent the body: the next request is lost
    wire.expect_closed()


# --- bodies the app does not read ----------------------------------------------------------------

@pytest.mark.parametrize("size", [10, LIMIT])
def test_a_small_unread_body_is_dropped_and_the_connection_serves_on(wire: Wire, size: int) -> None:
    smuggled = request("GET", "/smuggled")  # answered only if the body were taken for a request
    wire.send(request("POST", "/ignore", body=(smuggled * size)[:size]) + request("POST", "/after", body=b"x"))
    first = wire.response()
    assert (first.status, first.body, first.header("Connection")) == (200, b"ignored", None)
    assert wire.response().json()["path"] == "/after"
    wire.send(request("GET", "/last"))
    assert wire.response().json()["path"] == "/last"


def test_an_answer_before_a_body_still_arriving_is_not_lost_to_a_reset(wire: Wire) -> None:
    """The server reads what the client still sends before it closes: closing with unread input
    would reset the connection, and the reset can destroy the answer before the client reads it."""
    wire.send(request("POST", "/echo", headers=[("Transfer-Encoding", "chunked")]))
    for _ in range(8):
        time.sleep(0.02)
        wire.send(b"2000\r\n" + b"x" * 0x2000 + b"\r\n")
    assert_error_answer_and_close(wire, 411)


def test_an_unread_body_over_64_kib_closes_the_connection_after_the_answer(wire: Wire) -> None:
    wire.send(request("POST", "/ignore", headers=[("Content-Length", str(LIMIT + 1))]))  # the body never comes
    response = wire.response()
    assert (response.status, response.body) == (200, b"ignored")
    assert response.header("Connection") == "close"
    wire.expect_closed()


# --- what every answer carries -------------------------------------------------------------------

def test_a_header_value_outside_latin_1_is_sent_with_its_characters_replaced(wire: Wire) -> None:
    wire.send(request("GET", "/not-latin-1") + request("GET", "/echo"))
    response = wire.response()
    assert (response.status, response.header("X-Name"), response.body) == (200, "caf\u00e9 ?", b"sent")
    assert wire.response().status == 200  # the connection serves on


def test_head_gets_the_apps_content_length_and_no_body(wire: Wire) -> None:
    wire.send(request("HEAD", "/fixed") + request("HEAD", "/ignore") + request("GET", "/fixed"))
    fixed, ignore = wire.response(head_only=True), wire.response(head_only=True)
    assert (fixed.status, fixed.header("Content-Length")) == (200, "11")
    assert (ignore.status, ignore.header("Content-Length")) == (200, str(len(b"ignored")))
    assert wire.response().body == b"hello world"  # no stray body bytes in front of it


def test_content_length_is_that_of_what_the_app_returned(wire: Wire) -> None:
    wire.send(request("GET", "/wrong-length") + request("GET", "/after"))
    response = wire.response()
    assert (response.header("Content-Length"), response.body) == ("5", b"short")
    assert wire.response().json()["path"] == "/after"


@pytest.mark.parametrize(("data", "status"), [
    (request("GET", "/echo"), 200), (request("GET", "/boom"), 500), (b"nonsense\r\n\r\n", 400),
])
def test_every_answer_has_a_current_date(wire: Wire, data: bytes, status: int) -> None:
    wire.send(data)
    response = wire.response()
    assert response.status == status
    date = response.header("Date")
    assert date is not None
    assert date.endswith(" GMT")
    assert abs((email.utils.parsedate_to_datetime(date) - datetime.now(UTC)).total_seconds()) < 5


# --- the idle timeout ----------------------------------------------------------------------------

@pytest.mark.parametrize("before", ["nothing", "a request", "half a head", "half a body"])
def test_a_connection_that_sends_nothing_is_closed_after_idle_timeout(
        start_server: StartServer, connect: Connect, before: str) -> None:
    wire = connect(start_server(idle_timeout_s=SHORT_IDLE_S))
    if before == "a request":
        wire.send(request("GET", "/echo"))
        assert wire.response().status == 200
    elif before == "half a head":
        wire.send(b"GET /echo HTTP/1.1\r\nHost: te")
    elif before == "half a body":
        wire.send(request("POST", "/echo", headers=[("Content-Length", "10")]) + b"hello")
    assert SHORT_IDLE_S - 0.1 < time_until_closed(wire) < WAIT_S


def test_a_slow_but_steady_client_is_not_cut_off(start_server: StartServer, connect: Connect) -> None:
    """The timeout counts silence, not the time a request takes."""
    wire = connect(start_server(idle_timeout_s=1.0))
    data = request("POST", "/echo", body=b"0123456789")
    pieces = [data[:10], data[10:-5], data[-5:-3], data[-3:-1], data[-1:]]
    for piece in pieces:  # 5 pauses of 0.3 s: 1.5 s in all, none near 1 s
        time.sleep(0.3)
        wire.send(piece)
    assert wire.response().json()["body"] == "0123456789"


@pytest.mark.parametrize("part", ["head", "body"])
def test_a_trickling_client_is_closed_at_the_deadline_of_its_head_or_body(
        start_server: StartServer, connect: Connect, part: str) -> None:
    """Issue 37: a byte every 0.2 s never hits the idle timeout; the head's (body's) deadline cuts it off."""
    wire = connect(start_server(idle_timeout_s=5.0, header_timeout_s=1.0, body_timeout_s=1.0))
    data = request("POST", "/echo", headers=[("Content-Length", "100")]) + b"x" * 100
    if part == "body":
        wire.send(data[:-100])
        data = data[-100:]
    started = time.monotonic()
    closed = False
    for byte in data:
        if select.select([wire.sock], [], [], 0.2)[0]:
            closed = wire.sock.recv(1) == b""
            break
        try:
            wire.send(bytes([byte]))
        except OSError:
            closed = True
            break
    assert closed, "the trickling connection was still open"
    assert time.monotonic() - started < 4


# --- the WSGI environ ----------------------------------------------------------------------------

def test_header_names_with_an_underscore_are_not_passed_to_the_app(wire: Wire) -> None:
    wire.send(request("GET", "/echo", headers=[
        ("X-Forwarded-User", "real"), ("X_Forwarded_User", "spoofed"), ("X_Only_Underscores", "1"),
        ("X-Dashed-Name", "2")]))
    headers = wire.response().json()["headers"]
    assert headers["HTTP_X_FORWARDED_USER"] == "real"
    assert headers["HTTP_X_DASHED_NAME"] == "2"
    assert "HTTP_X_ONLY_UNDERSCORES" not in headers


def test_repeated_headers_are_joined_with_commas(wire: Wire) -> None:
    wire.send(request("GET", "/echo", headers=[("X-Dup", "a"), ("Accept", "text/plain"), ("x-dup", "b, c"),
                                               ("X-DUP", " d ")]))
    headers = wire.response().json()["headers"]
    assert headers["HTTP_X_DUP"] == "a,b, c,d"
    assert headers["HTTP_ACCEPT"] == "text/plain"


def test_content_type_and_length_have_no_http_prefix(wire: Wire) -> None:
    wire.send(request("POST", "/echo", body=b"{}", headers=[("Content-Type", "application/json")]))
    headers = wire.response().json()["headers"]
    assert (headers["CONTENT_TYPE"], headers["CONTENT_LENGTH"]) == ("application/json", "2")
    assert not {"HTTP_CONTENT_TYPE", "HTTP_CONTENT_LENGTH"} & set(headers)


@pytest.mark.parametrize(("target", "path", "query"), [
    ("/a%20b/%C3%A9%2Fc?x=%20y&z=1+2&e=%C3%A9", "/a b/\u00c3\u00a9/c", "x=%20y&z=1+2&e=%C3%A9"),
    ("/plain", "/plain", ""),
    ("/q?", "/q", ""),
    ("http://example.com/abs/p%20q?k=v", "/abs/p q", "k=v"),
], ids=["encoded", "plain", "empty-query", "absolute-form"])
def test_path_info_is_percent_decoded_and_query_string_is_raw(wire: Wire, target: str, path: str, query: str) -> None:
    wire.send(request("GET", target))
    echoed = wire.response().json()
    assert (echoed["path"], echoed["query"]) == (path, query)


# --- max_connections -----------------------------------------------------------------------------

def test_a_connection_over_max_connections_waits_until_one_ends(start_server: StartServer, connect: Connect) -> None:
    server = start_server(max_connections=1)
    first = connect(server)
    first.send(request("GET", "/first"))
    assert first.response().json()["path"] == "/first"  # it holds the only slot, kept alive
    second = connect(server)  # the kernel completes it into the listen backlog
    second.send(request("GET", "/second"))
    second.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        second.sock.recv(1)
    second.sock.settimeout(WAIT_S)
    first.close()
    assert second.response().json()["path"] == "/second"


# --- stop() --------------------------------------------------------------------------------------

def test_stop_closes_idle_connections_at_once_and_lets_a_request_in_progress_finish(
        app: App, server: ThreadedHttpServer, connect: Connect) -> None:
    idle = connect(server)
    idle.send(request("GET", "/echo"))
    assert idle.response().status == 200
    busy = connect(server)
    busy.send(request("POST", "/hold", body=b"in progress"))
    assert app.held.wait(WAIT_S)
    stopper = threading.Thread(target=server.stop, name="test-stop")
    stopper.start()
    try:
        assert time_until_closed(idle) < 2.0  # well before the 5 s grace that would close it anyway
        assert stopper.is_alive()  # stop waits for the request it holds
    finally:
        app.release.set()
        stopper.join(WAIT_S)
    assert not stopper.is_alive()
    response = busy.response()
    assert (response.status, response.json()["body"]) == (200, "in progress")
    assert response.header("Connection") == "close"  # the answer says the connection ends
    busy.expect_closed()


def test_after_stop_the_port_refuses_connections_and_can_be_bound_again(
        start_server: StartServer, server: ThreadedHttpServer, connect: Connect) -> None:
    wire = connect(server)
    wire.send(request("GET", "/echo", headers=[("Connection", "close")]))
    assert wire.response().status == 200
    wire.expect_closed()  # the server closed first: its end of the connection lingers in TIME_WAIT
    port = server.port
    server.stop()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=WAIT_S).close()
    again = start_server(port=port)
    assert again.port == port
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT_S)
    try:
        connection.request("GET", "/again")
        assert json.loads(connection.getresponse().read())["path"] == "/again"
    finally:
        connection.close()


# --- clients that vanish -------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["close", "reset"])
@pytest.mark.parametrize("cut", ["mid-head", "mid-body"])
def test_a_client_gone_mid_request_does_not_break_the_server(
        start_server: StartServer, connect: Connect, cut: str, how: str) -> None:
    server = start_server(max_connections=1)  # the gone client's slot must come back
    gone = connect(server)
    data = request("POST", "/echo", body=b"x" * 1000)
    gone.send(data[:20] if cut == "mid-head" else data[:-500])
    if how == "reset":
        gone.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    gone.close()
    wire = connect(server)
    wire.send(request("POST", "/echo", body=b"next"))
    assert wire.response().json()["body"] == "next"
