"""The fake GPU driver alone (no hook): SM sharing across processes, accounting, memory pool, reaping."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from simgpu.state import ProcRecord, read_state, sample_state
from tests.integration.hook.fake_arbiter import wait_until
from tests.integration.hook.memory_matrix import ROWS, STANDARD_STEPS, VMM_STEPS
from tests.integration.hook.tenants import Build, finish_tenant, run_memcheck, run_tenant, start_tenant

MS = 1_000_000


def _run_pair(build: Build, gpu_dir: Path, sm: str, launches: int, kernel_us: int) -> tuple[ProcRecord, ProcRecord]:
    start_at = time.monotonic_ns() + 300 * MS  # both start launching at the same instant
    args = ("--launches", str(launches), "--duration-us", str(kernel_us), "--start-at-ns", str(start_at))
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": sm}
    first = start_tenant(build, gpu_dir, *args, hook=False, env=env)
    second = start_tenant(build, gpu_dir, *args, hook=False, env=env)
    results = [finish_tenant(first), finish_tenant(second)]
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    state = read_state(gpu_dir)
    return state.by_pid(results[0].summary["pid"]), state.by_pid(results[1].summary["pid"])


def _span(*procs: ProcRecord) -> int:
    return max(p.last_end_ns for p in procs) - min(p.first_start_ns for p in procs)


@pytest.mark.parametrize("path", ["linked", "dlsym", "rtld-default", "rtld-next", "procaddr-legacy", "procaddr-v2"])
def test_every_launch_path_reaches_the_fake_driver(build: Build, gpu_dir: Path, path: str) -> None:
    result = run_tenant(build, gpu_dir, "--path", path, "--launches", "3", "--duration-us", "100", hook=False)
    assert result.returncode == 0, result.stderr
    assert result.summary["launches"] == 3
    assert read_state(gpu_dir).by_pid(result.summary["pid"]).kernels == 3


def test_busy_time_matches_the_launched_kernel_time(build: Build, gpu_dir: Path) -> None:
    result = run_tenant(build, gpu_dir, "--launches", "10", "--duration-us", "20000", hook=False)
    assert result.returncode == 0, result.stderr
    state = read_state(gpu_dir)
    proc = state.by_pid(result.summary["pid"])
    assert proc.kernels == 10
    assert 200 * MS <= proc.busy_ns <= 200 * MS + 10 * 5 * MS  # sleep overshoot only
    assert proc.busy_ns <= _span(proc) <= proc.busy_ns + 20 * MS
    assert not proc.alive
    assert (proc.sm_held, proc.running) == (0, 0)
    assert state.sm_free == state.sm_total == 100
    assert state.device_busy_ns == pytest.approx(proc.busy_ns, rel=0.05)


def test_a_graph_holds_the_gpu_for_the_sum_of_its_nodes(build: Build, gpu_dir: Path) -> None:
    result = run_tenant(build, gpu_dir, "--api", "graph", "--graph-nodes", "3", "--launches", "4",
                        "--duration-us", "10000", hook=False)
    assert result.returncode == 0, result.stderr
    proc = read_state(gpu_dir).by_pid(result.summary["pid"])
    assert (proc.kernels, proc.graph_launches) == (4, 4)
    assert 120 * MS <= proc.busy_ns <= 150 * MS


def test_two_tenants_at_50_sm_run_side_by_side(build: Build, gpu_dir: Path) -> None:
    first, second = _run_pair(build, gpu_dir, sm="50", launches=15, kernel_us=20_000)
    assert first.sm_units == second.sm_units == 50
    for proc in (first, second):
        assert 300 * MS <= proc.busy_ns <= 380 * MS
    # Both ran at once: the pair took about as long as one of them, not the sum.
    assert _span(first, second) < 0.75 * (first.busy_ns + second.busy_ns)
    assert read_state(gpu_dir).device_busy_ns < 0.75 * (first.busy_ns + second.busy_ns)


def test_two_tenants_at_100_sm_take_turns(build: Build, gpu_dir: Path) -> None:
    first, second = _run_pair(build, gpu_dir, sm="100", launches=15, kernel_us=20_000)
    assert _span(first, second) >= 0.97 * (first.busy_ns + second.busy_ns)
    assert read_state(gpu_dir).device_busy_ns >= 0.97 * (first.busy_ns + second.busy_ns)
    # FIFO across processes: they alternate rather than one running to completion first.
    assert first.first_start_ns < second.last_end_ns - 100 * MS
    assert second.first_start_ns < first.last_end_ns - 100 * MS


@pytest.mark.parametrize("sm", ["50", "100"])
def test_threads_of_one_process_share_its_sm_partition(build: Build, gpu_dir: Path, sm: str) -> None:
    """MPS's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE limits the client process, all its kernels together:
    two launching threads of a 50-SM process do not get 100 SMs between them."""
    result = run_tenant(build, gpu_dir, "--threads", "2", "--launches", "20", "--duration-us", "10000", hook=False,
                        env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": sm})
    assert result.returncode == 0, result.stderr
    state = read_state(gpu_dir)
    proc = state.by_pid(result.summary["pid"])
    assert proc.kernels == 20
    assert 200 * MS <= proc.busy_ns <= 200 * MS + 20 * 5 * MS
    # One kernel at a time: the process's kernels never overlap (side by side, the span was half).
    assert _span(proc) >= 0.97 * proc.busy_ns
    assert state.device_busy_ns >= 0.97 * proc.busy_ns


def test_a_process_waiting_on_its_own_kernel_does_not_hold_up_another(build: Build, gpu_dir: Path) -> None:
    """Two 50-SM processes, two launching threads each: the partitions still run side by side."""
    start_at = time.monotonic_ns() + 300 * MS
    args = ("--threads", "2", "--launches", "16", "--duration-us", "10000", "--start-at-ns", str(start_at))
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    tenants = [start_tenant(build, gpu_dir, *args, hook=False, env=env) for _ in range(2)]
    results = [finish_tenant(tenant) for tenant in tenants]
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    state = read_state(gpu_dir)
    first, second = (state.by_pid(r.summary["pid"]) for r in results)
    for proc in (first, second):
        assert _span(proc) >= 0.97 * proc.busy_ns
    assert _span(first, second) < 0.75 * (first.busy_ns + second.busy_ns)


def test_the_state_can_be_sampled_while_a_tenant_runs(build: Build, gpu_dir: Path) -> None:
    process = start_tenant(build, gpu_dir, "--launches", "40", "--duration-us", "20000", hook=False)

    def mid_run() -> bool:
        state = sample_state(gpu_dir)
        return state is not None and any(p.pid == process.pid and p.kernels >= 5 for p in state.procs)

    assert wait_until(mid_run, timeout_s=10)
    sample = read_state(gpu_dir).by_pid(process.pid)
    assert sample.alive
    assert sample.kernels < 40
    assert finish_tenant(process).returncode == 0
    final = read_state(gpu_dir).by_pid(process.pid)
    assert final.kernels == 40
    assert final.busy_ns > sample.busy_ns


def test_the_memory_pool_is_shared_across_processes(build: Build, gpu_dir: Path) -> None:
    env = {"FASTGSHARE_FAKE_GPU_MEMORY": "1G"}
    holder = start_tenant(build, gpu_dir, "--alloc-mb", "700", "--launches", "50", "--duration-us", "20000",
                          hook=False, env=env)
    assert wait_until(lambda: (state := sample_state(gpu_dir)) is not None and state.mem_used >= 700 << 20)
    late = run_tenant(build, gpu_dir, "--alloc-mb", "700", "--launches", "1", hook=False, env=env)
    assert late.summary["alloc_error"] == 2  # CUDA_ERROR_OUT_OF_MEMORY
    assert finish_tenant(holder).returncode == 0
    state = read_state(gpu_dir)
    assert state.mem_total == 1 << 30
    assert state.mem_used == 0


@pytest.mark.parametrize("case", [row.case for row in ROWS if row.kind in ("alloc", "vmm")])
def test_every_allocation_path_counts_in_the_shared_pool(build: Build, gpu_dir: Path, case: str) -> None:
    # A 64 MiB fake GPU, no hook: the driver itself refuses the second ~40 MiB object and frees
    # the first. For VMM the memory lives until its handle is released AND it is unmapped.
    result = run_memcheck(build, gpu_dir, "run", "--case", case, "--way", "gpa-v2", "--size", str(40 << 20),
                          hook=False, env={"FASTGSHARE_FAKE_GPU_MEMORY": "64M"})
    assert result.returncode == 0, result.stderr
    steps = [(s["op"], s["result"]) for s in result.summary["steps"]]
    assert steps == (VMM_STEPS if case == "vmm" else STANDARD_STEPS)
    assert read_state(gpu_dir).mem_used == 0


def test_a_killed_tenant_gives_back_its_sm_units_and_memory(build: Build, gpu_dir: Path) -> None:
    victim = start_tenant(build, gpu_dir, "--alloc-mb", "100", "--launches", "1", "--duration-us", "5000000",
                          hook=False)
    assert wait_until(lambda: (state := sample_state(gpu_dir)) is not None and state.running_kernels == 1)
    os.kill(victim.pid, signal.SIGKILL)
    victim.wait(timeout=5)
    started = time.monotonic()
    survivor = run_tenant(build, gpu_dir, "--launches", "2", "--duration-us", "1000", hook=False)
    assert survivor.returncode == 0, survivor.stderr
    assert time.monotonic() - started < 2.0  # reaped, not waited out
    state = read_state(gpu_dir)
    assert not state.by_pid(victim.pid).alive
    assert (state.sm_free, state.mem_used, state.running_kernels) == (100, 0, 0)


def test_a_killed_tenant_not_yet_reaped_by_its_parent_is_gone_too(build: Build, gpu_dir: Path) -> None:
    # A real driver frees a process's GPU when it exits, not when its parent waits for it.
    victim = start_tenant(build, gpu_dir, "--launches", "1", "--duration-us", "5000000", hook=False)
    assert wait_until(lambda: (state := sample_state(gpu_dir)) is not None and state.running_kernels == 1)
    os.kill(victim.pid, signal.SIGKILL)
    try:
        survivor = run_tenant(build, gpu_dir, "--launches", "2", "--duration-us", "1000", hook=False, timeout_s=5)
        assert survivor.returncode == 0, survivor.stderr
    finally:
        victim.wait(timeout=5)


def test_the_mps_percentage_sets_the_sm_units(build: Build, gpu_dir: Path) -> None:
    result = run_tenant(build, gpu_dir, "--launches", "1", hook=False, env={"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"})
    assert read_state(gpu_dir).by_pid(result.summary["pid"]).sm_units == 30


def test_without_a_device_directory_cuinit_fails_clearly(build: Build, gpu_dir: Path) -> None:
    result = run_tenant(build, gpu_dir, "--launches", "1", hook=False, env={"FASTGSHARE_FAKE_GPU_DIR": ""})
    assert result.returncode == 1
    assert "FASTGSHARE_FAKE_GPU_DIR is not set" in result.stderr
    assert "CUDA_ERROR_NO_DEVICE" in result.stderr


def test_the_fake_driver_binds_like_the_real_one(build: Build) -> None:
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) is not installed")
    dynamic = subprocess.run(["readelf", "-d", str(build.fake_dir / "libcuda.so.1")], capture_output=True, text=True,
                             check=True).stdout
    assert "Library soname: [libcuda.so.1]" in dynamic
    assert "SYMBOLIC" in dynamic  # its cuGetProcAddress hands out its own functions (pitfall 9)
