"""The arbiter's unix-socket server: the hook protocol in, token decisions out.

The connections and the token hot path are the native engine's (:mod:`.native`, C, on a thread of
its own): it accepts, frames what hooks send, and answers the renewal every hook sends (TOKEN on
a registered connection) itself, with one scheduler per GPU (``arbiter_engine/policy.c``, which follows
:class:`~fastgshare.arbitration.GpuArbiter` decision for decision) and the usage meter. This
module decides everything else, on the asyncio loop, from the engine's events: who a new
connection is, HELLO, memory, errors, refusals and deadlines, share changes, and the state
file. The engine answers every PING itself.

Fairness: each connection belongs to its peer's *group* (the pod by its cgroup, else the
process), told to the engine as soon as the connection is accepted and before a byte of it is
read; the engine keeps each group's events in a queue of its own and hands them to Python one
group after another (round-robin by pod: a pod's share of the Python side does not grow with its
number of connections, and an idle pod's next request waits for one event of each busy pod, not
for their backlog). Python takes at most ``DRAIN_BATCH`` events per turn of the loop, so the
loop's other work (usage snapshots, timers) never waits behind a flood either.

Charging: a returned token is charged at least the time it was held (grant to return, or to its
expiry), and what the client reports counts only above that, clamped to the time since the grant
(``fgs_token_charge``); a report that does not fit a signed 64-bit count is refused.

Liveness (:mod:`.probe`): an arbiter in this process is probed through a private socketpair the
engine answers itself, which no tenant can reach or queue in front of; its answer says whether
Python keeps taking the engine's events. The socket's path is checked by its inode.

The scheduler's client is the *pod*: all processes of a pod share its one share, so a
pod's connections queue for the pod's token and receive it one at a time. Memory reservations
are kept per pod too (:class:`~fastgshare.memory.PodMemoryLedger`), per connection inside it. A
dropped connection gives its token and its memory back at once; a pod's last connection
leaving removes it from the scheduler.

Identity: in ``trusted_env`` mode the pod named in HELLO is believed (demo, tests);
otherwise the peer's PID (SO_PEERCRED) is mapped through its cgroup to a pod UID and then
to the pod by the share book. One HELLO per connection.

Restarts (:mod:`.state`): with a state file, every change of the memory ledger is saved
before its reply goes out, and a restarted arbiter loads it: each process's reservations come
back as *orphans* that count against the pod's limit until the process reconnects and says
what it still holds (``MEM_RESTORE``) or is gone (``/proc/<pid>``, checked every second; the
agent runs with the node's PIDs).

Edge: at most ``max_connections_per_pod`` connections per pod (by the peer's cgroup; per
process outside pods), a connection that has not said HELLO within ``hello_timeout_s`` is
closed, the log lines a client can cause are rate-limited (:mod:`.ratelimit`), and a connection
whose replies pile up, or whose requests wait for Python, is not read until they drain.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

import attrs

from device_plugin.arbiter import probe
from device_plugin.arbiter.identity import pod_uid_of_pid
from device_plugin.arbiter.native import EVENT_ACCEPTED, EVENT_CLOSED, EngineEvent, NativeEngine
from device_plugin.arbiter.ratelimit import RepeatLimiter
from device_plugin.arbiter.shares import PodShare, ShareBook
from device_plugin.arbiter.state import SavedPod, StateFile
from fastgshare import keys, protocol
from fastgshare.arbitration import ArbitrationError, TimeShare
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
from fastgshare.usage import DEFAULT_WINDOW_NS as METER_WINDOW_NS
from fastgshare.usage import UsageSnapshot

try:
    import uvloop
except ImportError:  # pragma: no cover - a dependency; the GPU machine's bench may lack it
    uvloop = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS_PER_POD = 256
DEFAULT_HELLO_TIMEOUT_S = 5.0
ORPHAN_CHECK_S = 1.0
SAVE_DELAY_S = 0.05
MAX_REFUSING = 16  # refused connections held open at once to tell them why
REFUSE_WAIT_S = 0.5  # how long a refused connection may take to send the request it is told why on
BACKLOG = 128
DRAIN_BATCH = 64  # events Python takes per turn of its loop
INT64_MAX = 2**63 - 1


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The loop the arbiter's Python side runs on: uvloop's if it is installed, else asyncio's."""
    return uvloop.new_event_loop() if uvloop is not None else asyncio.new_event_loop()


