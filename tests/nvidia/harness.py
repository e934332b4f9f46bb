"""How the tier runs NVIDIA's user space: each program (``programs/``) is a real process under the
hook (``LD_PRELOAD``), talking to the real arbiter, on one simulated GPU (``LD_LIBRARY_PATH`` =
simgpu/build, the simulated ``libcuda.so.1``), with the hook's and the driver's call counts
written per process (:mod:`tests.nvidia.counts`); and what is read back once it has exited: its
JSON result, its share of GPU time as the simulated GPU measured it, what the GPU's state and
the arbiter's ledger still hold.

Two ways, the same enforcement path: :func:`run_tier` runs each program under ``fastgshare run``
(its own ``FASTGSHARE_RUN_DIR`` per test, so runs at once share that test's arbiter and simulated
GPU; a keeper run, ``sleep``, holds the session so the GPU's state outlives the programs), and
:func:`tier` runs them in a :func:`fastgshare_cli.sandbox.sandbox` (one arbiter in trusted-env mode,
one simulated GPU, pods that stay known to the arbiter, so its ledger can be read after a program
exits).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs

from fastgshare_cli.sandbox import HookBuild, Sandbox, TenantSpec, sandbox
from simgpu.state import ProcRecord, read_state
from tests.integration.memory.conftest import LedgerProbe
from tests.nvidia.counts import ENV_HOOK_COUNTS_DIR, ENV_SERVED_DIR, CallCounts, assert_counts_match

PROGRAMS = Path(__file__).parent / "programs"
ENV_KERNEL_TIME = "FASTGSHARE_FAKE_GPU_KERNEL_TIME"
ENV_TRACE = "FASTGSHARE_NVIDIA_TRACE"  # programs/trace_calls.py


def _trace_path(out: Path) -> Path:
    return out.with_name(f"trace-{out.name}")


def _read_trace(out: Path) -> dict[str, dict[str, int]] | None:
    path = _trace_path(out)
    if not path.exists():
        return None
    trace: dict[str, dict[str, int]] = json.loads(path.read_text())
    return trace


@attrs.frozen
class Outcome:
    """A program that ran to its end: exit status, result, and the simulated GPU's record of it."""

    name: str
    pid: int
    exit_code: int
    result: dict[str, Any]
    stderr: str
    record: ProcRecord | None  # its slot in the simulated GPU's state (None: it never attached)
    summary: dict[str, Any] | None = None  # fastgshare run's -o json object (None in a sandbox)
    trace: dict[str, dict[str, int]] | None = None  # {driver call: {CUresult name: count}} (programs/trace_calls.py)

    def refused_calls(self) -> dict[str, dict[str, int]]:
        """The driver calls the program made that the simulated driver does not serve: answered
        CUDA_ERROR_NOT_SUPPORTED or CUDA_ERROR_NOT_FOUND."""
        assert self.trace is not None, f"{self.name} wrote no trace of its driver calls"
        return {call: answers for call, answers in self.trace.items()
                if answers.keys() & {"CUDA_ERROR_NOT_SUPPORTED", "CUDA_ERROR_NOT_FOUND"}}

    @property
    def share(self) -> float:
        """Its share of GPU time as the simulated GPU measured it: busy time over the span from its
        first kernel's start to its last kernel's end."""
        assert self.record is not None, f"{self.name} never attached to the simulated GPU: {self.stderr[-3000:]}"
        assert self.record.kernels > 0, f"{self.name} ran no kernel: {self.stderr[-3000:]}"
        return self.record.busy_ns / (self.record.last_end_ns - self.record.first_start_ns)

    def check(self) -> dict[str, Any]:
        """Its result, after asserting it exited 0 without an error."""
        failure = f"{self.name} failed (exit {self.exit_code}): {self.result.get('error')}\n{self.stderr[-3000:]}"
        assert self.exit_code == 0, failure
        assert "error" not in self.result, failure
        return self.result


@attrs.define
class Running:
    spec: TenantSpec
    process: subprocess.Popen[str]
    out: Path


