"""The tenant program's own options (simgpu/workloads/tenant.c), as a test container's entrypoint uses
them: periodic reports, running until SIGTERM, ``--alloc`` sizes, the start line, a refused allocation."""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.integration.hook.fake_arbiter import FakeArbiter, Script
from tests.integration.hook.tenants import Build, tenant_env

MIB = 1 << 20
OOM = 2
FINAL_KEYS = {"pid", "api", "path", "ptsz", "threads", "launches", "errors", "first_error", "first_error_name",
              "alloc_error", "resolved", "elapsed_s"}


def _lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def _run(build: Build, gpu_dir: Path, *args: str, hook: bool = False, arbiter: FakeArbiter | None = None,
         env: dict[str, str] | None = None, timeout_s: float = 20) -> tuple[int, list[dict[str, Any]], str]:
    result = subprocess.run([str(build.tenant), *args], capture_output=True, text=True, timeout=timeout_s,
                            env=tenant_env(build, gpu_dir, hook=hook, arbiter=arbiter, extra=env), check=False)
    return result.returncode, _lines(result.stdout), result.stderr


def _events(lines: list[dict[str, Any]], event: str) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("event") == event]


def test_reports_come_every_interval_and_the_final_line_stays_last(build: Build, gpu_dir: Path) -> None:
    code, lines, stderr = _run(build, gpu_dir, "--seconds", "1.1", "--report-interval-s", "0.25",
                               "--duration-us", "5000")
    assert code == 0, stderr
    final = lines[-1]
    assert set(final) >= FINAL_KEYS
    assert "event" not in final
    assert final["terminated"] is False
    reports = _events(lines, "report")
    assert [r["t"] for r in reports] == pytest.approx([0.25, 0.5, 0.75, 1.0], abs=0.05)
    assert all(set(r) == {"event", "t", "launches", "errors", "interval_launches", "alloc_error"} for r in reports)
    assert all(r["interval_launches"] > 10 and r["errors"] == 0 and r["alloc_error"] == 0 for r in reports)
    running = 0
    for report in reports:
        running += report["interval_launches"]
        assert report["launches"] == running  # cumulative
    assert final["launches"] >= reports[-1]["launches"]
    [start] = _events(lines, "start")  # reports asked for: the memory view is printed too
    assert lines.index(start) == 0


def test_without_reports_or_allocation_only_the_final_line_is_printed(build: Build, gpu_dir: Path) -> None:
    code, lines, stderr = _run(build, gpu_dir, "--seconds", "0", "--duration-us", "100")
    assert code == 0, stderr
    assert len(lines) == 1
    assert lines[0]["launches"] == 10  # --seconds 0 alone keeps the launch-count default


