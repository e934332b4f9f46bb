"""``fastgshare run [--request R] [--limit L] [--sm S] [--memory M] [--gpu SPEC|real] [-o json] -- CMD [ARGS...]``.

Runs any program under the hook (``LD_PRELOAD``) with the arbiter holding the share the flags
name, on a simulated GPU (``--gpu SPEC``) or on this machine's NVIDIA GPU (``--gpu real``; the
default where NVML finds one), and says what the program got: achieved share of GPU time, peak
GPU memory, kernels, throttled time. Its exit status is CMD's. This module owns the flags and
their validation (the share's rules are :func:`fastgshare.share.parse_share`'s, the GPU spec's
:func:`fastgshare.inventory.parse_gpu_spec`'s), CMD's environment, starting and watching CMD,
signals, the live status line and the summary; the runs' shared arbiter and GPU are
:mod:`fastgshare_cli.run_session`'s, the GPU choice :mod:`fastgshare_cli.run_gpu`'s, the measures
:mod:`fastgshare_cli.run_meter`'s. Usage and measures: ``docs/run.md``.

Exit status: CMD's (``128 + N`` when a signal N killed it); 2 for a bad flag (one line naming the
flag, the value and what is allowed); 127 when CMD is not found and 126 when it cannot be run, as
a shell; 125 when the run itself could not be set up (the hook does not build, the arbiter does
not start, the state directory is not usable).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from types import FrameType
from typing import IO

import attrs

from fastgshare import keys
from fastgshare.errors import InvalidShareSpec
from fastgshare.quantity import format_bytes
from fastgshare.share import ShareSpec, format_fraction, parse_share
from fastgshare_cli.run_gpu import (
    GPU_HELP,
    REAL,
    GpuChoice,
    GpuChoiceError,
    choose_gpu,
    simulated_gpu,
)
from fastgshare_cli.run_meter import (
    ArbiterTotals,
    ArbiterUsageMeter,
    LedgerMeter,
    RunProcesses,
    RunTotals,
    SimulatedGpuMeter,
    with_arbiter_time,
)
from fastgshare_cli.run_session import GpuConflict, Membership, RunSession, SessionError, default_state_dir
from fastgshare_cli.sandbox import HookBuild, SandboxError, arbiter_command, build_hook

EXIT_USAGE, EXIT_SETUP, EXIT_CANNOT_RUN, EXIT_NOT_FOUND = 2, 125, 126, 127
OUTPUTS = ("text", "json")
DEFAULT_LIMIT = "1"
SAMPLE_INTERVAL_S = 0.1
STATUS_INTERVAL_S = 0.25
ARBITER_CHECK_S = 1.0
PREFIX = "fastgshare run: "
# The simulated driver's SM count (to move to fastgshare.keys beside ENV_FAKE_GPU_MEMORY).
ENV_FAKE_GPU_SMS = "FASTGSHARE_FAKE_GPU_SMS"
ENV_LIBRARY_PATH = "LD_LIBRARY_PATH"
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
FLAG_OF = {keys.GPU_QUOTA_REQUEST: "--request", keys.GPU_QUOTA_LIMIT: "--limit", keys.GPU_SM_PARTITION: "--sm",
           keys.GPU_MEM: "--memory"}
# Signals a terminal sends to its whole foreground process group (CMD is in ours) when a key is pressed or it hangs up.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
FORWARDED_SIGNALS = (*TERMINAL_SIGNALS, signal.SIGTERM)


class FlagError(Exception):
    """A bad flag: the message is one line naming the flag, the value and what is allowed."""


# --- flags -------------------------------------------------------------------------------
def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = commands.add_parser(
        "run", help="run any program under the hook and the arbiter, on a simulated or real GPU",
        usage="%(prog)s [--request R] [--limit L] [--sm S] [--memory M] [--gpu SPEC|real] [-o text|json] "
              "-- CMD [ARGS...]",
        description="Run CMD with a GPU share: the hook (LD_PRELOAD) gates its launches and allocations, the "
                    "arbiter holds its share, on a simulated GPU or on this machine's NVIDIA GPU. Shows a live "
                    "status line on a terminal and, at the end, the achieved share of GPU time, peak GPU memory "
                    "and kernels. Runs at once share one GPU and one arbiter. The exit status is CMD's. "
                    "See docs/run.md.")
    run.add_argument("--request", metavar="R", help="guaranteed fraction of GPU time, 0..1 (default: the limit)")
    run.add_argument("--limit", metavar="L", help=f"cap on the fraction of GPU time, 0 < L <= 1 (default: "
                                                  f"{DEFAULT_LIMIT})")
    run.add_argument("--sm", metavar="S", help="SM partition, percent 1..100 (default: 100)")
    run.add_argument("--memory", metavar="M", help='GPU memory limit, bytes or e.g. "4Gi" (default: the whole GPU)')
    run.add_argument("--gpu", metavar="SPEC|real",
                     help=f"{GPU_HELP} (default: real where NVML finds an NVIDIA GPU, else 1x16GiB:80sm)")
    run.add_argument("-o", "--output", default="text", metavar="text|json",
                     help="the summary: one line on stderr, or one JSON object as the last line of stdout "
                          "(default: %(default)s)")
    run.add_argument("program", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]", help="the program to run")


@attrs.frozen(kw_only=True)
class RunOptions:
    """The flags as given (None: not given) and the command."""

    request: str | None = None
    limit: str | None = None
    sm: str | None = None
    memory: str | None = None
    gpu: str | None = None
    output: str = "text"
    command: tuple[str, ...] = ()

    def annotations(self, gpu_memory_bytes: int) -> dict[str, str]:
        """The four share annotations: request defaults to the limit, the limit to 1, SM to 100 and
        memory to the whole GPU."""
        limit = self.limit if self.limit is not None else DEFAULT_LIMIT
        return {keys.GPU_QUOTA_REQUEST: self.request if self.request is not None else limit,
                keys.GPU_QUOTA_LIMIT: limit,
                keys.GPU_SM_PARTITION: self.sm if self.sm is not None else "100",
                keys.GPU_MEM: self.memory if self.memory is not None else str(gpu_memory_bytes)}

    def share(self, gpu: GpuChoice) -> ShareSpec:
        """The share on ``gpu``; :class:`FlagError` naming the flags that break the share's rules."""
        return self._share(gpu.memory_bytes)

    def _share(self, gpu_memory_bytes: int) -> ShareSpec:
        try:
            share = parse_share(self.annotations(gpu_memory_bytes))
        except InvalidShareSpec as error:
            raise FlagError(self._describe(error)) from None
        if share.is_parked:  # a parked pod waits to be woken; a command run so would never launch a kernel
            raise FlagError(f'--limit: "{self.limit}" gives the command no GPU time; allowed: a decimal fraction of '
                            'GPU time, 0 < limit <= 1 (e.g. "0.8")')
        return share

    def _describe(self, error: InvalidShareSpec) -> str:
        given = {keys.GPU_QUOTA_REQUEST: self.request, keys.GPU_QUOTA_LIMIT: self.limit, keys.GPU_SM_PARTITION: self.sm,
                 keys.GPU_MEM: self.memory}
        problems = [p for p in error.problems if given.get(p.field) is not None] or list(error.problems)
        lines = []
        for problem in problems:
            message = problem.message
            for key, flag in FLAG_OF.items():
                message = message.replace(key, flag)
            lines.append(f"{FLAG_OF.get(problem.field, problem.field)}: {message}")
        return "; ".join(lines)


