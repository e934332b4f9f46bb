"""The memory coverage matrix: every allocation path x every way of reaching the driver.

One cell = one run of ``memcheck run --case CASE --way WAY`` (vgpu_hook/tests/memcheck.c) under
the hook, against a :class:`~tests.integration.hook.fake_arbiter.FakeArbiter` whose pod limit is
64 MiB, on a GPU with far more memory (so an escaping path succeeds where an enforced one is
refused). An allocation cell is enforced when the second object is refused with
CUDA_ERROR_OUT_OF_MEMORY while the program goes on, the allocation after the free succeeds, the
arbiter's ledger held exactly the bytes the driver allocated for the first object (pitch x
height, the granularity-rounded VMM size, the array's texels; computed here, not by the
program), and every byte was released by the frees while the process ran. A view cell is
enforced when it shows the pod's slice: total = the limit, free = the limit minus what is held.

Used by ``test_memory_matrix.py`` on the fake GPU, and runnable on a real GPU without pytest
(the GPU machine has none): from the repository root, after ``make -C vgpu_hook``::

    python3 -m tests.integration.hook.memory_matrix --real [--json]

``--real`` runs ``vgpu_hook/build/memcheck-system`` (linked without a run path, so it loads the
machine's ``libcuda.so.1`` and ``libnvidia-ml.so.1``) and first runs every cell without the hook:
a path the driver itself does not support there (it fails without the hook too) shows ``n/a``.
Exit status 0 when no cell escapes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from tests.integration.hook.fake_arbiter import FakeArbiter, MemEvent, Script

REPO = Path(__file__).resolve().parents[3]
BUILD = REPO / "vgpu_hook" / "build"
SIMGPU_BUILD = REPO / "simgpu" / "build"

MIB = 1 << 20
LIMIT = 64 * MIB
SIZE = 40 * MIB  # one object fits the limit, two do not
OOM = 2  # CUDA_ERROR_OUT_OF_MEMORY
FLOAT4 = 16  # bytes per texel of the CU_AD_FORMAT_FLOAT x 4 arrays memcheck creates
# dlvsym and libc-dlvsym find a function only where the library versions its symbols (the fakes
# do, under FASTGSHARE_FAKE_1); on a driver without versions those cells show n/a with --real.
WAYS = ("linked", "dlsym", "dlvsym", "libc-dlvsym", "gpa-legacy", "gpa-v2", "gpa-runtime")
NO_V1 = ("linked", "dlsym", "dlvsym", "libc-dlvsym", "gpa-legacy", "gpa-v2")  # no v1 ABI at the runtime's version
NVML_WAYS = ("linked", "dlsym", "dlvsym", "libc-dlvsym")  # NVML is not reached through cuGetProcAddress

STANDARD_STEPS = [("alloc", 0), ("alloc-over-limit", OOM), ("free", 0), ("alloc-after-free", 0), ("free", 0)]
VMM_STEPS = [("create", 0), ("map", 0), ("set-access", 0), ("retain", 0), ("release", 0), ("release-retained", 0),
             ("create-over-limit", OOM), ("unmap", 0), ("create-after-unmap", 0), ("release", 0)]
VIEW_STEPS = [("hold", 0), ("query", 0)]


@attrs.frozen
class Row:
    case: str  # memcheck --case
    label: str  # how the printed matrix names the path
    symbols: frozenset[str]  # hooked entry points the case reaches through the cell's way
    ways: tuple[str, ...] = WAYS
    kind: str = "alloc"  # alloc | vmm | meminfo | totalmem | nvml


def _row(case: str, label: str, *symbols: str, ways: tuple[str, ...] = WAYS, kind: str = "alloc") -> Row:
    return Row(case, label, frozenset(symbols), ways, kind)


ROWS = (
    _row("alloc", "cuMemAlloc_v2 / cuMemFree_v2", "cuMemAlloc_v2", "cuMemFree_v2"),
    _row("alloc-v1", "cuMemAlloc / cuMemFree (v1 ABI)", "cuMemAlloc", "cuMemFree", ways=NO_V1),
    _row("pitch", "cuMemAllocPitch_v2", "cuMemAllocPitch_v2", "cuMemFree_v2"),
    _row("pitch-v1", "cuMemAllocPitch (v1 ABI)", "cuMemAllocPitch", "cuMemFree", ways=NO_V1),
    _row("managed", "cuMemAllocManaged", "cuMemAllocManaged", "cuMemFree_v2"),
    _row("async", "cuMemAllocAsync / cuMemFreeAsync", "cuMemAllocAsync", "cuMemFreeAsync"),
    _row("async-ptsz", "cuMemAllocAsync_ptsz / cuMemFreeAsync_ptsz", "cuMemAllocAsync_ptsz", "cuMemFreeAsync_ptsz"),
    _row("pool", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", "cuMemFreeAsync"),
    _row("pool-ptsz", "cuMemAllocFromPoolAsync_ptsz", "cuMemAllocFromPoolAsync_ptsz", "cuMemFreeAsync_ptsz"),
    _row("vmm", "cuMemCreate / Map / Retain / Release / Unmap", "cuMemCreate", "cuMemMap",
         "cuMemRetainAllocationHandle", "cuMemRelease", "cuMemUnmap", kind="vmm"),
    _row("array", "cuArrayCreate_v2 / cuArrayDestroy", "cuArrayCreate_v2", "cuArrayDestroy"),
    _row("array-v1", "cuArrayCreate (v1 ABI)", "cuArrayCreate", "cuArrayDestroy", ways=NO_V1),
    _row("array3d", "cuArray3DCreate_v2", "cuArray3DCreate_v2", "cuArrayDestroy"),
    _row("array3d-v1", "cuArray3DCreate (v1 ABI)", "cuArray3DCreate", "cuArrayDestroy", ways=NO_V1),
    _row("mipmap", "cuMipmappedArrayCreate / Destroy", "cuMipmappedArrayCreate", "cuMipmappedArrayDestroy"),
    _row("meminfo", "view: cuMemGetInfo_v2", "cuMemGetInfo_v2", kind="meminfo"),
    _row("meminfo-v1", "view: cuMemGetInfo (v1 ABI)", "cuMemGetInfo", ways=NO_V1, kind="meminfo"),
    _row("totalmem", "view: cuDeviceTotalMem_v2", "cuDeviceTotalMem_v2", kind="totalmem"),
    _row("totalmem-v1", "view: cuDeviceTotalMem (v1 ABI)", "cuDeviceTotalMem", ways=NO_V1, kind="totalmem"),
    _row("nvml", "view: nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo", ways=NVML_WAYS, kind="nvml"),
    _row("nvml-v2", "view: nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo_v2", ways=NVML_WAYS, kind="nvml"),
)


@attrs.frozen
class CellRun:
    returncode: int
    summary: dict[str, Any]
    stderr: str


# --- what each cell must show -------------------------------------------------------------------
def expected_bytes(case: str, summary: dict[str, Any]) -> int:
    """The bytes the driver allocates for one object of the case, computed here, not by the program."""
    desc = summary["desc"]
    if case.startswith("pitch"):
        return int(desc["pitch"] * desc["height"]) if desc["pitch"] >= desc["width"] else -1
    if case.startswith("array3d"):
        return int(FLOAT4 * desc["width"] * desc["height"] * desc["depth"])
    if case.startswith("array"):
        return int(FLOAT4 * desc["width"] * desc["height"])
    if case == "mipmap":
        return sum(FLOAT4 * max(1, desc["width"] >> level) * max(1, desc["height"] >> level)
                   for level in range(desc["levels"]))
    return SIZE  # linear memory; VMM (SIZE is a multiple of the 2 MiB granularity)


def ledger_problems(events: list[MemEvent], expected: int) -> list[str]:
    """What the arbiter's ledger shows that an enforced allocation path would not."""
    problems = []
    refused = [i for i, e in enumerate(events) if e.kind == "reserve" and not e.granted]
    if not refused:
        problems.append("no reservation was refused")
    else:
        held = events[refused[0] - 1].used_after if refused[0] > 0 else 0
        if held != expected:
            problems.append(f"the ledger held {held} bytes for one object, the driver allocated {expected}")
    if not any(e.kind == "release" for e in events):
        problems.append("nothing was released by a free")
    running = [e for e in events if e.kind != "drop"]
    if running and running[-1].used_after != 0:
        problems.append(f"{running[-1].used_after} bytes still reserved after the last free")
    if any(e.kind == "drop" for e in events):
        problems.append("bytes were left for the disconnect to drop")
    return problems