def process_alive(pid: int) -> bool:
    return pid > 0 and Path(f"/proc/{pid}").exists()


@attrs.frozen
class GpuSettings:
    mps_enabled: bool


def engine_share(share: TimeShare, mps_enabled: bool) -> TimeShare:
    """The share the GPU's scheduler in the engine is told: without MPS a pod's kernels may use
    every SM, so it counts as the whole GPU (100 %) and pods take turns (the engine's schedulers
    all run with MPS on; this is what turns it off, per GPU and at any time)."""
    return share if mps_enabled else attrs.evolve(share, sm_percent=keys.SM_UNITS)


@attrs.frozen
class ArbiterUsage:
    """What the arbiter saw, for the metrics: usage over the window, and each connected pod's
    memory use (bytes its processes hold through the hook) by (GPU, pod)."""

    usage: UsageSnapshot
    memory_bytes: dict[tuple[str, str], int]


@attrs.define(eq=False)
class _Connection:
    """A connection as the Python side knows it; its bytes go through the engine."""

    engine: NativeEngine
    id: int  # the engine's
    pid: int
    pod: str = ""
    gpu: str = ""
    memory_used: bool = False  # a memory request was made (MEM_RESTORE must come first)

    def send(self, message_type: int, request_id: int, payload: bytes = b"") -> None:
        self.engine.send(self.id, protocol.encode_frame(message_type, request_id, payload))


@attrs.frozen
class _Orphan:
    """Memory a process held before the arbiter restarted, until it reconnects (the ledger key)."""

    pid: int


@attrs.define(eq=False)
class _Pod:
    memory: PodMemoryLedger
    connections: set[_Connection] = attrs.field(factory=set)  # registered with the engine (HELLO said)
    orphans: set[_Orphan] = attrs.field(factory=set)
    share: PodShare | None = None  # as last known, saved for a restarted arbiter
    uid: str = ""  # the pod's UID when found by cgroup


