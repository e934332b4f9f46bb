"""``POST /async-function/<name>[.<namespace>][/rest]`` at the HTTP edge, with the queue faked
(:class:`~fastgshare_gateway.queue.Publisher`): what is stored, 202 and ``X-Call-Id``, and every refusal
(one line, the right 4xx/5xx)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from fastgshare import keys
from fastgshare_gateway import queue
from fastgshare_gateway.auth import BasicAuth
from fastgshare_gateway.endpoints import Endpoint
from fastgshare_gateway.http import MAX_BODY_BYTES, Gateway, Options
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.pool import Limits
from fastgshare_gateway.routing import Functions

NS = keys.DEFAULT_FUNCTION_NAMESPACE


class FakeQueue:
    def __init__(self, error: Exception | None = None, duplicate: bool = False) -> None:
        self.stored: list[queue.AsyncRequest] = []
        self.error, self.duplicate = error, duplicate

    async def publish(self, request: queue.AsyncRequest) -> bool:
        if self.error is not None:
            raise self.error
        self.stored.append(request)
        return self.duplicate


@contextlib.asynccontextmanager
async def gateway(async_queue: Any, options: Options | None = None) -> AsyncIterator[str]:
    functions = Functions([NS, "team-a"], Limits(), GatewayMetrics(), default_namespace=NS)
    functions.replace_pods([])
    functions.set_endpoints((NS, "resize"), [Endpoint("resize-0", "127.0.0.1:1")])
    functions.set_endpoints(("team-a", "resize"), [Endpoint("resize-1", "127.0.0.1:1")])
    runner = web.AppRunner(Gateway(functions, None, options, async_queue=async_queue).app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def post(async_queue: Any, path: str, *, data: Any = b"", headers: dict[str, str] | None = None,
         options: Options | None = None) -> tuple[int, str, dict[str, str]]:
    async def scenario() -> tuple[int, str, dict[str, str]]:
        async with gateway(async_queue, options) as url, aiohttp.ClientSession() as client, \
                client.post(url + path, data=data, headers=headers or {}) as answer:
            return answer.status, await answer.text(), dict(answer.headers)
    return asyncio.run(scenario())


def test_the_request_is_stored_whole_and_answered_202_with_a_fresh_call_id() -> None:
    fake = FakeQueue()
    status, text, headers = post(fake, "/async-function/resize.team-a/v1/images?size=3&x=%20", data=b"\x00raw",
                                 headers={"X-Callback-Url": "http://cb.example/done", "X-Tenant": "a",
                                          "Authorization": "Basic eDp5", "Content-Type": "image/png"})
    assert (status, text) == (202, "")
    [stored] = fake.stored
    assert headers["X-Call-Id"] == stored.call_id
    assert len(stored.call_id) == 36
    assert (stored.function, stored.namespace, stored.method, stored.path, stored.query) == (
        "resize", "team-a", "POST", "v1/images", "size=3&x=%20")
    assert (stored.body, stored.callback_url) == (b"\x00raw", "http://cb.example/done")
    names = {name.lower() for name, _ in stored.headers}
    assert {"x-tenant", "content-type", "x-forwarded-for", "x-forwarded-host"} <= names
    assert not names & {"authorization", "x-callback-url", "host", "content-length"}
    assert stored.queued_at > 1.7e9


def test_the_caller_s_uuid_call_id_is_kept_and_a_duplicate_is_still_202() -> None:
    call_id = "0b0e9c0e-1111-4222-8333-444455556666"
    fake = FakeQueue(duplicate=True)
    status, _, headers = post(fake, "/async-function/resize", headers={"X-Call-Id": call_id})
    assert (status, headers["X-Call-Id"]) == (202, call_id)
    assert (fake.stored[0].call_id, fake.stored[0].namespace) == (call_id, NS)


def test_an_unknown_function_is_404_and_nothing_is_stored() -> None:
    fake = FakeQueue()
    status, text, _ = post(fake, "/async-function/nope", data=b"x")
    assert status == 404
    assert text.startswith("no function 'nope' in namespace")
    assert text.count("\n") == 1
    status, _, _ = post(fake, "/async-function/resize.other-ns")
    assert status == 404
    assert fake.stored == []


def test_a_callback_url_that_is_not_absolute_http_is_400_naming_the_header() -> None:
    fake = FakeQueue()
    for url in ("ftp://x/", "/done", "not a url"):
        status, text, _ = post(fake, "/async-function/resize", headers={"X-Callback-Url": url})
        assert status == 400, text
        assert text.startswith("X-Callback-Url: ")
        assert text.count("\n") == 1
    assert fake.stored == []


def test_a_body_over_the_limit_is_413_declared_or_chunked() -> None:
    fake = FakeQueue()
    status, text, _ = post(fake, "/async-function/resize", data=b"x" * (MAX_BODY_BYTES + 1))
    assert status == 413
    assert f"more than {MAX_BODY_BYTES} bytes" in text

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(MAX_BODY_BYTES // 65536 + 2):
            yield b"y" * 65536
    status, text, _ = post(fake, "/async-function/resize", data=chunks())
    assert status == 413
    assert f"more than {MAX_BODY_BYTES} bytes" in text
    status, _, _ = post(fake, "/async-function/resize", data=b"x" * MAX_BODY_BYTES)
    assert status == 202
    assert len(fake.stored) == 1


def test_a_message_over_the_nats_server_s_limit_is_413() -> None:
    status, text, _ = post(FakeQueue(queue.TooLarge(2_000_000, 1_048_576)), "/async-function/resize")
    assert status == 413
    assert "max_payload is 1048576" in text


def test_not_stored_is_503_never_202() -> None:
    status, text, headers = post(FakeQueue(queue.QueueUnavailable("JetStream did not store it: nats: timeout")),
                                 "/async-function/resize", data=b"x")
    assert status == 503
    assert text == "not queued, retry later: JetStream did not store it: nats: timeout\n"
    assert len(headers["X-Call-Id"]) == 36


def test_without_a_queue_the_route_is_501_saying_which_flag() -> None:
    status, text, _ = post(None, "/async-function/resize")
    assert status == 501
    assert "--nats-url" in text


def test_async_invocations_sit_behind_the_same_auth_as_function_invocations(tmp_path: Path) -> None:
    (tmp_path / keys.BASIC_AUTH_USER_KEY).write_text("admin")
    (tmp_path / keys.BASIC_AUTH_PASSWORD_KEY).write_text("s3cret")
    guarded = Options(auth=BasicAuth(tmp_path), auth_functions=True)
    fake = FakeQueue()
    assert post(fake, "/async-function/resize", options=guarded)[0] == 401
    good = "Basic " + base64.b64encode(b"admin:s3cret").decode()
    assert post(fake, "/async-function/resize", options=guarded, headers={"Authorization": good})[0] == 202
    assert post(fake, "/async-function/resize", options=Options(auth=BasicAuth(tmp_path)))[0] == 202
    assert len(fake.stored) == 2