def _steps(run: CellRun) -> list[tuple[str, int]]:
    return [(s["op"], s["result"]) for s in run.summary.get("steps", [])]


def cell_problems(row: Row, run: CellRun, events: list[MemEvent]) -> list[str]:
    """Why the cell is not enforced; [] when it is."""
    if run.returncode != 0 or not run.summary.get("resolved"):
        return [f"exit {run.returncode}, resolved={run.summary.get('resolved')}: {run.stderr.strip()[-300:]}"]
    want = {"alloc": STANDARD_STEPS, "vmm": VMM_STEPS}.get(row.kind, VIEW_STEPS)
    if _steps(run) != want:
        return [f"steps {_steps(run)}, expected {want}"]
    if row.kind in ("alloc", "vmm"):
        return ledger_problems(events, expected_bytes(row.case, run.summary))
    view = run.summary["view"]
    want_view = {"total": LIMIT}
    if row.kind in ("meminfo", "nvml"):
        want_view["free"] = LIMIT - SIZE
    if row.kind == "nvml":
        want_view["used"] = SIZE
    got = {key: view[key] for key in want_view}
    return [] if got == want_view else [f"view {got}, expected {want_view}"]


def driver_supports(row: Row, run: CellRun) -> bool:
    """Without the hook the path works (its first steps succeed): the driver has it."""
    steps = _steps(run)
    return run.returncode == 0 and bool(run.summary.get("resolved")) and bool(steps) and \
        all(result == 0 for _, result in steps[:2])