@attrs.define
class Tier:
    """One test's simulated GPU and arbiter, serving ``specs``; start programs with :meth:`start`."""

    box: Sandbox
    hook_counts: Path
    served: Path
    kernel_time: str
    started: int = 0

    def start(self, spec: TenantSpec, program: str, *args: str, env: dict[str, str] | None = None) -> Running:
        """``python programs/<program> --out ... args`` as a process of pod ``spec`` (``env`` added)."""
        self.started += 1
        out = self.box.workdir / f"{spec.name}-{self.started}.json"
        extra = {ENV_HOOK_COUNTS_DIR: str(self.hook_counts), ENV_SERVED_DIR: str(self.served),
                 ENV_TRACE: str(_trace_path(out)),
                 ENV_KERNEL_TIME: self.kernel_time, "NUMBA_CUDA_USE_NVIDIA_BINDING": "1",
                 "NUMBA_CACHE_DIR": str(self.box.workdir / "numba-cache"), **(env or {})}
        process = self.box.start_process(spec, [sys.executable, str(PROGRAMS / program), "--out", str(out), *args],
                                         env=extra)
        return Running(spec, process, out)

    def wait(self, running: Running, timeout_s: float = 180) -> Outcome:
        """Wait for the program's end; what it reported and what the simulated GPU recorded."""
        try:
            _, stderr = running.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            running.process.kill()
            _, stderr = running.process.communicate()
            raise AssertionError(f"{running.spec.name} did not finish in {timeout_s:.0f} s: {stderr[-3000:]}") from None
        result: dict[str, Any] = json.loads(running.out.read_text()) if running.out.exists() else {}
        return Outcome(running.spec.name, running.process.pid, running.process.returncode, result, stderr,
                       self.record(running.process.pid), trace=_read_trace(running.out))

    def run(self, spec: TenantSpec, program: str, *args: str, env: dict[str, str] | None = None,
            timeout_s: float = 180) -> Outcome:
        return self.wait(self.start(spec, program, *args, env=env), timeout_s)

    def record(self, pid: int) -> ProcRecord | None:
        try:
            return read_state(self.box.gpu_dir).by_pid(pid)
        except (KeyError, FileNotFoundError):
            return None

    def device_memory_used(self) -> int:
        return read_state(self.box.gpu_dir).mem_used

    def ledger_used(self, spec: TenantSpec) -> int:
        """The bytes the arbiter's ledger holds for pod ``spec``."""
        probe = LedgerProbe(self.box.socket, spec.pod)
        try:
            return probe.used
        finally:
            probe.close()

    def counts(self, *outcomes: Outcome) -> list[CallCounts]:
        """The hook's and the driver's counts of each program, asserted equal."""
        return assert_counts_match(self.hook_counts, self.served, [outcome.pid for outcome in outcomes])


@contextmanager
def tier(build: HookBuild, specs: Sequence[TenantSpec], kernel_time: str = "default=1000us") -> Iterator[Tier]:
    """A fresh simulated GPU and arbiter serving ``specs``; every program is killed at the end."""
    with sandbox(build, specs) as box:
        hook_counts, served = box.workdir / "hook-counts", box.workdir / "served"
        hook_counts.mkdir()
        served.mkdir()
        yield Tier(box, hook_counts, served, kernel_time)


# --- under fastgshare run ------------------------------------------------------------------
SIMULATED_GPU = "1x16GiB:80sm"


@attrs.frozen(kw_only=True)
class RunFlags:
    """A ``fastgshare run``'s share flags."""

    name: str
    request: float
    limit: float
    memory: str = "1Gi"

    def argv(self) -> list[str]:
        return ["--request", str(self.request), "--limit", str(self.limit), "--memory", self.memory,
                "--gpu", SIMULATED_GPU, "-o", "json"]


@attrs.define
class RunningRun:
    flags: RunFlags
    process: subprocess.Popen[str]
    out: Path


