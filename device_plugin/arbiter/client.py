"""A blocking Python client of the hook <-> arbiter protocol.

The C hook is the real client; this one speaks the same frames for tools, tests and the
arbiter benchmark.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from fastgshare import protocol
from fastgshare.protocol import ErrorReply, Frame, FrameReader, Hello, HelloReply, MemReserveReply, MessageType


class ArbiterError(Exception):
    def __init__(self, reply: ErrorReply) -> None:
        super().__init__(f"{reply.code}: {reply.message}")
        self.reply = reply


class HookClient:
    def __init__(self, socket_path: Path, timeout_s: float = 10.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout_s)
        self.sock.connect(str(socket_path))
        self._reader = FrameReader()
        self._frames: list[Frame] = []
        self._next_id = 0

    def close(self) -> None:
        self.sock.close()

    def call(self, message_type: int, payload: bytes = b"") -> Frame:
        self._next_id += 1
        self.sock.sendall(protocol.encode_frame(message_type, self._next_id, payload))
        reply = self.receive()
        if reply.type == MessageType.ERROR:
            raise ArbiterError(ErrorReply.decode(reply.payload))
        assert reply.type == message_type | protocol.REPLY_BIT, reply
        assert reply.request_id == self._next_id, reply
        return reply

    def receive(self) -> Frame:
        while not self._frames:
            data = self.sock.recv(4096)
            if not data:
                raise ConnectionError("arbiter closed the connection")
            self._frames += self._reader.feed(data)
        return self._frames.pop(0)

    def hello(self, pod: str = "", gpu: str = "") -> HelloReply:
        return HelloReply.decode(self.call(MessageType.HELLO, Hello(os.getpid(), pod, gpu).encode()).payload)

    def token(self, used_ns: int = 0) -> int:
        return protocol.decode_u64(self.call(MessageType.TOKEN, protocol.encode_u64(used_ns)).payload)

    def reserve(self, size: int) -> MemReserveReply:
        return MemReserveReply.decode(self.call(MessageType.MEM_RESERVE, protocol.encode_u64(size)).payload)

    def restore(self, size: int) -> MemReserveReply:
        """After a reconnect: this process still holds ``size`` bytes (charged without the limit check)."""
        return MemReserveReply.decode(self.call(MessageType.MEM_RESTORE, protocol.encode_u64(size)).payload)

    def ping(self) -> None:
        self.call(MessageType.PING)

    def release(self, size: int) -> int:
        """Release ``size`` bytes; returns the pod's memory in use afterwards."""
        return protocol.decode_u64(self.call(MessageType.MEM_RELEASE, protocol.encode_u64(size)).payload)
