"""fake-fn under the real arbiter (``fastgshare-arbiter``, as ``fastgshare demo`` runs it): a quota
limit really slows its requests down, and the fake GPU records exactly the GPU time it asked for."""

from __future__ import annotations

import json
import urllib.request

from fastgshare import keys
from fastgshare_cli.sandbox import GPU_UUID, HookBuild, TenantSpec, sandbox
from tests.integration.fake_fn.server import fake_fn_env, start_fake_fn
from tests.integration.hook.tenants import Build, tenant_env

REQUESTS = 10
GPU_MS = 20


def test_a_quota_limit_slows_each_request_down(build: Build) -> None:
    spec = TenantSpec(name="fake-fn", request=0.1, limit=0.25, sm=100)
    hook_build = HookBuild(hook=build.hook, fake_driver_dir=build.fake_dir, tenant=build.tenant)
    with sandbox(hook_build, [spec], window_ms=100, min_token_ms=2) as box:
        env = tenant_env(build, box.gpu_dir, hook=True, extra={
            keys.ENV_ARBITER_SOCKET: str(box.socket), keys.ENV_POD: spec.pod, keys.ENV_GPU_UUID: GPU_UUID,
            keys.ENV_MPS_THREAD_PERCENTAGE: str(spec.sm)})
        server = start_fake_fn(fake_fn_env(build, box.gpu_dir, base=env, settings={"FAKE_FN_GPU_MS": str(GPU_MS)}))
        try:
            walls = []
            for _ in range(REQUESTS):
                with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", data=b"x", timeout=60) as response:
                    answer = json.loads(response.read())
                assert answer["pod"] == spec.pod
                assert answer["kernels"] == GPU_MS
                walls.append(answer["wall_ms"])
            snapshot = box.sample()
            assert snapshot is not None
            busy_ms = snapshot.by_pid(server.pid).busy_ns / 1e6
        finally:
            server.stop()
    assert snapshot.by_pid(server.pid).kernels == REQUESTS * GPU_MS
    assert busy_ms >= REQUESTS * GPU_MS  # the GPU time it asked for, all of it run
    # At a limit of 0.25 the 200 ms of GPU time need about 800 ms. Only a lower bound, with room for
    # the first window's budget: a slow machine can only make it slower.
    assert sum(walls) >= 0.5 * REQUESTS * GPU_MS / spec.limit, walls
