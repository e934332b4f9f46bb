"""``arbiter-flood`` (vgpu_hook/tests/arbiter_flood.c), the hostile tenant the real-node tier runs in team B's
pod (issue 37 item 8), against a standalone arbiter as test_fairness starts one.

The tool opens 256 connections with the hook's own client code, says HELLO on each as pod ``ns/flood``
(trusted mode: the pod named in HELLO), and floods PINGs or empty reservations with epoll. Meanwhile
another pod's memory reservations stay under 50 ms at p99, over 200 of them, and the node agent's
liveness check never fails (test_fairness's bounds, the issue's). Connections the arbiter refuses are
counted, not fatal, and ``--seconds`` ends the flood with a summary.

``--what hold`` is issue 42 row 5's client: one connection that holds every token to its end and
reports ``used_ns=0`` for it. At a limit of 0.2 it holds no more than 0.2 + 0.02 of the time (the
arbiter charges held time, as test_fairness's held-token test measures), and the arbiter's charge is
at least what it held.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from device_plugin.arbiter.server import ArbiterUsage
from fastgshare import keys
from tests.integration.arbiter.test_fairness import CONNECTIONS, RESERVATIONS, Liveness, reservation_latencies
from tests.integration.arbiter.test_fairness import arbiter as arbiter  # noqa: PLC0414 - the fixture
from tests.integration.arbiter.test_server import GPU, RunningArbiter, pod_share
from tests.integration.hook.tenants import BUILD, make_hook

FLOOD_TOOL = BUILD / "arbiter-flood"
SUMMARY = re.compile(r"sent (\d+) .* frames in .* (\d+) replies, (\d+) errors; (\d+) connections opened, "
                     r"(\d+) refused, (\d+) closed by the arbiter")


@pytest.fixture(scope="module")
def tool() -> Path:
    """``make -C vgpu_hook`` (up to date: nothing to do), then the tool's path."""
    make_hook()
    return FLOOD_TOOL


def start_flood(tool: Path, socket_path: Path, *args: str, pod: str = "ns/flood") -> subprocess.Popen[str]:
    """The tool in a process of its own, as ``pod`` would run it (its environment as Allocate gives a
    GPU container)."""
    env = {**os.environ, keys.ENV_ARBITER_SOCKET: str(socket_path), keys.ENV_POD: pod, keys.ENV_GPU_UUID: GPU}
    return subprocess.Popen([str(tool), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Stops the tool if it still runs (SIGTERM: it prints its summary) and returns (exit status, the rest
    of its output, its errors)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        output, errors = process.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        output, errors = process.communicate(timeout=10)
    return process.returncode, output, errors


@pytest.fixture
def flood(tool: Path, arbiter: RunningArbiter, request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str]]:
    process = start_flood(tool, arbiter.server.socket_path, "--connections", str(CONNECTIONS),
                          "--what", request.param)
    try:
        assert process.stdout is not None
        first = process.stdout.readline()
        assert f"flooding {CONNECTIONS} connections" in first, first
        assert "(0 refused)" in first, first
        time.sleep(0.5)  # the flood is at full strength
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)
        for pipe in (process.stdout, process.stderr):
            if pipe is not None:
                pipe.close()


@pytest.mark.parametrize("flood", ["ping", "reserve"], indirect=True)
def test_the_flood_tool_over_256_connections_leaves_other_pods_reservations_and_liveness_alone(
        arbiter: RunningArbiter, flood: subprocess.Popen[str]) -> None:
    liveness = Liveness(arbiter)
    try:
        latencies = reservation_latencies(arbiter)
        time.sleep(0.2)
    finally:
        liveness.stop()
    assert flood.poll() is None, "the flood stopped before the measurement ended"
    status, output, errors = finish(flood)
    assert status == 0, (status, output, errors)
    summary = SUMMARY.search(output)
    assert summary, output
    print(output.strip())
    sent, replies, refused_replies, opened, refused, closed = map(int, summary.groups())
    assert (opened, refused, closed) == (CONNECTIONS, 0, 0), output
    assert refused_replies == 0, output
    assert 0 < replies <= sent, output  # the arbiter answered the flood
    assert len(latencies) == RESERVATIONS, f"{len(latencies)} reservations in 30 s"
    p99 = statistics.quantiles(latencies, n=100)[98]
    print(f"reservations under arbiter-flood: p50 {statistics.median(latencies) * 1000:.1f} ms, "
          f"p99 {p99 * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms; {liveness.checks} liveness checks")
    assert p99 < 0.050, f"reservations took {p99 * 1000:.1f} ms at p99 (max {max(latencies) * 1000:.1f} ms)"
    assert liveness.checks >= 3
    assert liveness.failures == []