class ArbiterServer:
    def __init__(self, socket_path: Path, gpus: dict[str, GpuSettings], shares: ShareBook, *,
                 trusted_env: bool = False, window_ns: int = 100_000_000, min_token_ns: int = 2_000_000,
                 state: StateFile | None = None, max_connections_per_pod: int = DEFAULT_MAX_CONNECTIONS_PER_POD,
                 hello_timeout_s: float = DEFAULT_HELLO_TIMEOUT_S,
                 alive: Callable[[int], bool] = process_alive) -> None:
        if window_ns <= 0 or not 0 < min_token_ns <= window_ns:
            raise ArbitrationError(f"need window_ns > 0 and 0 < min_token_ns <= window_ns, "
                                   f"got {window_ns} and {min_token_ns}")
        self.socket_path = socket_path
        self._gpus = dict(gpus)
        self._state = state
        self._max_per_pod = max_connections_per_pod
        self._hello_timeout_s = hello_timeout_s
        self._alive = alive
        self._refusing = 0
        self._peers: dict[str, int] = {}  # peer key (pod uid, or pid outside pods) -> open connections
        self._groups: dict[str, int] = {}  # peer key -> its group in the engine (while it has connections)
        self._free_groups: list[int] = []
        self._drain_again: asyncio.Handle | None = None
        self._socket_id: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket bound
        self._orphan_sweeper: asyncio.Task[None] | None = None
        self._stopping = False
        self._save_timer: asyncio.TimerHandle | None = None
        self._saved_shares: dict[str, PodShare] = {}  # what the last arbiter knew, until the book is ready
        self._saved_uids: dict[str, str] = {}
        self._log = RepeatLimiter(log)
        self._shares = shares
        self._trusted = trusted_env
        self._window_ns = window_ns
        self._min_token_ns = min_token_ns
        self._pods: dict[tuple[str, str], _Pod] = {}  # (gpu, pod key) -> pod state
        self._listener: socket.socket | None = None
        self._engine: NativeEngine | None = None
        self._links: dict[int, _Link] = {}  # the engine's connection id -> its Python side

    def usage(self) -> ArbiterUsage:
        """A snapshot for the metrics; call it on the arbiter's loop."""
        snapshot = (self._engine.usage() if self._engine is not None
                    else UsageSnapshot(window_s=METER_WINDOW_NS / 1e9, pods=(), gpus=()))
        return ArbiterUsage(snapshot, {key: pod.memory.used_bytes for key, pod in self._pods.items()})

    async def start(self) -> None:
        if self._state is not None:
            self._restore(self._state.load())
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.socket_path))
            bound = self.socket_path.stat()
            self._socket_id = (bound.st_dev, bound.st_ino)
            listener.listen(BACKLOG)
            listener.setblocking(False)
            os.chmod(self.socket_path, 0o666)  # any container user may connect; identity comes from the kernel
            engine = NativeEngine(listener.fileno(), [(uuid, True) for uuid in self._gpus],  # see engine_share
                                  window_ns=self._window_ns, min_token_ns=self._min_token_ns,
                                  meter_window_ns=METER_WINDOW_NS)
        except BaseException:
            listener.close()
            raise
        self._listener, self._engine = listener, engine
        asyncio.get_running_loop().add_reader(engine.event_fd, self._drain)
        engine.start()
        probe.serve(self.socket_path, self.probe_problem)
        log.info("arbiter listening socket=%s gpus=%s trusted_env=%s", self.socket_path, ",".join(self._gpus),
                 self._trusted)

    async def stop(self) -> None:
        """Stop listening, drop every connection, remove the socket. The saved ledger stays as it
        is: the hooks reconnect to the next arbiter and keep what they hold."""
        self._stopping = True
        probe.unserve(self.socket_path, self.probe_problem)
        if self._drain_again is not None:
            self._drain_again.cancel()
        engine, self._engine = self._engine, None
        if engine is not None:
            asyncio.get_running_loop().remove_reader(engine.event_fd)
            engine.close()  # its thread stops, every connection closes
        for link in list(self._links.values()):
            link.finish()
        if self._listener is not None:
            self._listener.close()
        if self._save_timer is not None:
            self._save_timer.cancel()
        if self._orphan_sweeper is not None:
            self._orphan_sweeper.cancel()
            await asyncio.gather(self._orphan_sweeper, return_exceptions=True)
        self.socket_path.unlink(missing_ok=True)

    def probe_problem(self, timeout_s: float, stalled_after_s: float) -> str | None:
        """None while the socket's path is the one bound, the engine answers a PING on the probe's
        own socketpair and Python has taken the engine's events within ``stalled_after_s``; else
        what is wrong, in words. Any thread may call it."""
        try:
            now = self.socket_path.stat()
            replaced = (now.st_dev, now.st_ino) != self._socket_id
        except OSError as error:
            return f"the arbiter does not answer at {self.socket_path}: it is gone ({error.strerror or error})"
        if replaced:
            return f"{self.socket_path} is not the arbiter's socket any more: {probe.served_by(self.socket_path)}"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with ours:
            engine = self._engine
            if engine is None or not engine.add_probe(theirs.detach()):
                return "the arbiter is stopped, or its engine refused the probe's connection"
            stalled_ns = probe.ping_for_stall(ours, timeout_s)
        if isinstance(stalled_ns, str):
            return f"the arbiter's engine does not answer: {stalled_ns}"
        if stalled_ns > stalled_after_s * 1e9:
            return (f"the arbiter's Python side has not taken an event for {stalled_ns / 1e9:.1f}s "
                    f"(more than {stalled_after_s:g}s) while events waited")
        return None

    def _drain(self) -> None:
        """The engine's events, a group at a time: new connections, frames for Python, connections
        the peer closed; at most DRAIN_BATCH, then the loop's other work has its turn."""
        self._drain_again = None
        engine = self._engine
        if engine is None:
            return
        events = engine.events(DRAIN_BATCH)
        if len(events) == DRAIN_BATCH:
            self._drain_again = asyncio.get_running_loop().call_soon(self._drain)
        for event in events:
            try:
                self._dispatch(engine, event)
            except Exception:  # a bug must cost one connection, not the events queued behind it
                log.exception("unexpected error on an arbiter connection (pid %d): closing it", event.pid)
                link = self._links.get(event.connection)
                if link is not None:
                    link.finish()
                else:
                    engine.close_connection(event.connection)

    def _dispatch(self, engine: NativeEngine, event: EngineEvent) -> None:
        if event.kind == EVENT_ACCEPTED:
            _Link(self, engine, event.connection, event.pid)
            return
        link = self._links.get(event.connection)
        if link is None:  # closed here while the event waited
            return
        if event.kind == EVENT_CLOSED:
            link.lost()
        else:
            link.received(event.data)

    # --- the ledger across restarts ----------------------------------------------------
    def _restore(self, saved: list[SavedPod]) -> None:
        """Bring back what each process held; orphans of processes already gone are dropped."""
        kept = dropped = 0
        for entry in saved:
            if entry.gpu not in self._gpus:
                log.warning("saved pod %s is on GPU %s, not on this node: dropped", entry.pod, entry.gpu)
                continue
            if entry.share is not None:
                self._saved_shares[entry.pod] = PodShare(entry.gpu, entry.share, entry.memory_limit_bytes)
                if entry.uid:
                    self._saved_uids[entry.uid] = entry.pod
            pod = _Pod(PodMemoryLedger(entry.memory_limit_bytes), share=self._saved_shares.get(entry.pod),
                       uid=entry.uid)
            for pid, size in entry.held.items():
                if self._alive(pid):
                    pod.orphans.add(_Orphan(pid))
                    pod.memory.restore(_Orphan(pid), size)
                    kept += 1
                else:
                    dropped += 1
            if pod.orphans:
                self._pods[(entry.gpu, entry.pod)] = pod
        if saved:
            log.info("arbiter state restored: %d pods, %d processes' memory kept until they reconnect or exit, "
                     "%d of exited processes dropped", len(self._pods), kept, dropped)
        self._save()
        if any(pod.orphans for pod in self._pods.values()):
            self._orphan_sweeper = asyncio.get_running_loop().create_task(self._sweep_orphans())

    async def _sweep_orphans(self) -> None:
        """Every second drop the orphans whose process is gone (its memory went with it)."""
        while any(pod.orphans for pod in self._pods.values()):
            await asyncio.sleep(ORPHAN_CHECK_S)
            changed = False
            for key, pod in list(self._pods.items()):
                for orphan in list(pod.orphans):
                    if not self._alive(orphan.pid):
                        size = pod.memory.release_process(orphan)
                        pod.orphans.discard(orphan)
                        changed = True
                        log.info("memory of pid %d (pod %s) released: the process is gone, %d bytes", orphan.pid,
                                 key[1], size)
                self._forget_if_idle(key, pod)
            if changed:
                self._save()

    def _forget_if_idle(self, key: tuple[str, str], pod: _Pod) -> None:
        if not pod.connections and not pod.orphans and self._pods.get(key) is pod:
            del self._pods[key]
            self._save_soon()

    def _save_soon(self) -> None:
        """Save within 50 ms (releases: a ledger on disk that lags them only over-counts, and a
        reconnecting process reports what it really holds)."""
        if self._state is not None and self._save_timer is None and not self._stopping:
            self._save_timer = asyncio.get_running_loop().call_later(SAVE_DELAY_S, self._save)

    def _save(self) -> None:
        if self._save_timer is not None:
            self._save_timer.cancel()
            self._save_timer = None
        if self._state is None or self._stopping:
            return
        pods = []
        for (gpu, pod_key), pod in self._pods.items():
            held: dict[int, int] = {}
            processes: list[_Connection | _Orphan] = [*pod.connections, *pod.orphans]
            for process in processes:
                size = pod.memory.held_by(process)
                if size:
                    held[process.pid] = held.get(process.pid, 0) + size
            pods.append(SavedPod(gpu, pod_key, pod.memory.limit_bytes, held,
                                 pod.share.time if pod.share else None, pod.uid))
        if self._saved_shares and not self._shares.ready():  # not yet re-registered: keep them
            known = {pod.pod for pod in pods}
            pods += [SavedPod(share.gpu_uuid, key, share.memory_bytes, {}, share.time,
                              next((uid for uid, k in self._saved_uids.items() if k == key), ""))
                     for key, share in self._saved_shares.items() if key not in known]
        try:
            self._state.save(pods)
        except OSError as error:
            self._log.log(logging.ERROR, "cannot save the arbiter state to %s: %s", self._state.path, error)

    def refresh_shares(self) -> None:
        """Re-read every registered pod's share; changes apply from the next decision."""
        if self._saved_shares and self._shares.ready():
            self._saved_shares.clear()  # the book knows every pod now
            self._saved_uids.clear()
        for (gpu, pod_key), pod in self._pods.items():
            share = self._shares.by_pod(pod_key)
            if share is None or share.gpu_uuid != gpu:
                continue
            pod.share = share
            if pod.memory.limit_bytes != share.memory_bytes:
                log.info("memory limit changed pod=%s gpu=%s limit=%d", pod_key, gpu, share.memory_bytes)
                pod.memory.set_limit(share.memory_bytes)
            if pod.connections and self._engine is not None and self._engine.set_share(
                    gpu, pod_key, engine_share(share.time, self._gpus[gpu].mps_enabled)):
                log.info("share changed pod=%s gpu=%s share=%s", pod_key, gpu, share.time)

    def set_mps(self, gpu: str, enabled: bool) -> None:
        """The GPU's MPS started or stopped: its connected pods' SM percentages count, or do not,
        from the next decision (tokens held run out as granted). Call it on the arbiter's loop."""
        if gpu not in self._gpus or self._gpus[gpu].mps_enabled == enabled:
            return
        self._gpus[gpu] = GpuSettings(mps_enabled=enabled)
        log.info("gpu=%s mps=%s: SM partitions %s", gpu, enabled,
                 "apply" if enabled else "do not apply, pods take turns")
        for (pod_gpu, pod_key), pod in self._pods.items():
            if pod_gpu == gpu and pod.connections and pod.share is not None and self._engine is not None:
                self._engine.set_share(gpu, pod_key, engine_share(pod.share.time, enabled))

    # --- one connection ----------------------------------------------------------------
    def _connected(self, link: _Link, connection: _Connection) -> bool:
        """A new connection: whether its peer may have another (False: refused)."""
        peer = self._peer_key(connection.pid)
        if self._peers.get(peer, 0) >= self._max_per_pod:
            self._refuse_connection(link, connection, peer)
            return False
        self._peers[peer] = self._peers.get(peer, 0) + 1
        link.peer = peer
        connection.engine.set_group(connection.id, self._group_of(peer))
        return True

    def _group_of(self, peer: str) -> int:
        """The peer's group number in the engine (1 up, reused once its connections are all gone)."""
        group = self._groups.get(peer)
        if group is None:
            group = self._groups[peer] = self._free_groups.pop() if self._free_groups else len(self._groups) + 1
        return group

    def _closed(self, link: _Link, connection: _Connection) -> None:
        """The connection is gone (or the arbiter stops): its memory goes back (its token went back
        in the engine)."""
        self._peers[link.peer] -= 1
        if not self._peers[link.peer]:
            del self._peers[link.peer]
            self._free_groups.append(self._groups.pop(link.peer))
        self._disconnect(connection)

    def _refuse_connection(self, link: _Link, connection: _Connection, peer: str) -> None:
        """Over the pod's limit: answer its first request with why (waiting for it briefly, and for
        a few such connections at a time: a flood is closed at once), then close."""
        message = f"{peer} already has {self._max_per_pod} connections to the arbiter (--max-connections-per-pod)"
        self._log.warning("refused a connection from pid=%d: %s", connection.pid, message)
        group = self._groups.get(peer)
        if self._refusing >= MAX_REFUSING or group is None:
            link.finish()
            return
        self._refusing += 1
        connection.engine.set_group(connection.id, group)  # read, in the peer's turn

        def done() -> None:
            self._refusing -= 1

        link.refuse(connection, message, done)

    def _peer_key(self, pid: int) -> str:
        """Whose connection this is, for the per-pod limit: the pod by its cgroup, else the process."""
        uid = pod_uid_of_pid(pid)
        return f"pod {uid}" if uid else f"pid {pid}"

    def _handle(self, connection: _Connection, frame: Frame) -> None:
        if frame.type == MessageType.PING:
            connection.send(MessageType.PING | protocol.REPLY_BIT, frame.request_id)
        elif frame.type == MessageType.HELLO and connection.pod:
            # One identity per connection: a second HELLO would move the connection (and what it
            # holds) to another pod's books.
            self._refuse(connection, frame.request_id, ErrorCode.UNKNOWN_CLIENT,
                         f"this connection already said HELLO as pod {connection.pod}; open a new one")
        elif frame.type == MessageType.HELLO:
            self._hello(connection, frame)
        elif not connection.pod:
            self._refuse(connection, frame.request_id, ErrorCode.NOT_REGISTERED, "send HELLO first")
        elif frame.type == MessageType.TOKEN:
            # One that came before the engine knew the connection's pod, or a report the engine does not take.
            used_ns = protocol.decode_u64(frame.payload)
            if used_ns > INT64_MAX:
                self._refuse(connection, frame.request_id, ErrorCode.BAD_FRAME,
                             f"TOKEN used_ns={used_ns} is negative as a signed 64-bit count; allowed: 0..{INT64_MAX} "
                             "(reports above the time since the grant count as that time)")
                return
            connection.engine.token(connection.id, frame.request_id, used_ns)
        elif frame.type in (MessageType.MEM_RESERVE, MessageType.MEM_RELEASE):
            self._memory(connection, frame)
        elif frame.type == MessageType.MEM_RESTORE:
            self._memory_restore(connection, frame)
        else:
            self._refuse(connection, frame.request_id, ErrorCode.UNKNOWN_TYPE, f"unknown message type {frame.type}")

    def _hello(self, connection: _Connection, frame: Frame) -> None:
        hello = Hello.decode(frame.payload)
        pod_key, uid = self._identify(connection, hello)
        share = self._share_of(pod_key) if pod_key else None
        if pod_key is None or share is None:
            self._refuse(connection, frame.request_id, ErrorCode.UNKNOWN_CLIENT,
                         f"pid {connection.pid} belongs to no pod with a fastgshare assignment on this node"
                         if pod_key is None else f"pod {pod_key} has no fastgshare assignment on this node")
            return
        if hello.gpu_uuid and hello.gpu_uuid != share.gpu_uuid:
            self._refuse(connection, frame.request_id, ErrorCode.UNKNOWN_CLIENT,
                         f"pod {pod_key} is assigned GPU {share.gpu_uuid}, not {hello.gpu_uuid}")
            return
        if share.gpu_uuid not in self._gpus:
            self._refuse(connection, frame.request_id, ErrorCode.UNKNOWN_CLIENT,
                         f"GPU {share.gpu_uuid} of pod {pod_key} is not on this node")
            return
        connection.pod, connection.gpu = pod_key, share.gpu_uuid
        pod = self._pods.get((share.gpu_uuid, pod_key))
        if pod is None:
            pod = self._pods[(share.gpu_uuid, pod_key)] = _Pod(PodMemoryLedger(share.memory_bytes), share=share,
                                                               uid=uid)
            self._save()
        pod.share, pod.uid = share, uid or pod.uid
        if pod.memory.limit_bytes != share.memory_bytes:
            pod.memory.set_limit(share.memory_bytes)
        # The engine answers this connection's TOKENs from now on (with this share if the pod is new
        # to the GPU's scheduler; a running pod's share changes through refresh_shares).
        connection.engine.register(connection.id, share.gpu_uuid, pod_key,
                                   engine_share(share.time, self._gpus[share.gpu_uuid].mps_enabled))
        pod.connections.add(connection)
        self._log.info("hook connected pid=%d pod=%s gpu=%s", connection.pid, pod_key, share.gpu_uuid)
        connection.send(MessageType.HELLO | protocol.REPLY_BIT, frame.request_id, self._hello_reply(share).encode())

    def _identify(self, connection: _Connection, hello: Hello) -> tuple[str | None, str]:
        """The connecting process's pod key (None if it has none here), and its UID if found by cgroup."""
        if self._trusted:
            return hello.pod or None, ""
        uid = pod_uid_of_pid(connection.pid)
        if not uid:
            return None, ""
        key = self._shares.pod_of_uid(uid)
        if key is None and not self._shares.ready():
            key = self._saved_uids.get(uid)
        return key, uid

    def _share_of(self, pod_key: str) -> PodShare | None:
        """The pod's share; until the book is ready (the agent's pod cache is loading after a
        restart), also what the previous arbiter saved."""
        share = self._shares.by_pod(pod_key)
        if share is None and not self._shares.ready():
            share = self._saved_shares.get(pod_key)
        return share

    def _hello_reply(self, share: PodShare) -> HelloReply:
        return HelloReply(window_us=self._window_ns // 1000, request_permille=share.time.request_permille,
                          limit_permille=share.time.limit_permille, sm_percent=share.time.sm_percent,
                          memory_limit_bytes=share.memory_bytes, min_token_us=self._min_token_ns // 1000)

    def _memory(self, connection: _Connection, frame: Frame) -> None:
        """Reserve before an allocation, release after a free; the pod's processes share the limit."""
        ledger = self._pods[(connection.gpu, connection.pod)].memory
        size = protocol.decode_u64(frame.payload)
        reply_type = frame.type | protocol.REPLY_BIT
        connection.memory_used = True
        if frame.type == MessageType.MEM_RESERVE:
            granted = ledger.reserve(connection, size)
            if not granted:
                self._log.info("memory refused pod=%s pid=%d size=%d used=%d limit=%d", connection.pod,
                               connection.pid, size, ledger.used_bytes, ledger.limit_bytes)
            elif size:
                self._save()  # on disk before the process may allocate
            reply = MemReserveReply(granted, ledger.used_bytes, ledger.limit_bytes).encode()
            connection.send(reply_type, frame.request_id, reply)
        else:
            if ledger.release(connection, size):
                self._save_soon()
            connection.send(reply_type, frame.request_id, protocol.encode_u64(ledger.used_bytes))

    def _memory_restore(self, connection: _Connection, frame: Frame) -> None:
        """A reconnected process says what it still holds: that replaces its orphaned reservations."""
        pod = self._pods[(connection.gpu, connection.pod)]
        size = protocol.decode_u64(frame.payload)
        if connection.memory_used:
            self._refuse(connection, frame.request_id, ErrorCode.BAD_FRAME,
                         "MEM_RESTORE must be the first memory request of a connection")
            return
        orphan = _Orphan(connection.pid)
        saved = pod.memory.held_by(orphan) if orphan in pod.orphans else 0
        after = pod.memory.used_bytes - saved + size
        if after > pod.memory.limit_bytes:
            self._refuse(connection, frame.request_id, ErrorCode.BAD_FRAME,
                         f"MEM_RESTORE of {size} bytes would put pod {connection.pod} at {after} bytes, over its "
                         f"memory limit of {pod.memory.limit_bytes}; allowed: up to "
                         f"{max(0, pod.memory.limit_bytes - pod.memory.used_bytes + saved)}")
            return
        connection.memory_used = True
        before = pod.memory.release_process(orphan) if orphan in pod.orphans else 0
        pod.orphans.discard(orphan)
        pod.memory.restore(connection, size)
        self._save()
        self._log.info("memory restored pod=%s pid=%d bytes=%d (saved before the restart: %d)", connection.pod,
                       connection.pid, size, before)
        reply = MemReserveReply(True, pod.memory.used_bytes, pod.memory.limit_bytes).encode()
        connection.send(frame.type | protocol.REPLY_BIT, frame.request_id, reply)

    def _refuse(self, connection: _Connection, request_id: int, code: ErrorCode, message: str) -> None:
        self._log.warning("refused pid=%d pod=%s: %s", connection.pid, connection.pod or "?", message)
        connection.send(MessageType.ERROR, request_id, ErrorReply(code, message).encode())

    def _disconnect(self, connection: _Connection) -> None:
        if not connection.pod:
            return
        key = (connection.gpu, connection.pod)
        pod = self._pods[key]
        pod.connections.discard(connection)
        if pod.memory.release_process(connection):
            self._save_soon()
        if not pod.connections:
            self._log.info("pod left gpu=%s pod=%s", connection.gpu, connection.pod)
        self._forget_if_idle(key, pod)


class _Link:
    """One connection's Python side, fed by the engine's events: frames in, the deadline for its
    HELLO, a refusal's answer, and closing it."""

    def __init__(self, server: ArbiterServer, engine: NativeEngine, connection_id: int, pid: int) -> None:
        self._server = server
        self._engine = engine
        self.id = connection_id
        self.peer = ""
        self._hello_timer: asyncio.TimerHandle | None = None
        self._refused: Callable[[], None] | None = None  # refusing: called once when done
        self._refuse_message = ""
        self._refuse_connection: _Connection | None = None
        self._refuse_timer: asyncio.TimerHandle | None = None
        self._connection: _Connection | None = None
        server._links[connection_id] = self
        connection = _Connection(engine, connection_id, pid)
        if server._connected(self, connection):
            self._connection = connection
            # An unregistered connection only holds a descriptor: it gets a deadline.
            self._hello_timer = asyncio.get_running_loop().call_later(server._hello_timeout_s, self._hello_deadline)

    def refuse(self, connection: _Connection, message: str, done: Callable[[], None]) -> None:
        self._refused, self._refuse_message = done, message
        self._refuse_connection = connection
        self._refuse_timer = asyncio.get_running_loop().call_later(REFUSE_WAIT_S, self._refuse_done)

    def _refuse_done(self) -> None:
        done, self._refused = self._refused, None
        if self._refuse_timer is not None:
            self._refuse_timer.cancel()
        if done is not None:
            done()
            self.finish()

    def _hello_deadline(self) -> None:
        connection = self._connection
        self._hello_timer = None
        if connection is not None and not connection.pod:
            self._server._log.info("closed a connection of pid=%d: no HELLO within %gs", connection.pid,
                                   self._server._hello_timeout_s)
            self.finish()

    def received(self, data: bytes) -> None:
        """One frame, or bytes that cannot be framed (which FrameReader refuses as the protocol says)."""
        connection = self._connection
        if connection is None:
            if self._refused is not None:
                try:
                    frames = FrameReader().feed(data)
                    if frames and self._refuse_connection is not None:
                        self._refuse_connection.send(MessageType.ERROR, frames[0].request_id,
                                                     ErrorReply(ErrorCode.UNKNOWN_CLIENT,
                                                                self._refuse_message).encode())
                except ProtocolError:
                    pass
                self._refuse_done()
            return
        server = self._server
        try:
            for frame in FrameReader().feed(data):
                server._handle(connection, frame)
        except ProtocolError as error:
            server._log.warning("protocol error pid=%d pod=%s: %s", connection.pid, connection.pod or "?", error)
            connection.send(MessageType.ERROR, 0, ErrorReply(error.code, str(error)).encode())
            self.finish()
        else:
            if connection.pod and self._hello_timer is not None:
                self._hello_timer.cancel()
                self._hello_timer = None

    def lost(self) -> None:
        """The peer closed the connection (the engine has given its token back)."""
        if self._refused is not None:
            done, self._refused = self._refused, None
            if self._refuse_timer is not None:
                self._refuse_timer.cancel()
            done()
        self._drop(close=False)

    def finish(self) -> None:
        """Close the connection and give back what it held (once)."""
        self._drop(close=True)

    def _drop(self, *, close: bool) -> None:
        connection, self._connection = self._connection, None
        if self._hello_timer is not None:
            self._hello_timer.cancel()
            self._hello_timer = None
        if self._server._links.get(self.id) is self:
            del self._server._links[self.id]
            if close:
                self._engine.close_connection(self.id)
        if connection is not None:
            self._server._closed(self, connection)
