"""Part a, isolation: the share of GPU time each tenant got against its request and limit, three
scenarios x three ways: enforced with the hook's default (``cuCtxSynchronize`` when a token ends,
so the kernels queued under it cannot run into the next holder's time), enforced without it
(``FASTGSHARE_SYNC_AT_TOKEN_END=0``: the queue drains after the token), and uncontrolled (no hook).

Tenants keep ``DEPTH`` kernels of ``KERNEL_US`` in flight, as a framework does, so that on a real
GPU the queue outlives a token; the two enforced columns side by side settle what the sync buys.
"""

from __future__ import annotations

from bench.gpu.part import JsonDict, PartContext, Progress
from bench.gpu.target import Tenant, arbiter, fresh_gpu
from bench.gpu.tenants import calibrate, choose_program, run_together

KERNEL_US = 500
DEPTH = 4
SCENARIOS: dict[str, list[Tenant]] = {
    "a-alone-limit-0.3": [Tenant(name="alone", request=0.1, limit=0.3)],
    "b-three-saturating": [Tenant(name="t1", request=0.2, limit=0.3), Tenant(name="t2", request=0.3, limit=0.5),
                           Tenant(name="t3", request=0.1, limit=1.0)],
    "c-bursty-beside-saturating": [Tenant(name="bursty", request=0.4, limit=1.0, burst_on_ms=100, burst_off_ms=100),
                                   Tenant(name="steady", request=0.3, limit=1.0)],
}
WAYS = {"enforced": (True, True), "enforced_no_sync_at_token_end": (True, False), "uncontrolled": (False, True)}


def bounds(tenant: Tenant) -> JsonDict:
    """What the tenant should get: never above its limit; at least its request while it wants the
    GPU (a bursty tenant wants it its on-fraction of the time)."""
    duty = tenant.burst_on_ms / (tenant.burst_on_ms + tenant.burst_off_ms) if tenant.burst_on_ms else 1.0
    return {"request": tenant.request, "limit": tenant.limit, "floor": round(tenant.request * duty, 4)}


def isolation(ctx: PartContext, progress: Progress) -> JsonDict:
    ctx.build.need("hook")
    hook = str(ctx.build.hook)
    program = choose_program(ctx)
    progress.put("tenant", program.to_json())
    spin = calibrate(ctx, program, KERNEL_US)
    progress.put("kernel", {**spin.to_json(), "depth": DEPTH})
    scenarios: list[JsonDict] = []
    for scenario, tenants in SCENARIOS.items():
        row: JsonDict = {"scenario": scenario, "tenants": {t.name: bounds(t) for t in tenants}}
        for way, (enforced, sync) in WAYS.items():
            gpu = fresh_gpu(ctx, f"{scenario}-{way}")
            if enforced:
                with arbiter(ctx, f"{scenario}-{way}", tenants) as socket:
                    outcome = run_together(ctx, program, gpu, tenants, spin, hook=hook, socket=socket, sync=sync,
                                           depth=DEPTH, start_delay_s=start_delay(ctx))
            else:
                outcome = run_together(ctx, program, gpu, tenants, spin, hook=None, socket=None, depth=DEPTH,
                                       start_delay_s=start_delay(ctx))
            row[way] = outcome
        scenarios.append(row)
        progress.put("scenarios", scenarios)
    return {"status": "ok", **progress.data, "seconds_per_run": ctx.seconds}


def start_delay(ctx: PartContext) -> float:
    """Time for every tenant to load the driver, make its context and load its module first."""
    return 1.0 if ctx.dry_run else 2.0
