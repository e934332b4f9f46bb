"""A local sandbox of the whole enforcement path: a fake GPU, an arbiter, tenants under the hook.

Used by ``fastgshare demo``, the isolation and overhead benchmarks and the end-to-end tests of
enforcement. Everything is a real process: the C hook (``LD_PRELOAD``) in each tenant talks to
``fastgshare-arbiter`` over its unix socket, and the fake ``libcuda.so.1`` records every
tenant's busy time in the fake GPU's state file, which :mod:`simgpu.state` reads as
the independent measure of what each tenant got.

The arbiter runs in trusted-env mode (it believes the pod name the hook sends): a sandbox is
one user's machine, never a shared node.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

from fastgshare import keys
from simgpu import build as simgpu_build
from simgpu.state import FakeGpuSnapshot, sample_state

REPO = Path(__file__).resolve().parents[1]
HOOK_SOURCES = REPO / "vgpu_hook"
BUILD_LOCK = HOOK_SOURCES / "build" / ".build-lock"
GPU_UUID = "GPU-sandbox-0"
SANDBOX_NAMESPACE = "sandbox"


class SandboxError(RuntimeError):
    """The hook could not be built or a sandbox process failed; the message says which."""


@attrs.frozen
class HookBuild:
    hook: Path
    fake_driver_dir: Path
    tenant: Path

    @property
    def fake_fn(self) -> Path:
        """The fake function server (``simgpu/workloads/fake_fn.c``), built next to the tenant program."""
        return self.tenant.parent / "fake-fn"


def build_hook(python: str = sys.executable) -> HookBuild:
    """Build the hook, and the simulated GPU with its tenant program (``make -C vgpu_hook`` builds both)."""
    if not (HOOK_SOURCES / "Makefile").exists():
        raise SandboxError(f"the hook sources are not at {HOOK_SOURCES}: run from a checkout of the project")
    if shutil.which("make") is None or shutil.which("gcc") is None:
        raise SandboxError("building the hook needs make and gcc (apt-get install make gcc)")
    BUILD_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with BUILD_LOCK.open("a") as lock:  # runs that start together build once, one after the other
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = subprocess.run(["make", "-C", str(HOOK_SOURCES), f"PYTHON={python}"], capture_output=True, text=True,
                                check=False)
    if result.returncode != 0:
        raise SandboxError(f"building the hook failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return HookBuild(hook=HOOK_SOURCES / "build" / "libfastgshare-hook.so", fake_driver_dir=simgpu_build.BUILD,
                     tenant=simgpu_build.TENANT)


@attrs.frozen(kw_only=True)
class TenantSpec:
    """One tenant: its share, and how it uses the GPU (saturating, or in bursts)."""

    name: str
    request: float
    limit: float
    sm: int = 100
    memory: str = "1Gi"
    kernel_us: int = 1000
    burst_on_ms: float = 0
    burst_off_ms: float = 0

    @property
    def pod(self) -> str:
        return f"{SANDBOX_NAMESPACE}/{self.name}"

    def annotations(self) -> dict[str, str]:
        return {keys.GPU_QUOTA_REQUEST: str(self.request), keys.GPU_QUOTA_LIMIT: str(self.limit),
                keys.GPU_SM_PARTITION: str(self.sm), keys.GPU_MEM: self.memory}


@attrs.define
class Sandbox:
    """A running fake GPU (+ arbiter) in ``workdir``; start tenants with :meth:`start_tenants`."""

    build: HookBuild
    workdir: Path
    arbiter: subprocess.Popen[str] | None
    mps: bool = True
    tenants: dict[str, subprocess.Popen[str]] = attrs.field(factory=dict)
    pids: dict[str, int] = attrs.field(factory=dict)

    @property
    def gpu_dir(self) -> Path:
        return self.workdir / "gpu"

    @property
    def socket(self) -> Path:
        return self.workdir / keys.ARBITER_SOCKET_NAME

    def start_tenants(self, specs: Sequence[TenantSpec], seconds: float, *, hook: bool = True,
                      delay_s: float = 0.3) -> int:
        """Start every tenant to begin together ``delay_s`` from now; returns that start time (ns)."""
        start_at = time.monotonic_ns() + int(delay_s * 1e9)
        for spec in specs:
            args = [str(self.build.tenant), "--seconds", str(seconds), "--duration-us", str(spec.kernel_us),
                    "--start-at-ns", str(start_at)]
            if spec.burst_on_ms:
                args += ["--burst-on-ms", str(spec.burst_on_ms), "--burst-off-ms", str(spec.burst_off_ms)]
            self.start_process(spec, args, hook=hook)
        return start_at

    def start_process(self, spec: TenantSpec, args: Sequence[str], *, hook: bool = True,
                      env: dict[str, str] | None = None, stderr_log: Path | None = None) -> subprocess.Popen[str]:
        """Start any program as tenant ``spec`` (its environment: :meth:`tenant_env` plus ``env``;
        stderr to ``stderr_log`` for a long-running server, else a pipe); the sandbox kills it when
        it closes, and :meth:`busy_ns` counts its GPU time."""
        if stderr_log is None:
            process = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       env={**self.tenant_env(spec, hook), **(env or {})})
        else:
            with stderr_log.open("w") as log:
                process = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=log, text=True,
                                           env={**self.tenant_env(spec, hook), **(env or {})})
        self.tenants[spec.name], self.pids[spec.name] = process, process.pid
        return process

    def run_tenant(self, spec: TenantSpec, *args: str, hook: bool = True, timeout_s: float = 120) -> dict[str, object]:
        """Run one tenant with its own arguments to the end; its JSON summary."""
        result = subprocess.run([str(self.build.tenant), *args], capture_output=True, text=True, timeout=timeout_s,
                                env=self.tenant_env(spec, hook), check=False)
        lines = result.stdout.strip().splitlines()
        if result.returncode != 0 or not lines:
            raise SandboxError(f"tenant {spec.name} failed (exit {result.returncode}): {result.stderr.strip()[-500:]}")
        summary: dict[str, object] = json.loads(lines[-1])
        return summary

    def sample(self) -> FakeGpuSnapshot | None:
        return sample_state(self.gpu_dir)

    def busy_ns(self, snapshot: FakeGpuSnapshot) -> dict[str, int]:
        """Each tenant's cumulative busy time in ``snapshot`` (0 before its first kernel)."""
        result = {}
        for name, pid in self.pids.items():
            try:
                result[name] = snapshot.by_pid(pid).busy_ns
            except KeyError:
                result[name] = 0
        return result

    def wait_tenants(self, timeout_s: float) -> dict[str, dict[str, object]]:
        """Wait for every tenant; their JSON summaries. Raises if one failed."""
        summaries = {}
        for name, process in self.tenants.items():
            try:
                stdout, stderr = process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                raise SandboxError(f"tenant {name} did not finish in {timeout_s:.0f} s") from None
            lines = stdout.strip().splitlines()
            if process.returncode != 0 or not lines:
                raise SandboxError(f"tenant {name} failed (exit {process.returncode}): {stderr.strip()[-500:]}")
            summaries[name] = json.loads(lines[-1])
        self.tenants.clear()
        return summaries

    def tenant_env(self, spec: TenantSpec, hook: bool = True) -> dict[str, str]:
        """The environment of a process running as ``spec``: the fake driver, the fake GPU, the SM
        partition (with MPS) and, with ``hook``, the hook and the arbiter's socket."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("FASTGSHARE_") and k not in ("LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}
        env.update({"LD_LIBRARY_PATH": str(self.build.fake_driver_dir), keys.ENV_FAKE_GPU_DIR: str(self.gpu_dir)})
        if self.mps:  # without MPS a kernel has the whole GPU
            env[keys.ENV_MPS_THREAD_PERCENTAGE] = str(spec.sm)
        if hook:
            env.update({keys.ENV_LD_PRELOAD: str(self.build.hook), keys.ENV_ARBITER_SOCKET: str(self.socket),
                        keys.ENV_POD: spec.pod, keys.ENV_GPU_UUID: GPU_UUID})
        return env


@contextmanager
def sandbox(build: HookBuild, specs: Sequence[TenantSpec], *, mps: bool = True, arbiter: bool = True,
            window_ms: float = 100, min_token_ms: float = 2) -> Iterator[Sandbox]:
    """A fresh fake GPU and, with ``arbiter``, a ``fastgshare-arbiter`` serving ``specs``' shares."""
    with tempfile.TemporaryDirectory(prefix="fgs-sandbox-") as directory:
        workdir = Path(directory)
        (workdir / "gpu").mkdir()
        process = _start_arbiter(workdir, specs, mps, window_ms, min_token_ms) if arbiter else None
        box = Sandbox(build, workdir, process, mps)
        try:
            yield box
        finally:
            for tenant in box.tenants.values():
                tenant.kill()
                tenant.wait()
            if process is not None:
                process.terminate()
                process.wait(10)