# --- running it --------------------------------------------------------------------------------
@attrs.frozen
class Setup:
    memcheck: Path
    hook: Path
    base_env: dict[str, str]  # the environment of every run, without the hook's variables
    workdir: Path  # for the arbiters' sockets (keep the path short)

    def env(self, socket: Path | None, hook: bool) -> dict[str, str]:
        env = dict(self.base_env)
        if hook:
            env["LD_PRELOAD"] = str(self.hook)
        if socket is not None:
            env["FASTGSHARE_ARBITER_SOCKET"] = str(socket)
        return env


def scrubbed_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith("FASTGSHARE_") and k not in ("LD_PRELOAD", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")}


def run_memcheck_cell(setup: Setup, row: Row, way: str, *, hook: bool = True) -> tuple[CellRun, list[MemEvent]]:
    """One run of the cell; the program's result and the arbiter's ledger events."""
    socket = setup.workdir / f"{row.case}-{way}-{'h' if hook else 'n'}.sock"
    arbiter = FakeArbiter(socket, Script(memory_limit=LIMIT))
    try:
        try:
            done = subprocess.run([str(setup.memcheck), "run", "--case", row.case, "--way", way, "--size", str(SIZE)],
                                  capture_output=True, text=True, timeout=60, env=setup.env(socket, hook), check=False)
            lines = done.stdout.strip().splitlines()
            run = CellRun(done.returncode, json.loads(lines[-1]) if lines else {}, done.stderr)
        except subprocess.TimeoutExpired:
            run = CellRun(-1, {}, "memcheck did not finish within 60 s (hung?)")
        arbiter.wait_for(lambda _: not arbiter.memory_used, timeout_s=2)  # the disconnect has been seen
        return run, arbiter.memory_events
    finally:
        arbiter.close()


def run_cell(setup: Setup, row: Row, way: str, *, baseline: bool = False) -> list[str] | None:
    """Why the cell escapes ([] when enforced); None when the driver does not support the path."""
    if baseline and not driver_supports(row, run_memcheck_cell(setup, row, way, hook=False)[0]):
        return None
    run, events = run_memcheck_cell(setup, row, way)
    return cell_problems(row, run, events)


Results = dict[tuple[str, str], "list[str] | None"]


def run_matrix(setup: Setup, *, baseline: bool = False, workers: int = 4) -> Results:
    cells = [(row, way) for row in ROWS for way in row.ways]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        outcomes = list(pool.map(lambda cell: run_cell(setup, *cell, baseline=baseline), cells))
    return {(row.case, way): problems for (row, way), problems in zip(cells, outcomes, strict=True)}


def escaped(results: Results) -> dict[str, list[str]]:
    return {f"{case} via {way}": problems for (case, way), problems in results.items() if problems}


def render(results: Results, gpu: str) -> str:
    width = max(len(row.label) for row in ROWS)
    lines = ["memory coverage matrix: ✓ enforced, ✗ escapes, - no such way, n/a the driver lacks the path "
             f"(pod limit {LIMIT // MIB} MiB, objects of ~{SIZE // MIB} MiB, {gpu})",
             f"{'path':<{width}}  " + "  ".join(f"{way:^11}" for way in WAYS)]
    for row in ROWS:
        marks = []
        for way in WAYS:
            if way not in row.ways:
                marks.append("-")
                continue
            problems = results.get((row.case, way))
            marks.append("n/a" if problems is None else "✓" if not problems else "✗")
        lines.append(f"{row.label:<{width}}  " + "  ".join(f"{mark:^11}" for mark in marks))
    cells = [p for p in results.values() if p is not None]
    lines.append(f"{sum(not p for p in cells)} of {len(cells)} cells enforced"
                 + (f", {len(results) - len(cells)} not supported by the driver" if len(cells) < len(results) else ""))
    return "\n".join(lines)


def fake_setup(gpu_dir: Path, workdir: Path, build: Path = BUILD) -> Setup:
    env = scrubbed_environment()
    env.update({"FASTGSHARE_FAKE_GPU_DIR": str(gpu_dir), "LD_LIBRARY_PATH": str(SIMGPU_BUILD)})
    return Setup(build / "memcheck", build / "libfastgshare-hook.so", env, workdir)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", action="store_true", help="the machine's own driver (a real GPU), not the fake")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fgs-mm-", dir="/tmp") as directory:
        workdir = Path(directory)
        if args.real:
            setup = Setup(BUILD / "memcheck-system", BUILD / "libfastgshare-hook.so", scrubbed_environment(), workdir)
            gpu = "the machine's GPU"
        else:
            (workdir / "gpu").mkdir()
            setup = fake_setup(workdir / "gpu", workdir)
            gpu = "fake GPU 16 GiB"
        results = run_matrix(setup, baseline=args.real)
    table = render(results, gpu)
    if args.json:
        print(json.dumps({"benchmark": "memory-matrix", "table": table.splitlines(),
                          "cells": {f"{case} via {way}": ("n/a" if p is None else p or "enforced")
                                    for (case, way), p in results.items()}}, indent=2))
    else:
        print(table)
        for cell, problems in escaped(results).items():
            print(f"  {cell}: {'; '.join(problems)}", file=sys.stderr)
    return 1 if escaped(results) else 0


if __name__ == "__main__":
    sys.exit(main())
