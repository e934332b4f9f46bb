"""Part b, PyTorch serving under the hook: ``torch_serve.py`` (a ResNet-50-shaped network from
``torch.nn``, random weights, batch-1 inference) run by ``fastgshare run --gpu real`` at quotas
0.2, 0.5 and 1.0, alone and two at once (two ``fastgshare run`` share one arbiter and one GPU):
images/s and p50/p95 latency from the script, achieved share, kernels and peak memory from
``fastgshare run``.

Also the helpers the memory part shares: :func:`fastgshare_run` (the command as a user runs it,
from this checkout, through ``fastgshare_run.py``: ``fastgshare run``'s own parser and entry point
without the rest of the command line, whose imports the GPU machine lacks) and
:func:`script_check` (a script's ``--check``: its arguments and what a CPU can check of it).

In the dry run: "needs a GPU" (the CUDA runtime cannot run on the simulated GPU), after checking
``torch_serve.py --check`` and ``fastgshare run`` itself on the simulated GPU.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import attrs

from bench.gpu.part import OK, JsonDict, NeedsGpu, PartContext, PartFailed, Progress, last_json_line
from bench.gpu.target import python_path, scrubbed_environment

QUOTAS = (0.2, 0.5, 1.0)
SIMULATED_SPEC = "1x16GiB:80sm"
MEMORY = "16Gi"
WARMUP_S = 3.0
RUN_TIMEOUT_S = 100.0  # plus the measured seconds: import torch, CUDA under the hook, warm-up; a hang ends the part
RUN_KEYS = ("achievedShare", "peakMemoryBytes", "kernels", "exitCode")


@attrs.frozen(kw_only=True)
class RunOutcome:
    """What one ``fastgshare run`` printed (its JSON object) and what its program wrote (``out``)."""

    run: JsonDict
    program: JsonDict | None

    def to_json(self) -> JsonDict:
        return {**{key: self.run.get(key) for key in RUN_KEYS if key in self.run}, "program": self.program}


@attrs.define
class FastgshareRun:
    """One ``fastgshare run -o json -- python SCRIPT ...`` in progress; its output goes to files
    (no pipe to fill while several run at once)."""

    name: str
    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    out: Path | None

    def stop(self) -> None:
        """SIGTERM (fastgshare run stops its program and leaves the arbiter cleanly), then SIGKILL."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def outcome(self) -> RunOutcome:
        """What the finished run printed; PartFailed with the reason when it failed."""
        stdout = self.stdout.read_text(errors="replace")
        stderr = self.stderr.read_text(errors="replace").strip()
        run = _run_object(stdout)
        if run is None:
            raise PartFailed(f"fastgshare run ({self.name}): exit {self.process.returncode}, no JSON object: "
                             f"{stderr[-600:] or stdout.strip()[-300:]}")
        if run.get("exitCode") != 0:
            raise PartFailed(f"fastgshare run ({self.name}): the program exited {run.get('exitCode')}: {stderr[-600:]}")
        return RunOutcome(run=run, program=_read_json(self.out) if self.out else _program_object(stdout))


def finish_all(runs: list[FastgshareRun], timeout_s: float) -> list[RunOutcome]:
    """Wait for every run (or for the first that fails: the others are stopped, its reason is the
    part's); each one's outcome."""
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            codes = [run.process.poll() for run in runs]
            if all(code is not None for code in codes) or any(code not in (None, 0) for code in codes):
                break
            time.sleep(0.1)
        else:
            late = ", ".join(run.name for run in runs if run.process.poll() is None)
            raise PartFailed(f"fastgshare run ({late}) did not finish within {timeout_s:.0f} s")
        for run in runs:
            if run.process.poll() not in (None, 0):
                run.outcome()  # raises with the failed run's reason
        return [run.outcome() for run in runs]
    finally:
        for run in runs:
            run.stop()


def _run_object(stdout: str) -> JsonDict | None:
    """fastgshare run's own object: the last JSON line that has its keys (the program's output may
    come before it)."""
    for line in reversed(stdout.strip().splitlines()):
        found = last_json_line(line)
        if found is not None and "achievedShare" in found:
            return found
    return None


def _program_object(stdout: str) -> JsonDict | None:
    """The program's own result: the last JSON line that is not fastgshare run's object."""
    for line in reversed(stdout.strip().splitlines()):
        found = last_json_line(line)
        if found is not None and "achievedShare" not in found:
            return found
    return None