def write_shares(path: Path, gpu_uuid: str, mps: bool, pods: Mapping[str, Mapping[str, str]]) -> None:
    """Write the shares file of an arbiter serving one GPU: each pod key with its four share
    annotations (replaced whole: a reader sees the old file or the new one)."""
    document = {"gpus": [{"uuid": gpu_uuid, "mps": mps}],
                "pods": [{"pod": pod, "gpu": gpu_uuid, "annotations": dict(annotations)}
                         for pod, annotations in pods.items()]}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document))
    os.replace(partial, path)


def arbiter_command(socket: Path, shares: Path, *, window_ms: float = 100, min_token_ms: float = 2) -> list[str]:
    """The command line of a ``fastgshare-arbiter`` in trusted-env mode serving the shares file
    ``shares`` (its format: :mod:`device_plugin.arbiter.standalone`) on ``socket``; it prints
    ``arbiter ready`` on stdout once it listens, and logs warnings and errors on stderr."""
    return [sys.executable, "-m", "device_plugin.arbiter.standalone", "--socket", str(socket), "--shares", str(shares),
            "--trusted-env", "--window-ms", str(window_ms), "--min-token-ms", str(min_token_ms),
            "--log-level", "warning"]


def _start_arbiter(workdir: Path, specs: Sequence[TenantSpec], mps: bool, window_ms: float,
                   min_token_ms: float) -> subprocess.Popen[str]:
    shares = workdir / "shares.json"
    write_shares(shares, GPU_UUID, mps, {spec.pod: spec.annotations() for spec in specs})
    log = (workdir / "arbiter.log").open("w")
    process = subprocess.Popen(arbiter_command(workdir / keys.ARBITER_SOCKET_NAME, shares, window_ms=window_ms,
                                               min_token_ms=min_token_ms),
                               stdout=subprocess.PIPE, stderr=log, text=True)
    ready = process.stdout.readline() if process.stdout else ""
    if "arbiter ready" not in ready:
        process.kill()
        raise SandboxError(f"fastgshare-arbiter did not start: {(workdir / 'arbiter.log').read_text()[-1000:]}")
    return process


def measure_shares(box: Sandbox, specs: Sequence[TenantSpec], seconds: float, *, hook: bool = True,
                   warmup_s: float = 0.5) -> dict[str, float]:
    """Run the tenants for ``seconds``; each one's share of GPU time after ``warmup_s``."""
    start_at = box.start_tenants(specs, seconds, hook=hook)
    time.sleep(max(0.0, (start_at - time.monotonic_ns()) / 1e9) + warmup_s)
    first, first_at = box.sample(), time.monotonic_ns()
    time.sleep(max(0.0, seconds - warmup_s - 0.3))
    last, last_at = box.sample(), time.monotonic_ns()
    box.wait_tenants(timeout_s=seconds + 30)
    if first is None or last is None:
        raise SandboxError("the fake GPU recorded nothing: no tenant launched a kernel")
    before, after = box.busy_ns(first), box.busy_ns(last)
    return {name: (after[name] - before[name]) / (last_at - first_at) for name in after}
