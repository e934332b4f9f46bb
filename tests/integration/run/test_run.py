"""``fastgshare run`` end to end on the simulated GPU: exit statuses, the JSON summary, the share a
tenant achieves (the simulated GPU's own measure), two runs sharing one arbiter and one GPU, and the
shared state cleaned up after the last run, after a killed run and on SIGTERM.

Shares are asserted within 5 points of the limit (a run's share counts its whole wall time, start-up
included); `bench/isolation.py` measures the exact errors of the enforcement itself.
"""

from __future__ import annotations

import json
import signal
import time

import pytest

from fastgshare_cli.run_meter import LedgerMeter
from fastgshare_cli.sandbox import HookBuild
from tests.integration.run.conftest import Runs, last_json

TOLERANCE = 0.05
GIB, MIB = 1 << 30, 1 << 20


def tenant(build: HookBuild, *args: str) -> list[str]:
    return [str(build.tenant), "--duration-us", "1000", *args]


@pytest.mark.parametrize(("script", "status"), [("exit 7", 7), ("kill -KILL $$", 128 + signal.SIGKILL)])
def test_the_exit_status_is_the_commands_and_the_state_goes_with_the_last_run(
        hook_build: HookBuild, runs: Runs, script: str, status: int) -> None:
    result = runs.run("--", "sh", "-c", script)
    assert result.returncode == status, result.stderr
    assert result.stderr.splitlines()[-1].startswith(f"fastgshare run: exit {status} after ")
    assert not runs.state.exists()
    assert runs.arbiters() == []


def test_a_command_that_is_not_found_is_127_with_one_line(runs: Runs) -> None:
    result = runs.run("--", "no-such-command-fastgshare", "--flag")
    assert result.returncode == 127
    assert result.stderr.splitlines() == ["fastgshare run: no-such-command-fastgshare: command not found"]
    assert not runs.state.exists()


def test_the_json_summary_and_the_limits_the_program_sees(hook_build: HookBuild, runs: Runs) -> None:
    result = runs.run("--request", "0.2", "--limit", "0.6", "--sm", "50", "--memory", "1Gi", "-o", "json", "--",
                      *tenant(hook_build, "--seconds", "1", "--alloc", "64Mi"))
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.strip().splitlines()]
    start, tenant_summary, summary = lines[0], lines[-2], lines[-1]
    assert (start["event"], start["mem_total"], start["alloc_error"]) == ("start", GIB, 0)  # the hook's view
    assert summary["exitCode"] == 0
    assert summary["kernels"] == tenant_summary["launches"] > 0
    assert 64 * MIB <= summary["peakMemoryBytes"] < 65 * MIB
    assert (summary["request"], summary["limit"], summary["sm"]) == (0.2, 0.6, 50)
    assert (summary["memoryLimitBytes"], summary["gpu"]) == (GIB, "1x16GiB:80sm")
    assert summary["tokens"] > 0
    assert summary["waitedSeconds"] >= summary["throttledSeconds"] >= 0
    assert summary["achievedShare"] == pytest.approx(0.6, abs=0.1)  # a 1 s run: its start-up weighs more
    assert summary["wallSeconds"] > 0
    assert "fastgshare run: exit" not in result.stderr  # no text summary with -o json


def test_the_gpu_work_of_cmds_children_counts(hook_build: HookBuild, runs: Runs) -> None:
    child = f"{hook_build.tenant} --launches 100 --duration-us 3000 > /dev/null"
    result = runs.run("-o", "json", "--", "sh", "-c", f"{child}; {child}; exit 3")
    assert result.returncode == 3, result.stderr
    summary = last_json(result.stdout)
    assert (summary["exitCode"], summary["kernels"]) == (3, 200)
    assert summary["achievedShare"] > 0


@pytest.mark.parametrize("limit", [0.3, 1.0])
def test_a_tenant_alone_achieves_its_limit_and_the_arbiter_counts_as_the_gpu(
        hook_build: HookBuild, runs: Runs, limit: float) -> None:
    """The arbiter's count (the GPU time the hook reported, a real GPU's only measure) agrees with the
    simulated GPU's own; at 0.3 the tenant waits for its limit, alone at 1.0 it hardly waits."""
    result = runs.run("--limit", str(limit), "-o", "json", "--", *tenant(hook_build, "--seconds", "3"))
    assert result.returncode == 0, result.stderr
    summary = last_json(result.stdout)
    assert summary["achievedShare"] == pytest.approx(limit, abs=TOLERANCE)
    assert summary["arbiterShare"] == pytest.approx(summary["achievedShare"], abs=TOLERANCE)
    if limit < 1:
        assert summary["throttledSeconds"] > 0
    else:
        assert summary["throttledSeconds"] == pytest.approx(0, abs=0.05)


