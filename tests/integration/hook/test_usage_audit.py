"""The usage audit (issue 42 item 4) on the real simulated driver: a tenant that runs kernels
without the hook (no token, so no charge) is seen by the simulated GPU's own accounting under its
host pid, and the audit reports its pod's GPU time as unaccounted, with a GPUTimeUnaccounted Event."""

from __future__ import annotations

import time
from pathlib import Path

from device_plugin.allocation import NodePod
from device_plugin.arbiter.server import ArbiterUsage
from device_plugin.gpu_usage import REASON_GPU_TIME_UNACCOUNTED, UsageAudit
from device_plugin.simulated_usage import SimulatedProcessGpuTime
from fastgshare.usage import UsageSnapshot
from tests.integration.hook.fake_arbiter import wait_until
from tests.integration.hook.tenants import Build, finish_tenant, start_tenant

UID = "cccccccc-0000-0000-0000-000000000003"
POD = NodePod(uid=UID, namespace="team-b", name="bypass", node_name="n", phase="Running", resource_version="1")


class _Pods:
    def snapshot(self) -> tuple[int, list[NodePod]]:
        return 1, [POD]


def test_a_tenant_bypassing_the_hook_is_unaccounted_gpu_time(build: Build, gpu_dir: Path) -> None:
    nothing_charged = ArbiterUsage(UsageSnapshot(window_s=10.0, pods=(), gpus=()), {})
    warned: list[tuple[str, str, str]] = []
    tenant = start_tenant(build, gpu_dir, "--seconds", "6", "--duration-us", "20000", "--sync", "each", hook=False)
    try:
        audit = UsageAudit(SimulatedProcessGpuTime({"GPU-0": gpu_dir}), lambda: nothing_charged, _Pods(),
                           lambda pod, reason, message: warned.append((pod.key, reason, message)),
                           lambda pid: UID if pid == tenant.pid else None, threshold=0.05)
        assert wait_until((gpu_dir / "fake_gpu.state").exists, timeout_s=5)
        audit.tick()  # the baseline
        time.sleep(2.0)
        audit.tick()
        assert tenant.poll() is None, "the tenant must still run: the audit counts live processes"
        share = audit.latest()[("team-b", "bypass", "GPU-0")]
        assert 0.6 <= share <= 1.05  # one tenant spinning kernels back to back, charged nothing
        assert [(key, reason) for key, reason, _ in warned] == [("team-b/bypass", REASON_GPU_TIME_UNACCOUNTED)]
    finally:
        tenant.terminate()
        result = finish_tenant(tenant)
    assert result.returncode == 0, result.stderr


def test_the_simulated_gpu_names_no_process_once_it_exited(build: Build, gpu_dir: Path) -> None:
    reader = SimulatedProcessGpuTime({"GPU-0": gpu_dir})
    tenant = start_tenant(build, gpu_dir, "--launches", "5", "--duration-us", "1000", hook=False)
    result = finish_tenant(tenant)
    assert result.returncode == 0, result.stderr
    assert reader.read() is None
    reading = reader.read()
    assert reading is not None
    assert reading.seconds == {"GPU-0": {}}

