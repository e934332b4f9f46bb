"""Part d, the hook's cost per launch: empty kernels launched back to back (``launch``: the GPU
runs them as they come, one cuCtxSynchronize at the end) and each waited for (``launch_sync``),
without the hook, with it (default: a ``cuCtxSynchronize`` when each token ends), and with it but
no sync at the token's end; one pod at limit 1.0 (a token renewal every window). Each figure is
the median of ``REPEATS`` runs, in ns per launch (wall time / launches); ``launch_call_ns`` is the
mean time spent inside ``cuLaunchKernel`` itself.
"""

from __future__ import annotations

import statistics

from bench.gpu.part import JsonDict, PartContext, PartFailed, Progress
from bench.gpu.target import Gpu, Tenant, arbiter, fresh_gpu
from bench.gpu.tenants import DAY, Program, choose_program, run_one

REPEATS = 3
TENANT = Tenant(name="overhead", request=1.0, limit=1.0)
WAYS = {"no_hook": (False, True), "hook": (True, True), "hook_no_sync_at_token_end": (True, False)}


def launches(ctx: PartContext) -> dict[str, int]:
    return {"launch": 20_000, "launch_sync": 2_000} if ctx.dry_run else {"launch": 200_000, "launch_sync": 20_000}


def argv(program: Program, mode: str, count: int) -> list[str]:
    if program.kind == DAY:
        return [program.binary, "--ptx", str(program.ptx), "--kernel", "empty", "--timing", "none",
                "--depth", "0" if mode == "launch" else "1", "--launches", str(count)]
    # the simulated GPU's tenant: launches only, one wait at the end; or a wait after each launch
    sync = "end" if mode == "launch" else "each"
    return [program.binary, "--launches", str(count), "--duration-us", "0", "--sync", sync]


def measure(program: Program, gpu: Gpu, env: dict[str, str], mode: str, count: int) -> JsonDict:
    samples, calls = [], []
    for _ in range(REPEATS):
        summary = run_one(argv(program, mode, count), env, 300)
        if int(summary["launches"]) != count:
            raise PartFailed(f"{mode}: {summary['launches']} of {count} launches ({summary.get('first_error_name')})")
        wall_ms = float(summary["wall_ms"]) if "wall_ms" in summary else float(summary["elapsed_s"]) * 1e3
        samples.append(wall_ms * 1e6 / count)
        if "launch_call_ns" in summary:
            calls.append(float(summary["launch_call_ns"]))
    result: JsonDict = {"ns_per_launch": round(statistics.median(samples), 1),
                        "samples": [round(sample, 1) for sample in samples]}
    if calls:
        result["launch_call_ns"] = round(statistics.median(calls), 1)
    return result


def overhead(ctx: PartContext, progress: Progress) -> JsonDict:
    ctx.build.need("hook")
    program = choose_program(ctx)
    progress.put("tenant", program.to_json())
    progress.put("launches", launches(ctx))
    modes = launches(ctx)
    for way, (hooked, sync) in WAYS.items():
        gpu = fresh_gpu(ctx, f"overhead-{way}")
        figures: JsonDict = {}
        if hooked:
            with arbiter(ctx, f"overhead-{way}", [TENANT]) as socket:
                env = gpu.hooked_env(str(ctx.build.hook), socket, TENANT.pod, sync=sync)
                for mode, count in modes.items():
                    figures[mode] = measure(program, gpu, env, mode, count)
        else:
            for mode, count in modes.items():
                figures[mode] = measure(program, gpu, gpu.env(), mode, count)
        progress.put(way, figures)
    added = {f"{mode}_ns": round(progress.data["hook"][mode]["ns_per_launch"]
                                 - progress.data["no_hook"][mode]["ns_per_launch"], 1) for mode in modes}
    return {"status": "ok", **progress.data, "hook_adds": added}
