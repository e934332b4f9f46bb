"""The GPU day's markdown table, rendered from its JSON report (what docs/benchmarks.md takes).
Every figure comes from the report; a missing one shows as "–", a part that did not measure shows
its status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bench.gpu.part import NEEDS_GPU, OK

MIB = 1 << 20
DASH = "–"


def dig(data: Any, *keys: str | int) -> Any:
    """``data[k1][k2]...``, or None where a key is missing."""
    for key in keys:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return DASH
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in rows)]


def isolation(part: dict[str, Any]) -> list[str]:
    kernel = part.get("kernel", {})
    lines = [f"Share of GPU time achieved (work done x the kernel's time alone / wall time); spin kernel "
             f"{fmt(kernel.get('kernel_ms_alone'))} ms, {fmt(kernel.get('depth'))} in flight; tenant: "
             f"{dig(part, 'tenant', 'program') or DASH}.", ""]
    rows = []
    for scenario in part.get("scenarios", []):
        for name, bound in scenario.get("tenants", {}).items():
            rows.append([scenario["scenario"], name, fmt(bound.get("request")), fmt(bound.get("limit")),
                         *(fmt(dig(scenario, way, name, "achieved")) for way in
                           ("enforced", "enforced_no_sync_at_token_end", "uncontrolled"))])
    return lines + table(["scenario", "tenant", "request", "limit", "enforced", "enforced, no sync at token end",
                          "uncontrolled"], rows)


def serving(part: dict[str, Any]) -> list[str]:
    rows = []
    for run in part.get("runs", []):
        for index, tenant in enumerate(run.get("tenants", [])):
            program = tenant.get("program") or {}
            peak = tenant.get("peakMemoryBytes")
            rows.append([run["label"], str(index), f"{fmt(tenant.get('request'))}/{fmt(tenant.get('limit'))}",
                         fmt(program.get("images_per_s")), fmt(program.get("p50_ms")), fmt(program.get("p95_ms")),
                         fmt(tenant.get("achievedShare")), fmt(round(peak / MIB) if peak else None)])
    return table(["run", "tenant", "request/limit", "images/s", "p50 ms", "p95 ms", "achieved share",
                  "peak MiB"], rows)


def memory_limit(part: dict[str, Any]) -> list[str]:
    found = part.get("torch_memory", {})
    rows = [["limit", fmt(part.get("limit_bytes"))],
            ["torch.cuda.mem_get_info total", fmt(dig(found, "mem_get_info", "total"))],
            ["nvidia-smi memory.total (MiB)", fmt(dig(found, "nvidia_smi", "total_mib"))],
            ["allocated when refused", fmt(dig(found, "oom", "allocated_before_bytes"))],
            ["error raised", fmt(dig(found, "oom", "error_type"))],
            *([name, fmt(value)] for name, value in part.get("verdicts", {}).items())]
    return table(["what", "value"], rows)


def context_memory(part: dict[str, Any]) -> list[str]:
    keys = ("first_context_bytes", "module_and_first_launch_bytes", "per_process_bytes", "second_context_bytes",
            "second_context_bytes_meminfo")
    rows = [[str(index), run.get("context", DASH), *(fmt(run.get(key)) for key in keys)]
            for index, run in enumerate(part.get("runs", []))]
    lines = table(["run", "context", *keys], rows)
    return lines + (["", f"Median per process: {fmt(part.get('per_process_mib_median'))} MiB."]
                    if "per_process_mib_median" in part else [])


def overhead(part: dict[str, Any]) -> list[str]:
    ways = ("no_hook", "hook", "hook_no_sync_at_token_end")
    modes = [mode for mode in ("launch", "launch_sync") if dig(part, "no_hook", mode)]
    rows = [[mode, *(fmt(dig(part, way, mode, "ns_per_launch")) for way in ways)] for mode in modes]
    return ["ns per launch (median of 3 runs):", "", *table(["", *ways], rows)]


def mps(part: dict[str, Any]) -> list[str]:
    if not part.get("mps"):
        return [f"MPS: no ({part.get('reason', DASH)})"]
    columns = ("no_mps", "mps_100", "mps_50")
    return table(["", *columns], [["kernel ms", *(fmt(dig(part, c, "kernel_ms")) for c in columns)],
                                  ["SMs the process saw", *(fmt(dig(part, c, "sm_count_seen")) for c in columns)]])


def model_sharing(part: dict[str, Any]) -> list[str]:
    def mib(value: Any) -> str:
        return fmt(round(value / MIB, 1)) if isinstance(value, int) else DASH

    used = part.get("gpu_used_bytes", {})
    rows = [[f"GPU used (MiB), {step.replace('_', ' ')}", mib(value)] for step, value in used.items()]
    rows += [[key.replace("_bytes", "").replace("_", " ") + " (MiB)", mib(part.get(key))]
             for key in ("held_with_sharing_bytes", "held_without_sharing_bytes", "saved_bytes", "per_importer_bytes",
                         "per_copy_bytes")]
    rows += [[name.replace("_", " "), fmt(value)] for name, value in part.get("verdicts", {}).items()]
    rows.append(["stale handle after the free", fmt(dig(part, "stale_handle", "outcome"))])
    return [f"{fmt(part.get('pods'))} pods, weights of {mib(part.get('weights_bytes'))} MiB; the GPU's used memory "
            f"by {part.get('used_by', DASH)}, every process's context included.", "",
            *table(["what", "value"], rows)]


def matrix(part: dict[str, Any]) -> list[str]:
    return ["```", *part.get("table", []), "```"] if part.get("table") else []


SECTIONS: dict[str, tuple[str, Callable[[dict[str, Any]], list[str]]]] = {
    "a_isolation": ("a. Isolation", isolation),
    "b_torch_serving": ("b. PyTorch serving under the hook (ResNet-50 shape, batch 1)", serving),
    "c_memory_limit": ("c. Memory limit under PyTorch", memory_limit),
    "c_context_memory": ("c. Memory of one CUDA context", context_memory),
    "d_hook_overhead": ("d. Hook overhead per launch", overhead),
    "e_mps": ("e. MPS: an SM partition's effect", mps),
    "f_model_sharing": ("f. Model sharing: 4 pods, the weights once", model_sharing),
    "memory_matrix": ("Memory coverage matrix (real driver)", matrix),
}


def checks(part: dict[str, Any]) -> list[str]:
    """What a part that needs a GPU checked instead (the dry run)."""
    lines = [f"{part.get('why', '')}; checked instead:", ""]
    for name, found in part.get("checks", {}).items():
        program = found.get("program") if isinstance(found.get("program"), dict) else found
        verdict = "ok" if program.get("check") == "ok" and found.get("exitCode", 0) == 0 else "failed"
        extra = f", {fmt(program['params'])} parameters" if "params" in program else ""
        lines.append(f"- `{name}`: {verdict}{extra}; torch: {program.get('torch', DASH)}")
    return lines


def render(report: dict[str, Any]) -> str:
    gpu = report.get("gpu", {})
    name = "the simulated GPU" if gpu.get("simulated") else gpu.get("name", "GPU")
    lines = [f"# GPU day: {name} ({report.get('mode')})", "",
             *table(["part", "status", "seconds"], [[part, str(result.get("status")), fmt(result.get("elapsed_s"))]
                                                    for part, result in report.get("parts", {}).items()])]
    for key, (title, render_part) in SECTIONS.items():
        part = report.get("parts", {}).get(key)
        if part is None:
            continue
        lines += ["", f"## {title}", ""]
        data = part if part.get("status") == OK or key == "e_mps" else part.get("partial") or {}
        if part.get("status") != OK:
            lines += [f"status: {part.get('status')}", ""]
        if part.get("status") == NEEDS_GPU:
            lines += checks(part)
            continue
        try:
            lines += render_part(data) if data else []
        except Exception as error:  # a table that cannot render must not lose the JSON
            lines.append(f"(not rendered: {type(error).__name__}: {error})")
    return "\n".join(lines) + "\n"
