"""Running the day's tenant: ``tenant.c`` with ``kernels.cu``'s PTX (the real GPU and, where nvcc
is at hand, the simulated one), or in the dry run without PTX the simulated GPU's own tenant
(``simgpu/build/tenant``). One measurement starts every tenant to begin together and reads what
each got.

A tenant's share is measured by work done: kernels completed x the time one spin kernel takes on
the GPU alone (CUDA events, calibrated first) / the tenant's wall time. The sum of each kernel's
own events is no measure of it: a kernel's begin event is recorded before its launch call, which
the hook holds while the pod waits for a token, and without the hook the GPU time-slices between
processes inside a kernel's events; its mean per kernel is printed as ``kernel_span_ms_mean`` (the
kernel and whatever waited in front of it). On the simulated GPU its own accounting
(``simgpu_share``, from the state file) is a second, independent measure.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from bench.gpu.part import JsonDict, PartContext, PartFailed, last_json_line
from bench.gpu.target import Gpu, Tenant, fresh_gpu
from simgpu.state import sample_state

DAY = "bench/gpu/tenant.c + kernels.cu (PTX)"
SIMGPU = "simgpu/build/tenant (the simulated GPU's own tenant)"


@attrs.frozen(kw_only=True)
class Program:
    """Which tenant program runs, and why that one."""

    kind: str  # DAY or SIMGPU
    binary: str
    ptx: str | None = None
    why: str = ""

    def to_json(self) -> JsonDict:
        return {"program": self.kind, **({"why": self.why} if self.why else {})}


@attrs.frozen(kw_only=True)
class Spin:
    """The spin kernel of a measurement: its iterations, and how long it takes on the GPU alone."""

    iters: int
    kernel_ms: float
    kernel_us_asked: float

    def to_json(self) -> JsonDict:
        return {"iters": self.iters, "kernel_ms_alone": round(self.kernel_ms, 4),
                "kernel_us_asked": self.kernel_us_asked}


def run_one(argv: Sequence[str], env: dict[str, str], timeout_s: float) -> JsonDict:
    """Run a tenant to its end; its JSON summary (raises PartFailed with the reason otherwise)."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise PartFailed(f"{Path(argv[0]).name} did not finish within {timeout_s:.0f} s") from None
    summary = last_json_line(done.stdout)
    if summary is None or "error" in summary:
        why = (summary or {}).get("error") or done.stderr.strip()[-400:] or f"exit {done.returncode}"
        raise PartFailed(f"{Path(argv[0]).name} {' '.join(argv[1:4])}...: {why}")
    return summary


def choose_program(ctx: PartContext) -> Program:
    """tenant.c with PTX where setup built both; in the dry run, the simulated GPU's tenant otherwise
    (and when the simulated driver refuses the PTX)."""
    build = ctx.build
    if build.tenant and build.ptx:
        program = Program(kind=DAY, binary=build.tenant, ptx=build.ptx)
        if not ctx.dry_run:
            return program
        try:
            calibrate(ctx, program, 100)
            return program
        except PartFailed as error:
            why = f"tenant.c failed on the simulated GPU: {error}"
    else:
        why = f"no PTX: {build.problems.get('ptx') or build.problems.get('tenant') or 'setup did not run'}"
    if ctx.dry_run and build.simgpu_tenant:
        return Program(kind=SIMGPU, binary=build.simgpu_tenant, why=why)
    raise PartFailed(why)


def calibrate(ctx: PartContext, program: Program, kernel_us: float, *, grid: int = 0, block: int = 128) -> Spin:
    """The spin kernel's iterations for ``kernel_us`` alone on the GPU (the simulated GPU takes the
    time from its setting)."""
    if program.kind == SIMGPU:
        return Spin(iters=0, kernel_ms=kernel_us / 1e3, kernel_us_asked=kernel_us)
    gpu = fresh_gpu(ctx, f"calibrate-{kernel_us:g}-{grid}")
    summary = run_one([program.binary, "--ptx", str(program.ptx), "--calibrate-us", f"{kernel_us:g}",
                       "--grid", str(grid), "--block", str(block)], gpu.env(spin_us=kernel_us), 120)
    return Spin(iters=int(summary["iters"]), kernel_ms=float(summary["kernel_ms"]), kernel_us_asked=kernel_us)