def parse_options(args: argparse.Namespace) -> RunOptions:
    """The run's options from the parsed arguments, every flag checked; :class:`FlagError` if one is bad."""
    command = list(args.program)
    if command[:1] == ["--"]:
        command = command[1:]
    if args.output not in OUTPUTS:
        raise FlagError(f'-o "{args.output}" is not an output format; allowed: {", ".join(OUTPUTS)}')
    if not command:
        raise FlagError("no command to run; usage: fastgshare run [FLAGS] -- CMD [ARGS...]")
    options = RunOptions(request=args.request, limit=args.limit, sm=args.sm, memory=args.memory, gpu=args.gpu,
                         output=args.output, command=tuple(command))
    if options.gpu is not None and options.gpu.strip() != REAL:
        try:
            simulated_gpu(options.gpu)
        except GpuChoiceError as error:
            raise FlagError(f"--gpu: {error}") from None
    options._share(1)  # the GPU's memory is not known yet: any valid size checks the other flags
    return options


# --- the command -------------------------------------------------------------------------
@attrs.frozen
class NotRunnable:
    """CMD cannot be started: the shell's exit status for it and one line."""

    status: int
    message: str


def resolve_command(name: str, search_path: str) -> str | NotRunnable:
    """CMD's executable as a shell finds it (``search_path`` is ``$PATH``), or why it cannot run."""
    if "/" in name:
        return _runnable_path(name)
    found_not_executable = False
    for directory in search_path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            found_not_executable = True
    if found_not_executable:
        return NotRunnable(EXIT_CANNOT_RUN, f"{name}: Permission denied")
    return NotRunnable(EXIT_NOT_FOUND, f"{name}: command not found")