@pytest.fixture
def small_arbiter(tmp_path: Path) -> Iterator[RunningArbiter]:
    """An arbiter that lets a pod hold 4 connections."""
    running = RunningArbiter(tmp_path / "arbiter.sock", {"ns/flood": pod_share(200, 500)}, max_connections_per_pod=4)
    yield running
    running.stop()


def test_connections_the_arbiter_refuses_are_counted_and_the_flood_ends_after_its_seconds(
        tool: Path, small_arbiter: RunningArbiter) -> None:
    process = start_flood(tool, small_arbiter.server.socket_path, "--connections", "6", "--seconds", "1")
    status, output, errors = finish_after(process, 30)
    assert status == 0, (status, output, errors)
    first, *_ = output.splitlines()
    assert "flooding 4 connections with PING" in first, first
    assert "2 refused: " in first, first
    assert "--max-connections-per-pod" in first, first
    summary = SUMMARY.search(output)
    assert summary, output
    _, replies, _, opened, refused, _ = map(int, summary.groups())
    assert (opened, refused) == (4, 2), output
    assert replies > 0, output


def finish_after(process: subprocess.Popen[str], timeout_s: float) -> tuple[int, str, str]:
    """Waits up to ``timeout_s`` for the tool to end by itself (then stops it and fails)."""
    try:
        output, errors = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        status, output, errors = finish(process)
        pytest.fail(f"arbiter-flood still ran after {timeout_s} s (then exited {status}): {output}")
    return process.returncode, output, errors


def test_without_the_socket_variable_it_says_what_is_missing(tool: Path) -> None:
    env = {name: value for name, value in os.environ.items() if name != keys.ENV_ARBITER_SOCKET}
    result = subprocess.run([str(tool), "--seconds", "1"], env=env, capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 2
    assert keys.ENV_ARBITER_SOCKET in result.stderr, result.stderr
    bad = subprocess.run([str(tool), "--connections", "many"], env=env, capture_output=True, text=True, timeout=30,
                         check=False)
    assert bad.returncode == 2
    assert "--connections many: expected a whole number" in bad.stderr, bad.stderr
    what = subprocess.run([str(tool), "--what", "steal"], env=env, capture_output=True, text=True, timeout=30,
                          check=False)
    assert what.returncode == 2
    assert "--what steal: expected ping, reserve or hold" in what.stderr, what.stderr


HELD = re.compile(r"held (\d+) tokens for ([0-9.]+) s of ([0-9.]+) s")


def charged_seconds(arbiter: RunningArbiter, pod: str) -> float:
    """What the arbiter charged ``pod`` so far (its usage counter), in seconds."""
    async def usage() -> ArbiterUsage:
        return arbiter.server.usage()
    snapshot = asyncio.run_coroutine_threadsafe(usage(), arbiter.loop).result(5)
    return sum(entry.used_seconds_total for entry in snapshot.usage.pods if entry.pod == pod)


def test_a_holder_reporting_nothing_gets_no_more_than_its_limit_and_is_charged_what_it_held(
        tool: Path, arbiter: RunningArbiter) -> None:
    """Issue 42 row 5's client, ``ns/cheat`` (limit 0.2): each token held to its end, used_ns=0."""
    process = start_flood(tool, arbiter.server.socket_path, "--what", "hold", "--seconds", "3", pod="ns/cheat")
    status, output, errors = finish_after(process, 30)
    assert status == 0, (status, output, errors)
    first, *_ = output.splitlines()
    assert first.startswith("arbiter-flood: holding tokens"), first
    summary = HELD.search(output)
    assert summary, output
    print(output.strip())
    tokens, held, elapsed = int(summary[1]), float(summary[2]), float(summary[3])
    assert tokens > 10, output  # 3 s of 100 ms windows
    assert 2.9 <= elapsed <= 4.0, output
    share = held / elapsed
    assert share <= 0.2 + 0.02, f"held {share:.3f} of the GPU's time at a limit of 0.2: {output}"
    charged = charged_seconds(arbiter, "ns/cheat")
    assert charged >= 0.9 * held, f"charged {charged:.3f} s for {held:.3f} s held, reporting used_ns=0"


def test_the_holder_stops_on_sigterm_with_its_summary(tool: Path, arbiter: RunningArbiter) -> None:
    """As the kubelet stops the holder's pod: SIGTERM ends the hold, with the summary, exit 0."""
    process = start_flood(tool, arbiter.server.socket_path, "--what", "hold", pod="ns/cheat")
    assert process.stdout is not None
    first = process.stdout.readline()
    assert first.startswith("arbiter-flood: holding tokens"), first
    time.sleep(0.5)
    status, output, errors = finish(process)
    assert status == 0, (status, output, errors)
    summary = HELD.search(output)
    assert summary, output
    assert int(summary[1]) > 0, output
