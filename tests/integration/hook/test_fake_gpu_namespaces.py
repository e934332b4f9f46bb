"""The fake GPU across PID namespaces, as Kubernetes pods use it (each its own namespace, no hostPID).

Each tenant here runs under ``unshare --pid --fork --mount-proc``, so it is pid 1 of its own
namespace: two such tenants carry the same pid in the state file. A slot's liveness is a POSIX
record lock on ``<dir>/fake_gpu.lock`` (one byte per slot), not the pid, so they must keep their
slots, a killed one must be reaped by a process in any namespace, and
:func:`~simgpu.state.slot_holders` maps each slot to the holder's pid in the reader's
namespace.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from simgpu.state import FakeGpuSnapshot, read_state, sample_state, slot_holders
from tests.integration.hook.fake_arbiter import wait_until
from tests.integration.hook.tenants import Build, TenantResult, finish_tenant, run_tenant, tenant_env

MS = 1_000_000
MIB = 1 << 20


def _can_unshare_pid() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _can_unshare_pid(), reason="needs root and unshare --pid (util-linux)")


class NamespacedTenant:
    """``unshare --pid --fork --mount-proc tenant ...``: the tenant is pid 1 of a new PID namespace."""

    def __init__(self, build: Build, gpu_dir: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", str(build.tenant), *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=tenant_env(build, gpu_dir, hook=False, extra=env))

    @property
    def host_pid(self) -> int:
        """The tenant's pid in this (the host's) namespace: unshare's one child."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        assert wait_until(lambda: children.exists() and children.read_text().split() != [], timeout_s=5)
        (child,) = children.read_text().split()
        return int(child)

    def finish(self, timeout_s: float = 20.0) -> TenantResult:
        return finish_tenant(self.process, timeout_s)


@pytest.fixture
def namespaced(build: Build, gpu_dir: Path) -> Iterator[list[NamespacedTenant]]:
    """Tenants the test starts; any still running at the end are killed."""
    started: list[NamespacedTenant] = []
    yield started
    for tenant in started:
        if tenant.process.poll() is None:
            tenant.process.kill()
            tenant.process.communicate()


def _start(namespaced: list[NamespacedTenant], build: Build, gpu_dir: Path, *args: str,
           env: dict[str, str] | None = None) -> NamespacedTenant:
    tenant = NamespacedTenant(build, gpu_dir, *args, env=env)
    namespaced.append(tenant)
    return tenant


def _alive(state: FakeGpuSnapshot | None, min_kernels: int = 0) -> int:
    return 0 if state is None else sum(1 for p in state.procs if p.alive and p.kernels >= min_kernels)


def test_two_tenants_that_are_both_pid_1_keep_their_own_slots(build: Build, gpu_dir: Path,
                                                             namespaced: list[NamespacedTenant]) -> None:
    start_at = time.monotonic_ns() + 400 * MS
    args = ("--launches", "25", "--duration-us", "20000", "--start-at-ns", str(start_at))
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    first = _start(namespaced, build, gpu_dir, *args, env=env)
    second = _start(namespaced, build, gpu_dir, *args, env=env)
    # Both attached and both launching, each in its own slot, at the same time.
    assert wait_until(lambda: _alive(sample_state(gpu_dir), min_kernels=3) == 2, timeout_s=10), read_state(gpu_dir)
    results = [first.finish(), second.finish()]
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert [r.summary["pid"] for r in results] == [1, 1]  # the same pid, in two namespaces
    state = read_state(gpu_dir)
    procs = [p for p in state.procs if p.pid == 1]
    assert len(procs) == 2
    assert len({p.slot for p in procs}) == 2
    for proc in procs:
        assert proc.kernels == 25
        assert 500 * MS <= proc.busy_ns <= 620 * MS
        assert not proc.alive
    assert (state.sm_free, state.mem_used, state.running_kernels) == (100, 0, 0)