def _runnable_path(name: str) -> str | NotRunnable:
    path = Path(name)
    if not path.exists():
        return NotRunnable(EXIT_NOT_FOUND, f"{name}: No such file or directory")
    if path.is_dir():
        return NotRunnable(EXIT_CANNOT_RUN, f"{name}: Is a directory")
    if not os.access(path, os.X_OK):
        return NotRunnable(EXIT_CANNOT_RUN, f"{name}: Permission denied")
    return name


def exit_status(returncode: int) -> int:
    """A shell's exit status for a child's return code: ``128 + N`` for a death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


@attrs.frozen(kw_only=True)
class RunPlaces:
    """Where CMD's hook and GPU are: the hook library, the simulated driver, the arbiter's socket, the simulated GPU."""

    hook: Path
    driver_dir: Path
    socket: Path
    gpu_dir: Path


def child_environment(base: Mapping[str, str], places: RunPlaces, gpu: GpuChoice, pod: str,
                      share: ShareSpec) -> dict[str, str]:
    """CMD's environment: ours, with the hook preloaded, the arbiter's socket, the pod and GPU the hook
    names in HELLO, the SM partition where MPS applies and, on the simulated GPU, its driver and directory."""
    ours = {keys.ENV_FAKE_GPU_DIR, keys.ENV_FAKE_GPU_MEMORY, ENV_FAKE_GPU_SMS, keys.ENV_ARBITER_SOCKET, keys.ENV_POD,
            keys.ENV_GPU_UUID, keys.ENV_MPS_THREAD_PERCENTAGE}
    env = {name: value for name, value in base.items() if name not in ours}
    env[keys.ENV_LD_PRELOAD] = _prepend(str(places.hook), base.get(keys.ENV_LD_PRELOAD, ""))
    env.update({keys.ENV_ARBITER_SOCKET: str(places.socket), keys.ENV_POD: pod, keys.ENV_GPU_UUID: gpu.uuid})
    if gpu.simulated:
        env[ENV_LIBRARY_PATH] = _prepend(str(places.driver_dir), base.get(ENV_LIBRARY_PATH, ""))
        env.update({keys.ENV_FAKE_GPU_DIR: str(places.gpu_dir), keys.ENV_FAKE_GPU_MEMORY: str(gpu.memory_bytes),
                    ENV_FAKE_GPU_SMS: str(gpu.sm_count)})
    else:
        env[ENV_CUDA_VISIBLE_DEVICES] = gpu.uuid
    if gpu.mps:
        env[keys.ENV_MPS_THREAD_PERCENTAGE] = str(share.sm_percent)
    return env


def _prepend(first: str, paths: str) -> str:
    rest = [path for path in paths.replace(" ", ":").split(":") if path and path != first]
    return ":".join([first, *rest])


# --- what it got -------------------------------------------------------------------------
def run_summary(*, share: ShareSpec, gpu: GpuChoice, totals: RunTotals, arbiter: ArbiterTotals | None,
                wall_s: float, exit_code: int, pod: str) -> dict[str, object]:
    """The ``-o json`` object. ``totals`` is the GPU's measure (on a real GPU its GPU time is the
    arbiter's count, :func:`~fastgshare_cli.run_meter.with_arbiter_time`), ``arbiter`` the arbiter's
    count of the run's pod. Unknown measures are null: kernels on a real GPU, and the arbiter's
    numbers when its usage file could not be read."""
    busy_s = totals.busy_ns / 1e9 if totals.busy_ns is not None else None
    return {
        "exitCode": exit_code,
        "achievedShare": _fraction(busy_s, wall_s),
        "gpuSeconds": round(busy_s, 4) if busy_s is not None else None,
        "arbiterShare": _fraction(arbiter.used_s if arbiter is not None else None, wall_s),
        "peakMemoryBytes": totals.peak_memory_bytes,
        "kernels": totals.kernels,
        "throttledSeconds": round(arbiter.throttled_s, 4) if arbiter is not None else None,
        "waitedSeconds": round(arbiter.waited_s, 4) if arbiter is not None else None,
        "tokens": arbiter.tokens if arbiter is not None else None,
        "request": share.request_permille / keys.TIME_UNITS,
        "limit": share.limit_permille / keys.TIME_UNITS,
        "sm": share.sm_percent,
        "memoryLimitBytes": share.memory_bytes,
        "gpu": gpu.spec,
        "gpuUuid": gpu.uuid,
        "wallSeconds": round(wall_s, 3),
        "pod": pod,
    }


def _fraction(part_s: float | None, wall_s: float) -> float | None:
    return round(part_s / wall_s, 4) if part_s is not None and wall_s > 0 else None


def summary_line(summary: Mapping[str, object]) -> str:
    """The text summary: one line."""
    real = summary["gpu"] == REAL
    share, arbiter_share = summary["achievedShare"], summary["arbiterShare"]
    if isinstance(share, float):
        achieved = f"achieved share {share:.3f} of the GPU{', as its hooks reported it' if real else ''}"
    else:
        achieved = "achieved share not measured"
    parts = [f"exit {summary['exitCode']} after {summary['wallSeconds']:.2f} s",
             f"{achieved} (request {summary['request']:g}, limit {summary['limit']:g}, {summary['sm']} % SM)"]
    if not real and isinstance(arbiter_share, float):
        parts.append(f"the arbiter counted {arbiter_share:.3f}")
    kernels, throttled = summary["kernels"], summary["throttledSeconds"]
    parts.append(f"{kernels} kernels" if isinstance(kernels, int) else "kernels not counted")
    if isinstance(throttled, float):
        parts.append(f"throttled {throttled:.2f} s")
    parts.append(f"peak memory {_bytes(summary['peakMemoryBytes'])} of {_bytes(summary['memoryLimitBytes'])}")
    parts.append("real GPU" if real else f"simulated GPU {summary['gpu']}")
    return PREFIX + "; ".join(parts)


def status_line(elapsed_s: float, totals: RunTotals, share: ShareSpec) -> str:
    """The live status: time so far, achieved share so far, kernels, memory."""
    minutes, seconds = divmod(int(elapsed_s), 60)
    parts = [f"fastgshare run {minutes}:{seconds:02d}"]
    if totals.busy_ns is not None and elapsed_s > 0:
        parts.append(f"share {totals.busy_ns / 1e9 / elapsed_s:.2f} (limit {format_fraction(share.limit_permille)})")
    if totals.kernels is not None:
        parts.append(f"{totals.kernels} kernels")
    parts.append(f"memory {format_bytes(totals.memory_bytes)} (peak {format_bytes(totals.peak_memory_bytes)}) of "
                 f"{format_bytes(share.memory_bytes)}")
    return " | ".join(parts)


def _bytes(value: object) -> str:
    return format_bytes(value) if isinstance(value, int) else "?"


class LiveStatus:
    """One line on a terminal, rewritten in place."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._shown = False

    def show(self, text: str) -> None:
        width = shutil.get_terminal_size((100, 24)).columns
        self._stream.write(f"\r{text[:max(width - 1, 10)]}\x1b[K")
        self._stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self._stream.write("\r\x1b[K")
            self._stream.flush()
            self._shown = False


