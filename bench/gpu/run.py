"""The GPU day: one script that measures, on a machine with one NVIDIA GPU, what the simulated GPU
cannot show; and its ``--dry-run`` on the simulated GPU (a CI test), so that the day's script
cannot fail for a reason a CPU could show. docs/benchmarks.md says what each part measures.

    python3 bench/gpu/run.py [--seconds S] [--deadline-s D] [--parts a_isolation,...]
                             [--json FILE] [--table FILE] [--dry-run] [--keep-workdir]

Parts, in this order, each in its own process under its own timeout (a hang is killed and the part
reports what it had finished), all under one overall deadline (parts not started by then are
skipped): setup (builds), c_context_memory, d_hook_overhead, a_isolation, e_mps, f_model_sharing,
c_memory_limit, b_torch_serving, memory_matrix. A part's status: ``ok``, ``needs a GPU`` (dry run),
``skipped: <reason>`` or ``failed: <reason>``; a failed part never stops the others.

Output: stdout holds exactly one line, the JSON object, printed at the end (also on SIGTERM or
SIGINT, with what was done); stderr has progress lines and, at the end, the markdown table.
``--json FILE`` and ``--table FILE`` are rewritten after every part, so even a run killed with
SIGKILL leaves what it had. Exit status 0 when no part failed, 1 otherwise, 64 for bad arguments.

Needs only the standard library and attrs besides the project (the GPU machine has no network);
nvcc 13, gcc and make on the GPU machine, PyTorch for parts b and c.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import attrs  # noqa: E402 - the project's path is set just above

from bench.gpu import isolation, matrix, memory, model_sharing, mps, overhead, serving, toolchain  # noqa: E402
from bench.gpu.part import (  # noqa: E402
    NEEDS_GPU,
    Build,
    JsonDict,
    NeedsGpu,
    PartContext,
    PartFailed,
    Progress,
    Skipped,
    last_json_line,
    one_line,
)
from bench.gpu.report import render  # noqa: E402

DEFAULT_DEADLINE_S = 570.0  # the GPU machine is lent for 15 minutes, start-up included
MIN_PART_S = 20.0  # a part is not started with less than this left before the deadline
KILL_GRACE_S = 10.0


@attrs.frozen
class PartSpec:
    name: str
    timeout_s: float
    run: Callable[[PartContext, Progress], JsonDict]


# The order puts the parts that need only our own programs first, so that a framework that hangs
# under the hook (parts c_memory_limit and b, each stopped at its timeout) costs the matrix at most.
PARTS = (
    PartSpec("setup", 420, toolchain.setup),
    PartSpec("c_context_memory", 60, memory.context_memory),
    PartSpec("d_hook_overhead", 120, overhead.overhead),
    PartSpec("a_isolation", 200, isolation.isolation),
    PartSpec("e_mps", 120, mps.mps),
    PartSpec("f_model_sharing", 90, model_sharing.model_sharing),
    PartSpec("c_memory_limit", 120, memory.memory_limit),
    PartSpec("b_torch_serving", 240, serving.serving),
    PartSpec("memory_matrix", 240, matrix.matrix),
)
PART_NAMES = tuple(spec.name for spec in PARTS)


class Interrupted(BaseException):  # a signal, not an error: no "except Exception" swallows it
    """SIGTERM or SIGINT reached the script."""


# --- one part, in its own process --------------------------------------------------------------
def part_main(name: str, context_file: Path, progress_file: Path) -> int:
    """Run one part; its result is the last line of stdout."""
    spec = next(spec for spec in PARTS if spec.name == name)
    ctx = PartContext.from_json(json.loads(context_file.read_text()))
    progress = Progress(progress_file)
    signal.signal(signal.SIGTERM, on_signal)  # so that the part's cleanups (finally) run when it is stopped
    try:
        result = spec.run(ctx, progress)
    except Interrupted as signal_name:
        result = {"status": f"failed: stopped by {signal_name}", "partial": progress.data}
    except NeedsGpu as outcome:
        result = {"status": NEEDS_GPU, "why": str(outcome), "checks": outcome.checks}
    except Skipped as outcome:
        result = {"status": f"skipped: {one_line(str(outcome))}", **outcome.data}
    except PartFailed as error:
        result = {"status": f"failed: {one_line(str(error))}", "detail": str(error)[-3000:], "partial": progress.data}
    except Exception as error:  # any failure is reported, never raised: the day goes on
        result = {"status": f"failed: {type(error).__name__}: {one_line(str(error))}", "partial": progress.data,
                  "traceback": traceback.format_exc()[-3000:]}
    print(json.dumps(result), flush=True)
    return 0


# --- the whole day ------------------------------------------------------------------------------
@attrs.define
class Day:
    """The run in progress: its report, and the files it rewrites after every part."""

    args: argparse.Namespace
    workdir: Path
    report: JsonDict
    started: float = attrs.field(factory=time.monotonic)
    build: Build = attrs.field(factory=Build)
    running: subprocess.Popen[bytes] | None = None

    def context(self) -> PartContext:
        return PartContext(repo=REPO, workdir=self.workdir, dry_run=self.args.dry_run, seconds=self.args.seconds,
                           python=sys.executable, build=self.build, mps_dir=self.workdir / "mps")

    def remaining_s(self) -> float:
        return self.args.deadline_s - (time.monotonic() - self.started)

    def save(self) -> None:
        self.report["elapsed_s"] = round(time.monotonic() - self.started, 1)
        if self.args.json:
            write_atomically(self.args.json, json.dumps(self.report, indent=1) + "\n")
        if self.args.table:
            write_atomically(self.args.table, render(self.report))

    def run_part(self, spec: PartSpec) -> JsonDict:
        """The part in a child process (a session of its own, so its whole group can be killed)."""
        timeout_s = min(spec.timeout_s, self.remaining_s())
        directory = self.workdir / "parts"
        directory.mkdir(exist_ok=True)
        context_file, progress_file = directory / f"{spec.name}.context.json", directory / f"{spec.name}.progress.json"
        out_file, err_file = directory / f"{spec.name}.out", directory / f"{spec.name}.err"
        context_file.write_text(json.dumps(self.context().to_json()))
        began = time.monotonic()
        with out_file.open("wb") as out, err_file.open("wb") as err:
            self.running = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--part", spec.name, "--context", str(context_file),
                 "--progress", str(progress_file)], stdout=out, stderr=err, cwd=REPO, start_new_session=True)
        try:
            self.running.wait(timeout_s)
            result = last_json_line(out_file.read_text(errors="replace")) or {
                "status": f"failed: exit {self.running.returncode}, no result: "
                          f"{one_line(err_file.read_text(errors='replace'))}",
                "partial": Progress.read(progress_file)}
        except subprocess.TimeoutExpired:
            result = {"status": f"failed: timed out after {timeout_s:.0f} s (the partial results are what it finished)",
                      "partial": Progress.read(progress_file)}
        except Interrupted as signal_name:
            stop_group(self.running)
            self.report["parts"][spec.name] = {"status": f"failed: interrupted by {signal_name}",
                                               "partial": Progress.read(progress_file),
                                               "elapsed_s": round(time.monotonic() - began, 1)}
            raise
        finally:
            stop_group(self.running)
            self.running = None
        result["elapsed_s"] = round(time.monotonic() - began, 1)
        return result

    def absorb(self, spec: PartSpec, result: JsonDict) -> None:
        self.report["parts"][spec.name] = result
        if spec.name == "setup":
            found = result.get("build") or dig_partial(result, "build") or {}
            fields = {field.name for field in attrs.fields(Build)}
            self.build = Build(**{key: value for key, value in found.items() if key in fields})
            self.report["gpu"] = result.get("gpu") or dig_partial(result, "gpu") or {}
        if spec.name == "e_mps":
            result["daemon_stop_after_part"] = mps.stop_daemon(self.workdir / "mps")
        self.save()

    def interrupt(self, why: str) -> None:
        """After SIGTERM or SIGINT: the part that was running has recorded itself (run_part); the
        rest are skipped."""
        for name in PART_NAMES:
            self.report["parts"].setdefault(name, {"status": f"skipped: {why}"})
        mps.stop_daemon(self.workdir / "mps")


def dig_partial(result: JsonDict, key: str) -> JsonDict | None:
    partial = result.get("partial")
    value = partial.get(key) if isinstance(partial, dict) else None
    return value if isinstance(value, dict) else None


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """End the part's process group, whatever it left running: SIGTERM (the part and its programs
    clean up), then SIGKILL to what is still there after a grace period."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        process.wait()
        return
    deadline = time.monotonic() + KILL_GRACE_S
    while time.monotonic() < deadline:
        process.poll()  # reap the part itself, so that only live processes keep the group
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text)
    os.replace(partial, path)


