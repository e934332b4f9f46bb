"""The adapter to NATS JetStream (nats-py): where asynchronous invocations are stored.

- :func:`connect`: a client that reconnects for ever once connected; a server that cannot be reached at
  first is :class:`QueueUnavailable` (one line naming the URL).
- :func:`ensure_stream`: the stream (``--async-stream``) with subjects ``<stream>.>``, file storage,
  work-queue retention (a message is gone once a worker acknowledged it), duplicates dropped within
  :data:`~fastgshare_gateway.queue.DUPLICATE_WINDOW_S` by ``Nats-Msg-Id``, at most
  :data:`~fastgshare_gateway.queue.STREAM_MAX_BYTES` (then new messages are refused). An existing stream
  is used as it is.
- :func:`depths`: messages stored and not yet acknowledged per ``(namespace, name)``: waiting plus being
  worked on (the queue's demand).
- :class:`AsyncQueue`: the gateway's side. It connects in the background (the synchronous path never waits
  for NATS), and :meth:`AsyncQueue.publish` waits for JetStream's acknowledgement: stored on disk, or
  :class:`QueueUnavailable`, never a guess.

The gateway imports this module (``main`` wires it, the HTTP edge calls :class:`AsyncQueue`); so does the
queue worker, for :func:`connect`, :func:`ensure_stream` and :func:`depths`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js import JetStreamContext, api

from fastgshare_gateway import queue
from fastgshare_gateway.queue import QueueUnavailable, TooLarge

log = logging.getLogger(__name__)

RECONNECT_WAIT_S = 1.0
DEPTH_PAGE_LIMIT = 100_000  # subjects the server lists in one STREAM.INFO (nats-server's own cap)


async def connect(url: str, *, name: str, connect_timeout_s: float = 2.0,
                  on_change: Callable[[str], Awaitable[None]] | None = None) -> Client:
    """A connected client (reconnecting for ever after); :class:`QueueUnavailable` if ``url`` cannot be
    reached now."""
    async def _error(error: Exception) -> None:
        log.warning("NATS %s: %s", url, error)

    async def _note(what: str) -> None:
        log.info("NATS %s: %s", url, what)
        if on_change is not None:
            await on_change(what)

    async def _disconnected() -> None:
        await _note("disconnected")

    async def _reconnected() -> None:
        await _note("reconnected")

    try:
        return await nats.connect(
            url, name=name, connect_timeout=connect_timeout_s,
            allow_reconnect=True, max_reconnect_attempts=-1, reconnect_time_wait=RECONNECT_WAIT_S,
            error_cb=_error, disconnected_cb=_disconnected, reconnected_cb=_reconnected)
    except (OSError, TimeoutError, nats.errors.Error) as error:
        raise QueueUnavailable(f"--nats-url {url}: cannot connect: {error or type(error).__name__}") from None


def stream_config(stream: str) -> api.StreamConfig:
    return api.StreamConfig(
        name=stream, subjects=[queue.subjects(stream)], retention=api.RetentionPolicy.WORK_QUEUE,
        storage=api.StorageType.FILE, discard=api.DiscardPolicy.NEW, max_bytes=queue.STREAM_MAX_BYTES,
        duplicate_window=queue.DUPLICATE_WINDOW_S, num_replicas=1,
        description="fastgshare asynchronous invocations (POST /async-function/...)")


async def ensure_stream(js: JetStreamContext, stream: str) -> None:
    """The stream exists (made with :func:`stream_config` when it did not); :class:`QueueUnavailable` else."""
    try:
        await js.stream_info(stream)
        return
    except nats.js.errors.NotFoundError:
        pass
    except (TimeoutError, nats.errors.Error) as error:
        raise QueueUnavailable(f"JetStream: stream {stream!r} cannot be read ({error or type(error).__name__}); "
                               "is the server started with JetStream (nats-server -js)?") from None
    try:
        await js.add_stream(stream_config(stream))
        log.info("created JetStream stream %s (subjects %s, work queue, file storage)", stream, queue.subjects(stream))
    except nats.js.errors.BadRequestError as error:
        if "already in use" not in str(error):  # another process made it meanwhile
            raise QueueUnavailable(f"JetStream refused stream {stream!r}: {error}") from None
    except (TimeoutError, nats.errors.Error) as error:
        raise QueueUnavailable(f"JetStream: stream {stream!r} cannot be created: {error or type(error).__name__}") \
            from None


async def depths(js: JetStreamContext, stream: str) -> dict[tuple[str, str], int]:
    """Messages stored, not yet acknowledged, per ``(namespace, name)``."""
    info = await js.stream_info(stream, subjects_filter=queue.subjects(stream))
    found: dict[tuple[str, str], int] = {}
    for subject, count in (info.state.subjects or {}).items():
        key = queue.function_of(stream, subject)
        if key is not None:
            found[key] = found.get(key, 0) + int(count)
    return found


class AsyncQueue:
    """The gateway's producer (the :class:`~fastgshare_gateway.queue.Publisher` port): connects in the
    background, publishes with acknowledgement."""

    def __init__(self, url: str, stream: str, *, publish_timeout_s: float = 5.0, retry_s: float = 2.0) -> None:
        self.url, self.stream = url, stream
        self.publish_timeout_s = publish_timeout_s
        self.retry_s = retry_s
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_problem = f"not connected to NATS at {url} yet"

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._connect_loop())

    async def _connect_loop(self) -> None:
        while True:
            try:
                client = await connect(self.url, name="fastgshare-gateway")
            except QueueUnavailable as error:
                self._last_problem = str(error)
                log.warning("%s; retrying in %gs (async invocations answer 503 meanwhile)", error, self.retry_s)
                await asyncio.sleep(self.retry_s)
                continue
            js = client.jetstream(timeout=self.publish_timeout_s)
            try:
                await ensure_stream(js, self.stream)
            except QueueUnavailable as error:
                self._last_problem = str(error)
                log.warning("%s; retrying in %gs", error, self.retry_s)
                await client.close()
                await asyncio.sleep(self.retry_s)
                continue
            self._client, self._js = client, js
            log.info("async invocations go to JetStream stream %s at %s", self.stream, self.url)
            return

    @property
    def connected(self) -> bool:
        """Connected, the stream there: publishing may succeed."""
        return self._js is not None and self._client is not None and self._client.is_connected

    @property
    def max_payload(self) -> int | None:
        return self._client.max_payload if self._client is not None else None

    async def publish(self, request: queue.AsyncRequest) -> bool:
        """Store ``request``; True when JetStream already had this call id (a duplicate, stored once).
        :class:`TooLarge` past the server's limit, :class:`QueueUnavailable` when not stored."""
        if self._js is None or self._client is None:
            raise QueueUnavailable(self._last_problem)
        data = queue.encode(request)
        if len(data) > self._client.max_payload:
            raise TooLarge(len(data), self._client.max_payload)
        headers: dict[str, Any] = {"Nats-Msg-Id": request.call_id}
        try:
            ack = await self._js.publish(queue.subject(self.stream, request.namespace, request.function), data,
                                         timeout=self.publish_timeout_s, stream=self.stream, headers=headers)
        except (TimeoutError, nats.errors.Error) as error:
            raise QueueUnavailable(f"JetStream did not store it: {error or type(error).__name__}") from None
        return bool(ack.duplicate)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._client is not None:
            try:
                await self._client.close()
            except (OSError, TimeoutError, nats.errors.Error) as error:  # the server already gone
                log.debug("closing the NATS connection: %s", error)