def test_a_killed_tenant_in_its_own_namespace_is_reaped_from_another(build: Build, gpu_dir: Path,
                                                                     namespaced: list[NamespacedTenant]) -> None:
    env = {"FASTGSHARE_FAKE_GPU_MEMORY": "1G"}
    victim = _start(namespaced, build, gpu_dir, "--alloc-mb", "700", "--launches", "1", "--duration-us", "10000000",
                    env=env)
    assert wait_until(lambda: (s := sample_state(gpu_dir)) is not None and s.running_kernels == 1
                      and s.mem_used >= 700 * MIB, timeout_s=10)
    os.kill(victim.host_pid, signal.SIGKILL)
    victim.process.wait(timeout=5)
    # The next process (in the host's namespace, where the victim's pid 1 is init) gets it all.
    started = time.monotonic()
    survivor = run_tenant(build, gpu_dir, "--alloc-mb", "700", "--launches", "2", "--duration-us", "1000",
                          hook=False, env=env, timeout_s=8)
    assert survivor.returncode == 0, survivor.stderr
    assert survivor.summary["alloc_error"] == 0
    assert time.monotonic() - started < 2.0  # reaped, not waited out
    state = read_state(gpu_dir)
    victim_slot = next(p for p in state.procs if p.pid == 1)
    assert not victim_slot.alive
    assert (victim_slot.sm_held, victim_slot.mem_used, victim_slot.running) == (0, 0, 0)
    assert (state.sm_free, state.mem_used, state.running_kernels) == (100, 0, 0)


def test_slot_holders_names_the_host_pids_of_namespaced_tenants(build: Build, gpu_dir: Path,
                                                              namespaced: list[NamespacedTenant]) -> None:
    args = ("--launches", "150", "--duration-us", "20000")
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}
    tenants = [_start(namespaced, build, gpu_dir, *args, env=env) for _ in range(2)]
    assert wait_until(lambda: _alive(sample_state(gpu_dir), min_kernels=1) == 2, timeout_s=10)
    host_pids = {tenant.host_pid for tenant in tenants}
    # Reading the locks many times (open, F_GETLK, close) must not drop the tenants' locks.
    for _ in range(50):
        holders = slot_holders(gpu_dir)
    state = read_state(gpu_dir)
    live = [p for p in state.procs if p.alive]
    assert {p.pid for p in live} == {1}
    assert {holders[p.slot] for p in live} == host_pids
    assert set(holders) == {p.slot for p in live}
    # The tenants kept their slots: a third process attaching now reaps nothing of theirs.
    assert run_tenant(build, gpu_dir, "--launches", "1", "--duration-us", "1000", hook=False).returncode == 0
    assert _alive(read_state(gpu_dir)) == 2
    for tenant in tenants:
        tenant.process.kill()
    for tenant in tenants:
        tenant.process.communicate()
    assert wait_until(lambda: slot_holders(gpu_dir) == {}, timeout_s=5)


def test_slot_holders_of_a_fake_gpu_never_used_is_empty(gpu_dir: Path) -> None:
    assert slot_holders(gpu_dir) == {}
    assert not (gpu_dir / "fake_gpu.lock").exists()  # the reader creates nothing


_FORKING_PARENT = textwrap.dedent("""
    import ctypes, os, sys, time
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    for _ in range(3):
        child = os.fork()
        if child == 0:
            os._exit(0)  # closes the child's copy of the lock file: must not unlock the parent
        os.waitpid(child, 0)
    print("forked", flush=True)
    sys.stdin.readline()
""")


def test_a_forked_child_exiting_leaves_its_parent_attached(build: Build, gpu_dir: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-c", _FORKING_PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=tenant_env(build, gpu_dir, hook=False))
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "forked"
        # A tenant attaching now runs the reaper: the parent's slot must survive it.
        assert run_tenant(build, gpu_dir, "--launches", "1", "--duration-us", "1000", hook=False).returncode == 0
        state = read_state(gpu_dir)
        assert state.by_pid(parent.pid).alive
        assert slot_holders(gpu_dir) == {state.by_pid(parent.pid).slot: parent.pid}
    finally:
        parent.communicate(input="\n", timeout=10)
    assert not read_state(gpu_dir).by_pid(parent.pid).alive

