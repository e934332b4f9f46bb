"""How the hook's memory limit behaves beyond the matrix: undo on driver failure, pitch corrections,
double frees, threads, views on a full card, NVML through pynvml, and failing closed."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from fastgshare.protocol import MessageType
from tests.integration.hook.fake_arbiter import FakeArbiter, MemEvent, Script
from tests.integration.hook.memory_matrix import STANDARD_STEPS, ledger_problems
from tests.integration.hook.tenants import Build, run_memcheck, tenant_env

StartArbiter = Callable[[Script], FakeArbiter]
MIB = 1 << 20
OOM, INVALID_VALUE, NOT_PERMITTED = 2, 1, 800


def test_an_allocation_asks_no_token_and_uses_its_own_connection(build: Build, gpu_dir: Path,
                                                                 start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(memory_limit=64 * MIB))
    result = run_memcheck(build, gpu_dir, "run", "--case", "alloc", "--way", "linked", "--size", str(40 * MIB),
                          arbiter=arbiter, env={"FASTGSHARE_HOOK_LOG": "info"})
    assert result.returncode == 0, result.stderr
    assert arbiter.token_requests() == []  # allocation is not GPU time
    assert [r.type for r in arbiter.requests if r.type == MessageType.HELLO] == [MessageType.HELLO]
    assert any("cuMemAlloc_v2 of 41943040 bytes refused: the pod uses 41943040 of its 67108864 bytes "
               "(CUDA_ERROR_OUT_OF_MEMORY)" in line for line in result.hook_lines), result.stderr


def test_a_failed_driver_allocation_gives_its_reservation_back(build: Build, gpu_dir: Path,
                                                               start_arbiter: StartArbiter) -> None:
    # The pod may have 1 GiB, but the card has only 32 MiB left: the driver says no.
    arbiter = start_arbiter(Script(memory_limit=1 << 30))
    result = run_memcheck(build, gpu_dir, "run", "--case", "alloc", "--way", "linked", "--size", str(40 * MIB),
                          arbiter=arbiter, env={"FASTGSHARE_FAKE_GPU_MEMORY": "32M"})
    assert result.summary["steps"][0] == {"op": "alloc", "result": OOM}
    assert [(e.kind, e.bytes, e.granted) for e in arbiter.memory_events[:2]] == [
        ("reserve", 40 * MIB, True), ("release", 40 * MIB, True)]
    assert arbiter.memory_events[-1].used_after == 0


def test_a_wider_pitch_than_guessed_reserves_the_difference(build: Build, gpu_dir: Path,
                                                            start_arbiter: StartArbiter) -> None:
    # The driver pads 1100-byte rows to 2048 bytes; the hook guessed 1536 and must reserve the rest.
    arbiter = start_arbiter(Script(memory_limit=100 * MIB))
    result = run_memcheck(build, gpu_dir, "run", "--case", "pitch", "--way", "gpa-v2", "--size", str(40 * MIB),
                          arbiter=arbiter, env={"FASTGSHARE_FAKE_GPU_PITCH_ALIGN": "2048"})
    assert result.returncode == 0, result.stderr
    assert [(s["op"], s["result"]) for s in result.summary["steps"]] == STANDARD_STEPS
    desc = result.summary["desc"]
    assert desc["pitch"] == 2048
    guess = 1536 * desc["height"]
    events = arbiter.memory_events
    assert [(e.kind, e.bytes) for e in events[:2]] == [("reserve", guess), ("reserve", (2048 - 1536) * desc["height"])]
    assert ledger_problems(events, 2048 * desc["height"]) == []


def test_a_refused_pitch_difference_frees_the_allocation_again(build: Build, gpu_dir: Path,
                                                               start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(memory_limit=60 * MIB))  # the guess (48 MiB) fits, the real 64 MiB does not
    result = run_memcheck(build, gpu_dir, "run", "--case", "pitch", "--way", "linked", "--size", str(40 * MIB),
                          arbiter=arbiter, env={"FASTGSHARE_FAKE_GPU_PITCH_ALIGN": "2048"})
    assert result.summary["steps"][0] == {"op": "alloc", "result": OOM}
    events: list[MemEvent] = arbiter.memory_events
    assert [(e.kind, e.granted) for e in events[:3]] == [("reserve", True), ("reserve", False), ("release", True)]
    assert events[2].used_after == 0
    assert not any(e.kind == "drop" for e in events)


def test_views_never_exceed_the_physical_card(build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    env = {"FASTGSHARE_FAKE_GPU_MEMORY": "48M"}  # smaller than the pod's limit (a misconfigured share)
    for case, view in [("meminfo", {"total": 48 * MIB, "free": 40 * MIB}), ("totalmem", {"total": 48 * MIB}),
                       ("nvml", {"total": 48 * MIB, "free": 40 * MIB, "used": 8 * MIB})]:
        arbiter = start_arbiter(Script(memory_limit=1 << 30))
        result = run_memcheck(build, gpu_dir, "run", "--case", case, "--way", "linked", "--size", str(8 * MIB),
                              arbiter=arbiter, env=env)
        assert result.returncode == 0, result.stderr
        assert {key: result.summary["view"][key] for key in view} == view, case


def test_threads_allocating_and_freeing_at_once_release_every_byte(build: Build, gpu_dir: Path,
                                                                   start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(memory_limit=16 * MIB))  # 8 threads x 2 x 2 MiB want 32 MiB: some are refused
    result = run_memcheck(build, gpu_dir, "stress", "--threads", "8", "--iterations", "150", "--size", str(2 * MIB),
                          arbiter=arbiter, timeout_s=120)
    assert result.returncode == 0, result.stderr
    assert result.summary["errors"] == 0
    assert result.summary["oom"] > 0
    events = arbiter.memory_events
    assert max(e.used_after for e in events) <= 16 * MIB
    granted = sum(e.bytes for e in events if e.kind == "reserve" and e.granted)
    assert granted == sum(e.bytes for e in events if e.kind == "release")
    assert not any(e.kind == "drop" for e in events)
    assert events[-1].used_after == 0


def test_a_second_free_of_a_pointer_releases_nothing(build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(memory_limit=64 * MIB))
    replies = _shell(build, gpu_dir, ["alloc 10485760", "double-free 0", "quit"], arbiter=arbiter)
    assert replies[1] == {"op": "double-free", "result": 0, "second": INVALID_VALUE}
    assert [(e.kind, e.bytes) for e in arbiter.memory_events] == [("reserve", 10 * MIB), ("release", 10 * MIB)]


def test_without_an_arbiter_allocations_fail_closed_and_the_program_goes_on(build: Build, gpu_dir: Path) -> None:
    replies, result = _shell_run(build, gpu_dir, ["alloc 1048576", "alloc 1048576", "info", "quit"])
    assert [(r["op"], r["result"]) for r in replies] == [("alloc", NOT_PERMITTED), ("alloc", NOT_PERMITTED),
                                                        ("info", NOT_PERMITTED)]
    assert result.returncode == 0
    [line] = [line for line in result.stderr.splitlines() if line.startswith("fastgshare-hook:")]
    assert "FASTGSHARE_ARBITER_SOCKET is not set" in line
    assert "refusing GPU memory allocations of process" in line


def test_an_arbiter_that_goes_away_refuses_later_allocations_but_frees_still_work(
        build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(memory_limit=64 * MIB, close_after_memory=2))
    replies = _shell(build, gpu_dir, ["alloc 1048576", "alloc 1048576", "alloc 1048576", "alloc 1048576", "free 0",
                                      "quit"], arbiter=arbiter, env={"FASTGSHARE_HOOK_RECONNECT_S": "0"})
    assert [(r["op"], r["result"]) for r in replies] == [("alloc", 0), ("alloc", 0), ("alloc", NOT_PERMITTED),
                                                        ("alloc", NOT_PERMITTED), ("free", 0)]


def test_pynvml_sees_the_pods_slice(build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    script = ("import json, pynvml\n"
              "pynvml.nvmlInit()\n"
              "h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
              "m = pynvml.nvmlDeviceGetMemoryInfo(h)\n"
              "m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)\n"
              "print(json.dumps([m.total, m.free, m.used, m2.total, m2.free, m2.used]))\n")
    arbiter = start_arbiter(Script(memory_limit=64 * MIB))
    for hook, expected in [(True, [64 * MIB, 64 * MIB, 0] * 2), (False, [16 << 30, 16 << 30, 0] * 2)]:
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                                env=tenant_env(build, gpu_dir, hook=hook, arbiter=arbiter), check=False)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout) == expected


# --- helpers -------------------------------------------------------------------------------------
def _shell_run(build: Build, gpu_dir: Path, commands: list[str], arbiter: FakeArbiter | None = None,
               env: dict[str, str] | None = None) -> tuple[list[dict[str, int]], subprocess.CompletedProcess[str]]:
    """``memcheck shell`` with the commands: its replies after "ready", and the finished process."""
    result = subprocess.run([str(build.memcheck), "shell"], input="".join(f"{c}\n" for c in commands),
                            capture_output=True, text=True, timeout=30,
                            env=tenant_env(build, gpu_dir, hook=True, arbiter=arbiter, extra=env), check=False)
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines, result.stderr
    assert lines[0]["op"] == "ready", result.stderr
    return lines[1:], result


def _shell(build: Build, gpu_dir: Path, commands: list[str], arbiter: FakeArbiter | None = None,
           env: dict[str, str] | None = None) -> list[dict[str, int]]:
    return _shell_run(build, gpu_dir, commands, arbiter, env)[0]


def test_each_lookup_version_gets_the_wrapper_of_its_own_abi(build: Build, gpu_dir: Path) -> None:
    # (exported name the lookup must return, base, version, per-thread flag)
    lookups = [("cuMemAlloc", "cuMemAlloc", 2000, 0), ("cuMemAlloc", "cuMemAlloc", 3010, 0),
               ("cuMemAlloc_v2", "cuMemAlloc", 3020, 0), ("cuMemAlloc_v2", "cuMemAlloc", 13000, 0),
               ("cuMemAlloc_v2", "cuMemAlloc", 13000, 1),  # no per-thread variant: the default one
               ("cuMemGetInfo", "cuMemGetInfo", 3000, 0), ("cuArray3DCreate_v2", "cuArray3DCreate", 12000, 0),
               ("cuMemFreeAsync_ptsz", "cuMemFreeAsync", 12000, 1)]
    lines = "".join(f"cuda {symbol} {base} {version} {flag}\n" for symbol, base, version, flag in lookups)
    result = subprocess.run([str(build.memcheck), "resolve"], input=lines, capture_output=True, text=True, timeout=30,
                            env=tenant_env(build, gpu_dir, hook=True), check=True)
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(a["symbol"], a["gpa_legacy"], a["gpa_v2"]) for a in answers] == [
        (symbol, True, True) for symbol, *_ in lookups]


def test_a_lookup_older_than_every_abi_of_a_memory_call_is_not_wrapped(build: Build, gpu_dir: Path) -> None:
    # cuMemAllocManaged appeared in CUDA 6.0: the driver's "version not sufficient" passes through.
    result = subprocess.run([str(build.memcheck), "resolve"], input="cuda cuMemAllocManaged cuMemAllocManaged 5050 0\n",
                            capture_output=True, text=True, timeout=30, env=tenant_env(build, gpu_dir, hook=True),
                            check=True)
    answer = json.loads(result.stdout)
    assert (answer["exported"], answer["gpa_legacy"], answer["gpa_v2"]) == (True, False, False)
