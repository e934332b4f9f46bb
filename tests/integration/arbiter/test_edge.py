"""The arbiter's edge against hostile or broken clients (issue 13, item 5): each test failed on
the arbiter before its fix."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from device_plugin.arbiter.client import ArbiterError, HookClient
from device_plugin.arbiter.probe import arbiter_problem
from fastgshare import protocol
from fastgshare.protocol import ErrorCode, MessageType
from tests.integration.arbiter.test_server import GPU, RunningArbiter, pod_share

MIB = 1 << 20


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "arbiter.sock"


@pytest.fixture
def running(socket_path: Path) -> Iterator[RunningArbiter]:
    arbiter = RunningArbiter(socket_path, {"ns/a": pod_share(300, 500), "ns/b": pod_share(200, 1000)})
    yield arbiter
    arbiter.stop()


def test_a_second_hello_on_one_connection_is_refused_and_leaks_no_memory(running: RunningArbiter) -> None:
    client = running.client()
    client.hello("ns/a", GPU)
    assert client.reserve(100 * MIB).granted
    with pytest.raises(ArbiterError) as caught:
        client.hello("ns/b", GPU)  # would move the connection, and the 100 MiB it holds, to pod b's books
    assert caught.value.reply.code == ErrorCode.UNKNOWN_CLIENT
    assert "already said HELLO as pod ns/a" in caught.value.reply.message
    client.close()
    probe = running.client()
    probe.hello("ns/a", GPU)
    deadline = time.monotonic() + 2
    while probe.reserve(0).pod_used_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert probe.reserve(0).pod_used_bytes == 0  # pod a got its memory back when the connection closed


def test_twenty_thousand_bad_hellos_write_a_bounded_log(running: RunningArbiter,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="device_plugin.arbiter")
    client = running.client()
    hello = protocol.Hello(os.getpid(), "ns/nobody", GPU).encode()
    count = 20_000
    replies = []
    for batch in range(0, count, 500):  # batches: neither side's socket buffer fills up
        client.sock.sendall(b"".join(protocol.encode_frame(MessageType.HELLO, n, hello)
                                     for n in range(batch, batch + 500)))
        replies += [client.receive() for _ in range(500)]
    assert {reply.type for reply in replies} == {MessageType.ERROR}
    lines = [record for record in caplog.records if record.name.startswith("device_plugin.arbiter")]
    assert len(lines) <= 20, f"{len(lines)} log lines for {count} bad HELLOs"
    assert sum(len(record.getMessage()) for record in lines) < 4000


def test_an_unregistered_connection_is_closed_after_the_hello_timeout(socket_path: Path) -> None:
    arbiter = RunningArbiter(socket_path, {"ns/a": pod_share(300, 500)}, hello_timeout_s=0.3)
    try:
        idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        idle.settimeout(5)
        idle.connect(str(socket_path))
        started = time.monotonic()
        assert idle.recv(16) == b""  # closed by the arbiter
        assert time.monotonic() - started < 3
        idle.close()
        registered = arbiter.client()  # a registered connection may stay idle
        registered.hello("ns/a", GPU)
        time.sleep(0.6)
        assert registered.token() > 0
    finally:
        arbiter.stop()


FLOOD = """
import socket, sys, time
held = []
stuck_since = time.monotonic()
while len(held) < int(sys.argv[2]) and time.monotonic() - stuck_since < 2:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.setblocking(False)  # a full backlog would block connect() for good: retry for 2 s, then stop
    try:
        s.connect(sys.argv[1])
    except BlockingIOError:
        s.close()
        time.sleep(0.001)
        continue
    held.append(s)
    stuck_since = time.monotonic()
print("flooding", flush=True)
time.sleep(60)
"""


def test_a_connection_flood_from_one_process_leaves_other_clients_served(tmp_path: Path) -> None:
    shares = tmp_path / "shares.json"
    shares.write_text(json.dumps({"gpus": [{"uuid": GPU}], "pods": [{"pod": "ns/a", "gpu": GPU, "annotations": {
        "fastgshare/gpu_quota_request": "0.3", "fastgshare/gpu_quota_limit": "0.5",
        "fastgshare/gpu_sm_partition": "100", "fastgshare/gpu_mem": "1000000"}}]}))
    sock = tmp_path / "arbiter.sock"
    # The arbiter's process may open only 1024 files (a common default).
    few_descriptors = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024)); "
                       "sys.argv[0] = 'fastgshare-arbiter'; "
                       "runpy.run_module('device_plugin.arbiter.standalone', run_name='__main__')")
    arbiter = subprocess.Popen([sys.executable, "-c", few_descriptors, "--socket", str(sock),
                                "--shares", str(shares), "--trusted-env", "--log-level", "warning"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    flood = None
    try:
        assert arbiter.stdout is not None
        assert "arbiter ready" in arbiter.stdout.readline()
        flood = subprocess.Popen([sys.executable, "-c", FLOOD, str(sock), "2000"], stdout=subprocess.PIPE, text=True)
        assert flood.stdout is not None
        assert flood.stdout.readline().strip() == "flooding"
        victim = HookClient(sock, timeout_s=5)
        assert victim.hello("ns/a", GPU).limit_permille == 500
        assert victim.token() > 0
        victim.close()
        assert arbiter_problem(sock, expected_pid=arbiter.pid) is None
    finally:
        for process in (flood, arbiter):
            if process is not None:
                process.kill()
                process.wait(10)
                if process.stdout is not None:
                    process.stdout.close()


def test_a_connection_over_the_pods_limit_is_told_why(socket_path: Path) -> None:
    arbiter = RunningArbiter(socket_path, {"ns/a": pod_share(300, 500)}, max_connections_per_pod=2)
    try:
        first, second = arbiter.client(), arbiter.client()
        first.hello("ns/a", GPU)
        second.hello("ns/a", GPU)
        with pytest.raises(ArbiterError) as caught:
            arbiter.client().hello("ns/a", GPU)
        assert caught.value.reply.code == ErrorCode.UNKNOWN_CLIENT
        assert f"pid {os.getpid()} already has 2 connections" in caught.value.reply.message
        second.close()  # a connection closes: there is room again
        deadline = time.monotonic() + 2
        while True:
            try:
                arbiter.client().hello("ns/a", GPU)
                break
            except ArbiterError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        arbiter.stop()


def test_the_probe_sees_an_answering_arbiter_and_refuses_an_impostor(running: RunningArbiter,
                                                                     socket_path: Path) -> None:
    assert arbiter_problem(socket_path) is None  # the arbiter runs in this process
    assert "not by the arbiter" in str(arbiter_problem(socket_path, expected_pid=os.getpid() + 1))
    socket_path.unlink()  # what a tenant with a writable socket directory could do
    impostor = subprocess.Popen([sys.executable, "-c", "import socket, sys, time\n"
                                 "s = socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen()\n"
                                 "print('bound', flush=True); time.sleep(60)", str(socket_path)],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert impostor.stdout is not None
        assert impostor.stdout.readline().strip() == "bound"
        assert f"served by pid {impostor.pid}" in str(arbiter_problem(socket_path))
    finally:
        impostor.kill()
        impostor.wait(10)
        impostor.stdout.close()  # type: ignore[union-attr]
    socket_path.unlink()
    assert "does not answer" in str(arbiter_problem(socket_path))
