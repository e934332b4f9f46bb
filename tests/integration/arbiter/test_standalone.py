"""``fastgshare-arbiter`` (the standalone arbiter) as a process: SIGHUP reads its shares file again
without dropping a connection, and ``--usage-file`` publishes each pod's GPU time and token waits
(about once a second, on SIGUSR1 and at exit)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from device_plugin.arbiter.client import ArbiterError, HookClient
from fastgshare.protocol import ErrorCode
from tests.integration.hook.fake_arbiter import wait_until

GPU = "GPU-sim-0"
MS = 1_000_000


def write_shares(path: Path, limits: dict[str, str]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps({"gpus": [{"uuid": GPU, "mps": True}], "pods": [
        {"pod": pod, "gpu": GPU, "annotations": {"fastgshare/gpu_quota_request": limit,
                                                 "fastgshare/gpu_quota_limit": limit, "fastgshare/gpu_mem": "1Gi"}}
        for pod, limit in limits.items()]}))
    partial.replace(path)


class Standalone:
    def __init__(self, directory: Path, limits: dict[str, str]) -> None:
        self.socket, self.shares, self.usage = directory / "a.sock", directory / "shares.json", directory / "usage.json"
        self.log = directory / "arbiter.log"
        write_shares(self.shares, limits)
        with self.log.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "device_plugin.arbiter.standalone", "--socket", str(self.socket), "--shares",
                 str(self.shares), "--usage-file", str(self.usage), "--trusted-env", "--log-level", "info"],
                stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.process.stdout is not None
        assert "arbiter ready" in self.process.stdout.readline()

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def read_usage(self) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.usage.read_text())
        return document

    def pod_usage(self, pod: str) -> dict[str, Any]:
        [entry] = [entry for entry in self.read_usage()["pods"] if entry["pod"] == pod]
        return entry

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate(timeout=10)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], Standalone]]:
    started: list[Standalone] = []

    def start(limits: dict[str, str]) -> Standalone:
        started.append(Standalone(tmp_path, limits))
        return started[-1]

    yield start
    for arbiter in started:
        arbiter.stop()


def says_hello(arbiter: Standalone, pod: str) -> bool:
    client = HookClient(arbiter.socket, timeout_s=5)
    try:
        client.hello(pod, GPU)
    except ArbiterError as error:
        refused = error.reply.code
    else:
        return True
    finally:
        client.close()
    assert refused == ErrorCode.UNKNOWN_CLIENT
    return False


def test_sighup_serves_the_shares_file_again_and_keeps_every_connection(
        standalone: Callable[[dict[str, str]], Standalone]) -> None:
    arbiter = standalone({"run/1": "0.5"})
    going = HookClient(arbiter.socket, timeout_s=5)
    assert going.hello("run/1", GPU).limit_permille == 500
    assert going.token() > 0
    assert not says_hello(arbiter, "run/2")
    write_shares(arbiter.shares, {"run/1": "0.2", "run/2": "0.5"})
    arbiter.signal(signal.SIGHUP)
    assert wait_until(lambda: says_hello(arbiter, "run/2"))
    assert going.token(1 * MS) > 0  # the connection that was going goes on
    newcomer = HookClient(arbiter.socket, timeout_s=5)
    assert newcomer.hello("run/1", GPU).limit_permille == 200  # the pod's new share
    newcomer.close()
    write_shares(arbiter.shares, {"run/2": "0.5"})
    arbiter.signal(signal.SIGHUP)
    assert wait_until(lambda: not says_hello(arbiter, "run/1"))
    going.ping()  # a pod dropped from the file keeps the connection it has
    going.close()
    assert arbiter.process.poll() is None


def test_a_shares_file_it_cannot_serve_leaves_the_shares_it_had(
        standalone: Callable[[dict[str, str]], Standalone]) -> None:
    arbiter = standalone({"run/1": "0.5"})
    arbiter.shares.write_text("{broken")
    arbiter.signal(signal.SIGHUP)
    assert wait_until(lambda: "still serving the shares read before" in arbiter.log.read_text())
    assert says_hello(arbiter, "run/1")
    assert arbiter.process.poll() is None


def test_the_usage_file_has_each_pods_gpu_time_tokens_and_waits(
        standalone: Callable[[dict[str, str]], Standalone]) -> None:
    arbiter = standalone({"run/1": "0.5"})
    assert wait_until(arbiter.usage.exists)
    client = HookClient(arbiter.socket, timeout_s=5)
    client.hello("run/1", GPU)
    client.token()
    held = 0.0
    for _ in range(9):
        granted = time.monotonic()
        time.sleep(0.002)
        held += time.monotonic() - granted
        client.token(2 * MS)  # each reports what the token before it used: the 2 ms it held it
    sequence = arbiter.read_usage()["sequence"]
    arbiter.signal(signal.SIGUSR1)
    assert wait_until(lambda: arbiter.read_usage()["sequence"] > sequence)
    entry = arbiter.pod_usage("run/1")
    assert (entry["gpu"], entry["tokens"]) == (GPU, 10)
    # Each token is charged the time it was held (grant to return): at least the 2 ms reported.
    assert 0.018 <= entry["usedSeconds"] <= held + 0.01, (entry["usedSeconds"], held)
    assert entry["waitedSeconds"] >= entry["throttledSeconds"] >= 0
    time.sleep(0.003)
    client.token(3 * MS)
    client.close()
    before = arbiter.read_usage()["sequence"]
    arbiter.stop()
    final = arbiter.read_usage()
    assert final["sequence"] > before
    assert final["pid"] == arbiter.process.pid
    # The last token was held when the connection closed: charged the time held, at most the token (50 ms).
    assert 0.021 <= arbiter.pod_usage("run/1")["usedSeconds"] <= held + 0.003 + 0.05 + 0.02
