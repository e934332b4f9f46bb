"""The arbiter server over a real unix socket, with Python clients speaking the hook protocol."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from device_plugin.arbiter import server as server_module
from device_plugin.arbiter.client import ArbiterError, HookClient
from device_plugin.arbiter.identity import peer_pid
from device_plugin.arbiter.server import ArbiterServer, GpuSettings
from device_plugin.arbiter.shares import PodShare, StaticShares
from fastgshare import protocol
from fastgshare.arbitration import TimeShare
from fastgshare.protocol import ErrorCode, MessageType

GPU = "GPU-sim-0"
MS = 1_000_000


def pod_share(request: int, limit: int, sm: int = 100, gpu: str = GPU) -> PodShare:
    return PodShare(gpu, TimeShare(request, limit, sm), 2**30)


class RunningArbiter:
    def __init__(self, socket_path: Path, shares: dict[str, PodShare], *, trusted: bool = True,
                 mps: bool = True, uids: dict[str, str] | None = None, **options: Any) -> None:
        book = StaticShares(shares)
        if uids is not None:
            book.pod_of_uid = uids.get  # type: ignore[method-assign]
        self.server = ArbiterServer(socket_path, {GPU: GpuSettings(mps_enabled=mps)}, book, trusted_env=trusted,
                                    window_ns=100 * MS, min_token_ns=2 * MS, **options)
        self.shares = shares
        self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def client(self) -> HookClient:
        return HookClient(self.server.socket_path)

    def call_soon(self, function: object) -> None:
        self.loop.call_soon_threadsafe(function)  # type: ignore[arg-type]

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def socket_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="fgs-arb-") as directory:
        yield Path(directory) / "arbiter.sock"


@pytest.fixture
def arbiter(socket_path: Path) -> Iterator[RunningArbiter]:
    running = RunningArbiter(socket_path, {"ns/a": pod_share(300, 500), "ns/b": pod_share(200, 1000),
                                           "ns/half1": pod_share(500, 1000, sm=50),
                                           "ns/half2": pod_share(500, 1000, sm=50)})
    yield running
    running.stop()


def test_hello_returns_the_pods_share(arbiter: RunningArbiter) -> None:
    reply = arbiter.client().hello("ns/a", GPU)
    assert (reply.window_us, reply.request_permille, reply.limit_permille, reply.sm_percent,
            reply.memory_limit_bytes, reply.min_token_us) == (100_000, 300, 500, 100, 2**30, 2_000)


def test_the_socket_is_open_to_any_container_user(arbiter: RunningArbiter) -> None:
    assert arbiter.server.socket_path.stat().st_mode & 0o777 == 0o666


@pytest.mark.parametrize(
    ("pod", "gpu", "message"),
    [("ns/nobody", "", "pod ns/nobody has no fastgshare assignment on this node"),
     ("ns/a", "GPU-other", f"pod ns/a is assigned GPU {GPU}, not GPU-other")],
)
def test_unknown_pods_and_wrong_gpus_are_refused(arbiter: RunningArbiter, pod: str, gpu: str, message: str) -> None:
    with pytest.raises(ArbiterError) as caught:
        arbiter.client().hello(pod, gpu)
    assert caught.value.reply.code == ErrorCode.UNKNOWN_CLIENT
    assert caught.value.reply.message == message


def test_token_before_hello_is_refused(arbiter: RunningArbiter) -> None:
    with pytest.raises(ArbiterError) as caught:
        arbiter.client().token()
    assert caught.value.reply.code == ErrorCode.NOT_REGISTERED


def test_first_token_is_request_times_window(arbiter: RunningArbiter) -> None:
    client = arbiter.client()
    client.hello("ns/a")
    assert client.token() == 30 * MS


def test_garbage_gets_an_error_and_the_server_survives(arbiter: RunningArbiter) -> None:
    bad = arbiter.client()
    bad.sock.sendall(b"\xff" * 64)
    reply = bad.receive()
    assert reply.type == MessageType.ERROR
    assert protocol.ErrorReply.decode(reply.payload).code == ErrorCode.BAD_FRAME
    good = arbiter.client()
    good.hello("ns/a")
    assert good.token() > 0


def test_a_frame_sent_byte_by_byte_is_understood(arbiter: RunningArbiter) -> None:
    client = arbiter.client()
    client.hello("ns/b")
    for byte in protocol.encode_frame(MessageType.TOKEN, 99, protocol.encode_u64(0)):
        client.sock.send(bytes([byte]))
        time.sleep(0.001)
    reply = client.receive()
    assert (reply.type, reply.request_id) == (MessageType.TOKEN | protocol.REPLY_BIT, 99)


def test_whole_gpu_tenants_take_turns(arbiter: RunningArbiter) -> None:
    first, second = arbiter.client(), arbiter.client()
    first.hello("ns/a")
    second.hello("ns/b")
    assert first.token() == 30 * MS
    started = time.monotonic()
    assert second.token() == 20 * MS
    assert time.monotonic() - started >= 0.025  # waited for the first tenant's 30 ms token


def test_half_sm_tenants_hold_tokens_together(arbiter: RunningArbiter) -> None:
    first, second = arbiter.client(), arbiter.client()
    first.hello("ns/half1")
    second.hello("ns/half2")
    first.token()
    started = time.monotonic()
    second.token()
    assert time.monotonic() - started < 0.04  # no wait for the first's 50 ms token


def test_a_dropped_holder_frees_the_gpu_at_once(arbiter: RunningArbiter) -> None:
    holder, waiter = arbiter.client(), arbiter.client()
    holder.hello("ns/a")
    waiter.hello("ns/b")
    holder.token()
    result: list[float] = []

    def wait_for_token() -> None:
        started = time.monotonic()
        waiter.token()
        result.append(time.monotonic() - started)

    thread = threading.Thread(target=wait_for_token)
    thread.start()
    time.sleep(0.005)
    holder.close()
    thread.join(5)
    assert result
    assert result[0] < 0.025  # well before the 30 ms token would have ended


def test_processes_of_one_pod_share_one_token_stream(arbiter: RunningArbiter) -> None:
    one, two = arbiter.client(), arbiter.client()
    one.hello("ns/a")
    two.hello("ns/a")
    one.token()
    started = time.monotonic()
    two.token()  # the pod holds its token through process one: process two waits for it
    assert time.monotonic() - started >= 0.025


def test_share_changes_apply_live(arbiter: RunningArbiter) -> None:
    client = arbiter.client()
    client.hello("ns/a")
    assert client.token() == 30 * MS
    arbiter.server._shares._shares["ns/a"] = pod_share(100, 500)  # type: ignore[attr-defined]
    arbiter.call_soon(arbiter.server.refresh_shares)
    time.sleep(0.05)
    assert client.token(used_ns=30 * MS) == 10 * MS


def test_without_trusted_env_a_process_outside_any_pod_is_refused(socket_path: Path) -> None:
    running = RunningArbiter(socket_path, {"ns/a": pod_share(300, 500)}, trusted=False)
    try:
        with pytest.raises(ArbiterError, match=r"pid \d+ belongs to no pod with a fastgshare assignment"):
            running.client().hello("ns/a")  # the claimed pod name is ignored
    finally:
        running.stop()


def test_without_trusted_env_the_pod_comes_from_the_peer_cgroup(socket_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "pod_uid_of_pid", lambda pid: "uid-of-a")
    running = RunningArbiter(socket_path, {"ns/a": pod_share(300, 500)}, trusted=False, uids={"uid-of-a": "ns/a"})
    try:
        client = running.client()
        assert client.hello("ns/somebody-else").request_permille == 300
        assert client.token() == 30 * MS
    finally:
        running.stop()


def test_peer_pid_is_the_connecting_process(socket_path: Path) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(socket_path))
    listener.listen(1)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(str(socket_path))
    accepted, _ = listener.accept()
    assert peer_pid(accepted) == os.getpid()
    for s in (client, accepted, listener):
        s.close()


def test_memory_is_shared_by_a_pods_processes_and_freed_when_one_exits(arbiter: RunningArbiter) -> None:
    one, two = arbiter.client(), arbiter.client()
    one.hello("ns/a")
    two.hello("ns/a")
    assert one.reserve(2**29).granted  # 512 MiB of the pod's 1 GiB
    reply = two.reserve(2**29 + 1)
    assert (reply.granted, reply.pod_used_bytes, reply.pod_limit_bytes) == (False, 2**29, 2**30)
    assert two.reserve(2**29).granted
    assert two.release(2**28) == 2**29 + 2**28
    one.close()  # its 512 MiB come back at once
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not two.reserve(2**29).granted:
        time.sleep(0.01)
    assert two.release(0) == 2**29 + 2**28


def test_memory_of_different_pods_is_separate(arbiter: RunningArbiter) -> None:
    a, b = arbiter.client(), arbiter.client()
    a.hello("ns/a")
    b.hello("ns/b")
    assert a.reserve(2**30).granted
    assert b.reserve(2**30).granted
    assert not a.reserve(1).granted


def test_a_waiter_that_leaves_before_its_grant_does_not_break_the_scheduler(arbiter: RunningArbiter) -> None:
    """Pod b waits behind a's token with one of its two processes, which then exits: the grant that
    comes when a's token ends finds nobody of b queued, and is handed back, not an IndexError."""
    errors: list[dict[str, Any]] = []
    arbiter.loop.call_soon_threadsafe(arbiter.loop.set_exception_handler,
                                      lambda _loop, context: errors.append(context))
    holder, leaving, staying = arbiter.client(), arbiter.client(), arbiter.client()
    holder.hello("ns/a")
    leaving.hello("ns/b")
    staying.hello("ns/b")
    assert holder.token() == 30 * MS

    def ask() -> None:
        with contextlib.suppress(ArbiterError, OSError):  # closed under it
            leaving.token()

    thread = threading.Thread(target=ask)
    thread.start()
    time.sleep(0.005)
    leaving.sock.shutdown(socket.SHUT_RDWR)  # the process exits while its request waits
    thread.join(5)
    time.sleep(0.05)  # a's 30 ms token ends: b is granted with nobody of it queued
    started = time.monotonic()
    assert staying.token() == 20 * MS
    assert time.monotonic() - started < 0.5
    assert errors == []


