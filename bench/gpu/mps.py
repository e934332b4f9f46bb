"""Part e, MPS: what an SM partition does to a compute-bound kernel. If the machine allows, it starts
NVIDIA's MPS control daemon (``nvidia-cuda-mps-control -f``, in the foreground so that this part
owns the process, with its pipe and log directories under the day's temporary directory; no device
setting is changed: no compute mode, no reset), runs the tenant's spin kernel over 8 blocks of 256
threads per SM (one wave on the whole GPU) at ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` 100 and 50,
and stops the daemon (``quit``; run.py stops it again after the part, whatever happened). Else it
records ``"mps": false`` and why.

``read_only_pipe`` answers issue 42, item 6: the node agent mounts the MPS pipe directory into
pods read-only, so a pod cannot plant a file another pod's client opens. One more client runs at 50 %
with the pipe directory read-only in a private mount namespace (``unshare --mount``, a read-only
bind mount of the directory onto itself, as the kubelet mounts it): ``"ok": true`` when MPS clients
need no writes there, else the client's error. Needs root and ``unshare``; else ``"checked": false``
and why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from bench.gpu.part import OK, JsonDict, PartContext, PartFailed, Progress, Skipped
from bench.gpu.target import scrubbed_environment
from bench.gpu.tenants import DAY, Program, choose_program, run_one
from bench.gpu.toolchain import run_text

CONTROL = "nvidia-cuda-mps-control"
KERNEL_MS = 20.0
BLOCKS_PER_SM, BLOCK = 8, 256
LAUNCHES = 10
PERCENTAGES = (100, 50)


def mps_env(mps_dir: Path) -> dict[str, str]:
    return {**scrubbed_environment(), "CUDA_MPS_PIPE_DIRECTORY": str(mps_dir / "pipe"),
            "CUDA_MPS_LOG_DIRECTORY": str(mps_dir / "log")}


def stop_daemon(mps_dir: Path) -> str:
    """Ask the daemon of ``mps_dir`` to quit (nothing to do when its pipe is gone)."""
    if not (mps_dir / "pipe" / "control").exists() or shutil.which(CONTROL) is None:
        return "not running"
    try:
        done = subprocess.run([CONTROL], input="quit\n", capture_output=True, text=True, timeout=20,
                              env=mps_env(mps_dir), check=False)
    except subprocess.TimeoutExpired:
        return "quit did not answer within 20 s"
    return f"quit: exit {done.returncode}"


def log_tail(mps_dir: Path) -> str:
    texts = [path.read_text(errors="replace")[-300:] for path in sorted((mps_dir / "log").glob("*.log"))]
    return " | ".join(text.strip() for text in texts if text.strip())


def kernel_ms(program: Program, env: dict[str, str], grid: int, iters: int) -> JsonDict:
    summary = run_one([program.binary, "--ptx", str(program.ptx), "--kernel", "spin", "--iters", str(iters),
                       "--grid", str(grid), "--block", str(BLOCK), "--launches", str(LAUNCHES)], env, 120)
    return {"kernel_ms": round(float(summary["busy_ms"]) / LAUNCHES, 3), "sm_count_seen": summary["sm_count"]}


def read_only_pipe_client(program: Program, mps_dir: Path, grid: int, iters: int) -> JsonDict:
    """The spin kernel at 50 % from a client that sees the pipe directory read-only (see the module)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return {"checked": False, "reason": "needs root and unshare (a private read-only bind mount)"}
    pipe = str(mps_dir / "pipe")
    client = [program.binary, "--ptx", str(program.ptx), "--kernel", "spin", "--iters", str(iters),
              "--grid", str(grid), "--block", str(BLOCK), "--launches", str(LAUNCHES)]
    in_read_only_view = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                         'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"', pipe, *client]
    env = {**mps_env(mps_dir), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    try:
        summary = run_one(in_read_only_view, env, 120)
    except PartFailed as error:
        return {"checked": True, "ok": False, "error": str(error), "log": log_tail(mps_dir)}
    return {"checked": True, "ok": True, "kernel_ms": round(float(summary["busy_ms"]) / LAUNCHES, 3)}


def start_daemon(mps_dir: Path) -> subprocess.Popen[bytes]:
    for sub in ("pipe", "log"):
        (mps_dir / sub).mkdir(parents=True, exist_ok=True)
    with (mps_dir / "daemon.out").open("wb") as out:
        daemon = subprocess.Popen([CONTROL, "-f"], stdout=out, stderr=subprocess.STDOUT, env=mps_env(mps_dir))
    deadline = time.monotonic() + 15
    while not (mps_dir / "pipe" / "control").exists() and daemon.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if daemon.poll() is not None or not (mps_dir / "pipe" / "control").exists():
        daemon.kill()
        daemon.wait()
        why = (mps_dir / "daemon.out").read_text(errors="replace")[-300:].strip() or log_tail(mps_dir)
        raise Skipped(f"the MPS control daemon did not start: {why}", {"mps": False, "reason": why})
    return daemon


def measure(ctx: PartContext, program: Program, progress: Progress) -> JsonDict:
    assert ctx.mps_dir is not None
    sm_count = int(run_one([program.binary, "--ptx", str(program.ptx), "--kernel", "empty", "--timing", "none",
                            "--depth", "0", "--launches", "1"], scrubbed_environment(), 120)["sm_count"])
    grid = BLOCKS_PER_SM * sm_count
    calibration = run_one([program.binary, "--ptx", str(program.ptx), "--calibrate-us", f"{KERNEL_MS * 1e3:g}",
                           "--grid", str(grid), "--block", str(BLOCK)], scrubbed_environment(), 120)
    iters = int(calibration["iters"])
    progress.put("kernel", {"grid": grid, "block": BLOCK, "iters": iters, "sm_count": sm_count})
    progress.put("no_mps", kernel_ms(program, scrubbed_environment(), grid, iters))
    daemon = start_daemon(ctx.mps_dir)
    try:
        for percentage in PERCENTAGES:
            env = {**mps_env(ctx.mps_dir), "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(percentage)}
            try:
                progress.put(f"mps_{percentage}", kernel_ms(program, env, grid, iters))
            except PartFailed as error:
                why = f"a client at {percentage} % failed under MPS: {error}; log: {log_tail(ctx.mps_dir)}"
                raise Skipped(why, {**progress.data, "mps": False, "reason": why}) from None
        progress.put("read_only_pipe", read_only_pipe_client(program, ctx.mps_dir, grid, iters))
    finally:
        progress.put("daemon_stop", stop_daemon(ctx.mps_dir))
        try:
            daemon.wait(15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
    full, half = progress.data["mps_100"]["kernel_ms"], progress.data["mps_50"]["kernel_ms"]
    return {"status": OK, "mps": True, **progress.data, "slowdown_50_vs_100": round(half / full, 3)}


def mps(ctx: PartContext, progress: Progress) -> JsonDict:
    if ctx.dry_run:
        why = "the simulated GPU has no MPS daemon (nvidia-cuda-mps-control is NVIDIA's)"
        raise Skipped(why, {"mps": False, "reason": why})
    if shutil.which(CONTROL) is None:
        raise Skipped(f"{CONTROL} is not on PATH", {"mps": False, "reason": f"{CONTROL} is not on PATH"})
    status, mode = run_text(["nvidia-smi", "--query-gpu=compute_mode", "--format=csv,noheader"], 60)
    progress.put("compute_mode", mode)
    if status != 0 or "prohibited" in mode.lower():
        why = f"compute mode {mode!r} (not changed here)"
        raise Skipped(why, {"mps": False, "reason": why, "compute_mode": mode})
    program = choose_program(ctx)
    if program.kind != DAY:
        raise PartFailed("MPS needs bench/gpu/tenant.c with PTX")
    return measure(ctx, program, progress)
