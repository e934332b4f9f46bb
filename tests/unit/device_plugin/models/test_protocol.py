"""The model store's wire formats: parsing, and the one-line refusals."""

from __future__ import annotations

import json

import pytest

from device_plugin.models import protocol
from device_plugin.models.protocol import (
    AnswerRefused,
    FreeRequest,
    ListRequest,
    LoadRequest,
    OpenRequest,
    ProtocolError,
)

HANDLE = "ab" * 64


def line(document: object) -> bytes:
    return json.dumps(document).encode() + b"\n"


def test_open_requests() -> None:
    assert protocol.parse_open_request(protocol.decode_line(line({"op": "open", "model": ""}))) == OpenRequest("")
    assert protocol.parse_open_request({"op": "open"}) == OpenRequest("")
    assert protocol.parse_open_request({"op": "open", "model": None}) == OpenRequest("")
    assert protocol.parse_open_request({"op": "open", "model": "resnet"}) == OpenRequest("resnet")
    assert protocol.parse_open_request({"op": "open", "model": "", "pod": "ns/p"}) == OpenRequest("", "ns/p")


@pytest.mark.parametrize(("document", "names"), [
    ({"op": "close"}, "op: 'close'"),
    ({"op": "open", "model": 7}, "model: 7"),
    ({"op": "open", "model": "x" * 300}, "field model"),
    ({"op": "open", "extra": 1}, "field extra: unknown"),
    ({"op": "open", "pod": ""}, "field pod"),
])
def test_bad_open_requests_name_the_field(document: dict[str, object], names: str) -> None:
    with pytest.raises(ProtocolError, match=names) as caught:
        protocol.parse_open_request(document)
    assert "\n" not in str(caught.value)
    assert "allowed" in str(caught.value)


@pytest.mark.parametrize(("raw", "says"), [
    (b"x" * (protocol.MAX_LINE + 1), "at most 4096"),
    (b"{not json}\n", "not JSON"),
    (b"[1, 2]\n", "a JSON object"),
    (b'{"op": "open"}\n{"op": "open"}\n', "one line"),
    (b"\xff\xfe\n", "not JSON"),
])
def test_lines_that_are_not_one_json_object(raw: bytes, says: str) -> None:
    with pytest.raises(ProtocolError, match=says) as caught:
        protocol.decode_line(raw)
    assert "\n" not in str(caught.value)


def test_worker_requests() -> None:
    load = {"op": "load", "identity": "i", "key": "a/b/c", "bytes": 10, "path": "/m/w.bin"}
    assert protocol.parse_worker_request(load) == LoadRequest("i", "a/b/c", 10, "/m/w.bin")
    assert protocol.load_request(LoadRequest("i", "a/b/c", 10, "/m/w.bin")) == load
    assert protocol.parse_worker_request({"op": "free", "identity": "i"}) == FreeRequest("i")
    assert protocol.parse_worker_request({"op": "list"}) == ListRequest()


@pytest.mark.parametrize(("document", "names"), [
    ({"op": "load", "identity": "i", "key": "k", "bytes": 0, "path": "/w"}, "bytes: 0"),
    ({"op": "load", "identity": "i", "key": "k", "bytes": True, "path": "/w"}, "bytes: True"),
    ({"op": "load", "identity": "i", "key": "k", "bytes": 1, "path": "w"}, "path: 'w'"),
    ({"op": "load", "identity": "", "key": "k", "bytes": 1, "path": "/w"}, "identity: ''"),
    ({"op": "load", "identity": "i", "key": "", "bytes": 1, "path": "/w"}, "key: ''"),
    ({"op": "free"}, "identity: None"),
    ({"op": "list", "x": 1}, "field x: unknown"),
    ({"op": "drop"}, "op: 'drop'"),
])
def test_bad_worker_requests_name_the_field(document: dict[str, object], names: str) -> None:
    with pytest.raises(ProtocolError, match=names):
        protocol.parse_worker_request(document)


def test_answers() -> None:
    assert protocol.parse_load_answer({"ok": True, "handle": HANDLE, "bytes": 5}, 5) == HANDLE
    with pytest.raises(ProtocolError, match="expected 5"):
        protocol.parse_load_answer({"ok": True, "handle": HANDLE, "bytes": 6}, 5)
    with pytest.raises(ProtocolError, match="128 lower-case hex"):
        protocol.parse_load_answer({"ok": True, "handle": HANDLE.upper(), "bytes": 5}, 5)
    with pytest.raises(AnswerRefused, match="the file is gone"):
        protocol.parse_load_answer({"ok": False, "error": "the file is gone"}, 5)
    with pytest.raises(ProtocolError, match="field ok"):
        protocol.parse_answer({"handle": HANDLE})
    pid, models = protocol.parse_list_answer({"ok": True, "pid": 42, "models": [
        {"identity": "i", "key": "a/b/c", "bytes": 5, "handle": HANDLE}]})
    assert pid == 42
    assert [(m.identity, m.key, m.bytes, m.handle) for m in models] == [("i", "a/b/c", 5, HANDLE)]
    with pytest.raises(ProtocolError, match=r"models\[0\].bytes"):
        protocol.parse_list_answer({"ok": True, "pid": 42, "models": [{"identity": "i", "key": "k", "bytes": -1,
                                                                        "handle": HANDLE}]})


def test_errors_and_answers_are_one_line() -> None:
    refusal = protocol.error("first\nsecond   third")
    assert refusal == {"ok": False, "error": "first second third"}
    encoded = protocol.encode_line(protocol.open_answer(HANDLE, 5, "a/b/c"))
    assert encoded.count(b"\n") == 1
    assert json.loads(encoded) == {"ok": True, "handle": HANDLE, "bytes": 5, "model": "a/b/c"}
    with pytest.raises(ProtocolError, match="at most 4096"):
        protocol.encode_line({"error": "x" * 5000})
