"""The hook gates every way a program can reach the launch entry points, and costs nothing while a token is valid."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from fastgshare.protocol import MessageType
from simgpu.state import read_state
from tests.integration.hook.fake_arbiter import FakeArbiter, Script
from tests.integration.hook.symbols import exported_names
from tests.integration.hook.tenants import Build, run_tenant, tenant_env

StartArbiter = Callable[[Script], FakeArbiter]
MS = 1_000_000

PATHS = ["linked", "dlsym", "rtld-default", "rtld-next", "procaddr-legacy", "procaddr-v2"]
APIS = ["kernel", "ex", "coop", "graph"]


def test_the_hook_exports_only_what_it_intercepts(build: Build) -> None:
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run(["nm", "-D", "--defined-only", str(build.hook)], capture_output=True, text=True,
                             check=True).stdout
    assert {line.split()[-1] for line in listing.splitlines() if line.strip()} == exported_names()


@pytest.mark.parametrize("ptsz", [False, True], ids=["legacy-stream", "per-thread"])
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("path", PATHS)
def test_every_launch_path_is_gated(build: Build, gpu_dir: Path, start_arbiter: StartArbiter, *, path: str, api: str,
                                    ptsz: bool) -> None:
    # A 1 ns token expires at once, so every launch must fetch a new one from the arbiter.
    arbiter = start_arbiter(Script(token_ns=1))
    args = ["--path", path, "--api", api, "--launches", "4", "--duration-us", "100"] + (["--ptsz"] if ptsz else [])
    result = run_tenant(build, gpu_dir, *args, arbiter=arbiter)
    assert result.returncode == 0, result.stderr
    assert result.summary["launches"] == 4
    assert len(arbiter.token_requests()) == 4
    assert read_state(gpu_dir).by_pid(result.summary["pid"]).kernels == 4


def test_hello_identifies_the_process_its_pod_and_gpu(build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script())
    result = run_tenant(build, gpu_dir, "--launches", "1", arbiter=arbiter,
                        env={"FASTGSHARE_POD": "team-a/trainer-0", "FASTGSHARE_GPU_UUID": "GPU-1234"})
    assert result.returncode == 0, result.stderr
    [hello] = arbiter.hellos()
    assert (hello.pid, hello.pod, hello.gpu_uuid) == (result.summary["pid"], "team-a/trainer-0", "GPU-1234")
    assert [r.type for r in arbiter.requests] == [MessageType.HELLO, MessageType.TOKEN]


def test_a_valid_token_costs_no_request(build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(token_ns=60_000 * MS))
    result = run_tenant(build, gpu_dir, "--launches", "500", "--duration-us", "0", arbiter=arbiter)
    assert result.returncode == 0, result.stderr
    assert result.summary["launches"] == 500
    assert len(arbiter.token_requests()) == 1


def _syscalls(build: Build, gpu_dir: Path, arbiter: FakeArbiter, launches: int, out: Path) -> int:
    # futex is not counted: launches are asynchronous, and the simulated driver wakes its stream
    # worker, and the tenant waits for its kernel, on condition variables (a real driver rings a
    # doorbell in mapped memory). The hook's valid-token path takes no lock at all.
    subprocess.run(["strace", "-f", "-c", "-e", "trace=!futex", "-o", str(out), str(build.tenant), "--launches",
                    str(launches), "--duration-us", "0"], env=tenant_env(build, gpu_dir, hook=True, arbiter=arbiter),
                   capture_output=True, text=True, timeout=60, check=True)
    total = [line for line in out.read_text().splitlines() if line.rstrip().endswith("total")]
    return int(total[-1].split()[3])


def test_a_valid_token_costs_no_syscall(build: Build, gpu_dir: Path, start_arbiter: StartArbiter,
                                        tmp_path: Path) -> None:
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    probe = subprocess.run(["strace", "-o", "/dev/null", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip("ptrace is not permitted here")
    arbiter = start_arbiter(Script(token_ns=60_000 * MS))
    few = _syscalls(build, gpu_dir, arbiter, 10, tmp_path / "few.txt")
    many = _syscalls(build, gpu_dir, arbiter, 2010, tmp_path / "many.txt")
    # 2000 more gated launches (0 µs kernels, so the fake driver makes no syscall either).
    assert many - few <= 5, (few, many)


def test_used_time_of_each_returned_token_is_reported(build: Build, gpu_dir: Path,
                                                      start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(token_ns=2 * MS))
    result = run_tenant(build, gpu_dir, "--launches", "4", "--duration-us", "5000", arbiter=arbiter)
    assert result.returncode == 0, result.stderr
    # First request: nothing held yet. Then each 5 ms kernel outlived its 2 ms token: the whole
    # kernel is reported (overruns are charged), not just the token.
    used = [r.used_ns for r in arbiter.token_requests()]
    assert used[0] == 0
    assert len(used) == 4
    assert all(5 * MS <= u < 7 * MS for u in used[1:]), used


@pytest.mark.parametrize(("setting", "syncs"), [(None, {4, 5}), ("1", {4, 5}), ("0", {0})])
def test_sync_at_token_end_synchronises_before_returning_a_token(build: Build, gpu_dir: Path,
                                                                 start_arbiter: StartArbiter, setting: str | None,
                                                                 syncs: set[int]) -> None:
    """On by default (a real GPU's queued kernels must not outlive the token); 0 turns it off. Each
    of the five 1 ns tokens is synchronised once when it ends: the first four before their renewal,
    the last one too unless the tenant exits first."""
    arbiter = start_arbiter(Script(token_ns=1))
    result = run_tenant(build, gpu_dir, "--launches", "5", "--duration-us", "100", arbiter=arbiter,
                        env={} if setting is None else {"FASTGSHARE_SYNC_AT_TOKEN_END": setting})
    assert result.returncode == 0, result.stderr
    assert read_state(gpu_dir).by_pid(result.summary["pid"]).ctx_syncs in syncs


@pytest.mark.parametrize("path", ["procaddr-legacy", "procaddr-v2"])
def test_a_lookup_older_than_the_wrapped_abi_is_not_wrapped(build: Build, gpu_dir: Path,
                                                            start_arbiter: StartArbiter, path: str) -> None:
    # cuLaunchKernel has no ABI before CUDA 4.0: the driver's "version not sufficient" passes through.
    arbiter = start_arbiter(Script())
    result = run_tenant(build, gpu_dir, "--path", path, "--procaddr-version", "3000", arbiter=arbiter)
    assert result.returncode == 3
    assert result.summary["resolved"] is False
    assert arbiter.requests == []


def test_a_lookup_with_a_newer_cuda_version_is_still_gated(build: Build, gpu_dir: Path,
                                                           start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(token_ns=1))
    result = run_tenant(build, gpu_dir, "--path", "procaddr-v2", "--procaddr-version", "13090", "--launches", "3",
                        arbiter=arbiter)
    assert result.returncode == 0, result.stderr
    assert len(arbiter.token_requests()) == 3


def test_threads_share_one_connection_and_token(build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(token_ns=1 * MS))
    result = run_tenant(build, gpu_dir, "--threads", "4", "--launches", "200", "--duration-us", "200",
                        arbiter=arbiter)
    assert result.returncode == 0, result.stderr
    assert (result.summary["launches"], result.summary["errors"]) == (200, 0)
    assert len(arbiter.hellos()) == 1
    assert {r.connection for r in arbiter.requests} == {1}
    assert 2 <= len(arbiter.token_requests()) <= 200


def test_a_bursty_tenant_keeps_its_token_through_short_pauses(build: Build, gpu_dir: Path,
                                                             start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(token_ns=60_000 * MS))
    result = run_tenant(build, gpu_dir, "--seconds", "0.4", "--burst-on-ms", "20", "--burst-off-ms", "30",
                        "--duration-us", "1000", arbiter=arbiter)
    assert result.returncode == 0, result.stderr
    busy_s = read_state(gpu_dir).by_pid(result.summary["pid"]).busy_ns / 1e9
    assert 0.2 < busy_s / result.summary["elapsed_s"] < 0.6  # on 20 ms of every 50 ms
    assert len(arbiter.token_requests()) == 1


def test_a_program_that_never_launches_never_contacts_the_arbiter(build: Build, gpu_dir: Path,
                                                                  start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script())
    env = tenant_env(build, gpu_dir, hook=True, arbiter=arbiter)
    result = subprocess.run(["sh", "-c", "echo hello"], env=env, capture_output=True, text=True, timeout=10,
                            check=False)
    assert (result.returncode, result.stdout, result.stderr) == (0, "hello\n", "")
    assert arbiter.requests == []


def test_debug_log_shows_how_each_lookup_was_wrapped(build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script())
    result = run_tenant(build, gpu_dir, "--path", "procaddr-v2", "--ptsz", "--launches", "1", arbiter=arbiter,
                        env={"FASTGSHARE_HOOK_LOG": "debug"})
    assert result.returncode == 0, result.stderr
    log = "\n".join(result.hook_lines)
    assert "dlsym(cuGetProcAddress_v2): returning the hook's wrapper" in log
    assert re.search(r'cuGetProcAddress\("cuGetProcAddress", 12000, flags 0\): returning the wrapper of '
                     r"cuGetProcAddress_v2", log)
    assert re.search(r'cuGetProcAddress\("cuLaunchKernel", 7000, flags 2\): returning the wrapper of '
                     r"cuLaunchKernel_ptsz", log)
