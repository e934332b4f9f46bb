"""A minimal arbiter for the hook's integration tests: fixed tokens, recorded requests, scripted faults.

It speaks protocol version 1 through :mod:`fastgshare.protocol` on a unix socket, one thread per
connection. It grants every TOKEN request at once with ``token_ns`` and records what it saw, so a
test can assert on the requests the hook made. Faults for the fail-closed tests: close the
connection after N TOKEN requests, never answer TOKEN, or answer HELLO with an ERROR. The real
arbiter (``device_plugin/arbiter``) is tested against the hook separately.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from fastgshare import protocol
from fastgshare.protocol import MessageType


@attrs.frozen
class Request:
    connection: int  # 1 for the first connection accepted, 2 for the next, ...
    type: MessageType
    hello: protocol.Hello | None = None
    used_ns: int | None = None  # TOKEN only


@attrs.define
class Script:
    token_ns: int = 10_000_000
    close_after_tokens: int | None = None  # close the connection instead of answering this TOKEN
    silent_tokens: bool = False  # read TOKEN requests but never answer them
    hello_error: protocol.ErrorReply | None = None
    hello_reply: protocol.HelloReply = attrs.field(factory=lambda: protocol.HelloReply(
        window_us=100_000, request_permille=500, limit_permille=1000, sm_percent=100,
        memory_limit_bytes=8 << 30, min_token_us=1000))


class FakeArbiter:
    def __init__(self, path: Path, script: Script | None = None) -> None:
        self.path = path
        self.script = script or Script()
        self._requests: list[Request] = []
        self._changed = threading.Condition()
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        self._listener.listen(16)
        self._connections: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._stopping = False
        self._accepter = threading.Thread(target=self._accept_loop, name="fake-arbiter-accept", daemon=True)
        self._accepter.start()

    # --- what the tests read ---------------------------------------------------------------
    @property
    def requests(self) -> list[Request]:
        with self._changed:
            return list(self._requests)

    def hellos(self) -> list[protocol.Hello]:
        return [r.hello for r in self.requests if r.hello is not None]

    def token_requests(self) -> list[Request]:
        return [r for r in self.requests if r.type == MessageType.TOKEN]

    def wait_for(self, predicate: Callable[[list[Request]], bool], timeout_s: float = 5.0) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self._requests), timeout=timeout_s)

    def close(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for conn in list(self._connections):
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._accepter.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)
        for conn in self._connections:
            conn.close()

    # --- serving ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        number = 0
        while not self._stopping:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            number += 1
            self._connections.append(conn)
            thread = threading.Thread(target=self._serve, args=(conn, number), daemon=True,
                                      name=f"fake-arbiter-conn-{number}")
            self._threads.append(thread)
            thread.start()

    def _record(self, request: Request) -> None:
        with self._changed:
            self._requests.append(request)
            self._changed.notify_all()

    def _serve(self, conn: socket.socket, number: int) -> None:
        reader = protocol.FrameReader()
        tokens = 0
        while True:
            try:
                data = conn.recv(4096)
            except OSError:
                return
            if not data:
                return
            for frame in reader.feed(data):
                if frame.type == MessageType.HELLO:
                    hello = protocol.Hello.decode(frame.payload)
                    self._record(Request(number, MessageType.HELLO, hello=hello))
                    self._answer_hello(conn, frame)
                elif frame.type == MessageType.TOKEN:
                    tokens += 1
                    self._record(Request(number, MessageType.TOKEN, used_ns=protocol.decode_u64(frame.payload)))
                    if self.script.close_after_tokens is not None and tokens > self.script.close_after_tokens:
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    if not self.script.silent_tokens:
                        conn.sendall(protocol.encode_frame(frame.type | protocol.REPLY_BIT, frame.request_id,
                                                           protocol.encode_u64(self.script.token_ns)))
                else:
                    self._record(Request(number, MessageType(frame.type)))

    def _answer_hello(self, conn: socket.socket, frame: protocol.Frame) -> None:
        if self.script.hello_error is not None:
            conn.sendall(protocol.encode_frame(MessageType.ERROR, frame.request_id, self.script.hello_error.encode()))
        else:
            conn.sendall(protocol.encode_frame(frame.type | protocol.REPLY_BIT, frame.request_id,
                                               self.script.hello_reply.encode()))


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0, interval_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()
