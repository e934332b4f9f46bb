"""Asynchronous launches, streams and events of the simulated driver, as real processes (the
stream-probe program of async_programs.py).

Ordering is asserted through gates (a host function that holds its stream until the test opens it)
and the log of host functions, so the assertions follow from CUDA's rules, not from timing; the
only durations asserted are lower bounds that the simulated GPU guarantees (a kernel holds the GPU
for at least its configured time) with generous upper bounds.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from simgpu.state import read_state, sample_state
from tests.integration.hook.fake_arbiter import wait_until
from tests.integration.simgpu.async_programs import LiveProbe, build_probe, probe_env, run_probe

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_NOT_READY = 600
MS = 1_000_000

KERNELS_PTX = textwrap.dedent("""
    .version 8.0
    .target sm_90
    .address_size 64
    .visible .entry work(.param .u64 p)
    {
        ret;
    }
    .visible .entry other(.param .u64 p)
    {
        ret;
    }
""")


@pytest.fixture(scope="module")
def probe(simgpu_build: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="stream-probe-") as directory:
        yield build_probe(Path(directory))


@pytest.fixture
def ptx(tmp_path: Path) -> Path:
    path = tmp_path / "kernels.ptx"
    path.write_text(KERNELS_PTX)
    return path


def _kernels(ptx: Path) -> str:
    return f"load m data {ptx}; func f m work; func g m other"


def test_a_launch_returns_while_its_kernel_is_pending(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    """The kernel runs for 30 s: the launch returns at once, the stream is not ready, the state file
    shows it running and not yet counted; the process then exits with it queued, and cleanly."""
    env = {"FASTGSHARE_FAKE_GPU_KERNEL_TIME": "default=30s"}
    live = LiveProbe(probe, gpu_dir, f"{_kernels(ptx)}; launch f null; launch f null; query null; pause; exit",
                     env=env)
    try:
        assert live.read_until("query")["rc"] == CUDA_ERROR_NOT_READY
        state = read_state(gpu_dir)
        pid = live.lines[0]["pid"]
        assert state.by_pid(pid).kernels == 0
        assert state.running_kernels + state.by_pid(pid).waiting_threads >= 1
        live.resume()
        run = live.finish(timeout_s=20)  # exit does not wait for the queued minute of kernels
    finally:
        live.kill()
    assert run.returncode == 0, run.stderr
    state = read_state(gpu_dir)
    assert not state.by_pid(run.pid).alive
    assert (state.sm_free, state.running_kernels, state.by_pid(run.pid).kernels) == (100, 0, 0)


def test_kernels_run_in_stream_order_and_events_time_them(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    env = {"FASTGSHARE_FAKE_GPU_KERNEL_TIME": "default=40ms,other=80ms,per_block=10ms"}
    script = (f"{_kernels(ptx)}; stream s; event e0; event e1; event e2; record e0 s; launch f s grid=3; "
              "record e1 s; host s after-f; launch g s; record e2 s; host s after-g; sync s; "
              "elapsed e0 e1; elapsed e1 e2; query s")
    run = run_probe(probe, gpu_dir, script, env=env)
    assert all(line["rc"] == CUDA_SUCCESS for line in run.lines if "i" in line), run.lines
    first, second = run.op(15)["ms"], run.op(16)["ms"]
    assert 70 <= first < 70 + 5000  # 40 ms + 3 blocks x 10 ms
    assert 90 <= second < 90 + 5000  # other=80ms + 1 block x 10 ms
    assert run.log == ["after-f", "after-g"]
    proc = read_state(gpu_dir).by_pid(run.pid)
    assert proc.kernels == 2
    assert proc.busy_ns >= 160 * MS


def test_event_queries_and_elapsed_time_follow_the_records(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    script = (f"{_kernels(ptx)}; stream s; event a; event b; event quiet notiming; equery a; "
              "elapsed a b; hostwait s G; record a s; equery a; elapsed a b; open G; esync a; equery a; "
              "record b s; record quiet s; sync s; elapsed a b; elapsed a quiet")
    run = run_probe(probe, gpu_dir, script)
    ops = {index: run.rc(index) for index in range(7, 21)}
    assert ops[7] == CUDA_SUCCESS  # never recorded: complete
    assert ops[8] == CUDA_ERROR_INVALID_HANDLE  # never recorded: no time
    assert ops[11] == CUDA_ERROR_NOT_READY  # recorded behind the closed gate
    assert ops[12] == CUDA_ERROR_INVALID_HANDLE  # b never recorded
    assert ops[15] == CUDA_SUCCESS
    assert ops[19] == CUDA_SUCCESS
    assert run.op(19)["ms"] >= 0
    assert ops[20] == CUDA_ERROR_INVALID_HANDLE  # CU_EVENT_DISABLE_TIMING


def test_a_stream_waits_for_an_event_of_another(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    script = (f"{_kernels(ptx)}; stream s1; stream s2; stream s3; event e; hostwait s1 G; record e s1; "
              "wait s2 e; host s2 after-e; host s3 independent; waitfor independent; sleep 100; open G; "
              "sync s2")
    run = run_probe(probe, gpu_dir, script)
    assert run.rc(12) == CUDA_SUCCESS  # s3 ran while s1 was held
    log = run.log
    assert log.index("open:G") < log.index("passed:G") < log.index("after-e")


def test_the_legacy_stream_waits_for_blocking_streams_and_they_for_it(probe: Path, gpu_dir: Path) -> None:
    script = ("stream b; hostwait b G1; host legacy L1; query legacy; sleep 50; open G1; sync legacy; "
              "hostwait legacy G2; host b B2; query b; sleep 50; open G2; sync b")
    run = run_probe(probe, gpu_dir, script)
    assert run.rc(3) == CUDA_ERROR_NOT_READY  # the legacy stream's work waits for b's
    assert run.rc(9) == CUDA_ERROR_NOT_READY  # b's later work waits for the legacy stream's
    log = run.log
    assert log.index("open:G1") < log.index("passed:G1") < log.index("L1")
    assert log.index("open:G2") < log.index("passed:G2") < log.index("B2")


def test_non_blocking_streams_do_not_synchronise_with_the_legacy_stream(probe: Path, gpu_dir: Path) -> None:
    script = ("stream nb nonblocking; hostwait nb G1; host legacy L1; waitfor L1; open G1; sync nb; "
              "hostwait legacy G2; host nb N2; waitfor N2; open G2; sync legacy")
    run = run_probe(probe, gpu_dir, script)
    assert run.rc(3) == CUDA_SUCCESS  # the legacy stream's work ran while nb was held
    assert run.rc(8) == CUDA_SUCCESS  # nb's work ran while the legacy stream was held
    assert run.log.index("L1") < run.log.index("open:G1")


def test_per_thread_default_streams_are_per_thread_and_blocking(probe: Path, gpu_dir: Path) -> None:
    """NULL through a _ptsz entry point is the calling thread's own stream: another thread's is not
    held up by it; the legacy stream waits for it (it is a blocking stream)."""
    script = ("on t1 hostwait null G ptsz; on t2 host null T2 ptsz; waitfor T2; host perthread M; waitfor M; "
              "host legacy L; query legacy; sleep 50; open G; sync legacy; on t1 sync null ptsz")
    run = run_probe(probe, gpu_dir, script)
    assert run.rc(2) == CUDA_SUCCESS  # t2's per-thread stream is not t1's
    assert run.rc(4) == CUDA_SUCCESS  # nor is the main thread's
    assert run.rc(6) == CUDA_ERROR_NOT_READY
    log = run.log
    assert log.index("open:G") < log.index("passed:G") < log.index("L")


def test_host_functions_and_callbacks_run_in_stream_order(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    env = {"FASTGSHARE_FAKE_GPU_KERNEL_TIME": "default=20ms"}
    script = (f"{_kernels(ptx)}; stream s; callback s A; launch f s; host s B; callback s C; launch f s; "
              "host s D; sync s")
    run = run_probe(probe, gpu_dir, script, env=env)
    assert run.log == ["A", "B", "C", "D"]


def test_a_full_stream_blocks_the_next_launch(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    """With room for two items, the third waits until one of them has run."""
    script = (f"{_kernels(ptx)}; stream s; hostwait s G; launch f s; spawn t launch f s; sleep 200; open G; "
              "join t; sync s")
    run = run_probe(probe, gpu_dir, script, env={"FASTGSHARE_FAKE_GPU_QUEUE_DEPTH": "2"})
    assert all(line["rc"] == CUDA_SUCCESS for line in run.lines if "i" in line), run.lines
    log = run.log
    assert log.index("open:G") < log.index("passed:G") < log.index("t:done")


def test_cuctxsynchronize_waits_for_every_stream(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    env = {"FASTGSHARE_FAKE_GPU_KERNEL_TIME": "default=30ms"}
    script = (f"{_kernels(ptx)}; stream a; stream n nonblocking; launch f a; launch f n; launch f null; "
              "on t launch f null ptsz; ctxsync; query a; query n; query legacy; on t query null ptsz")
    run = run_probe(probe, gpu_dir, script, env=env)
    assert [run.rc(i) for i in range(10, 14)] == [CUDA_SUCCESS] * 4
    proc = read_state(gpu_dir).by_pid(run.pid)
    assert (proc.kernels, proc.ctx_syncs) == (4, 1)


def test_a_destroyed_stream_still_runs_its_work(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    env = {"FASTGSHARE_FAKE_GPU_KERNEL_TIME": "default=20ms"}
    run = run_probe(probe, gpu_dir, f"{_kernels(ptx)}; stream s; launch f s; host s H; destroy s; query s; ctxsync",
                    env=env)
    assert [run.rc(6), run.rc(7), run.rc(8)] == [CUDA_SUCCESS, CUDA_ERROR_INVALID_HANDLE, CUDA_SUCCESS]
    assert run.log == ["H"]
    assert read_state(gpu_dir).by_pid(run.pid).kernels == 1


def test_streams_of_one_process_share_its_sm_partition(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    """Kernels of two streams run one at a time (the partition is the process's): accounting stays exact."""
    env = {"FASTGSHARE_FAKE_GPU_KERNEL_TIME": "default=25ms", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    launches = "; ".join(f"launch f {s}" for s in ("a", "b") * 4)
    run = run_probe(probe, gpu_dir, f"{_kernels(ptx)}; stream a; stream b; {launches}; ctxsync", env=env)
    proc = read_state(gpu_dir).by_pid(run.pid)
    assert proc.kernels == 8
    assert proc.busy_ns >= 200 * MS
    assert proc.last_end_ns - proc.first_start_ns >= 0.97 * proc.busy_ns


def test_a_bad_kernel_time_setting_fails_cuinit_with_one_line(probe: Path, gpu_dir: Path) -> None:
    run = run_probe(probe, gpu_dir, "query null", env={"FASTGSHARE_FAKE_GPU_KERNEL_TIME": "default=fast"})
    assert run.returncode == 1
    assert run.lines[0]["rc"] == CUDA_ERROR_INVALID_VALUE
    [line] = run.stderr.strip().splitlines()
    assert "FASTGSHARE_FAKE_GPU_KERNEL_TIME=default=fast" in line
    assert "'fast' is not a duration" in line
    assert "allowed:" in line


def test_a_killed_process_with_queued_kernels_leaves_the_gpu_whole(probe: Path, gpu_dir: Path, ptx: Path) -> None:
    env = {"FASTGSHARE_FAKE_GPU_KERNEL_TIME": "default=5s"}
    live = LiveProbe(probe, gpu_dir, f"{_kernels(ptx)}; stream a; launch f a; launch f null; launch f a; pause",
                     env=env)
    try:
        live.read_until("launch")
        pid = live.lines[0]["pid"]
        assert wait_until(lambda: (s := sample_state(gpu_dir)) is not None and s.running_kernels == 1)
        os.kill(pid, signal.SIGKILL)
        live.process.wait(timeout=10)
    finally:
        live.kill()
    after = run_probe(probe, gpu_dir, f"{_kernels(ptx)}; launch f null; sync null",
                      env={"FASTGSHARE_FAKE_GPU_KERNEL_TIME": "default=1ms"}, timeout_s=10)
    assert after.rc(3) == CUDA_SUCCESS
    state = read_state(gpu_dir)
    assert not state.by_pid(pid).alive
    assert (state.sm_free, state.running_kernels) == (100, 0)


_FORK_AFTER_LAUNCH = textwrap.dedent("""
    import ctypes, os, sys
    cuda = ctypes.CDLL("libcuda.so.1")
    ctx, dev, mod, fn = ctypes.c_void_p(), ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuCtxCreate_v4(ctypes.byref(ctx), None, 0, dev) == 0
    assert cuda.cuModuleLoadData(ctypes.byref(mod), b"FAKECUBIN fork\\0") == 0
    assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"spin") == 0
    us = ctypes.c_ulonglong(200000)
    params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(us), ctypes.c_void_p))
    for _ in range(3):
        assert cuda.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, None, params, None) == 0
    child = os.fork()
    if child == 0:
        code = cuda.cuInit(0)  # CUDA_ERROR_NOT_INITIALIZED in a child forked after init
        sys.exit(0 if code == 3 else 1)  # a normal exit: the driver's exit handlers run
    _, status = os.waitpid(child, 0)
    assert cuda.cuCtxSynchronize() == 0
    print(os.WEXITSTATUS(status), flush=True)
""")


def test_a_child_forked_with_kernels_queued_exits_cleanly(simgpu_build: Path, gpu_dir: Path) -> None:
    env = probe_env(gpu_dir, {"LD_LIBRARY_PATH": str(simgpu_build)})
    result = subprocess.run([sys.executable, "-c", _FORK_AFTER_LAUNCH], env=env, capture_output=True, text=True,
                            timeout=30, check=False)
    assert (result.returncode, result.stdout.strip()) == (0, "0"), result.stderr
    state = read_state(gpu_dir)
    assert [p.kernels for p in state.procs] == [3]