@attrs.define
class RunTier:
    """``fastgshare run`` in its own state directory; start programs with :meth:`start`."""

    directory: Path
    hook_counts: Path
    served: Path
    env: dict[str, str]
    started: int = 0
    runs: list[subprocess.Popen[str]] = attrs.field(factory=list)

    @property
    def gpu_dir(self) -> Path:
        return self.directory / "gpu"

    def command(self, flags: RunFlags, *argv: str) -> list[str]:
        return [sys.executable, "-m", "fastgshare_cli", "run", *flags.argv(), "--", *argv]

    def start(self, flags: RunFlags, program: str, *args: str) -> RunningRun:
        """``fastgshare run FLAGS -- python programs/<program> --out ... args``."""
        self.started += 1
        out = self.directory.parent / f"{flags.name}-{self.started}.json"
        argv = self.command(flags, sys.executable, str(PROGRAMS / program), "--out", str(out), *args)
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env={**self.env, ENV_TRACE: str(_trace_path(out))})
        self.runs.append(process)
        return RunningRun(flags, process, out)

    def stop_all(self) -> None:
        """Stop every run still going (fastgshare run passes SIGTERM on to its program)."""
        for process in self.runs:
            if process.poll() is None:
                process.terminate()
                try:
                    process.communicate(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.communicate()

    def wait(self, running: RunningRun, timeout_s: float = 180) -> Outcome:
        """Wait for the run's end; the program's result, fastgshare run's summary and the GPU's record."""
        try:
            stdout, stderr = running.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            running.process.kill()
            stdout, stderr = running.process.communicate()
            raise AssertionError(f"{running.flags.name} did not finish in {timeout_s:.0f} s: {stderr[-3000:]}") \
                from None
        result: dict[str, Any] = json.loads(running.out.read_text()) if running.out.exists() else {}
        lines = stdout.strip().splitlines()
        summary: dict[str, Any] | None = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
        pid = int(result.get("pid", -1))
        return Outcome(running.flags.name, pid, running.process.returncode, result, stderr, self.record(pid), summary,
                       _read_trace(running.out))

    def run(self, flags: RunFlags, program: str, *args: str, timeout_s: float = 180) -> Outcome:
        return self.wait(self.start(flags, program, *args), timeout_s)

    def record(self, pid: int) -> ProcRecord | None:
        try:
            return read_state(self.gpu_dir).by_pid(pid)
        except (KeyError, FileNotFoundError):
            return None

    def counts(self, *outcomes: Outcome) -> list[CallCounts]:
        """The hook's and the driver's counts of each program, asserted equal."""
        return assert_counts_match(self.hook_counts, self.served, [outcome.pid for outcome in outcomes])


KEEPER = RunFlags(name="keeper", request=0.0, limit=0.01, memory="1Mi")


@contextmanager
def run_tier(kernel_time: str = "default=1000us") -> Iterator[RunTier]:
    """A fresh ``fastgshare run`` state directory, held by a keeper run (``sleep``) until the end, so
    the simulated GPU's state outlives the programs; every run is stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="fgs-nv-", dir="/tmp") as directory:  # short: unix socket paths
        root = Path(directory)
        hook_counts, served = root / "hook-counts", root / "served"
        hook_counts.mkdir()
        served.mkdir()
        env = {name: value for name, value in os.environ.items()
               if not name.startswith("FASTGSHARE_") and name not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
        env.update({"FASTGSHARE_RUN_DIR": str(root / "run"), ENV_HOOK_COUNTS_DIR: str(hook_counts),
                    ENV_SERVED_DIR: str(served), ENV_KERNEL_TIME: kernel_time, "NUMBA_CUDA_USE_NVIDIA_BINDING": "1",
                    "NUMBA_CACHE_DIR": str(root / "numba-cache")})
        gpu = RunTier(root / "run", hook_counts, served, env)
        keeper = subprocess.Popen(gpu.command(KEEPER, "sleep", "3600"), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
        try:
            _wait_for_session(gpu, keeper)
            yield gpu
        finally:
            gpu.stop_all()
            keeper.send_signal(signal.SIGTERM)  # fastgshare run passes it to sleep, then leaves the session
            try:
                keeper.wait(timeout=30)
            except subprocess.TimeoutExpired:
                keeper.kill()
                keeper.wait()


def _wait_for_session(gpu: RunTier, keeper: subprocess.Popen[str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not any((gpu.directory / "runs").glob("*.json")):
        if keeper.poll() is not None:
            _, stderr = keeper.communicate()
            raise AssertionError(f"the keeper run exited ({keeper.returncode}): {stderr[-2000:]}")
        assert time.monotonic() < deadline, f"fastgshare run did not register in {gpu.directory} in {timeout_s:.0f} s"
        time.sleep(0.1)
