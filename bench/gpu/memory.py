"""Part c, memory, in two parts:

- ``c_memory_limit``: PyTorch under the hook through ``fastgshare run --memory``:
  ``torch.cuda.mem_get_info`` and ``nvidia-smi`` (run from inside the hooked process, so it has the
  hook too) show the limit, and the first allocation past it raises ``torch.cuda.OutOfMemoryError``
  (``torch_memory.py``). Needs the CUDA runtime: in the dry run it checks the command line and
  ``fastgshare run`` on the simulated GPU instead.
- ``c_context_memory``: the GPU memory one CUDA context costs (``ctxmem.c``, driver API, a fresh
  process, no hook): the number the packing needs, since the hook does not charge it to the pod.
  Runs on the simulated GPU too, where it is 0 (it models no context memory).
"""

from __future__ import annotations

import statistics

from bench.gpu.part import OK, JsonDict, NeedsGpu, PartContext, PartFailed, Progress
from bench.gpu.serving import fastgshare_run, script_check
from bench.gpu.target import fresh_gpu
from bench.gpu.tenants import run_one

MIB = 1 << 20
LIMIT = "4Gi"
LIMIT_BYTES = 4 << 30
CHUNK_MIB = 256
CONTEXT_RUNS = 3


def deltas(steps: list[JsonDict]) -> JsonDict:
    """Bytes each step added, by NVML's used memory (and cuMemGetInfo's free for the second context)."""
    by_step = {step["step"]: step for step in steps}

    def used(name: str) -> int | None:
        value = by_step.get(name, {}).get("nvml_used")
        return int(value) if value is not None else None

    def difference(after: int | None, before: int | None) -> int | None:
        return after - before if after is not None and before is not None else None

    loaded = "after_module_and_first_launch" if "after_module_and_first_launch" in by_step else "after_first_context"
    free_before, free_after = (by_step.get(loaded, {}).get("free"), by_step.get("after_second_context", {}).get("free"))
    return {"first_context_bytes": difference(used("after_first_context"), used("before")),
            "module_and_first_launch_bytes": difference(used("after_module_and_first_launch"),
                                                        used("after_first_context")),
            "per_process_bytes": difference(used(loaded), used("before")),
            "second_context_bytes": difference(used("after_second_context"), used(loaded)),
            "second_context_bytes_meminfo": difference(free_before, free_after)}


def context_memory(ctx: PartContext, progress: Progress) -> JsonDict:
    ctx.build.need("ctxmem")
    runs = []
    for index in range(1 if ctx.dry_run else CONTEXT_RUNS):
        gpu = fresh_gpu(ctx, f"ctxmem-{index}")
        argv = [str(ctx.build.ctxmem)] + (["--ptx", ctx.build.ptx] if ctx.build.ptx else [])
        try:
            summary = run_one(argv, gpu.env(), 120)
        except PartFailed as error:
            if not (ctx.dry_run and ctx.build.ptx):
                raise
            progress.put("ptx_refused", f"{error} (measured without loading the PTX)")
            summary = run_one(argv[:1], fresh_gpu(ctx, f"ctxmem-{index}-noptx").env(), 120)
        runs.append({"context": summary["context"], "driver_version": summary.get("driver_version"),
                     "nvml": summary["nvml"], **deltas(summary["steps"]),
                     "steps": summary["steps"]})
        progress.put("runs", runs)
    per_process = [r["per_process_bytes"] for r in runs if r["per_process_bytes"] is not None]
    result: JsonDict = {"status": OK, **progress.data}
    if per_process:
        result["per_process_bytes_median"] = int(statistics.median(per_process))
        result["per_process_mib_median"] = round(statistics.median(per_process) / MIB, 1)
    if ctx.dry_run:
        result["note"] = "the simulated GPU models no context memory: 0 is what it measures, not a GPU's figure"
    return result


def memory_limit(ctx: PartContext, progress: Progress) -> JsonDict:
    script = str(ctx.repo / "bench" / "gpu" / "programs" / "torch_memory.py")
    if ctx.dry_run:
        checks = {"torch_memory.py --check": script_check(ctx, script, ["--limit-bytes", str(LIMIT_BYTES)]),
                  "fastgshare run": fastgshare_run(ctx, "memcheck", 1.0, 1.0, [script, "--check"],
                                                   memory=LIMIT).to_json()}
        raise NeedsGpu("PyTorch needs NVIDIA's CUDA runtime, which cannot run on the simulated GPU", checks)
    out = ctx.scratch("memory-limit") / "torch_memory.json"
    run = fastgshare_run(ctx, "memlimit", 1.0, 1.0, [script, "--limit-bytes", str(LIMIT_BYTES), "--chunk-mib",
                                                     str(CHUNK_MIB), "--out", str(out)], memory=LIMIT, out=out)
    progress.put("fastgshare_run", run.to_json())
    found = run.program or {}
    verdicts = {
        "mem_get_info_total_is_limit": found.get("mem_get_info", {}).get("total") == LIMIT_BYTES,
        "nvidia_smi_total_is_limit": found.get("nvidia_smi", {}).get("total_mib") == LIMIT_BYTES // MIB,
        "oom_is_torch_OutOfMemoryError": bool(found.get("oom", {}).get("is_torch_oom")),
        "refused_within_limit": (found.get("oom", {}).get("allocated_before_bytes") or 0) <= LIMIT_BYTES
        and bool(found.get("oom", {}).get("raised")),
    }
    return {"status": OK, "limit_bytes": LIMIT_BYTES, "chunk_mib": CHUNK_MIB, "verdicts": verdicts,
            "torch_memory": found, "fastgshare_run": run.to_json()}