def on_signal(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def run_day(args: argparse.Namespace) -> JsonDict:
    workdir = Path(tempfile.mkdtemp(prefix="fgs-day-", dir="/tmp"))  # short: unix socket paths
    day = Day(args, workdir, {
        "benchmark": "gpu-day", "mode": "dry-run (simulated GPU)" if args.dry_run else "gpu",
        "started_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"), "seconds_per_run": args.seconds,
        "deadline_s": args.deadline_s, "gpu": {}, "parts": {}, "complete": False})
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for spec in PARTS:
            if spec.name not in args.parts:
                day.absorb(spec, {"status": "skipped: not asked for (--parts)"})
                continue
            if day.remaining_s() < MIN_PART_S:
                day.absorb(spec, {"status": f"skipped: the overall deadline ({args.deadline_s:g} s) was reached"})
                continue
            print(f"run.py: {spec.name} (at most {min(spec.timeout_s, day.remaining_s()):.0f} s)...", file=sys.stderr,
                  flush=True)
            result = day.run_part(spec)
            day.absorb(spec, result)
            print(f"run.py: {spec.name}: {result['status']} ({result['elapsed_s']} s)", file=sys.stderr, flush=True)
        day.report["complete"] = True
    except Interrupted as signal_name:
        day.interrupt(f"interrupted by {signal_name}")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        day.save()
        if not args.keep_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"run.py: the work directory is kept: {workdir}", file=sys.stderr)
    return day.report


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="run on the simulated GPU (what CI runs)")
    parser.add_argument("--seconds", type=float, help="length of each measured run (default: 5, dry run 1)")
    parser.add_argument("--deadline-s", type=float, default=DEFAULT_DEADLINE_S,
                        help="stop starting parts after this many seconds (default: %(default)s)")
    parser.add_argument("--parts", default=",".join(PART_NAMES),
                        help="comma-separated parts to run (default: all; setup always runs)")
    parser.add_argument("--json", type=Path, help="write the JSON report here too (rewritten after every part)")
    parser.add_argument("--table", type=Path, help="write the markdown table here too (rewritten after every part)")
    parser.add_argument("--keep-workdir", action="store_true", help="keep the temporary directory (builds, logs)")
    parser.add_argument("--part", choices=PART_NAMES, help=argparse.SUPPRESS)  # internal: one part, in a child
    parser.add_argument("--context", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--progress", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seconds is None:
        args.seconds = 1.0 if args.dry_run else 5.0
    if args.seconds <= 0 or args.deadline_s <= 0:
        parser.error(f"--seconds and --deadline-s must be > 0 (got {args.seconds:g}, {args.deadline_s:g})")
    parts = [name.strip() for name in args.parts.split(",") if name.strip()]
    unknown = [name for name in parts if name not in PART_NAMES]
    if unknown:
        parser.error(f"--parts: unknown part {unknown[0]!r}; allowed: {', '.join(PART_NAMES)}")
    args.parts = {"setup", *parts}
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.part:
        return part_main(args.part, args.context, args.progress)
    report = run_day(args)
    print(render(report), file=sys.stderr)
    print(json.dumps(report), flush=True)
    failed = [name for name, part in report["parts"].items() if str(part.get("status")).startswith("failed")]
    return 1 if failed or not report["complete"] else 0


if __name__ == "__main__":
    sys.exit(main())

