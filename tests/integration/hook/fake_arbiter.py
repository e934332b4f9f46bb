"""A minimal arbiter for the hook's integration tests: fixed tokens, recorded requests, scripted faults.

It speaks protocol version 1 through :mod:`fastgshare.protocol` on a unix socket, one thread per
connection. It grants every TOKEN request at once with ``token_ns`` and records what it saw, so a
test can assert on the requests the hook made. Memory: one pod-wide ledger for all connections
(the limit is ``Script.memory_limit``), per connection inside it, a connection's holdings dropped
when it closes, exactly like the real arbiter; every reservation, release and drop is kept as a
:class:`MemEvent` with the pod's usage after it. Faults for the fail-closed tests: close the
connection after N TOKEN (or memory) requests, never answer TOKEN, or answer HELLO with an
ERROR. The real arbiter (``device_plugin/arbiter``) is tested against the hook separately.
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


@attrs.frozen
class MemEvent:
    connection: int
    kind: str  # "reserve", "release", or "drop" (the connection closed holding `bytes`)
    bytes: int
    granted: bool  # reserve: the ledger said yes; release/drop: always True
    used_after: int  # the pod's usage after this event


@attrs.define
class Script:
    token_ns: int = 10_000_000
    close_after_tokens: int | None = None  # close the connection instead of answering this TOKEN
    silent_tokens: bool = False  # read TOKEN requests but never answer them
    close_after_memory: int | None = None  # close instead of answering this memory request
    hello_error: protocol.ErrorReply | None = None
    # Called on the connection's thread after a TOKEN request is read and before it is answered: the
    # time the process holds no token (a test may wait there, as if another tenant held the GPU).
    before_token_reply: Callable[[Request], None] | None = None
    memory_limit: int = 8 << 30  # the pod's limit: sent in HELLO and enforced on MEM_RESERVE
    hello_reply: protocol.HelloReply = attrs.field(factory=lambda: protocol.HelloReply(
        window_us=100_000, request_permille=500, limit_permille=1000, sm_percent=100,
        memory_limit_bytes=8 << 30, min_token_us=1000))


class FakeArbiter:
    def __init__(self, path: Path, script: Script | None = None) -> None:
        self.path = path
        self.script = script or Script()
        self._requests: list[Request] = []
        self._memory_events: list[MemEvent] = []
        self._held: dict[int, int] = {}  # connection -> bytes it holds in the pod's ledger
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

    @property
    def memory_events(self) -> list[MemEvent]:
        with self._changed:
            return list(self._memory_events)

    @property
    def memory_used(self) -> int:
        with self._changed:
            return sum(self._held.values())

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
        try:
            self._serve_frames(conn, number)
        finally:
            self._drop(number)

    def _serve_frames(self, conn: socket.socket, number: int) -> None:
        reader = protocol.FrameReader()
        tokens = memory_requests = 0
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
                    request = Request(number, MessageType.TOKEN, used_ns=protocol.decode_u64(frame.payload))
                    self._record(request)
                    if self.script.close_after_tokens is not None and tokens > self.script.close_after_tokens:
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    if not self.script.silent_tokens:
                        if self.script.before_token_reply is not None:
                            self.script.before_token_reply(request)
                        conn.sendall(protocol.encode_frame(frame.type | protocol.REPLY_BIT, frame.request_id,
                                                           protocol.encode_u64(self.script.token_ns)))
                elif frame.type in (MessageType.MEM_RESERVE, MessageType.MEM_RELEASE):
                    memory_requests += 1
                    self._record(Request(number, MessageType(frame.type)))
                    if self.script.close_after_memory is not None and memory_requests > self.script.close_after_memory:
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    conn.sendall(protocol.encode_frame(frame.type | protocol.REPLY_BIT, frame.request_id,
                                                       self._memory(number, frame)))
                else:
                    self._record(Request(number, MessageType(frame.type)))

    def _memory(self, number: int, frame: protocol.Frame) -> bytes:
        size = protocol.decode_u64(frame.payload)
        with self._changed:
            used = sum(self._held.values())
            if frame.type == MessageType.MEM_RESERVE:
                granted = used + size <= self.script.memory_limit
                if granted:
                    self._held[number] = self._held.get(number, 0) + size
                    used += size
                if size:  # a 0-byte reservation only reads the ledger
                    self._memory_events.append(MemEvent(number, "reserve", size, granted, used))
                self._changed.notify_all()
                return protocol.MemReserveReply(granted, used, self.script.memory_limit).encode()
            released = min(size, self._held.get(number, 0))
            self._held[number] = self._held.get(number, 0) - released
            used -= released
            self._memory_events.append(MemEvent(number, "release", size, True, used))
            self._changed.notify_all()
            return protocol.encode_u64(used)

    def _drop(self, number: int) -> None:
        with self._changed:
            held = self._held.pop(number, 0)
            if held:
                self._memory_events.append(MemEvent(number, "drop", held, True, sum(self._held.values())))
            self._changed.notify_all()

    def _answer_hello(self, conn: socket.socket, frame: protocol.Frame) -> None:
        if self.script.hello_error is not None:
            conn.sendall(protocol.encode_frame(MessageType.ERROR, frame.request_id, self.script.hello_error.encode()))
        else:
            reply = attrs.evolve(self.script.hello_reply, memory_limit_bytes=self.script.memory_limit)
            conn.sendall(protocol.encode_frame(frame.type | protocol.REPLY_BIT, frame.request_id, reply.encode()))


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0, interval_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval_s)
    return condition()