def _read_json(path: Path) -> JsonDict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def start_run(ctx: PartContext, name: str, request: float, limit: float, command: list[str], *,
              memory: str = MEMORY, out: Path | None = None) -> FastgshareRun:
    """Start ``fastgshare run`` for ``python COMMAND...``: the real GPU, or the simulated one in the
    dry run. Every run of this day shares one run directory, so runs at once share one arbiter."""
    gpu = SIMULATED_SPEC if ctx.dry_run else "real"
    argv = [ctx.python, str(ctx.repo / "bench" / "gpu" / "fastgshare_run.py"), "--request", f"{request:g}",
            "--limit", f"{limit:g}",
            "--memory", memory, "--gpu", gpu, "-o", "json", "--", ctx.python, *command]
    env = {**scrubbed_environment(), "PYTHONPATH": python_path(ctx.repo),
           "FASTGSHARE_RUN_DIR": str(ctx.scratch("run"))}
    logs = ctx.scratch("fastgshare-run")
    stdout, stderr = logs / f"{name}.out", logs / f"{name}.err"
    with stdout.open("wb") as out_file, stderr.open("wb") as err_file:
        process = subprocess.Popen(argv, stdout=out_file, stderr=err_file, cwd=ctx.repo, env=env)
    return FastgshareRun(name=name, process=process, stdout=stdout, stderr=stderr, out=out)


def fastgshare_run(ctx: PartContext, name: str, request: float, limit: float, command: list[str], *,
                   memory: str = MEMORY, out: Path | None = None, timeout_s: float = RUN_TIMEOUT_S) -> RunOutcome:
    return finish_all([start_run(ctx, name, request, limit, command, memory=memory, out=out)], timeout_s)[0]


def script_check(ctx: PartContext, script: str, args: list[str]) -> JsonDict:
    """``python SCRIPT --check ARGS``: its verdict (raises PartFailed when the check fails)."""
    try:
        done = subprocess.run([ctx.python, script, "--check", *args], capture_output=True, text=True, timeout=300,
                              check=False, env=scrubbed_environment())
    except subprocess.TimeoutExpired:
        raise PartFailed(f"{Path(script).name} --check did not finish within 300 s") from None
    verdict = last_json_line(done.stdout)
    if done.returncode != 0 or verdict is None or verdict.get("check") != "ok":
        raise PartFailed(f"{Path(script).name} --check: exit {done.returncode}: "
                         f"{(verdict or {}).get('error') or done.stderr.strip()[-600:]}")
    return verdict


def configurations() -> list[tuple[str, float, list[tuple[float, float]]]]:
    """(label, quota, [(request, limit) per tenant]): each quota alone, then two tenants at once
    (at 1.0 the two share: request 0.5, limit 1.0 each)."""
    alone = [(f"alone-{q:g}", q, [(q, q)]) for q in QUOTAS]
    pairs = [(f"two-{q:g}", q, [(q / 2, q)] * 2 if q >= 1.0 else [(q, q)] * 2) for q in QUOTAS]
    return alone + pairs


def serve_once(ctx: PartContext, label: str, tenants: list[tuple[float, float]], script: str) -> JsonDict:
    directory = ctx.scratch(f"serve-{label}")
    barrier = directory / "barrier"
    barrier.mkdir(exist_ok=True)
    runs = []
    for index, (request, limit) in enumerate(tenants):
        out = directory / f"serve-{index}.json"
        command = [script, "--seconds", f"{ctx.seconds:g}", "--warmup-s", f"{WARMUP_S:g}", "--out", str(out),
                   "--barrier", str(barrier), "--parties", str(len(tenants))]
        runs.append(start_run(ctx, f"{label}-{index}", request, limit, command, out=out))
    outcomes = finish_all(runs, RUN_TIMEOUT_S + ctx.seconds)
    return {"tenants": [{"request": request, "limit": limit, **outcome.to_json()}
                        for (request, limit), outcome in zip(tenants, outcomes, strict=True)]}


def serving(ctx: PartContext, progress: Progress) -> JsonDict:
    script = str(ctx.repo / "bench" / "gpu" / "programs" / "torch_serve.py")
    check = script_check(ctx, script, ["--seconds", f"{ctx.seconds:g}"])
    progress.put("check", check)
    if ctx.dry_run:
        run = fastgshare_run(ctx, "check", 0.5, 0.5, [script, "--check"])
        raise NeedsGpu("PyTorch needs NVIDIA's CUDA runtime, which cannot run on the simulated GPU",
                       {"torch_serve.py --check": check, "fastgshare run": run.to_json()})
    results = []
    for label, quota, tenants in configurations():
        results.append({"label": label, "quota": quota, **serve_once(ctx, label, tenants, script)})
        progress.put("runs", results)
    return {"status": OK, **progress.data, "seconds_per_run": ctx.seconds}
