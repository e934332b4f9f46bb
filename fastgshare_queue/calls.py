"""The queue worker's HTTP calls (aiohttp client): the function through the gateway, and the callback.

- :meth:`GatewayCalls.invoke`: ``<gateway>/function/<name>.<namespace>[/path][?query]`` with the stored
  method, headers and body, ``X-Call-Id``, and ``Authorization`` from ``--basic-auth-dir`` (the gateway's
  Secret ``basic-auth``, read at each call so that a rotated Secret applies). The answer is read up to
  ``max_answer_bytes`` (past it: 502 to the callback). A gateway that refuses or drops the connection is
  status None (retried, then left in the queue); no answer within ``invoke_timeout_s`` is 504.
- :meth:`GatewayCalls.post_callback`: ``POST`` to ``X-Callback-Url`` with the answer's body and
  :func:`fastgshare_gateway.queue.callback_headers`; its status, or None when it cannot be reached.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from pathlib import Path

import aiohttp
from multidict import CIMultiDict

from fastgshare import keys
from fastgshare_gateway.queue import CALL_ID_HEADER, AsyncRequest, callback_headers
from fastgshare_queue.worker import Outcome

log = logging.getLogger(__name__)

CHUNK = 64 * 1024


class CredentialsError(Exception):
    """``--basic-auth-dir`` cannot be read; one line naming the file."""


def basic_auth_header(directory: Path) -> str:
    """``Basic ...`` from ``directory``'s ``basic-auth-user`` and ``basic-auth-password`` (trimmed)."""
    values = []
    for key in (keys.BASIC_AUTH_USER_KEY, keys.BASIC_AUTH_PASSWORD_KEY):
        path = directory / key
        try:
            value = path.read_bytes().strip()
        except OSError as error:
            raise CredentialsError(f"--basic-auth-dir: cannot read {path}: {error.strerror or error}") from None
        if not value:
            raise CredentialsError(f"--basic-auth-dir: {path} is empty")
        values.append(value)
    return "Basic " + base64.b64encode(values[0] + b":" + values[1]).decode()


class GatewayCalls:
    """The :class:`~fastgshare_queue.worker.Calls` port over HTTP."""

    def __init__(self, gateway_url: str, *, basic_auth_dir: Path | None = None, invoke_timeout_s: float = 120.0,
                 callback_timeout_s: float = 10.0, connect_timeout_s: float = 5.0,
                 max_answer_bytes: int = 16 << 20) -> None:
        self.gateway_url = gateway_url.rstrip("/")
        self.basic_auth_dir = basic_auth_dir
        self.invoke_timeout = aiohttp.ClientTimeout(total=invoke_timeout_s, connect=connect_timeout_s)
        self.callback_timeout = aiohttp.ClientTimeout(total=callback_timeout_s, connect=connect_timeout_s)
        self.max_answer_bytes = max_answer_bytes
        self._session: aiohttp.ClientSession | None = None
        self._last_auth = ""

    async def start(self) -> None:
        if self.basic_auth_dir is not None:
            self._last_auth = basic_auth_header(self.basic_auth_dir)  # refuse to start without them
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True), auto_decompress=False,
            skip_auto_headers=("User-Agent", "Content-Type", "Accept-Encoding"))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _authorization(self) -> str:
        if self.basic_auth_dir is None:
            return ""
        try:
            self._last_auth = basic_auth_header(self.basic_auth_dir)
        except CredentialsError as error:
            log.warning("keeping the last gateway credentials: %s", error)
        return self._last_auth

    def function_url(self, request: AsyncRequest) -> str:
        path = f"/{request.path}" if request.path else ""
        query = f"?{request.query}" if request.query else ""
        return f"{self.gateway_url}/function/{request.function}.{request.namespace}{path}{query}"

    async def invoke(self, request: AsyncRequest) -> Outcome:
        assert self._session is not None
        headers = CIMultiDict(request.headers)
        headers[CALL_ID_HEADER] = request.call_id
        if authorization := self._authorization():
            headers["Authorization"] = authorization
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            async with self._session.request(request.method, self.function_url(request), headers=headers,
                                             data=request.body or None, allow_redirects=False,
                                             timeout=self.invoke_timeout) as answer:
                body = await answer.content.read(self.max_answer_bytes + 1)
                if len(body) > self.max_answer_bytes:
                    return Outcome(502, (), f"the answer is over {self.max_answer_bytes} bytes\n".encode(),
                                   loop.time() - started, "answer too large")
                return Outcome(answer.status, tuple(answer.headers.items()), body, loop.time() - started)
        except aiohttp.ClientConnectionError as error:
            return Outcome(None, duration_s=loop.time() - started,
                           error=f"gateway {self.gateway_url}: {error or type(error).__name__}")
        except TimeoutError:
            return Outcome(504, (), f"no answer within {self.invoke_timeout.total:g}s\n".encode(),
                           loop.time() - started, "timeout")
        except aiohttp.ClientError as error:
            return Outcome(502, (), f"the exchange broke: {error}\n".encode(), loop.time() - started, str(error))

    async def post_callback(self, request: AsyncRequest, outcome: Outcome, attempts: int) -> int | None:
        assert self._session is not None
        assert request.callback_url is not None
        status = outcome.status if outcome.status is not None else 503
        headers = CIMultiDict(callback_headers(request, status, outcome.duration_s, attempts, outcome.headers))
        try:
            async with self._session.post(request.callback_url, data=outcome.body, headers=headers,
                                          allow_redirects=False, timeout=self.callback_timeout) as answer:
                await answer.content.read(CHUNK)
                return answer.status
        except (aiohttp.ClientError, TimeoutError) as error:
            log.info("call=%s: callback %s: %s", request.call_id, request.callback_url, error or type(error).__name__)
            return None
