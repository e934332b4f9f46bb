"""The queue worker's HTTP calls (:mod:`fastgshare_queue.calls`) against small aiohttp servers: the URL and
headers of a call, the worker's own credentials, the outcomes for an unreachable gateway and a slow one,
and the callback's headers."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from aiohttp import web

from fastgshare import keys
from fastgshare_gateway.queue import AsyncRequest
from fastgshare_queue.calls import CredentialsError, GatewayCalls, basic_auth_header
from fastgshare_queue.worker import Outcome

REQUEST = AsyncRequest(call_id="0b0e9c0e-1111-4222-8333-444455556666", function="resize", namespace="team-a",
                       method="PUT", path="v1/images", query="size=3&x=%26", headers=(("X-Tenant", "a"),),
                       body=b"raw", callback_url=None, queued_at=0.0)


@contextlib.asynccontextmanager
async def serving(handler: Any) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def credentials(tmp_path: Path) -> Path:
    (tmp_path / keys.BASIC_AUTH_USER_KEY).write_text("admin\n")
    (tmp_path / keys.BASIC_AUTH_PASSWORD_KEY).write_text("s3cret\n")
    return tmp_path


def test_the_call_goes_to_the_function_s_path_with_the_stored_request_and_the_worker_s_credentials(
        tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    async def function(request: web.Request) -> web.Response:
        seen.update(method=request.method, path=request.path, query=request.rel_url.raw_query_string,
                    headers=dict(request.headers), body=await request.read())
        return web.Response(status=201, body=b"answer", headers={"X-Model": "v2"})

    async def scenario() -> Outcome:
        async with serving(function) as url:
            calls = GatewayCalls(url, basic_auth_dir=credentials(tmp_path))
            await calls.start()
            try:
                return await calls.invoke(REQUEST)
            finally:
                await calls.close()
    outcome = asyncio.run(scenario())
    assert (outcome.status, outcome.body, dict(outcome.headers)["X-Model"]) == (201, b"answer", "v2")
    assert (seen["method"], seen["path"], seen["query"], seen["body"]) == (
        "PUT", "/function/resize.team-a/v1/images", "size=3&x=%26", b"raw")
    assert seen["headers"]["X-Call-Id"] == REQUEST.call_id
    assert seen["headers"]["X-Tenant"] == "a"
    assert seen["headers"]["Authorization"] == "Basic " + base64.b64encode(b"admin:s3cret").decode()


def test_an_unreachable_gateway_is_no_status_and_a_silent_one_is_504() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response()

    async def scenario() -> tuple[Outcome, Outcome]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
        calls = GatewayCalls(closed, invoke_timeout_s=0.2)
        await calls.start()
        try:
            refused = await calls.invoke(REQUEST)
            async with serving(slow) as url:
                calls.gateway_url = url
                silent = await calls.invoke(REQUEST)
        finally:
            await calls.close()
        return refused, silent
    refused, silent = asyncio.run(scenario())
    assert refused.status is None
    assert "gateway http://127.0.0.1:" in refused.error
    assert silent.status == 504


def test_the_callback_gets_the_answer_and_openfaas_s_headers_and_its_status_is_returned() -> None:
    got: dict[str, Any] = {}

    async def receiver(request: web.Request) -> web.Response:
        got.update(headers=dict(request.headers), body=await request.read(), path=request.path)
        return web.Response(status=503)

    async def scenario() -> int | None:
        async with serving(receiver) as url:
            calls = GatewayCalls("http://127.0.0.1:1")
            await calls.start()
            try:
                with_callback = attrs.evolve(REQUEST, callback_url=f"{url}/done")
                outcome = Outcome(500, (("Content-Type", "text/plain"),), b"broken\n", 0.5)
                return await calls.post_callback(with_callback, outcome, 4)
            finally:
                await calls.close()
    status = asyncio.run(scenario())
    assert status == 503
    assert (got["path"], got["body"]) == ("/done", b"broken\n")
    headers = got["headers"]
    assert (headers["X-Call-Id"], headers["X-Function-Name"], headers["X-Function-Status"]) == (
        REQUEST.call_id, "resize.team-a", "500")
    assert (headers["X-Duration-Seconds"], headers["X-Fastgshare-Attempts"], headers["Content-Type"]) == (
        "0.500000", "4", "text/plain")


def test_unreadable_credentials_name_the_file(tmp_path: Path) -> None:
    (tmp_path / keys.BASIC_AUTH_USER_KEY).write_text("admin")
    with pytest.raises(CredentialsError, match=keys.BASIC_AUTH_PASSWORD_KEY):
        basic_auth_header(tmp_path)
    (tmp_path / keys.BASIC_AUTH_PASSWORD_KEY).write_text("  \n")
    with pytest.raises(CredentialsError, match="is empty"):
        basic_auth_header(tmp_path)