def _start_forever(build: Build, gpu_dir: Path, command: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen([*command, str(build.tenant), "--seconds", "0", "--report-interval-s", "0.1",
                             "--duration-us", "20000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=tenant_env(build, gpu_dir, hook=False))


def _terminate_after_reports(process: subprocess.Popen[str], kill: Callable[[], None],
                             reports: int = 4) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    assert process.stdout is not None
    seen: list[dict[str, Any]] = []
    try:
        while len(_events(seen, "report")) < reports:
            line = process.stdout.readline()
            assert line, f"the tenant ended early: {process.stderr.read() if process.stderr else ''}"
            seen.append(json.loads(line))
        kill()
        rest, stderr = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    return seen, _lines(rest)


def test_seconds_0_with_reports_runs_until_sigterm(build: Build, gpu_dir: Path) -> None:
    process = _start_forever(build, gpu_dir, [])
    seen, rest = _terminate_after_reports(process, lambda: process.send_signal(signal.SIGTERM))
    final = rest[-1]
    assert final["terminated"] is True
    assert final["errors"] == 0
    assert final["launches"] >= _events(seen, "report")[-1]["launches"] > 0


def test_sigterm_stops_the_tenant_when_it_is_pid_1(build: Build, gpu_dir: Path) -> None:
    # A container's entrypoint is pid 1 of its namespace: without a handler SIGTERM would be ignored.
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("needs root and unshare --pid (util-linux)")
    process = _start_forever(build, gpu_dir, ["unshare", "--pid", "--fork", "--mount-proc"])
    children = Path(f"/proc/{process.pid}/task/{process.pid}/children")

    def term_tenant() -> None:
        (child,) = children.read_text().split()
        subprocess.run(["kill", "-TERM", child], check=True)

    seen, rest = _terminate_after_reports(process, term_tenant)
    assert _events(seen, "start")[0]["pid"] == 1
    assert rest[-1]["terminated"] is True
    assert rest[-1]["pid"] == 1


@pytest.mark.parametrize(("size", "expected"), [
    ("3145728", 3 * MIB), ("3Mi", 3 * MIB), ("1.5Ki", 1536), ("2Gi", 2 << 30), ("1Ti", 1 << 40),
    ("1k", 1000), ("1K", 1000), ("2M", 2_000_000), ("1.5G", 1_500_000_000), ("1T", 10**12),
])
def test_alloc_takes_bytes_with_decimal_or_binary_suffixes(build: Build, gpu_dir: Path, size: str,
                                                           expected: int) -> None:
    code, lines, stderr = _run(build, gpu_dir, "--alloc", size, "--launches", "1",
                               env={"FASTGSHARE_FAKE_GPU_MEMORY": "4G"})
    assert code == 0, stderr
    [start] = _events(lines, "start")
    assert start["alloc_bytes"] == expected
    assert start["mem_total"] == 4 << 30
    if expected <= 4 << 30:
        assert (start["alloc_error"], start["mem_free"]) == (0, (4 << 30) - expected)
    else:  # 1 TiB and 1 TB do not fit: refused, named, and the launches still run
        assert (start["alloc_error"], start["alloc_error_name"]) == (OOM, "CUDA_ERROR_OUT_OF_MEMORY")
        assert _events(lines, "alloc_error") == [
            {"event": "alloc_error", "code": OOM, "name": "CUDA_ERROR_OUT_OF_MEMORY", "bytes": expected}]
    assert lines[-1]["launches"] == 1


def test_alloc_mb_still_counts_mebibytes(build: Build, gpu_dir: Path) -> None:
    code, lines, stderr = _run(build, gpu_dir, "--alloc-mb", "3", "--launches", "1")
    assert code == 0, stderr
    [start] = _events(lines, "start")
    assert (start["alloc_bytes"], start["alloc_error"], start["meminfo_error"]) == (3 * MIB, 0, 0)
    assert start["mem_total"] - start["mem_free"] == 3 * MIB
    assert start["pid"] == lines[-1]["pid"]


@pytest.mark.parametrize("size", ["", "Mi", "1.5", "0.0001k", "-1", "12X", "3 Mi", "99999999999999999999"])
def test_a_bad_alloc_size_is_a_usage_error(build: Build, gpu_dir: Path, size: str) -> None:
    code, lines, stderr = _run(build, gpu_dir, "--alloc", size, "--launches", "1")
    assert code == 64
    assert lines == []
    assert "usage: tenant" in stderr


def test_an_allocation_refused_by_the_hook_is_named_and_the_tenant_keeps_launching(
        build: Build, gpu_dir: Path, start_arbiter: Callable[[Script], FakeArbiter]) -> None:
    arbiter = start_arbiter(Script(memory_limit=64 * MIB))
    code, lines, stderr = _run(build, gpu_dir, "--alloc", "100Mi", "--keep-going", "--seconds", "0.5",
                               "--report-interval-s", "0.1", "--duration-us", "1000", hook=True, arbiter=arbiter)
    assert code == 0, stderr
    assert lines[0] == {"event": "alloc_error", "code": OOM, "name": "CUDA_ERROR_OUT_OF_MEMORY", "bytes": 100 * MIB}
    start = lines[1]
    assert start["event"] == "start"
    # The pod's slice, not the 16 GiB card: the hook's view of the memory.
    assert (start["mem_total"], start["mem_free"]) == (64 * MIB, 64 * MIB)
    assert (start["alloc_bytes"], start["alloc_error"]) == (100 * MIB, OOM)
    reports = _events(lines, "report")
    assert len(reports) >= 3
    assert all(r["alloc_error"] == OOM for r in reports)
    assert reports[-1]["launches"] > reports[0]["launches"] > 0  # it kept launching
    final = lines[-1]
    assert (final["alloc_error"], final["errors"]) == (OOM, 0)
    assert final["launches"] > 0
    assert arbiter.token_requests() != []
