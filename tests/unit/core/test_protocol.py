"""The hook <-> arbiter protocol: framing, payloads, and agreement with the C header."""

from __future__ import annotations

import contextlib
import re
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastgshare import protocol
from fastgshare.protocol import (
    ErrorCode,
    ErrorReply,
    Frame,
    FrameReader,
    Hello,
    HelloReply,
    MemReserveReply,
    MessageType,
    ProtocolError,
    decode_u64,
    encode_frame,
    encode_u64,
)

HEADER = Path(__file__).resolve().parents[3] / "vgpu_hook" / "include" / "fastgshare_protocol.h"


def _c_defines() -> dict[str, str]:
    text = HEADER.read_text()
    return dict(re.findall(r"^#define\s+(FGS_\w+)\s+(\S+)", text, flags=re.MULTILINE))


def test_c_header_and_python_agree() -> None:
    defines = _c_defines()
    assert int(defines["FGS_PROTOCOL_VERSION"]) == protocol.PROTOCOL_VERSION
    assert int(defines["FGS_HEADER_SIZE"]) == protocol.HEADER_SIZE
    assert int(defines["FGS_MAX_FRAME"]) == protocol.MAX_FRAME
    assert int(defines["FGS_REPLY_BIT"]) == protocol.REPLY_BIT
    c_messages = {name.removeprefix("FGS_MSG_"): int(v) for name, v in defines.items() if name.startswith("FGS_MSG_")}
    assert c_messages == {m.name: m.value for m in MessageType}
    c_errors = {name.removeprefix("FGS_ERR_"): int(v) for name, v in defines.items() if name.startswith("FGS_ERR_")}
    assert c_errors == {e.name: e.value for e in ErrorCode}
    c_env = {name: value.strip('"') for name, value in defines.items() if name.startswith("FGS_ENV_")}
    assert c_env == protocol.ENV_NAMES


def test_frame_layout_is_explicit_little_endian() -> None:
    frame = encode_frame(MessageType.TOKEN, 7, encode_u64(5))
    assert frame == struct.pack("<IHHI", 16, 1, 2, 7) + (5).to_bytes(8, "little")


def test_reader_handles_partial_and_coalesced_frames() -> None:
    data = encode_frame(MessageType.TOKEN, 1, encode_u64(10)) + encode_frame(MessageType.HELLO, 2, b"")
    reader = FrameReader()
    frames = []
    for byte in data:  # one byte at a time
        frames += reader.feed(bytes([byte]))
    assert frames == [Frame(MessageType.TOKEN, 1, encode_u64(10)), Frame(MessageType.HELLO, 2, b"")]
    assert reader.pending == 0
    assert FrameReader().feed(data) == frames


@pytest.mark.parametrize(
    ("data", "code"),
    [
        pytest.param(struct.pack("<I", 3), ErrorCode.BAD_FRAME, id="too-short"),
        pytest.param(struct.pack("<I", 10_000), ErrorCode.BAD_FRAME, id="too-long"),
        pytest.param(struct.pack("<IHHI", 8, 9, 1, 0), ErrorCode.VERSION, id="future-version"),
    ],
)
def test_bad_frames(data: bytes, code: ErrorCode) -> None:
    with pytest.raises(ProtocolError) as caught:
        FrameReader().feed(data)
    assert caught.value.code is code


def test_payload_round_trips() -> None:
    hello = Hello(1234, "team-a/resnet-0", "GPU-1")
    assert Hello.decode(hello.encode()) == hello
    reply = HelloReply(100_000, 300, 500, 25, 2**31, 2_000)
    assert HelloReply.decode(reply.encode()) == reply
    mem = MemReserveReply(True, 10, 20)
    assert MemReserveReply.decode(mem.encode()) == mem
    error = ErrorReply(ErrorCode.UNKNOWN_CLIENT, "pid 7 is in no known pod")
    assert ErrorReply.decode(error.encode()) == error
    assert decode_u64(encode_u64(2**64 - 1)) == 2**64 - 1


@pytest.mark.parametrize("payload", [b"", b"\x01\x02", encode_u64(1) + b"x"])
def test_wrong_payload_sizes_are_protocol_errors(payload: bytes) -> None:
    with pytest.raises(ProtocolError, match="payload"):
        decode_u64(payload)


def test_strings_must_be_utf8_and_fit() -> None:
    with pytest.raises(ProtocolError, match="UTF-8"):
        Hello.decode(struct.pack("<IH", 1, 1) + b"\xff" + struct.pack("<H", 0))
    with pytest.raises(ProtocolError, match="too short for its string"):
        Hello.decode(struct.pack("<IH", 1, 50) + b"abc")
    with pytest.raises(ProtocolError, match="exceeds"):
        encode_frame(MessageType.HELLO, 1, b"x" * 5000)


@given(st.binary(max_size=200))
def test_fuzzed_bytes_raise_only_protocol_errors(data: bytes) -> None:
    try:
        frames = FrameReader().feed(data)
    except ProtocolError:
        return
    for frame in frames:
        for decoder in (Hello.decode, HelloReply.decode, decode_u64, MemReserveReply.decode, ErrorReply.decode):
            with contextlib.suppress(ProtocolError):
                decoder(frame.payload)
