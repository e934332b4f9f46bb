"""A pod's memory limit, end to end: the C hook in every tenant, the real arbiter's pod ledger, the fake GPU."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from fastgshare_cli.sandbox import HookBuild, TenantSpec, sandbox
from tests.integration.memory.conftest import MIB, OOM, OpenProbe, StartTenant, hooked_env, memcheck_path

LIMIT = 100 * MIB


def pod(name: str, memory: int = LIMIT) -> TenantSpec:
    return TenantSpec(name=name, request=0.5, limit=1.0, memory=str(memory))


def test_two_processes_of_a_pod_cannot_together_exceed_its_limit(hook_build: HookBuild, start_tenant: StartTenant,
                                                                 open_probe: OpenProbe) -> None:
    spec = pod("trainer")
    with sandbox(hook_build, [spec]) as box:
        first, second = start_tenant(box, spec), start_tenant(box, spec)
        assert first.alloc(60 * MIB)["result"] == 0
        assert second.alloc(60 * MIB)["result"] == OOM  # 120 MiB > 100 MiB, although each alone fits
        assert second.alloc(30 * MIB)["result"] == 0
        probe = open_probe(box, spec)
        ledger = probe.read()
        assert (ledger.pod_used_bytes, ledger.pod_limit_bytes) == (90 * MIB, LIMIT)
        assert first.command("free 0")["result"] == 0
        assert probe.used == 30 * MIB  # released by the free, while the process lives on
        assert second.alloc(60 * MIB)["result"] == 0


def test_killing_a_process_frees_its_memory_in_the_ledger_at_once(hook_build: HookBuild, start_tenant: StartTenant,
                                                                  open_probe: OpenProbe) -> None:
    spec = pod("server")
    with sandbox(hook_build, [spec]) as box:
        victim, survivor = start_tenant(box, spec), start_tenant(box, spec)
        assert victim.alloc(80 * MIB)["result"] == 0
        assert survivor.alloc(50 * MIB)["result"] == OOM
        probe = open_probe(box, spec)
        victim.kill()  # SIGKILL: no free, no exit handler; only its socket closes
        killed_at = time.monotonic()
        while probe.used != 0:
            assert time.monotonic() - killed_at < 2.0, "the arbiter kept a killed process's memory"
            time.sleep(0.01)
        assert survivor.alloc(50 * MIB)["result"] == 0


def test_cumemgetinfo_inside_a_tenant_shows_the_pods_limit(hook_build: HookBuild, start_tenant: StartTenant) -> None:
    spec = pod("notebook")
    with sandbox(hook_build, [spec]) as box:
        first, second = start_tenant(box, spec), start_tenant(box, spec)
        assert first.alloc(30 * MIB)["result"] == 0
        assert second.alloc(20 * MIB)["result"] == 0
        info = first.command("info")
        assert (info["result"], info["total"], info["free"]) == (0, LIMIT, LIMIT - 50 * MIB)  # pod-wide
        assert first.command("total") == {"op": "total", "result": 0, "total": LIMIT}


def test_an_over_limit_allocation_returns_the_error_and_the_process_continues(hook_build: HookBuild,
                                                                              start_tenant: StartTenant) -> None:
    spec = pod("batch")
    with sandbox(hook_build, [spec]) as box:
        tenant = start_tenant(box, spec)
        assert tenant.alloc(150 * MIB) == {"op": "alloc", "result": OOM, "id": -1}
        assert tenant.alloc(10 * MIB)["result"] == 0
        assert tenant.command("free 0")["result"] == 0
        assert tenant.quit() == 0


def test_each_pod_has_its_own_ledger(hook_build: HookBuild, start_tenant: StartTenant) -> None:
    specs = [pod("alpha"), pod("beta")]
    with sandbox(hook_build, specs) as box:
        alpha, beta = start_tenant(box, specs[0]), start_tenant(box, specs[1])
        assert alpha.alloc(80 * MIB)["result"] == 0
        assert beta.alloc(80 * MIB)["result"] == 0


@pytest.mark.parametrize("case", ["alloc", "pitch", "managed", "async-ptsz", "pool", "vmm", "array3d", "mipmap"])
def test_allocation_paths_are_enforced_by_the_real_arbiter(hook_build: HookBuild, case: str) -> None:
    """A slice of the coverage matrix against the real ledger (the full matrix: tests/integration/hook)."""
    spec = pod("matrix", memory=64 * MIB)
    with sandbox(hook_build, [spec]) as box:
        result = subprocess.run([str(memcheck_path(hook_build)), "run", "--case", case, "--way", "gpa-v2", "--size",
                                 str(40 * MIB)], capture_output=True, text=True, timeout=30,
                                env=hooked_env(hook_build, box, spec), check=False)
    assert result.returncode == 0, result.stderr
    results = [step["result"] for step in json.loads(result.stdout.splitlines()[-1])["steps"]]
    refused = results.index(OOM)  # the first object fits, the second is refused, the program goes on
    assert all(r == 0 for i, r in enumerate(results) if i != refused), results


def test_a_tenant_that_allocates_too_much_still_launches(hook_build: HookBuild) -> None:
    """Memory and time are separate: a refused allocation does not stop the token gate."""
    spec = pod("mixed")
    with sandbox(hook_build, [spec]) as box:
        summary = box.run_tenant(spec, "--alloc-mb", "200", "--launches", "5", "--duration-us", "1000")
    assert summary["alloc_error"] == OOM
    assert (summary["launches"], summary["errors"]) == (5, 0)
