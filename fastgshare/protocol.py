"""The hook <-> arbiter wire protocol, version 1: the Python side (pure encode/decode).

Defined twice, here and in ``vgpu_hook/include/fastgshare_protocol.h``; a test parses the
header and fails if the two disagree. The frame layout and every payload are documented in
that header. Integers are little-endian and explicitly packed; a :class:`FrameReader` takes
bytes as they arrive (partial frames, several frames at once) and yields whole messages.
"""

from __future__ import annotations

import enum
import struct

import attrs

from fastgshare import keys
from fastgshare.errors import FastGShareError

PROTOCOL_VERSION = 1
HEADER_SIZE = 12
MAX_FRAME = 4096
REPLY_BIT = 128

_HEADER = struct.Struct("<IHHI")  # length, version, type, request_id


class MessageType(enum.IntEnum):
    HELLO = 1
    TOKEN = 2
    MEM_RESERVE = 3
    MEM_RELEASE = 4
    MEM_RESTORE = 5
    PING = 6
    ERROR = 127


class ErrorCode(enum.IntEnum):
    BAD_FRAME = 1
    VERSION = 2
    UNKNOWN_CLIENT = 3
    NOT_REGISTERED = 4
    UNKNOWN_TYPE = 5


ENV_NAMES = {
    "FGS_ENV_ARBITER_SOCKET": keys.ENV_ARBITER_SOCKET,
    "FGS_ENV_POD": keys.ENV_POD,
    "FGS_ENV_GPU_UUID": keys.ENV_GPU_UUID,
}


class ProtocolError(FastGShareError):
    """Bytes that are not a valid frame of this protocol; ``code`` says which rule broke."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@attrs.frozen
class Frame:
    type: int
    request_id: int
    payload: bytes


def encode_frame(message_type: int, request_id: int, payload: bytes = b"") -> bytes:
    length = HEADER_SIZE - 4 + len(payload)
    if length + 4 > MAX_FRAME:
        raise ProtocolError(ErrorCode.BAD_FRAME, f"frame of {length + 4} bytes exceeds {MAX_FRAME}")
    return _HEADER.pack(length, PROTOCOL_VERSION, message_type, request_id) + payload


class FrameReader:
    """Accumulates bytes and returns complete frames; raises on the first malformed one."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= 4:
            (length,) = struct.unpack_from("<I", self._buffer)
            if length < HEADER_SIZE - 4 or length + 4 > MAX_FRAME:
                raise ProtocolError(ErrorCode.BAD_FRAME, f"frame length {length} outside "
                                    f"{HEADER_SIZE - 4}..{MAX_FRAME - 4}")
            if len(self._buffer) < length + 4:
                break
            _, version, message_type, request_id = _HEADER.unpack_from(self._buffer)
            payload = bytes(self._buffer[HEADER_SIZE:length + 4])
            del self._buffer[:length + 4]
            if version != PROTOCOL_VERSION:
                raise ProtocolError(ErrorCode.VERSION, f"protocol version {version} is not supported "
                                    f"(this arbiter speaks {PROTOCOL_VERSION})")
            frames.append(Frame(message_type, request_id, payload))
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame still waiting for the rest."""
        return len(self._buffer)


# --- payloads ------------------------------------------------------------------------------
class PayloadReader:
    """Reads fields from a payload in order; a short or oversized payload is a protocol error."""

    def __init__(self, payload: bytes) -> None:
        self._payload = payload
        self._offset = 0

    def _take(self, fmt: str) -> int:
        size = struct.calcsize(fmt)
        if self._offset + size > len(self._payload):
            raise ProtocolError(ErrorCode.BAD_FRAME, "payload too short")
        (value,) = struct.unpack_from(fmt, self._payload, self._offset)
        self._offset += size
        return int(value)

    def u32(self) -> int:
        return self._take("<I")

    def u64(self) -> int:
        return self._take("<Q")

    def text(self) -> str:
        size = self._take("<H")
        if self._offset + size > len(self._payload):
            raise ProtocolError(ErrorCode.BAD_FRAME, "payload too short for its string")
        raw = self._payload[self._offset:self._offset + size]
        self._offset += size
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(ErrorCode.BAD_FRAME, "string is not UTF-8") from None

    def end(self) -> None:
        if self._offset != len(self._payload):
            raise ProtocolError(ErrorCode.BAD_FRAME, f"{len(self._payload) - self._offset} unexpected payload bytes")


def pack_text(value: str) -> bytes:
    raw = value.encode("utf-8")
    if len(raw) > 0xFFFF:
        raise ProtocolError(ErrorCode.BAD_FRAME, "string longer than 65535 bytes")
    return struct.pack("<H", len(raw)) + raw


@attrs.frozen
class Hello:
    pid: int
    pod: str  # trusted-env mode only; empty when the arbiter resolves the peer itself
    gpu_uuid: str

    def encode(self) -> bytes:
        return struct.pack("<I", self.pid) + pack_text(self.pod) + pack_text(self.gpu_uuid)

    @classmethod
    def decode(cls, payload: bytes) -> Hello:
        reader = PayloadReader(payload)
        hello = cls(reader.u32(), reader.text(), reader.text())
        reader.end()
        return hello


@attrs.frozen
class HelloReply:
    window_us: int
    request_permille: int
    limit_permille: int
    sm_percent: int
    memory_limit_bytes: int
    min_token_us: int

    def encode(self) -> bytes:
        return struct.pack("<IIIIQI", self.window_us, self.request_permille, self.limit_permille,
                           self.sm_percent, self.memory_limit_bytes, self.min_token_us)

    @classmethod
    def decode(cls, payload: bytes) -> HelloReply:
        reader = PayloadReader(payload)
        reply = cls(reader.u32(), reader.u32(), reader.u32(), reader.u32(), reader.u64(), reader.u32())
        reader.end()
        return reply


def encode_u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def decode_u64(payload: bytes) -> int:
    reader = PayloadReader(payload)
    value = reader.u64()
    reader.end()
    return value


@attrs.frozen
class MemReserveReply:
    granted: bool
    pod_used_bytes: int
    pod_limit_bytes: int

    def encode(self) -> bytes:
        return struct.pack("<IQQ", int(self.granted), self.pod_used_bytes, self.pod_limit_bytes)

    @classmethod
    def decode(cls, payload: bytes) -> MemReserveReply:
        reader = PayloadReader(payload)
        reply = cls(reader.u32() == 1, reader.u64(), reader.u64())
        reader.end()
        return reply


@attrs.frozen
class ErrorReply:
    code: int
    message: str

    def encode(self) -> bytes:
        return struct.pack("<I", self.code) + pack_text(self.message[:1000])

    @classmethod
    def decode(cls, payload: bytes) -> ErrorReply:
        reader = PayloadReader(payload)
        reply = cls(reader.u32(), reader.text())
        reader.end()
        return reply