def test_two_runs_share_one_arbiter_and_one_gpu_each_at_its_limit(hook_build: HookBuild, runs: Runs) -> None:
    say_where = 'echo "$FASTGSHARE_FAKE_GPU_DIR $FASTGSHARE_ARBITER_SOCKET" >&2; exec "$@"'
    first = runs.start("--limit", "0.2", "-o", "json", "--", "sh", "-c", say_where, "sh",
                       *tenant(hook_build, "--seconds", "4"))
    assert first.stderr is not None
    where_first = first.stderr.readline().split()  # CMD runs: the run has joined
    second = runs.start("--limit", "0.5", "-o", "json", "--", "sh", "-c", say_where, "sh",
                        *tenant(hook_build, "--seconds", "3"))
    assert second.stderr is not None
    where_second = second.stderr.readline().split()
    assert where_first == where_second == [str(runs.state / "gpu"), str(runs.state / "arbiter.sock")]
    assert first.poll() is None, "the first run ended before the second began"
    assert len(runs.arbiters()) == 1
    outputs = [process.communicate(timeout=120) for process in (first, second)]
    assert [first.returncode, second.returncode] == [0, 0], outputs
    shares = [last_json(stdout)["achievedShare"] for stdout, _ in outputs]
    assert shares == [pytest.approx(0.2, abs=TOLERANCE), pytest.approx(0.5, abs=TOLERANCE)]
    assert not runs.state.exists()
    assert runs.arbiters() == []


def test_on_a_real_gpu_the_memory_comes_from_the_arbiters_ledger(hook_build: HookBuild, runs: Runs) -> None:
    """The real GPU's measure of memory, tried on the simulated one: the pod's ledger while the tenant holds 64 MiB."""
    process = runs.start("--memory", "1Gi", "--", *tenant(hook_build, "--seconds", "3", "--alloc", "64Mi"))
    runs.wait_registered(process)
    meter = LedgerMeter(runs.state / "arbiter.sock", f"run/{process.pid}", "GPU-fastgshare-run-0")
    deadline = time.monotonic() + 30
    while meter.sample().memory_bytes < 64 * MIB and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    totals = meter.sample()
    meter.close()
    assert (totals.memory_bytes, totals.peak_memory_bytes, totals.busy_ns) == (64 * MIB, 64 * MIB, None)
    process.communicate(timeout=60)
    assert process.returncode == 0


def test_a_killed_runs_arbiter_is_replaced_by_the_next_run(runs: Runs) -> None:
    victim = runs.start("--", "sleep", "60")
    runs.wait_registered(victim)
    [left_behind] = runs.arbiters()
    victim.send_signal(signal.SIGKILL)  # the run only: its arbiter (a session of its own) and CMD live on
    victim.communicate(timeout=30)
    result = runs.run("--", "true")
    assert result.returncode == 0, result.stderr
    assert left_behind not in runs.arbiters()
    assert runs.arbiters() == []
    assert not runs.state.exists()


def test_sigterm_goes_to_the_command_and_the_run_cleans_up(runs: Runs) -> None:
    process = runs.start("--", "sleep", "60")
    runs.wait_registered(process)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert not runs.state.exists()
    assert runs.arbiters() == []


def test_a_second_run_on_another_gpu_spec_gets_one_line(runs: Runs) -> None:
    first = runs.start("--", "sleep", "60")
    runs.wait_registered(first)
    result = runs.run("--gpu", "1x8GiB:40sm", "--", "true")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        'fastgshare run: --gpu "1x8GiB:40sm": the runs already going on this machine use GPU "1x16GiB:80sm" (the '
        'first run fixes it); allowed: "1x16GiB:80sm", or no --gpu to join it']
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=60)
    assert not runs.state.exists()


def test_a_run_that_joins_and_leaves_does_not_disturb_one_going(hook_build: HookBuild, runs: Runs) -> None:
    """The arbiter reloads its shares (SIGHUP) when a run joins or leaves: the run going keeps its
    connection (its hook prints nothing) and the arbiter, with its usage history, stays the same process."""
    first = runs.start("--limit", "0.3", "-o", "json", "--", *tenant(hook_build, "--seconds", "4"))
    runs.wait_registered(first)
    [arbiter] = runs.arbiters()
    joining = runs.run("--limit", "0.5", "-o", "json", "--", *tenant(hook_build, "--seconds", "1"))
    assert joining.returncode == 0, joining.stderr
    assert last_json(joining.stdout)["achievedShare"] == pytest.approx(0.5, abs=0.1)  # a 1 s run: start-up weighs
    assert first.poll() is None, "the first run ended before the second left"
    assert runs.arbiters() == [arbiter]
    stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    assert "fastgshare-hook:" not in stderr
    assert last_json(stdout)["achievedShare"] == pytest.approx(0.3, abs=TOLERANCE)
    assert runs.arbiters() == []