def tenant_argv(program: Program, tenant: Tenant, spin: Spin, *, seconds: float, start_at_ns: int,
                depth: int) -> list[str]:
    if program.kind == SIMGPU:
        argv = [program.binary, "--seconds", f"{seconds:g}", "--duration-us", f"{spin.kernel_us_asked:g}",
                "--start-at-ns", str(start_at_ns)]
    else:
        argv = [program.binary, "--ptx", str(program.ptx), "--kernel", "spin", "--iters", str(spin.iters),
                "--seconds", f"{seconds:g}", "--depth", str(depth), "--start-at-ns", str(start_at_ns)]
    if tenant.burst_on_ms:
        argv += ["--burst-on-ms", f"{tenant.burst_on_ms:g}", "--burst-off-ms", f"{tenant.burst_off_ms:g}"]
    return argv


def share_of(program: Program, summary: JsonDict, spin: Spin, gpu: Gpu) -> JsonDict:
    """One tenant's outcome from its summary (and the simulated GPU's accounting)."""
    wall_ms = float(summary["wall_ms"]) if "wall_ms" in summary else float(summary["elapsed_s"]) * 1e3
    result: JsonDict = {"kernels": summary["launches"], "wall_ms": round(wall_ms, 1),
                        "first_error": summary.get("first_error_name", summary.get("first_error"))}
    if program.kind == DAY:
        result["achieved"] = round(int(summary["launches"]) * spin.kernel_ms / wall_ms, 4)
        if summary.get("busy_ms") is not None and int(summary["launches"]):
            result["kernel_span_ms_mean"] = round(float(summary["busy_ms"]) / int(summary["launches"]), 4)
        result["timing"] = summary.get("timing")
    if gpu.gpu_dir is not None:
        snapshot = sample_state(gpu.gpu_dir)
        try:
            busy_ns = snapshot.by_pid(int(summary["pid"])).busy_ns if snapshot else 0
        except KeyError:
            busy_ns = 0
        result["simgpu_share"] = round(busy_ns / (wall_ms * 1e6), 4)
        if program.kind == SIMGPU:
            result["achieved"] = result["simgpu_share"]
    return result


def run_together(ctx: PartContext, program: Program, gpu: Gpu, tenants: Sequence[Tenant], spin: Spin, *,
                 hook: str | None, socket: Path | None, sync: bool = True, depth: int = 1,
                 start_delay_s: float = 2.0) -> dict[str, JsonDict]:
    """Every tenant at once for ``ctx.seconds`` (from a common start); each one's outcome."""
    start_at_ns = time.monotonic_ns() + int(start_delay_s * 1e9)
    processes: dict[str, subprocess.Popen[str]] = {}
    try:
        for tenant in tenants:
            if hook is not None and socket is not None:
                env = gpu.hooked_env(hook, socket, tenant.pod, sync=sync, spin_us=spin.kernel_us_asked)
            else:
                env = gpu.env(spin_us=spin.kernel_us_asked)
            argv = tenant_argv(program, tenant, spin, seconds=ctx.seconds, start_at_ns=start_at_ns, depth=depth)
            processes[tenant.name] = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                      env=env)
        summaries = {}
        for name, process in processes.items():
            stdout, stderr = process.communicate(timeout=start_delay_s + ctx.seconds + 60)
            summary = last_json_line(stdout)
            if summary is None or "error" in summary or "launches" not in summary:
                raise PartFailed(f"tenant {name}: exit {process.returncode}: "
                                 f"{(summary or {}).get('error') or stderr.strip()[-400:]}")
            summaries[name] = summary
    except subprocess.TimeoutExpired:
        raise PartFailed(f"the tenants did not finish within {ctx.seconds + 60:.0f} s") from None
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return {name: share_of(program, summary, spin, gpu) for name, summary in summaries.items()}