# --- signals -----------------------------------------------------------------------------
class SignalForwarder:
    """SIGINT, SIGQUIT, SIGHUP and SIGTERM go to CMD, so it can end cleanly; the run waits for it.

    CMD is in our process group, so a key pressed on our terminal reaches it from the terminal
    itself: those three are forwarded only when our group is not the terminal's foreground group
    (someone used ``kill``). A signal that comes before CMD starts stops the run before it does."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._child: subprocess.Popen[bytes] | None = None
        self._pending: list[int] = []
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in FORWARDED_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        self._child = child
        pending, self._pending = self._pending, []
        for signum in pending:
            self._forward(signum)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._child is None:
            self._pending.append(signum)
        else:
            self._forward(signum)

    def _forward(self, signum: int) -> None:
        child = self._child
        if child is None or child.returncode is not None:
            return
        if signum in TERMINAL_SIGNALS and _terminal_foreground():
            return
        with suppress(ProcessLookupError):
            os.kill(child.pid, signum)


def _terminal_foreground() -> bool:
    """Whether our process group is the foreground group of the terminal on stdin, stdout or stderr."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False


class ExitWatch:
    """Waits for a child to exit without reaping it (a pidfd, or ``waitid`` with ``WNOWAIT`` where
    there is none), so its pid stays its own until the last sample is taken."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        try:
            self._fd: int | None = os.pidfd_open(pid)
        except (OSError, AttributeError):
            self._fd = None

    def wait(self, timeout_s: float) -> bool:
        """Whether the child has exited, waiting up to ``timeout_s`` for it."""
        if self._fd is not None:
            return bool(select.select([self._fd], [], [], timeout_s)[0])
        deadline = time.monotonic() + timeout_s
        while True:
            if os.waitid(os.P_PID, self._pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# --- the run -----------------------------------------------------------------------------
def run_main(args: argparse.Namespace, environ: Mapping[str, str] | None = None,
             stdout: IO[str] | None = None, stderr: IO[str] | None = None) -> int:
    """``fastgshare run``: the exit status (CMD's, or 2, 125, 126, 127)."""
    env = dict(os.environ if environ is None else environ)
    err = stderr or sys.stderr
    try:
        return _prepare_and_run(args, env, stdout or sys.stdout, err)
    except KeyboardInterrupt:  # Ctrl-C before anything started (the build): nothing to clean up
        return 128 + signal.SIGINT


def _prepare_and_run(args: argparse.Namespace, env: dict[str, str], out: IO[str], err: IO[str]) -> int:
    try:
        options = parse_options(args)
    except FlagError as error:
        return _fail(err, EXIT_USAGE, str(error))
    executable = resolve_command(options.command[0], env.get("PATH", os.defpath))
    if isinstance(executable, NotRunnable):
        return _fail(err, executable.status, executable.message)
    try:
        gpu = choose_gpu(options.gpu, env)
    except GpuChoiceError as error:
        return _fail(err, EXIT_USAGE, f'--gpu "{options.gpu}": {error}')
    try:
        build = build_hook()
    except SandboxError as error:
        return _fail(err, EXIT_SETUP, str(error).splitlines()[0])
    run = _Run(options, executable, build, env, out, err)
    run.signals.install()
    try:
        return run.join_and_run(gpu)
    finally:
        run.signals.restore()


@attrs.define
class _Run:
    """One run, from joining the shared arbiter to leaving it."""

    options: RunOptions
    executable: str
    build: HookBuild
    env: dict[str, str]
    out: IO[str]
    err: IO[str]
    signals: SignalForwarder = attrs.field(factory=SignalForwarder)

    def join_and_run(self, gpu: GpuChoice) -> int:
        session = RunSession(default_state_dir(self.env), arbiter_command_for_runs)
        name = str(os.getpid())
        try:
            membership = session.join(name, f"run/{name}", gpu, explicit_gpu=self.options.gpu is not None,
                                      share_for=self.options.share)
        except GpuConflict as conflict:
            current = conflict.current.spec
            return _fail(self.err, EXIT_USAGE, f'--gpu "{self.options.gpu}": the runs already going on this machine '
                                               f'use GPU "{current}" (the first run fixes it); allowed: "{current}", '
                                               "or no --gpu to join it")
        except SessionError as error:
            return _fail(self.err, EXIT_SETUP, str(error))
        try:
            for warning in membership.warnings:
                print(f"{PREFIX}warning: {warning}", file=self.err, flush=True)
            if self.signals.received:
                return 128 + self.signals.received[0]
            return self._supervise(session, membership)
        finally:
            try:
                session.leave(membership)
            except (SessionError, OSError) as error:
                print(f"{PREFIX}cleaning up {session.directory} failed: {error}", file=self.err, flush=True)

    def _supervise(self, session: RunSession, membership: Membership) -> int:
        """Start CMD, watch it (status line, the arbiter's health) until it exits, print the summary."""
        entry, gpu = membership.entry, membership.gpu
        places = RunPlaces(hook=self.build.hook, driver_dir=self.build.fake_driver_dir, socket=session.socket,
                           gpu_dir=session.gpu_dir)
        usage = ArbiterUsageMeter(entry.pod, session.usage_file, session.ask_usage)
        usage.sample()  # the baseline: what a pod of this name had before (none, unless a pid came back)
        started_ns = time.monotonic_ns()
        try:
            process = subprocess.Popen(list(self.options.command), executable=self.executable,
                                       env=child_environment(self.env, places, gpu, entry.pod, entry.share))
        except OSError as error:
            return _fail(self.err, EXIT_CANNOT_RUN, f"{self.options.command[0]}: {error.strerror}")
        self.signals.attach(process)
        meter = _meter(gpu, session, entry.pod, process.pid, started_ns)
        live = LiveStatus(self.err) if self.err.isatty() else None
        exited = ExitWatch(process.pid)
        next_status = last_check = started_ns / 1e9
        totals = _sample(meter, usage, gpu, final=False)[0]
        while not exited.wait(SAMPLE_INTERVAL_S):
            totals, now = _sample(meter, usage, gpu, final=False)[0], time.monotonic()
            if live is not None and now >= next_status:
                live.show(status_line(now - started_ns / 1e9, totals, entry.share))
                next_status = now + STATUS_INTERVAL_S
            if now >= last_check + ARBITER_CHECK_S:
                last_check = now
                self._say(_check_arbiter(session, membership), live)
        wall_s = (time.monotonic_ns() - started_ns) / 1e9
        totals, arbiter = _sample(meter, usage, gpu, final=True)  # CMD has exited, not reaped: its pid is its own
        exited.close()
        process.wait()
        if isinstance(meter, LedgerMeter):
            meter.close()
        if live is not None:
            live.clear()
        summary = run_summary(share=entry.share, gpu=gpu, totals=totals, arbiter=arbiter, wall_s=wall_s,
                              exit_code=exit_status(process.returncode), pod=entry.pod)
        if self.options.output == "json":
            print(json.dumps(summary), file=self.out, flush=True)
        else:
            print(summary_line(summary), file=self.err, flush=True)
        return exit_status(process.returncode)

    def _say(self, message: str | None, live: LiveStatus | None) -> None:
        if message:
            if live is not None:
                live.clear()
            print(f"{PREFIX}{message}", file=self.err, flush=True)


def _meter(gpu: GpuChoice, session: RunSession, pod: str, cmd_pid: int,
           started_ns: int) -> SimulatedGpuMeter | LedgerMeter:
    if gpu.simulated:
        return SimulatedGpuMeter(session.gpu_dir, RunProcesses(cmd_pid, pod), started_ns)
    return LedgerMeter(session.socket, pod, gpu.uuid)


def _sample(meter: SimulatedGpuMeter | LedgerMeter, usage: ArbiterUsageMeter, gpu: GpuChoice, *,
            final: bool) -> tuple[RunTotals, ArbiterTotals | None]:
    """The GPU's measure and the arbiter's count; on a real GPU the GPU time is the arbiter's. The
    final sample asks the arbiter for a fresh usage file (CMD has exited)."""
    totals = meter.sample()
    arbiter = usage.final() if final else usage.sample()
    return (totals if gpu.simulated else with_arbiter_time(totals, arbiter)), arbiter


def arbiter_command_for_runs(socket: Path, shares: Path, usage: Path) -> list[str]:
    """The arbiter of ``fastgshare run``: the sandbox's (trusted-env mode), writing its usage file."""
    return [*arbiter_command(socket, shares), "--usage-file", str(usage)]


def _check_arbiter(session: RunSession, membership: Membership) -> str | None:
    try:
        return session.check_arbiter(membership)
    except (SessionError, OSError) as error:
        return f"the arbiter is gone and could not be started again: {error}"


def _fail(err: IO[str], status: int, message: str) -> int:
    print(f"{PREFIX}{message}", file=err, flush=True)
    return status
