"""The async message format and header rules (:mod:`fastgshare_gateway.queue`), pure."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastgshare_gateway import queue
from fastgshare_gateway.queue import AsyncRequest, BadMessage

REQUEST = AsyncRequest(call_id="0b0e9c0e-1111-4222-8333-444455556666", function="resize", namespace="team-a",
                       method="PUT", path="v1/images", query="size=3&x=%20", headers=(("X-Tenant", "a"),),
                       body=b"\x00\xff\nraw bytes\n", callback_url="https://cb.example/done", queued_at=1764812345.5)


def test_encode_keeps_the_body_raw_and_decode_gives_back_the_same_request() -> None:
    data = queue.encode(REQUEST)
    assert data.endswith(b"\n" + REQUEST.body)  # no base64: the body's bytes as they came
    assert queue.decode(data) == REQUEST


@given(body=st.binary(max_size=300), method=st.sampled_from(["POST", "PUT", "GET"]),
       headers=st.lists(st.tuples(st.text(max_size=10), st.text(max_size=20)), max_size=5),
       callback=st.none() | st.just("http://x:1/y"))
def test_any_request_survives_the_round_trip(body: bytes, method: str, headers: list[tuple[str, str]],
                                             callback: str | None) -> None:
    request = AsyncRequest(call_id=str(uuid.uuid4()), function="f", namespace="n", method=method, path="",
                           query="", headers=tuple(headers), body=body, callback_url=callback, queued_at=0.0)
    assert queue.decode(queue.encode(request)) == request


@pytest.mark.parametrize(("data", "says"), [
    (b"no newline", "no header line"),
    (b"{not json\nbody", "no JSON"),
    (b"[1]\n", "no JSON object"),
    (json.dumps({"v": 2}).encode() + b"\n", "version 2"),
])
def test_what_is_no_message_is_named(data: bytes, says: str) -> None:
    with pytest.raises(BadMessage, match=says):
        queue.decode(data)


@pytest.mark.parametrize("field", ["callId", "function", "namespace", "method", "path", "query", "headers",
                                   "queuedAt", "callbackUrl"])
def test_a_field_of_the_wrong_type_is_named(field: str) -> None:
    line, _, body = queue.encode(REQUEST).partition(b"\n")
    head = json.loads(line)
    head[field] = 7 if field != "queuedAt" else "soon"
    with pytest.raises(BadMessage, match=field):
        queue.decode(json.dumps(head).encode() + b"\n" + body)


def test_headers_must_be_string_pairs() -> None:
    line, _, body = queue.encode(REQUEST).partition(b"\n")
    head = json.loads(line)
    head["headers"] = [["a", "b", "c"]]
    with pytest.raises(BadMessage, match="pairs"):
        queue.decode(json.dumps(head).encode() + b"\n" + body)


def test_credentials_hop_by_hop_and_the_queue_s_own_headers_are_not_stored() -> None:
    sent = [("Authorization", "Basic eDp5"), ("Proxy-Authorization", "x"), ("Connection", "close"),
            ("Host", "gw"), ("Content-Length", "3"), ("X-Callback-Url", "http://cb/"), ("X-Call-Id", "abc"),
            ("Content-Type", "image/png"), ("X-Tenant", "a"), ("x-tenant", "b"), ("Cookie", "s=1")]
    assert queue.kept_headers(sent) == (("Content-Type", "image/png"), ("X-Tenant", "a"), ("x-tenant", "b"),
                                        ("Cookie", "s=1"))


def test_a_uuid_call_id_is_kept_anything_else_replaced() -> None:
    given_id = "0B0E9C0E-1111-4222-8333-444455556666"
    assert queue.call_id(given_id) == given_id.lower()
    for sent in (None, "", "abc", "0b0e9c0e-1111", "x" * 36):
        fresh = queue.call_id(sent)
        assert uuid.UUID(fresh).version == 4
        assert fresh != sent
    assert queue.call_id(None) != queue.call_id(None)


@pytest.mark.parametrize("url", ["http://cb.example/done", "https://10.0.0.1:8443/x?y=1", "http://[::1]:80/"])
def test_absolute_http_callbacks_are_accepted(url: str) -> None:
    assert queue.callback_problem(url) is None


@pytest.mark.parametrize("url", ["ftp://cb.example/", "/relative", "cb.example/done", "http://", "javascript:x",
                                 "http://host:notaport/", "file:///etc/passwd", ""])
def test_other_callbacks_are_refused_naming_the_header_and_what_is_allowed(url: str) -> None:
    problem = queue.callback_problem(url)
    assert problem is not None
    assert problem.startswith("X-Callback-Url: ")
    assert "absolute http(s) URL" in problem


def test_subjects_are_per_function_and_read_back() -> None:
    assert queue.subject("q", "team-a", "resize") == "q.team-a.resize"
    assert queue.function_of("q", "q.team-a.resize") == ("team-a", "resize")
    for other in ("r.team-a.resize", "q.team-a", "q.a.b.c", "q..x"):
        assert queue.function_of("q", other) is None
    for namespace, name in (("a.b", "f"), ("a", "f.g"), ("a", "*"), ("a", ">"), ("A", "f")):
        with pytest.raises(ValueError, match="not a Kubernetes name"):
            queue.subject("q", namespace, name)


def test_stream_names_that_nats_refuses_are_refused() -> None:
    assert queue.stream_problem(queue.DEFAULT_STREAM) is None
    for bad in ("", "a.b", "a b", "a*", "a>", "x" * 65):
        assert "--async-stream" in (queue.stream_problem(bad) or "")


def test_the_callback_carries_the_answer_headers_then_openfaas_s_own() -> None:
    answer = [("Content-Type", "text/plain"), ("Content-Length", "9"), ("X-Call-Id", "forged"),
              ("X-Function-Status", "999"), ("X-Model", "v2")]
    headers = queue.callback_headers(REQUEST, 500, 0.25, 4, answer)
    assert headers == [("Content-Type", "text/plain"), ("X-Model", "v2"), ("X-Call-Id", REQUEST.call_id),
                       ("X-Function-Name", "resize.team-a"), ("X-Function-Status", "500"),
                       ("X-Duration-Seconds", "0.250000"), ("X-Fastgshare-Attempts", "4")]
