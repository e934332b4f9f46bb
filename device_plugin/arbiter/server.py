"""The arbiter's unix-socket server: the hook protocol in, token decisions out.

One asyncio task per connection reads frames (partial reads handled by the protocol's
FrameReader); one :class:`~fastgshare.arbitration.GpuArbiter` per GPU decides. The
scheduler's client is the *pod*: all processes of a pod share its one share, so a pod's
connections queue for the pod's token and receive it one at a time. Memory reservations are
kept per pod too (:class:`~fastgshare.memory.PodMemoryLedger`), per connection inside it. A
dropped connection gives its token and its memory back at once; a pod's last connection
leaving removes it from the scheduler.

Identity: in ``trusted_env`` mode the pod named in HELLO is believed (demo, tests);
otherwise the peer's PID (SO_PEERCRED) is mapped through its cgroup to a pod UID and then
to the pod by the share book.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import attrs

from device_plugin.arbiter.identity import peer_pid, pod_uid_of_pid
from device_plugin.arbiter.shares import PodShare, ShareBook
from fastgshare import protocol
from fastgshare.arbitration import GpuArbiter
from fastgshare.memory import PodMemoryLedger
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
)
from fastgshare.usage import UsageMeter, UsageSnapshot

log = logging.getLogger(__name__)


@attrs.frozen
class GpuSettings:
    mps_enabled: bool


@attrs.frozen
class ArbiterUsage:
    """What the arbiter saw, for the metrics: usage over the window, and each connected pod's
    memory use (bytes its processes hold through the hook) by (GPU, pod)."""

    usage: UsageSnapshot
    memory_bytes: dict[tuple[str, str], int]


@attrs.define(eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    pid: int
    pod: str = ""
    gpu: str = ""
    pending_request: int | None = None  # request id of an unanswered TOKEN

    def send(self, message_type: int, request_id: int, payload: bytes = b"") -> None:
        self.writer.write(protocol.encode_frame(message_type, request_id, payload))


@attrs.define(eq=False)
class _Pod:
    memory: PodMemoryLedger
    connections: set[_Connection] = attrs.field(factory=set)
    queue: deque[_Connection] = attrs.field(factory=deque)  # connections waiting for the pod's token
    holder: _Connection | None = None
    granted_at: int = 0
    token_ns: int = 0  # length of the token the holder was given


class ArbiterServer:
    def __init__(self, socket_path: Path, gpus: dict[str, GpuSettings], shares: ShareBook, *,
                 trusted_env: bool = False, window_ns: int = 100_000_000, min_token_ns: int = 2_000_000,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        self.socket_path = socket_path
        self._shares = shares
        self._trusted = trusted_env
        self._window_ns = window_ns
        self._min_token_ns = min_token_ns
        self._clock = clock
        self._arbiters = {uuid: GpuArbiter(window_ns=window_ns, min_token_ns=min_token_ns,
                                           mps_enabled=settings.mps_enabled) for uuid, settings in gpus.items()}
        self._pods: dict[tuple[str, str], _Pod] = {}  # (gpu, pod key) -> pod state
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._server: asyncio.base_events.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._meter = UsageMeter()

    def usage(self) -> ArbiterUsage:
        """A snapshot for the metrics; call it on the arbiter's loop."""
        return ArbiterUsage(self._meter.snapshot(self._clock()),
                            {key: pod.memory.used_bytes for key, pod in self._pods.items()})

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o666)  # any container user may connect; identity comes from the kernel
        log.info("arbiter listening socket=%s gpus=%s trusted_env=%s", self.socket_path, ",".join(self._arbiters),
                 self._trusted)

    async def stop(self) -> None:
        """Stop listening, drop every connection (their hooks fail closed), remove the socket."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        for timer in self._timers.values():
            timer.cancel()
        self.socket_path.unlink(missing_ok=True)

    def refresh_shares(self) -> None:
        """Re-read every registered pod's share; changes apply from the next decision."""
        for (gpu, pod_key), pod in self._pods.items():
            share = self._shares.by_pod(pod_key)
            if share is None or share.gpu_uuid != gpu:
                continue
            if pod.memory.limit_bytes != share.memory_bytes:
                log.info("memory limit changed pod=%s gpu=%s limit=%d", pod_key, gpu, share.memory_bytes)
                pod.memory.set_limit(share.memory_bytes)
            arbiter = self._arbiters[gpu]
            if arbiter.share(pod_key) != share.time:
                log.info("share changed pod=%s gpu=%s share=%s", pod_key, gpu, share.time)
                arbiter.update_share(pod_key, share.time)
                self._pump(gpu)

    # --- one connection ----------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw: socket.socket = writer.get_extra_info("socket")
        connection = _Connection(writer, peer_pid(raw))
        frames = FrameReader()
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            while data := await reader.read(4096):
                for frame in frames.feed(data):
                    self._handle(connection, frame)
                await writer.drain()
        except ProtocolError as error:
            log.warning("protocol error pid=%d pod=%s: %s", connection.pid, connection.pod or "?", error)
            connection.send(MessageType.ERROR, 0, ErrorReply(error.code, str(error)).encode())
        except ConnectionError:
            pass
        finally:
            self._disconnect(connection)
            writer.close()
            self._handlers.discard(task)

    def _handle(self, connection: _Connection, frame: Frame) -> None:
        if frame.type == MessageType.HELLO:
            self._hello(connection, frame)
        elif not connection.pod:
            self._refuse(connection, frame.request_id, ErrorCode.NOT_REGISTERED, "send HELLO first")
        elif frame.type == MessageType.TOKEN:
            self._token(connection, frame.request_id, protocol.decode_u64(frame.payload))
        elif frame.type in (MessageType.MEM_RESERVE, MessageType.MEM_RELEASE):
            self._memory(connection, frame)
        else:
            self._refuse(connection, frame.request_id, ErrorCode.UNKNOWN_TYPE, f"unknown message type {frame.type}")

    def _hello(self, connection: _Connection, frame: Frame) -> None:
        hello = Hello.decode(frame.payload)
        pod_key = self._identify(connection, hello)
        share = self._shares.by_pod(pod_key) if pod_key else None
        if pod_key is None or share is None:
            self._refuse(connection, frame.request_id, ErrorCode.UNKNOWN_CLIENT,
                         f"pid {connection.pid} belongs to no pod with a fastgshare assignment on this node"
                         if pod_key is None else f"pod {pod_key} has no fastgshare assignment on this node")
            return
        if hello.gpu_uuid and hello.gpu_uuid != share.gpu_uuid:
            self._refuse(connection, frame.request_id, ErrorCode.UNKNOWN_CLIENT,
                         f"pod {pod_key} is assigned GPU {share.gpu_uuid}, not {hello.gpu_uuid}")
            return
        if share.gpu_uuid not in self._arbiters:
            self._refuse(connection, frame.request_id, ErrorCode.UNKNOWN_CLIENT,
                         f"GPU {share.gpu_uuid} of pod {pod_key} is not on this node")
            return
        connection.pod, connection.gpu = pod_key, share.gpu_uuid
        pod = self._pods.get((share.gpu_uuid, pod_key))
        if pod is None:
            pod = self._pods[(share.gpu_uuid, pod_key)] = _Pod(PodMemoryLedger(share.memory_bytes))
            self._arbiters[share.gpu_uuid].add_client(pod_key, share.time)
            self._meter.join(share.gpu_uuid, pod_key)
        pod.connections.add(connection)
        log.info("hook connected pid=%d pod=%s gpu=%s", connection.pid, pod_key, share.gpu_uuid)
        connection.send(MessageType.HELLO | protocol.REPLY_BIT, frame.request_id, self._hello_reply(share).encode())

    def _identify(self, connection: _Connection, hello: Hello) -> str | None:
        if self._trusted:
            return hello.pod or None
        uid = pod_uid_of_pid(connection.pid)
        return self._shares.pod_of_uid(uid) if uid else None

    def _hello_reply(self, share: PodShare) -> HelloReply:
        return HelloReply(window_us=self._window_ns // 1000, request_permille=share.time.request_permille,
                          limit_permille=share.time.limit_permille, sm_percent=share.time.sm_percent,
                          memory_limit_bytes=share.memory_bytes, min_token_us=self._min_token_ns // 1000)

    def _token(self, connection: _Connection, request_id: int, used_ns: int) -> None:
        pod = self._pods[(connection.gpu, connection.pod)]
        arbiter = self._arbiters[connection.gpu]
        now = self._clock()
        connection.pending_request = request_id
        if connection not in pod.queue:
            pod.queue.append(connection)
        if pod.holder is connection:  # it reports what it used of its token, and asks again
            pod.holder = None
            arbiter.request(connection.pod, now, used_ns)
            self._meter.used(connection.gpu, connection.pod, pod.granted_at, used_ns)
        share = arbiter.share(connection.pod)
        at_limit = arbiter.usage_ns(connection.pod, now) >= share.limit_permille * self._window_ns // 1000
        self._meter.asked(connection.gpu, connection.pod, now, at_limit=at_limit)
        self._pump(connection.gpu)

    def _memory(self, connection: _Connection, frame: Frame) -> None:
        """Reserve before an allocation, release after a free; the pod's processes share the limit."""
        ledger = self._pods[(connection.gpu, connection.pod)].memory
        size = protocol.decode_u64(frame.payload)
        reply_type = frame.type | protocol.REPLY_BIT
        if frame.type == MessageType.MEM_RESERVE:
            granted = ledger.reserve(connection, size)
            if not granted:
                log.info("memory refused pod=%s pid=%d size=%d used=%d limit=%d", connection.pod, connection.pid,
                         size, ledger.used_bytes, ledger.limit_bytes)
            reply = MemReserveReply(granted, ledger.used_bytes, ledger.limit_bytes).encode()
            connection.send(reply_type, frame.request_id, reply)
        else:
            ledger.release(connection, size)
            connection.send(reply_type, frame.request_id, protocol.encode_u64(ledger.used_bytes))

    def _refuse(self, connection: _Connection, request_id: int, code: ErrorCode, message: str) -> None:
        log.warning("refused pid=%d pod=%s: %s", connection.pid, connection.pod or "?", message)
        connection.send(MessageType.ERROR, request_id, ErrorReply(code, message).encode())

    def _disconnect(self, connection: _Connection) -> None:
        if not connection.pod:
            return
        key = (connection.gpu, connection.pod)
        pod = self._pods[key]
        arbiter = self._arbiters[connection.gpu]
        pod.connections.discard(connection)
        pod.memory.release_process(connection)
        if connection in pod.queue:
            pod.queue.remove(connection)
        if pod.holder is connection:  # it cannot report its use: charge the time held, at most the token
            pod.holder = None
            now = self._clock()
            held = min(now - pod.granted_at, pod.token_ns)
            arbiter.release(connection.pod, now, held)
            self._meter.used(connection.gpu, connection.pod, pod.granted_at, held)
        if not pod.connections:
            del self._pods[key]
            arbiter.remove_client(connection.pod)
            self._meter.leave(connection.gpu, connection.pod)
            log.info("pod left gpu=%s pod=%s", connection.gpu, connection.pod)
        self._pump(connection.gpu)

    # --- scheduling --------------------------------------------------------------------
    def _pump(self, gpu: str) -> None:
        """Ask the GPU's scheduler for decisions now, send the grants, arm the next wake-up."""
        arbiter = self._arbiters[gpu]
        now = self._clock()
        for (pod_gpu, pod_key), pod in self._pods.items():
            if pod_gpu != gpu or not pod.queue or arbiter.is_waiting(pod_key):
                continue
            # Another process of the pod waits: the pod asks again once the holder's token is over
            # (the silent holder is charged its whole token).
            holding = arbiter.holding_until(pod_key)
            if pod.holder is None or holding is None or holding <= now:
                arbiter.request(pod_key, now, pod.token_ns)
                if pod.holder is not None:  # the silent holder is charged its whole token
                    self._meter.used(gpu, pod_key, pod.granted_at, pod.token_ns)
        decision = arbiter.schedule(now)
        for grant in decision.grants:
            pod = self._pods[(gpu, str(grant.client))]
            connection = pod.queue.popleft()
            pod.holder, pod.granted_at, pod.token_ns = connection, now, grant.token_ns
            self._meter.granted(gpu, str(grant.client), now)
            request_id, connection.pending_request = connection.pending_request or 0, None
            connection.send(MessageType.TOKEN | protocol.REPLY_BIT, request_id, protocol.encode_u64(grant.token_ns))
        self._arm(gpu, decision.wake_at_ns, now)

    def _arm(self, gpu: str, wake_at_ns: int | None, now: int) -> None:
        timer = self._timers.pop(gpu, None)
        if timer is not None:
            timer.cancel()
        if wake_at_ns is not None:
            loop = asyncio.get_running_loop()
            self._timers[gpu] = loop.call_later(max(0, wake_at_ns - now) / 1e9, self._pump, gpu)
