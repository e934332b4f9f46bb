"""The queue worker's adapter to NATS JetStream (nats-py): the durable pull consumer and the queue's depth.

:class:`JetStreamSource` connects (retrying until it can or the worker stops), makes the stream when missing
(:func:`fastgshare_gateway.jetstream.ensure_stream`) and binds the durable pull consumer ``--durable`` over
all the stream's subjects: explicit acknowledgement, ``ack_wait`` ``--ack-wait``, unlimited deliveries, at
most ``--max-held`` messages delivered and not yet acknowledged. An existing consumer is used as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from fastgshare_gateway import jetstream, queue
from fastgshare_gateway.queue import QueueUnavailable
from fastgshare_queue.worker import Delivery

log = logging.getLogger(__name__)

RETRY_S = 2.0


class NatsDelivery:
    """A JetStream message as the worker's :class:`~fastgshare_queue.worker.Delivery`."""

    def __init__(self, msg: Msg) -> None:
        self._msg = msg

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def num_delivered(self) -> int:
        return int(self._msg.metadata.num_delivered or 1)

    async def ack(self) -> None:
        await self._msg.ack()

    async def nak(self, delay_s: float) -> None:
        await self._msg.nak(delay=delay_s)

    async def in_progress(self) -> None:
        await self._msg.in_progress()

    async def term(self) -> None:
        await self._msg.term()


class JetStreamSource:
    def __init__(self, url: str, stream: str, durable: str, *, ack_wait_s: float, max_held: int) -> None:
        self.url, self.stream, self.durable = url, stream, durable
        self.ack_wait_s, self.max_held = ack_wait_s, max_held
        self._client: Client | None = None
        self._js: JetStreamContext | None = None
        self._sub: JetStreamContext.PullSubscription | None = None

    @property
    def bound(self) -> bool:
        return self._sub is not None and self._client is not None and self._client.is_connected

    async def start(self, stop: asyncio.Event) -> bool:
        """Connected and bound (True), or ``stop`` set first (False)."""
        while not stop.is_set():
            try:
                await self._bind()
                log.info("consuming stream %s at %s as durable consumer %s", self.stream, self.url, self.durable)
                return True
            except QueueUnavailable as error:
                log.warning("%s; retrying in %gs", error, RETRY_S)
                await self.close()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY_S)
        return False

    async def _bind(self) -> None:
        self._client = await jetstream.connect(self.url, name=f"fastgshare-queue-worker/{self.durable}")
        self._js = self._client.jetstream()
        await jetstream.ensure_stream(self._js, self.stream)
        config = api.ConsumerConfig(
            durable_name=self.durable, ack_policy=api.AckPolicy.EXPLICIT, ack_wait=self.ack_wait_s, max_deliver=-1,
            max_ack_pending=self.max_held, deliver_policy=api.DeliverPolicy.ALL,
            description="fastgshare-queue-worker: runs asynchronous invocations")
        try:
            self._sub = await self._js.pull_subscribe(queue.subjects(self.stream), durable=self.durable,
                                                      stream=self.stream, config=config)
        except (TimeoutError, nats.errors.Error) as error:
            raise QueueUnavailable(f"JetStream: consumer {self.durable!r} on stream {self.stream!r} cannot be "
                                   f"bound: {error or type(error).__name__}") from None

    async def fetch(self, batch: int, timeout_s: float) -> Sequence[Delivery]:
        if self._sub is None:
            raise QueueUnavailable("not bound to the stream")
        try:
            msgs = await self._sub.fetch(batch, timeout=timeout_s)
        except TimeoutError:  # nats' own timeouts are TimeoutErrors too: nothing came
            return []
        except nats.errors.Error as error:
            raise QueueUnavailable(f"fetch from stream {self.stream!r}: {error or type(error).__name__}") from None
        return [NatsDelivery(msg) for msg in msgs]

    async def depths(self) -> dict[tuple[str, str], int]:
        if self._js is None:
            raise QueueUnavailable("not connected")
        try:
            return await jetstream.depths(self._js, self.stream)
        except (TimeoutError, nats.errors.Error) as error:
            raise QueueUnavailable(f"stream {self.stream!r} info: {error or type(error).__name__}") from None

    async def close(self) -> None:
        if self._client is not None:
            try:
                await self._client.close()
            except (OSError, TimeoutError, nats.errors.Error) as error:
                log.debug("closing the NATS connection: %s", error)
        self._client, self._js, self._sub = None, None, None