# --- the native engine: what it answers itself and what it hands to Python --------------------
def test_a_token_sent_with_the_hello_in_one_write_is_answered(arbiter: RunningArbiter) -> None:
    """The engine reads both frames before Python has registered the connection: the TOKEN reaches
    Python, which passes it back to the engine once the HELLO is through."""
    client = arbiter.client()
    hello = protocol.Hello(os.getpid(), "ns/a", GPU).encode()
    client.sock.sendall(protocol.encode_frame(MessageType.HELLO, 1, hello)
                        + protocol.encode_frame(MessageType.TOKEN, 2, protocol.encode_u64(0)))
    first, second = client.receive(), client.receive()
    assert (first.type, first.request_id) == (MessageType.HELLO | protocol.REPLY_BIT, 1)
    assert (second.type, second.request_id) == (MessageType.TOKEN | protocol.REPLY_BIT, 2)
    assert protocol.decode_u64(second.payload) == 30 * MS


def test_a_client_that_never_reads_its_replies_is_not_read_and_others_are_served(arbiter: RunningArbiter) -> None:
    """Replies pile up past 64 KiB: the engine stops reading that connection (the flood stays in its
    socket, not in the arbiter), and other tenants' tokens and HELLOs go on."""
    flooder = arbiter.client()
    flooder.sock.setblocking(False)
    ping = protocol.encode_frame(MessageType.PING, 7)
    sent, last_sent = 0, time.monotonic()
    deadline = last_sent + 10
    # Send until the arbiter has stopped taking requests for a whole second (it keeps reading while
    # its replies fit in the socket and 64 KiB, and while Python works through what it read).
    while time.monotonic() - last_sent < 1 and time.monotonic() < deadline:
        try:
            sent += flooder.sock.send(ping * 256)
            last_sent = time.monotonic()
        except BlockingIOError:
            time.sleep(0.01)
    assert time.monotonic() < deadline, f"the arbiter kept reading requests whose replies nobody reads ({sent} bytes)"
    assert 64 * 1024 < sent < 2 * 2**20
    tenant = arbiter.client()
    tenant.hello("ns/b")
    assert tenant.token() == 20 * MS
    flooder.close()
    later = arbiter.client()
    later.hello("ns/a")
    assert later.token() == 30 * MS


