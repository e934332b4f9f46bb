"""The arbiter restarts under running tenants (issue 13, item 1): the C hook in real processes
reconnects, says HELLO again, reports the memory it holds and goes on; the restarted arbiter
loaded the memory ledger it saved, so a pod at its limit stays at its limit.

The arbiter here is ``fastgshare-arbiter`` with ``--state-file`` (the node agent runs the same
server with its state directory), killed with SIGKILL as a crash or an OOM kill would.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from fastgshare_cli.sandbox import GPU_UUID, HookBuild, Sandbox, TenantSpec, sandbox
from tests.integration.memory.conftest import MIB, OOM, LedgerProbe, OpenProbe, StartTenant, hooked_env

LIMIT = 100 * MIB


@attrs.define
class RestartableArbiter:
    """A ``fastgshare-arbiter`` for the sandbox's pods that keeps its ledger in ``state``."""

    box: Sandbox
    specs: list[TenantSpec]
    process: subprocess.Popen[str] | None = None
    ready_at: float = 0.0

    @property
    def state(self) -> Path:
        return self.box.workdir / "arbiter-state.json"

    def start(self) -> None:
        shares = self.box.workdir / "shares.json"
        shares.write_text(json.dumps({"gpus": [{"uuid": GPU_UUID, "mps": True}],
                                      "pods": [{"pod": s.pod, "gpu": GPU_UUID, "annotations": s.annotations()}
                                               for s in self.specs]}))
        log = (self.box.workdir / "arbiter.log").open("a")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "device_plugin.arbiter.standalone", "--socket", str(self.box.socket),
             "--shares", str(shares), "--trusted-env", "--state-file", str(self.state), "--log-level", "info"],
            stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        assert self.process.stdout is not None
        assert "arbiter ready" in self.process.stdout.readline()
        self.ready_at = time.monotonic()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(10)
            if self.process.stdout is not None:
                self.process.stdout.close()


@pytest.fixture
def restartable() -> Iterator[list[RestartableArbiter]]:
    arbiters: list[RestartableArbiter] = []
    yield arbiters
    for arbiter in arbiters:
        arbiter.kill()


def pod(name: str) -> TenantSpec:
    return TenantSpec(name=name, request=0.3, limit=0.6, memory=str(LIMIT), kernel_us=2000)


def test_a_pod_at_its_memory_limit_stays_there_through_an_arbiter_crash(
        hook_build: HookBuild, start_tenant: StartTenant, open_probe: OpenProbe,
        restartable: list[RestartableArbiter]) -> None:
    spec = pod("trainer")
    with sandbox(hook_build, [spec], arbiter=False) as box:
        arbiter = RestartableArbiter(box, [spec])
        restartable.append(arbiter)
        arbiter.start()
        tenant = start_tenant(box, spec)
        assert tenant.alloc(80 * MIB)["result"] == 0
        arbiter.kill()  # the node agent crashes; its socket closes, the tenant keeps its memory
        arbiter.start()
        newcomer = start_tenant(box, spec)  # a second process of the pod, before the first reconnects
        assert newcomer.alloc(30 * MIB)["result"] == OOM  # 80 + 30 > 100: the saved ledger counts
        assert tenant.alloc(30 * MIB)["result"] == OOM  # the tenant reconnects, reports its 80 MiB
        assert tenant.alloc(10 * MIB)["result"] == 0
        probe: LedgerProbe = open_probe(box, spec)
        assert probe.used == 90 * MIB
        assert tenant.command("free 0")["result"] == 0  # the 80 MiB allocation
        assert probe.used == 10 * MIB
        assert newcomer.alloc(30 * MIB)["result"] == 0
        stderr_lines = tenant.quit(), tenant.process.stderr.read() if tenant.process.stderr else ""
        assert "reconnected the memory link" in stderr_lines[1]


def test_tenants_keep_launching_through_arbiter_restarts(hook_build: HookBuild,
                                                         restartable: list[RestartableArbiter]) -> None:
    specs = [pod("alpha"), pod("beta")]
    with sandbox(hook_build, specs, arbiter=False) as box:
        arbiter = RestartableArbiter(box, specs)
        restartable.append(arbiter)
        arbiter.start()
        box.start_tenants(specs, seconds=6.0, delay_s=0.2)
        resumed_after = []
        for _ in range(3):
            time.sleep(1.0)
            arbiter.kill()
            time.sleep(0.3)  # the agent is down for a while
            before = box.sample()
            arbiter.start()
            assert before is not None
            busy = {name: before.by_pid(pid).busy_ns for name, pid in box.pids.items()}
            # Tokens resume: every tenant runs a kernel again soon after the new arbiter is ready.
            while True:
                now = box.sample()
                assert now is not None
                if all(now.by_pid(pid).busy_ns > busy[name] for name, pid in box.pids.items()):
                    resumed_after.append(time.monotonic() - arbiter.ready_at)
                    break
                assert time.monotonic() - arbiter.ready_at < 5.0, "tenants did not resume"
                time.sleep(0.005)
        summaries = box.wait_tenants(timeout_s=30)  # raises if a tenant failed
        final = box.sample()
        assert final is not None
        shares = {name: final.by_pid(pid).busy_ns / (final.by_pid(pid).last_end_ns - final.by_pid(pid).first_start_ns)
                  for name, pid in box.pids.items()}
        print(f"tokens resumed {', '.join(f'{s * 1000:.0f} ms' for s in resumed_after)} after the new arbiter "
              f"was ready; shares over the run {shares}")
        for name, summary in summaries.items():
            assert summary["errors"] == 0, (name, summary)
            assert shares[name] <= 0.6 + 0.05, (name, shares)  # never past its limit, restarts included


def test_a_launching_tenant_reports_its_memory_to_the_new_arbiter_without_allocating_again(
        hook_build: HookBuild, restartable: list[RestartableArbiter]) -> None:
    spec = pod("server")
    with sandbox(hook_build, [spec], arbiter=False) as box:
        arbiter = RestartableArbiter(box, [spec])
        restartable.append(arbiter)
        arbiter.start()
        tenant = subprocess.Popen([str(hook_build.tenant), "--alloc", str(40 * MIB), "--seconds", "4",
                                   "--duration-us", "2000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=hooked_env(hook_build, box, spec))
        try:
            time.sleep(1.0)
            arbiter.kill()
            arbiter.start()
            stdout, stderr = tenant.communicate(timeout=30)
        finally:
            if tenant.poll() is None:
                tenant.kill()
                tenant.communicate()
        assert tenant.returncode == 0, stderr
        assert json.loads(stdout.strip().splitlines()[-1])["errors"] == 0
        log = (box.workdir / "arbiter.log").read_text()
        # The gate reconnected for its next token and had the memory link report what it holds.
        assert f"memory restored pod={spec.pod} pid={tenant.pid} bytes={40 * MIB}" in log, log[-2000:]
