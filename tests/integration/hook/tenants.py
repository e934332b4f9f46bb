"""Running the ``tenant`` test program (simgpu/workloads/tenant.c) as a real process, with or without the hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from tests.integration.hook.fake_arbiter import FakeArbiter

REPO = Path(__file__).resolve().parents[3]
HOOK_DIR = REPO / "vgpu_hook"
BUILD = HOOK_DIR / "build"
SIMGPU_BUILD = REPO / "simgpu" / "build"

# Variables of the outer environment that would change what the tenants see.
_SCRUBBED = ("LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
_SCRUBBED_PREFIX = "FASTGSHARE_"


@attrs.frozen
class Build:
    hook: Path
    fake_dir: Path
    tenant: Path
    test_quota: Path
    memcheck: Path = BUILD / "memcheck"


@attrs.frozen
class TenantResult:
    returncode: int
    summary: dict[str, Any]
    stderr: str

    @property
    def hook_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("fastgshare-hook:")]


def make_hook() -> None:
    """``make -C vgpu_hook`` (up to date: nothing to do); the test fails with make's output otherwise."""
    result = subprocess.run(["make", "-C", str(HOOK_DIR), f"PYTHON={sys.executable}"], capture_output=True,
                            text=True, timeout=300, check=False)
    if result.returncode != 0:
        pytest.fail(f"make -C vgpu_hook failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")


def tenant_env(build: Build, gpu_dir: Path, *, hook: bool, arbiter: FakeArbiter | None = None,
               extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIX)}
    env["FASTGSHARE_FAKE_GPU_DIR"] = str(gpu_dir)
    env["LD_LIBRARY_PATH"] = str(build.fake_dir)
    if hook:
        env["LD_PRELOAD"] = str(build.hook)
    if arbiter is not None:
        env["FASTGSHARE_ARBITER_SOCKET"] = str(arbiter.path)
    env.update(extra or {})
    return env


def start_tenant(build: Build, gpu_dir: Path, *args: str, hook: bool = True, arbiter: FakeArbiter | None = None,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([str(build.tenant), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=tenant_env(build, gpu_dir, hook=hook, arbiter=arbiter, extra=env))


def finish_tenant(process: subprocess.Popen[str], timeout_s: float = 20.0) -> TenantResult:
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        pytest.fail(f"tenant did not finish within {timeout_s} s (hung?); stderr:\n{stderr}")
    lines = stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    return TenantResult(process.returncode, summary, stderr)


def run_tenant(build: Build, gpu_dir: Path, *args: str, hook: bool = True, arbiter: FakeArbiter | None = None,
               env: dict[str, str] | None = None, timeout_s: float = 20.0) -> TenantResult:
    return finish_tenant(start_tenant(build, gpu_dir, *args, hook=hook, arbiter=arbiter, env=env), timeout_s)


def run_memcheck(build: Build, gpu_dir: Path, *args: str, hook: bool = True, arbiter: FakeArbiter | None = None,
                 env: dict[str, str] | None = None, stdin: str | None = None,
                 timeout_s: float = 20.0) -> TenantResult:
    """Runs ``memcheck`` (vgpu_hook/tests/memcheck.c) to the end; its last JSON line is the summary."""
    try:
        result = subprocess.run([str(build.memcheck), *args], input=stdin, capture_output=True, text=True,
                                timeout=timeout_s, env=tenant_env(build, gpu_dir, hook=hook, arbiter=arbiter,
                                                                  extra=env), check=False)
    except subprocess.TimeoutExpired as error:
        pytest.fail(f"memcheck {' '.join(args)} did not finish within {timeout_s} s (hung?): {error.stderr!r}")
    lines = result.stdout.strip().splitlines()
    summary = json.loads(lines[-1]) if lines else {}
    return TenantResult(result.returncode, summary, result.stderr)