def test_usage_comes_from_the_engine(arbiter: RunningArbiter) -> None:
    client = arbiter.client()
    client.hello("ns/a")
    client.token()
    time.sleep(0.01)
    client.token(used_ns=5 * MS)  # reports 5 ms of the first token used, having held it 10 ms
    usage = asyncio.run_coroutine_threadsafe(_usage(arbiter), arbiter.loop).result(5)
    (pod,) = usage.usage.pods
    assert (pod.pod, pod.gpu) == ("ns/a", GPU)
    assert 0.010 <= pod.used_seconds_total <= 0.030  # charged the time held, not the 5 ms reported
    assert pod.wait_count == 2
    assert usage.memory_bytes == {(GPU, "ns/a"): 0}


async def _usage(arbiter: RunningArbiter) -> Any:
    return arbiter.server.usage()


def test_an_unexpected_error_closes_its_connection_and_the_events_behind_it_are_handled(
        arbiter: RunningArbiter, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(arbiter.server, "_memory", broken)
    victim, bystander = arbiter.client(), arbiter.client()
    victim.hello("ns/a")
    bystander.hello("ns/b")
    # The bug and the bystander's request reach Python together, as one drain of the engine's events.
    victim.sock.sendall(protocol.encode_frame(MessageType.MEM_RESERVE, 5, protocol.encode_u64(1)))
    bystander.sock.sendall(protocol.encode_frame(MessageType.PING, 6))
    with pytest.raises(ConnectionError):
        victim.receive()
    assert bystander.receive().request_id == 6
    assert bystander.token() == 20 * MS


def test_the_engine_runs_on_a_named_thread_that_takes_no_signals(arbiter: RunningArbiter) -> None:
    """Signals go to Python's threads, which handle them; the engine's calls are never interrupted."""
    tasks = [task for task in Path("/proc/self/task").iterdir() if (task / "comm").read_text().strip() == "fgs-arbiter"]
    assert len(tasks) == 1
    blocked = next(line for line in (tasks[0] / "status").read_text().splitlines() if line.startswith("SigBlk:"))
    standard = sum(1 << (number - 1) for number in range(1, 32) if number not in (signal.SIGKILL, signal.SIGSTOP))
    assert int(blocked.split()[1], 16) & standard == standard  # every one that can be blocked
