"""``fastgshare profile run`` and ``fastgshare profile show``: measure a function's profile, and read one.

``run`` sweeps a grid of (time quota, SM %) shares. For each point it starts the fake function
(``simgpu/build/fake-fn``) on this machine's simulated GPU, through the real hook and a
standalone ``fastgshare-arbiter`` holding that point's share (quota request = limit, SM, memory),
with :mod:`fastgshare_cli.sandbox`; with ``--url`` it loads a function that already runs (one
point, the share the flags name, e.g. on a real GPU). The load is open-loop: arrivals are drawn in
advance (Poisson or evenly spaced) at increasing rates, one step each, and each request's latency
runs from its scheduled arrival to its answer. This module owns the processes and the HTTP; what
a step, a point and a dominated point are is the core's (:mod:`fastgshare.profiling`), and the
document is :mod:`fastgshare.profile`'s codec.

**The load generator and its limits.** One asyncio event loop in this process: a feeder puts each
request into a queue at its due time, ``--concurrency`` workers (default 2) take them in order and
send each on the worker's own kept-open connection (``Connection: keep-alive``, reopened when the
server closes it; plain HTTP/1.1, no TLS), timing it with the loop's monotonic clock. Because
latency is charged from the *scheduled* arrival, a request that waits in the queue (the pod is
busy) or behind a late timer is charged the wait, never hidden (no coordinated omission); the
cost of the client itself is the loop's timer lateness (about 1 ms, more when the machine is busy)
and ~0.3 ms of Python per request, so the generator is good for a few hundred requests per second
on one core and for latencies of a few ms and up. It is no tool for sub-millisecond latencies or
for thousands of requests per second (use k6 or wrk there).

**Why two in flight, and one inference at a time.** The local fake-fn runs with
``FAKE_FN_CONCURRENCY=1``: like a batch-1 model server it runs one inference at a time, while the
next request is already read and waits its turn. With two requests in flight (what the gateway's
dispatcher keeps at a pod) the GPU goes from one request's last kernel to the next request's first
without a gap. With one in flight, every request's turnaround (the answer back to this client,
the next request to the pod: 1-2 ms on a busy machine) was idle time inside the pod's time token,
which the arbiter charges as used: ``maxRps`` came out at 80-90 % of ``quota x 1000 / gpu_ms``
although the hook and the arbiter give a saturating process its quota to within a few per cent.
Without the one-at-a-time limit two inferences would run at once (fake-fn has a thread per
connection), and on the fake GPU two kernels of a 50 % SM partition run side by side, which
measures up to twice the share.

**Fidelity on the simulated GPU.** ``quota x 1000 / gpu_ms`` is what a pod kept busy gets: the
arbiter grants it ``quota`` of the GPU's time, each request needs ``gpu_ms`` of it. The fake GPU's
kernels are timed sleeps; each costs about 0.1 ms of wall time beyond its length on a quiet
machine (1 ms kernels about 15 %, 5 ms kernels about 2 %: ``--kernel-us`` defaults to 5000), and
more when the machine's cores are busy (a 5 ms kernel measured 5.2-6.2 ms with a load average of
5-8 on 2 cores), which the token pays for. A sweep step that starts after the pod idled also pays
the hook's charge for that idle time (up to ``(1 - quota) x`` the 100 ms window, once). Measured
with a 2 x 2 grid (quota 0.25/0.5 x SM 50/100, gpu_ms 10, 2 s steps, about 60 s) on a busy 2-core
machine, ``maxRps`` came out at 88-97 % of ``quota x 1000 / gpu_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import attrs
from rich.console import Console
from rich.table import Table

from fastgshare.profile import (
    PERCENTILES,
    LoadStep,
    Profile,
    ProfileError,
    ProfilePoint,
    Slo,
    decode_profile,
    encode_profile,
)
from fastgshare.profiling import (
    Arrivals,
    RequestTiming,
    SweepPlan,
    Verdict,
    analyse_step,
    arrival_times,
    point_from_steps,
    profile_rows,
    prune,
    step_verdict,
)
from fastgshare.quantity import format_bytes, parse_bytes
from fastgshare_cli.sandbox import HookBuild, SandboxError, TenantSpec, build_hook, sandbox

DEFAULT_KERNEL_US = 5000
DEFAULT_CONCURRENCY = 2
START_FRACTION = 0.25  # the first step offers this fraction of quota x 1000 / gpu_ms
READY_TIMEOUT_S = 20
WARMUP_REQUESTS = 3
_T = TypeVar("_T")


class ProfileRunError(RuntimeError):
    """A flag is wrong or the function could not be loaded; the message is one line."""


# --- arguments ---------------------------------------------------------------------------
def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    profile = commands.add_parser(
        "profile", help="measure a function's profile (req/s and latency per quota x SM share), or show one",
        description="Profiles: for each (time quota, SM %) share, how many requests per second one pod serves "
                    "and how fast. 'run' measures them under open-loop load, 'show' prints a profile document.")
    actions = profile.add_subparsers(dest="profile_command", required=True, metavar="ACTION")
    run = actions.add_parser(
        "run", help="sweep a (quota, SM) grid with open-loop load and write the profile document",
        description="For each grid point, start the fake function on the simulated GPU under the real hook and "
                    "a standalone arbiter holding the point's share (or, with --url, load a function already "
                    "running), offer Poisson load at increasing rates until the pod saturates, and write the "
                    "versioned profile document with dominated points pruned. Progress goes to stderr.")
    run.add_argument("--grid-quota", default="0.25,0.5", metavar="Q,...",
                     help="time quotas (request = limit), fractions in (0, 1] (default: %(default)s)")
    run.add_argument("--grid-sm", default="50,100", metavar="S,...",
                     help="SM partitions, percent 1..100 (default: %(default)s)")
    run.add_argument("--memory", default="1Gi", help="the share's GPU memory (default: %(default)s)")
    run.add_argument("--gpu-ms", type=float, default=10.0,
                     help="GPU time per request, ms: the fake function's setting, and with --url the estimate "
                          "the first step's rate comes from (default: %(default)s)")
    run.add_argument("--kernel-us", type=int, default=DEFAULT_KERNEL_US,
                     help="the fake function's kernel length, us (default: %(default)s)")
    run.add_argument("--slo-ms", type=float, help="the SLO latency; without it the document has no slo and "
                                                  "sloRps is 0")
    run.add_argument("--percentile", type=int, choices=PERCENTILES, default=95,
                     help="the SLO's latency percentile (default: %(default)s)")
    run.add_argument("--seconds-per-step", type=float, default=2.0, help="length of each load step (default: "
                                                                         "%(default)s)")
    run.add_argument("--start-rps", type=float, help=f"the first step's rate (default: {START_FRACTION:g} x "
                                                     "quota x 1000 / gpu-ms)")
    run.add_argument("--step-factor", type=float, default=1.4, help="each step offers this multiple of the last "
                                                                    "(default: %(default)s)")
    run.add_argument("--arrivals", choices=[a.value for a in Arrivals], default=Arrivals.POISSON.value,
                     help="arrival process (default: %(default)s)")
    run.add_argument("--concurrency", type=int, default=DEFAULT_CONCURRENCY,
                     help="requests in flight at once, each on its own kept-open connection; 2 keeps the next "
                          "request at the pod while one runs, as the gateway does (default: %(default)s)")
    run.add_argument("--timeout-s", type=float, default=10.0, help="a request unanswered this long is an error "
                                                                   "(default: %(default)s)")
    run.add_argument("--seed", type=int, default=0, help="seed of the arrival times (default: %(default)s)")
    run.add_argument("--function", help="the function's name in the document (default: fake-fn, or the URL's "
                                        "last path segment)")
    run.add_argument("--gpu-model", default="", help="the GPU model recorded in the document (default: none)")
    run.add_argument("--keep-dominated", action="store_true", help="write dominated points too")
    run.add_argument("--url", help="load this running function (http://host:port/path) instead of a local "
                                   "fake-fn: one point, the share of --grid-quota/--grid-sm/--memory")
    run.add_argument("--out", type=Path, metavar="FILE", help="write the document here (default: stdout)")
    show = actions.add_parser(
        "show", help="print a profile document as a table",
        description="One row per point: share, maxRps, sloRps, latency percentiles, and whether another point "
                    "dominates it (as much capacity with no more quota, SM and memory).")
    show.add_argument("file", type=Path, metavar="FILE", help="the profile document (JSON)")
    show.add_argument("-o", "--output", choices=["table", "json"], default="table")


def profile_main(args: argparse.Namespace, console: Console, errors: Console) -> int:
    if args.profile_command == "show":
        return run_show(args, console, errors)
    return run_run(args, errors)


# --- show --------------------------------------------------------------------------------
def run_show(args: argparse.Namespace, console: Console, errors: Console) -> int:
    try:
        text = args.file.read_text()
    except OSError as error:
        errors.print(f"fastgshare profile show: {args.file}: cannot be read: {error.strerror}", markup=False,
                     highlight=False)
        return 2
    try:
        profile = decode_profile(text)
    except ProfileError as error:
        errors.print(f"fastgshare profile show: {args.file}: {error}", markup=False, highlight=False)
        return 1
    rows = profile_rows(profile)
    if args.output == "json":
        slo = None if profile.slo is None else {"percentile": profile.slo.percentile,
                                                 "latencyMs": profile.slo.latency_ms}
        console.print_json(json.dumps({"function": profile.function, "gpuModel": profile.gpu_model,
                                       "source": profile.source, "measuredAt": profile.measured_at, "slo": slo,
                                       "points": rows}))
        return 0
    console.print(profile_table(profile, rows))
    return 0


def profile_table(profile: Profile, rows: Sequence[dict[str, object]]) -> Table:
    slo = f"p{profile.slo.percentile} <= {profile.slo.latency_ms:g} ms" if profile.slo else "no SLO"
    title = " ".join(part for part in (f"{profile.function}:", slo, f"on {profile.gpu_model}" if profile.gpu_model
                                       else "", f"({profile.source})" if profile.source else "") if part)
    table = Table(title=title)
    for column in ("config", "quota", "SM %", "memory", "maxRps", "sloRps", "p50 ms", "p95 ms", "p99 ms", "steps",
                   "pruning"):
        table.add_column(column, justify="left" if column in ("config", "pruning") else "right")
    for row in rows:
        request, limit = row["quotaRequest"], row["quotaLimit"]
        quota = f"{request:g}" if request == limit else f"{request:g}-{limit:g}"
        table.add_row(str(row["config"]), quota, str(row["smPartition"]), format_bytes(_int(row["memoryBytes"])),
                      _number(row["maxRps"]) + (" (derived)" if row["derived"] else ""), _number(row["sloRps"]),
                      _number(row["p50Ms"]), _number(row["p95Ms"]), _number(row["p99Ms"]), str(row["steps"]),
                      "dominated" if row["dominated"] else "kept")
    return table


def _number(value: object) -> str:
    return "-" if not isinstance(value, int | float) else f"{value:.4g}"


def _int(value: object) -> int:
    return value if isinstance(value, int) else 0


# --- run ---------------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class RunSettings:
    quotas: tuple[float, ...]
    sms: tuple[int, ...]
    memory: str
    memory_bytes: int
    gpu_ms: float
    kernel_us: int
    slo: Slo | None
    seconds_per_step: float
    start_rps: float | None
    step_factor: float
    arrivals: Arrivals
    concurrency: int
    timeout_s: float
    seed: int
    url: str | None


def run_run(args: argparse.Namespace, errors: Console) -> int:
    def say(line: str) -> None:
        errors.print(line, markup=False, highlight=False)

    try:
        settings = _settings(args)
        target = HttpTarget.from_url(settings.url) if settings.url else None
    except (ProfileRunError, ProfileError, ValueError) as error:
        say(f"fastgshare profile run: {error}")
        return 2
    started = time.monotonic()
    try:
        points = (measure_url(settings, target, say) if target is not None
                  else measure_fake_fn(settings, build_hook(), say))
    except (ProfileRunError, SandboxError, ProfileError) as error:
        say(f"fastgshare profile run: {error}")
        return 1
    except KeyboardInterrupt:  # the sandbox and fake-fn were stopped on the way out
        say("fastgshare profile run: interrupted; fake-fn and the arbiter are stopped, nothing was written")
        return 130
    function = args.function or (_url_name(settings.url) if settings.url else "fake-fn")
    source = (f"fastgshare profile run --url {settings.url}" if settings.url else
              f"fastgshare profile run: fake-fn on the simulated GPU (gpu_ms {settings.gpu_ms:g}, kernel_us "
              f"{settings.kernel_us})")
    profile = Profile(function=function, points=tuple(points), slo=settings.slo, gpu_model=args.gpu_model,
                      source=source, measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
    pruned: list[ProfilePoint] = []
    if not args.keep_dominated:
        profile, pruned = prune(profile)
    say(f"{len(points)} point(s) in {time.monotonic() - started:.1f} s; "
        + (f"pruned as dominated: {', '.join(p.key for p in pruned)}" if pruned else "none dominated"))
    text = encode_profile(profile) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    try:
        args.out.write_text(text)
    except OSError as error:
        say(f"fastgshare profile run: --out {args.out}: cannot be written: {error.strerror}")
        return 1
    say(f"wrote {args.out}")
    return 0


def _settings(args: argparse.Namespace) -> RunSettings:
    quotas = tuple(_parse_list(args.grid_quota, "--grid-quota", float))
    sms = tuple(_parse_list(args.grid_sm, "--grid-sm", int))
    for quota in quotas:
        if not (math.isfinite(quota) and 0 < quota <= 1):
            raise ProfileRunError(f"--grid-quota: {quota:g} is not a fraction in (0, 1]")
    for sm in sms:
        if not 1 <= sm <= 100:
            raise ProfileRunError(f"--grid-sm: {sm} is not a percent in 1..100")
    if args.url and (len(quotas), len(sms)) != (1, 1):
        raise ProfileRunError("--url loads one running function: give one --grid-quota and one --grid-sm (its share)")
    memory = parse_bytes(args.memory)
    if memory is None or memory <= 0:
        raise ProfileRunError(f"--memory: {args.memory!r} is not a byte count like 1Gi or 512Mi")
    checks = [("--gpu-ms", args.gpu_ms, 0 < args.gpu_ms <= 60_000, "ms in (0, 60000]"),
              ("--kernel-us", args.kernel_us, 1 <= args.kernel_us <= 60_000_000, "us in 1..60000000"),
              ("--seconds-per-step", args.seconds_per_step, 0.2 <= args.seconds_per_step <= 600, "seconds in 0.2..600"),
              ("--step-factor", args.step_factor, 1 < args.step_factor <= 10, "a factor in (1, 10]"),
              ("--concurrency", args.concurrency, 1 <= args.concurrency <= 1024, "1..1024"),
              ("--timeout-s", args.timeout_s, 0 < args.timeout_s <= 600, "seconds in (0, 600]"),
              ("--start-rps", args.start_rps, args.start_rps is None or 0 < args.start_rps <= 100_000,
               "req/s in (0, 100000]"),
              ("--slo-ms", args.slo_ms, args.slo_ms is None or args.slo_ms > 0, "ms > 0")]
    for flag, value, ok, allowed in checks:
        if not ok or (isinstance(value, float) and not math.isfinite(value)):
            raise ProfileRunError(f"{flag}: {value} is not allowed; allowed: {allowed}")
    return RunSettings(
        quotas=quotas, sms=sms, memory=args.memory, memory_bytes=memory, gpu_ms=args.gpu_ms, kernel_us=args.kernel_us,
        slo=None if args.slo_ms is None else Slo(percentile=args.percentile, latency_ms=args.slo_ms),
        seconds_per_step=args.seconds_per_step, start_rps=args.start_rps, step_factor=args.step_factor,
        arrivals=Arrivals(args.arrivals), concurrency=args.concurrency, timeout_s=args.timeout_s, seed=args.seed,
        url=args.url)


def _parse_list(text: str, flag: str, kind: Callable[[str], _T]) -> list[_T]:
    values: list[_T] = []
    for part in text.split(","):
        try:
            values.append(kind(part.strip()))
        except ValueError:
            raise ProfileRunError(f"{flag}: {part.strip()!r} is not a number; give a comma-separated list like "
                                  f"{'0.25,0.5' if kind is float else '50,100'}") from None
    if len(set(values)) != len(values):
        raise ProfileRunError(f"{flag}: {text!r} repeats a value")
    return values


def _url_name(url: str) -> str:
    parts = urlsplit(url)
    segments = [s for s in parts.path.split("/") if s]
    return segments[-1] if segments else (parts.hostname or "function")


def _sweep_plan(settings: RunSettings, quota: float) -> SweepPlan:
    estimate = quota * 1000 / settings.gpu_ms
    return SweepPlan(start_rps=settings.start_rps or START_FRACTION * estimate, factor=settings.step_factor)


def measure_fake_fn(settings: RunSettings, build: HookBuild, say: Callable[[str], None]) -> list[ProfilePoint]:
    """Every grid point on a fresh simulated GPU with its own arbiter and fake-fn."""
    if not build.fake_fn.exists():
        raise ProfileRunError(f"{build.fake_fn} was not built (make -C simgpu)")
    points = []
    for quota in settings.quotas:
        for sm in settings.sms:
            spec = TenantSpec(name=f"profile-q{round(quota * 100)}-s{sm}", request=quota, limit=quota, sm=sm,
                              memory=settings.memory)
            with local_fake_fn(build, spec, gpu_ms=settings.gpu_ms, kernel_us=settings.kernel_us,
                               max_connections=max(64, settings.concurrency + 8), inferences=1) as port:
                target = HttpTarget(host="127.0.0.1", port=port, path="/")
                points.append(_measure_point(settings, target, quota, sm, say))
    return points


def measure_url(settings: RunSettings, target: HttpTarget | None, say: Callable[[str], None]) -> list[ProfilePoint]:
    assert target is not None
    return [_measure_point(settings, target, settings.quotas[0], settings.sms[0], say)]


def _measure_point(settings: RunSettings, target: HttpTarget, quota: float, sm: int,
                   say: Callable[[str], None]) -> ProfilePoint:
    name = f"q{round(quota * 100)}-s{sm}"
    began = time.monotonic()
    plan = _sweep_plan(settings, quota)
    steps = asyncio.run(sweep(target, plan, settings, random.Random(f"{settings.seed}/{name}"),
                              lambda n, rate, step, verdict: say(_step_line(name, n, rate, step, verdict))))
    point = point_from_steps(quota_request=quota, quota_limit=quota, sm_partition=sm,
                             memory_bytes=settings.memory_bytes, steps=steps, slo=settings.slo)
    expected = quota * 1000 / settings.gpu_ms
    say(f"{name}: maxRps {point.max_rps:.4g} ({point.max_rps / expected:.0%} of quota x 1000 / gpu_ms = "
        f"{expected:.4g}), sloRps {point.slo_rps:.4g}, {len(steps)} steps in {time.monotonic() - began:.1f} s")
    return point


def _step_line(name: str, number: int, rate: float, step: LoadStep, verdict: Verdict) -> str:
    return (f"{name} step {number}: nominal {rate:.4g}, offered {step.offered_rps:.4g}, achieved "
            f"{step.achieved_rps:.4g} req/s; p50 {step.p50_ms:.4g} p95 {step.p95_ms:.4g} p99 {step.p99_ms:.4g} ms"
            + (f"; errors {step.error_rate:.1%}" if step.error_rate else "") + f"; {verdict.value}")


@contextmanager
def local_fake_fn(build: HookBuild, spec: TenantSpec, *, gpu_ms: float, kernel_us: int,
                  max_connections: int = 64, inferences: int = 1) -> Iterator[int]:
    """fake-fn as tenant ``spec`` on a fresh simulated GPU with a standalone arbiter holding the
    spec's share; yields its port. ``inferences``: how many it runs at once (``FAKE_FN_CONCURRENCY``;
    1, a batch-1 model server, is what the profile describes). Both processes end when the block
    does, however it ends."""
    with sandbox(build, [spec]) as box:
        log = box.workdir / "fake-fn.log"
        process = box.start_process(spec, [str(build.fake_fn)], stderr_log=log, env={
            "FAKE_FN_PORT": "0", "FAKE_FN_HOST": "127.0.0.1", "FAKE_FN_GPU_MS": f"{gpu_ms:g}",
            "FAKE_FN_KERNEL_US": str(kernel_us), "FAKE_FN_MAX_CONNECTIONS": str(max_connections),
            "FAKE_FN_CONCURRENCY": str(inferences)})
        try:
            yield _ready_port(process, log)
        finally:
            _stop(process)


def _ready_port(process: subprocess.Popen[str], log: Path) -> int:
    assert process.stdout is not None
    line = process.stdout.readline()  # the ready line, or "" when it exited
    try:
        ready = json.loads(line)
        if ready.get("event") == "ready":
            return int(ready["port"])
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    _stop(process)
    tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:]) if log.exists() else ""
    raise ProfileRunError(f"fake-fn did not start (exit {process.returncode}): {tail or line.strip()!r}")


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# --- the load generator --------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class HttpTarget:
    host: str
    port: int
    path: str = "/"
    body: bytes = b"{}"

    @classmethod
    def from_url(cls, url: str) -> HttpTarget:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ProfileRunError(f"--url: {url!r} is not allowed; allowed: http://host[:port]/path (plain HTTP)")
        try:
            port = parts.port or 80
        except ValueError:
            raise ProfileRunError(f"--url: {url!r} has a bad port") from None
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(host=parts.hostname, port=port, path=path)

    def request_bytes(self, *, keep_alive: bool = False) -> bytes:
        """The request; ``keep_alive`` asks the server to keep the connection open after its answer."""
        connection = "keep-alive" if keep_alive else "close"
        return (f"POST {self.path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(self.body)}\r\nConnection: {connection}\r\n\r\n").encode() + self.body


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> tuple[bool, bool]:
    """Send one request and read its answer to the end: (2xx, the server keeps the connection open)."""
    writer.write(data)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {name.strip().lower(): value.strip().lower()
               for name, _, value in (line.partition(":") for line in lines[1:] if line)}
    length = int(headers["content-length"]) if "content-length" in headers else None
    if length is None:
        await reader.read()  # to the end of the connection
    else:
        await reader.readexactly(length)
    kept = length is not None and "close" not in headers.get("connection", "") and lines[0].startswith("HTTP/1.1")
    return 200 <= status < 300, kept


async def request_once(target: HttpTarget, data: bytes) -> bool:
    """One request on a fresh connection; True for a 2xx answer read to its end."""
    reader, writer = await asyncio.open_connection(target.host, target.port)
    try:
        return (await _exchange(reader, writer, data))[0]
    finally:
        writer.close()


class KeptConnection:
    """One client connection kept open from request to request (HTTP/1.1 keep-alive), opened on
    first use and again whenever the server closed it. A request on a reused connection that the
    server had already closed (no answer byte came back) is sent once more on a fresh one."""

    def __init__(self, target: HttpTarget) -> None:
        self._target = target
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def request(self, data: bytes) -> bool:
        """True for a 2xx answer read to its end."""
        reused = self._streams is not None
        try:
            return await self._request(data)
        except (asyncio.IncompleteReadError, ConnectionError) as error:
            nothing = not isinstance(error, asyncio.IncompleteReadError) or not error.partial
            if not (reused and nothing):
                raise
            return await self._request(data)  # the server had closed the kept connection: once more

    async def _request(self, data: bytes) -> bool:
        if self._streams is None:
            self._streams = await asyncio.open_connection(self._target.host, self._target.port)
        reader, writer = self._streams
        try:
            ok, kept = await _exchange(reader, writer, data)
        except BaseException:
            self.close()
            raise
        if not kept:
            self.close()
        return ok

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


async def run_step(target: HttpTarget, due: Sequence[float], window_s: float, *, concurrency: int,
                   timeout_s: float) -> list[RequestTiming]:
    """Offer requests at ``due`` (seconds from now); wait for them at most until the window's end
    plus one more window (and the request timeout). Unfinished ones count as failed."""
    loop = asyncio.get_running_loop()
    data = target.request_bytes(keep_alive=True)
    queue: asyncio.Queue[float] = asyncio.Queue()
    start = loop.time() + 0.005
    timings: dict[float, RequestTiming] = {}
    all_in = asyncio.Event()  # the next step starts as soon as this one's last answer is in, not a poll later

    async def feed() -> None:
        for offset in due:
            delay = start + offset - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            queue.put_nowait(offset)

    async def work() -> None:
        connection = KeptConnection(target)
        try:
            while True:
                offset = await queue.get()
                try:
                    ok = await asyncio.wait_for(connection.request(data), timeout_s)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError,
                        TimeoutError):
                    connection.close()
                    ok = False
                timings[offset] = RequestTiming(due_s=offset, latency_ms=(loop.time() - start - offset) * 1000,
                                                ok=ok)
                if len(timings) == len(due):
                    all_in.set()
        finally:
            connection.close()

    tasks = [asyncio.create_task(feed())] + [asyncio.create_task(work()) for _ in range(concurrency)]
    give_up = start + window_s + max(window_s, min(timeout_s, 2 * window_s))
    try:
        await asyncio.wait_for(all_in.wait(), max(0.0, give_up - loop.time()))
    except TimeoutError:
        pass
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    end = loop.time()
    return [timings.get(offset) or RequestTiming(due_s=offset, latency_ms=(end - start - offset) * 1000, ok=False)
            for offset in due]


async def sweep(target: HttpTarget, plan: SweepPlan, settings: RunSettings, rng: random.Random,
                progress: Callable[[int, float, LoadStep, Verdict], None]) -> list[LoadStep]:
    """A few sequential warm-up requests, then load steps at the plan's rates until it says stop."""
    data = target.request_bytes()
    for _ in range(WARMUP_REQUESTS):
        try:
            if not await asyncio.wait_for(request_once(target, data), settings.timeout_s):
                raise ProfileRunError(f"{target.host}:{target.port}{target.path} answered a warm-up request with "
                                      "an error status")
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError) as error:
            raise ProfileRunError(f"{target.host}:{target.port}{target.path} did not answer a warm-up request: "
                                  f"{error or type(error).__name__}") from None
    history: list[tuple[float, Verdict]] = []
    steps: list[LoadStep] = []
    while (rate := plan.next_rate(history)) is not None:
        due = arrival_offsets(rate, settings, rng)
        if not due:
            history.append((rate, Verdict.OK))
            continue
        timings = await run_step(target, due, settings.seconds_per_step, concurrency=settings.concurrency,
                                 timeout_s=settings.timeout_s)
        step = analyse_step(timings, settings.seconds_per_step)
        verdict = step_verdict(step, settings.slo, settings.seconds_per_step)
        steps.append(step)
        history.append((rate, verdict))
        progress(len(steps), rate, step, verdict)
    if not steps:
        raise ProfileRunError("no load step had any request: raise --start-rps or --seconds-per-step")
    return steps


def arrival_offsets(rate: float, settings: RunSettings, rng: random.Random) -> list[float]:
    return arrival_times(rate, settings.seconds_per_step, settings.arrivals, rng)
