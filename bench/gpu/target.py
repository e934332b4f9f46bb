"""The GPU the day's processes run on: the machine's NVIDIA GPU, or in the dry run a fresh
simulated GPU per measurement; the environment of a CUDA process on it, with or without the hook;
and the arbiter (``fastgshare-arbiter``, trusted-env mode) that the hooked processes ask for tokens.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs

from bench.gpu.part import PartContext, PartFailed
from fastgshare import keys

GPU_UUID = "GPU-day-0"
NAMESPACE = "gpu"
# The simulated driver's kernel run times, by kernel name (simgpu/README.md): the day's kernels
# are kernels.cu's "spin" and "empty".
KERNEL_TIME_ENV = "FASTGSHARE_FAKE_GPU_KERNEL_TIME"
SIMULATED_MEMORY = "16G"
ARBITER_START_S = 60.0


def kernel_time_setting(spin_us: float) -> str:
    """The simulated GPU's kernel times: ``spin`` runs ``spin_us``, ``empty`` and others nothing."""
    return f"default=0us,spin={spin_us:g}us,empty=0us"


@attrs.frozen(kw_only=True)
class Tenant:
    """One tenant of a measurement: its pod's share, and how it uses the GPU."""

    name: str
    request: float
    limit: float
    burst_on_ms: float = 0
    burst_off_ms: float = 0

    @property
    def pod(self) -> str:
        return f"{NAMESPACE}/{self.name}"


def python_path(repo: Path) -> str:
    """PYTHONPATH for a Python process that imports this checkout (what is already there stays)."""
    existing = os.environ.get("PYTHONPATH")
    return f"{repo}{os.pathsep}{existing}" if existing else str(repo)


def scrubbed_environment() -> dict[str, str]:
    """This process's environment less everything that would steer a CUDA process."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("FASTGSHARE_", "CUDA_MPS_")) and k != keys.ENV_LD_PRELOAD}


@attrs.frozen
class Gpu:
    """One GPU to run processes on: ``gpu_dir`` is the simulated GPU's directory (None: the real GPU)."""

    repo: Path
    gpu_dir: Path | None

    @property
    def simulated(self) -> bool:
        return self.gpu_dir is not None

    def env(self, *, spin_us: float = 0) -> dict[str, str]:
        """A CUDA process's environment on this GPU, without the hook."""
        env = scrubbed_environment()
        if self.gpu_dir is not None:
            library_path = str(self.repo / "simgpu" / "build")
            if env.get("LD_LIBRARY_PATH"):
                library_path += ":" + env["LD_LIBRARY_PATH"]
            env.update({"LD_LIBRARY_PATH": library_path, keys.ENV_FAKE_GPU_DIR: str(self.gpu_dir),
                        keys.ENV_FAKE_GPU_MEMORY: SIMULATED_MEMORY, KERNEL_TIME_ENV: kernel_time_setting(spin_us)})
        return env

    def hooked_env(self, hook: str, socket: Path, pod: str, *, sync: bool = True, spin_us: float = 0) -> dict[str, str]:
        """The same under the hook, asking ``socket``'s arbiter as ``pod``; ``sync`` is the hook's
        ``cuCtxSynchronize`` at each token's end."""
        env = self.env(spin_us=spin_us)
        env.update({keys.ENV_LD_PRELOAD: hook, keys.ENV_ARBITER_SOCKET: str(socket), keys.ENV_POD: pod,
                    keys.ENV_GPU_UUID: GPU_UUID, keys.ENV_HOOK_SYNC_AT_TOKEN_END: "1" if sync else "0"})
        return env


def fresh_gpu(ctx: PartContext, name: str) -> Gpu:
    """The real GPU, or in the dry run a new simulated GPU (its own directory, so its accounting
    holds this measurement alone)."""
    return Gpu(ctx.repo, ctx.scratch(f"gpu-{name}") if ctx.dry_run else None)


@contextmanager
def arbiter(ctx: PartContext, name: str, tenants: Sequence[Tenant], *, memory: str = "8Gi") -> Iterator[Path]:
    """A ``fastgshare-arbiter`` serving ``tenants``' shares (no MPS: tokens are exclusive); yields
    its socket, stops it on the way out. ``name`` goes into its log's first line."""
    directory = Path(tempfile.mkdtemp(prefix="a", dir=ctx.workdir))  # short: unix socket paths
    shares, socket, log_path = directory / "shares.json", directory / "a.sock", directory / "arbiter.log"
    shares.write_text(json.dumps({"gpus": [{"uuid": GPU_UUID, "mps": False}], "pods": [
        {"pod": t.pod, "gpu": GPU_UUID, "annotations": {
            keys.GPU_QUOTA_REQUEST: str(t.request), keys.GPU_QUOTA_LIMIT: str(t.limit),
            keys.GPU_SM_PARTITION: "100", keys.GPU_MEM: memory}} for t in tenants]}))
    with log_path.open("w") as log:
        log.write(f"arbiter for {name}\n")
        log.flush()
        process = subprocess.Popen(
            [sys.executable, "-m", "device_plugin.arbiter.standalone", "--socket", str(socket), "--shares",
             str(shares), "--trusted-env", "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=ctx.repo,
            env={**scrubbed_environment(), "PYTHONPATH": python_path(ctx.repo)})
    try:
        ready = first_line(process, ARBITER_START_S)
        if "arbiter ready" not in ready:
            raise PartFailed(f"fastgshare-arbiter did not start: {log_path.read_text()[-500:].strip() or ready!r}")
        yield socket
    finally:
        stop(process)


def stop(process: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 10 s; waited for."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def first_line(process: subprocess.Popen[str], timeout_s: float) -> str:
    """The process's next stdout line, or "" when it exits or says nothing within ``timeout_s``."""
    if process.stdout is None:
        return ""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout_s):
            return ""
    return process.stdout.readline()
