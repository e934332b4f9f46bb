"""``fastgshare demo``: three tenants sharing one simulated GPU under the real enforcement path.

It builds the hook, the fake GPU driver and the tenant program, starts the arbiter with one
simulated GPU, runs the tenants under the hook (different request/limit/SM, one of them
bursty), shows a live table of configured versus achieved share (measured by the fake GPU,
not by the arbiter), and ends with a summary and, with ``--plot FILE``, a PNG of each tenant's
share over time.

Before it runs, it checks the tenants as the scheduler would place them on one GPU (the core's
ledger: time x SM rectangles) and warns when they over-commit it. Ctrl-C stops the tenants and
the arbiter and exits 130.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
from rich.console import Console
from rich.live import Live
from rich.table import Table

from fastgshare import keys
from fastgshare.errors import LedgerError
from fastgshare.inventory import GpuDevice
from fastgshare.ledger import GpuLedger
from fastgshare.share import ShareSpec
from fastgshare_cli.sandbox import GPU_UUID, Sandbox, SandboxError, TenantSpec, build_hook, sandbox

DEFAULT_TENANTS = (
    TenantSpec(name="resnet", request=0.3, limit=0.5, sm=40),
    TenantSpec(name="bert", request=0.4, limit=0.6, sm=60),
    TenantSpec(name="bursty", request=0.2, limit=1.0, sm=30, burst_on_ms=400, burst_off_ms=400),
)
TENANT_HELP = "NAME:REQUEST:LIMIT:SM[:ON_MS:OFF_MS], e.g. resnet:0.3:0.5:40 or spiky:0.2:1:30:400:400"
SAMPLE_S = 0.25
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


class DemoError(Exception):
    """Bad demo arguments or a failed run; the message says what to change."""


def parse_tenant(text: str) -> TenantSpec:
    """A tenant from ``NAME:REQUEST:LIMIT:SM[:ON_MS:OFF_MS]``."""
    parts = text.split(":")
    if len(parts) not in (4, 6):
        raise DemoError(f'tenant "{text}" is malformed; allowed: {TENANT_HELP}')
    try:
        request, limit, sm = float(parts[1]), float(parts[2]), int(parts[3])
        on_ms, off_ms = (float(parts[4]), float(parts[5])) if len(parts) == 6 else (0.0, 0.0)
    except ValueError:
        raise DemoError(f'tenant "{text}": request and limit must be numbers, SM an integer; '
                        f"allowed: {TENANT_HELP}") from None
    if not (parts[0] and 0 <= request <= limit <= 1 and limit > 0 and 1 <= sm <= 100 and on_ms >= 0 and off_ms >= 0):
        raise DemoError(f'tenant "{text}": need a name, 0 <= request <= limit <= 1, limit > 0, SM 1..100')
    return TenantSpec(name=parts[0], request=request, limit=limit, sm=sm, burst_on_ms=on_ms, burst_off_ms=off_ms)


def overcommit_warning(specs: Sequence[TenantSpec]) -> str | None:
    """A warning if the tenants' time x SM rectangles do not all fit one GPU, as the extender judges
    (the arbiter then cannot give every tenant its request); ``None`` if they fit."""
    gpu = GpuDevice(uuid=GPU_UUID, index=0, model="simulated", memory_bytes=2**62, sm_count=keys.SM_UNITS,
                    healthy=True, mps_enabled=True)
    ledger = GpuLedger(gpu, slots=max(len(specs), 1))
    for spec in specs:
        share = ShareSpec(request_permille=math.ceil(spec.request * keys.TIME_UNITS),
                          limit_permille=math.ceil(spec.limit * keys.TIME_UNITS), sm_percent=spec.sm, memory_bytes=1)
        try:
            ledger.add(spec.name, share)
        except LedgerError:
            beside = ", ".join(ledger.pods) or "nothing"
            return (f"warning: these tenants over-commit the GPU: {spec.name} ({spec.request:g} of the time on "
                    f"{spec.sm} percent of the SMs) does not fit beside {beside}, so the scheduler would not place "
                    "them together and the arbiter cannot give every tenant its request")
    return None


@attrs.define
class Timeline:
    """Each tenant's share of GPU time per sampling interval."""

    times_s: list[float] = attrs.field(factory=list)
    shares: dict[str, list[float]] = attrs.field(factory=dict)

    def add(self, at_s: float, shares: dict[str, float]) -> None:
        self.times_s.append(at_s)
        for name, share in shares.items():
            self.shares.setdefault(name, []).append(share)


def run_demo(specs: Sequence[TenantSpec], seconds: float, console: Console, plot: Path | None) -> int:
    if len({spec.name for spec in specs}) != len(specs):
        raise DemoError("tenant names must be unique")
    if plot is not None:
        _check_plotting()
    console.print("building the hook, the fake GPU driver and the tenant program ...")
    build = build_hook()
    with sandbox(build, specs) as box:
        console.print(f"arbiter up on {box.socket}; running {len(specs)} tenants for {seconds:.0f} s "
                      "on one simulated GPU (100 SM units, MPS on)")
        timeline, totals = _watch(box, specs, seconds, console)
        box.wait_tenants(timeout_s=30)
    console.print()
    console.print(_summary(specs, totals))
    if plot is not None:
        _plot(specs, timeline, plot)
        console.print(f"plot written to {plot}")
    return 0


def _watch(box: Sandbox, specs: Sequence[TenantSpec], seconds: float,
           console: Console) -> tuple[Timeline, dict[str, float]]:
    start_at = box.start_tenants(specs, seconds)
    time.sleep(max(0.0, (start_at - time.monotonic_ns()) / 1e9))
    timeline = Timeline()
    previous = {spec.name: 0 for spec in specs}
    previous_at = start_at
    totals: dict[str, float] = {spec.name: 0.0 for spec in specs}
    with Live(_table(specs, {}, {}, 0.0), console=console, refresh_per_second=4) as live:
        while time.monotonic_ns() < start_at + int(seconds * 1e9):
            time.sleep(SAMPLE_S)
            snapshot, now = box.sample(), time.monotonic_ns()
            busy = box.busy_ns(snapshot) if snapshot else previous
            interval = {name: (busy[name] - previous[name]) / (now - previous_at) for name in busy}
            elapsed_s = (now - start_at) / 1e9
            totals = {name: busy[name] / (now - start_at) for name in busy}
            timeline.add(elapsed_s, interval)
            live.update(_table(specs, interval, totals, elapsed_s))
            previous, previous_at = busy, now
    return timeline, totals


def _table(specs: Sequence[TenantSpec], interval: dict[str, float], totals: dict[str, float],
           elapsed_s: float) -> Table:
    table = Table(title=f"one simulated GPU, {elapsed_s:4.1f} s", title_justify="left")
    for column in ("tenant", "request", "limit", "SM %", "pattern", "now", "so far"):
        table.add_column(column, justify="left" if column in ("tenant", "pattern") else "right")
    for spec in specs:
        pattern = f"{spec.burst_on_ms:.0f}/{spec.burst_off_ms:.0f} ms on/off" if spec.burst_on_ms else "saturating"
        table.add_row(spec.name, f"{spec.request:.2f}", f"{spec.limit:.2f}", str(spec.sm), pattern,
                      _percent(interval.get(spec.name)), _percent(totals.get(spec.name)))
    return table


def _percent(value: float | None) -> str:
    return "" if value is None else f"{value:6.1%}"


def _summary(specs: Sequence[TenantSpec], totals: dict[str, float]) -> Table:
    table = Table(title="achieved share of GPU time (measured by the fake GPU)", title_justify="left")
    for column in ("tenant", "request", "limit", "achieved", "verdict"):
        table.add_column(column)
    for spec in specs:
        achieved = totals.get(spec.name, 0.0)
        duty = spec.burst_on_ms / (spec.burst_on_ms + spec.burst_off_ms) if spec.burst_on_ms else 1.0
        if achieved > spec.limit + 0.02:
            verdict = "[red]above its limit[/red]"
        elif achieved < spec.request * duty - 0.02:
            verdict = "[red]below its request[/red]"
        else:
            verdict = "[green]within request..limit[/green]" + (" (while active)" if duty < 1 else "")
        table.add_row(spec.name, f"{spec.request:.2f}", f"{spec.limit:.2f}", f"{achieved:.1%}", verdict)
    return table


def _check_plotting() -> None:
    try:
        import matplotlib  # noqa: F401, PLC0415 - optional: only --plot needs it
    except ImportError:
        raise DemoError("--plot needs matplotlib: pip install matplotlib (make install includes it)") from None


def _plot(specs: Sequence[TenantSpec], timeline: Timeline, path: Path) -> None:
    import matplotlib  # noqa: PLC0415 - optional dependency, checked before the run

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    figure, axes = plt.subplots(figsize=(9, 4.5))
    for index, spec in enumerate(specs):
        color = f"C{index}"
        axes.plot(timeline.times_s, timeline.shares.get(spec.name, []), color=color, label=spec.name)
        axes.axhline(spec.limit, color=color, linestyle="--", linewidth=0.8)
        axes.axhline(spec.request, color=color, linestyle=":", linewidth=0.8)
    axes.set_xlabel("time (s)")
    axes.set_ylabel(f"share of GPU time per {SAMPLE_S * 1000:.0f} ms")
    axes.set_ylim(0, 1.05)
    axes.set_title("fastgshare demo: achieved share (solid), limit (dashed), request (dotted)")
    axes.legend(loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def demo_main(tenants: Sequence[str] | None, seconds: float, plot: str | None, console: Console,
              errors: Console) -> int:
    try:
        specs = [parse_tenant(text) for text in tenants] if tenants else list(DEFAULT_TENANTS)
        if seconds < 2:
            raise DemoError(f"--seconds must be at least 2, got {seconds:g}")
        if (warning := overcommit_warning(specs)) is not None:
            errors.print(warning, markup=False, highlight=False)
        return run_demo(specs, seconds, console, Path(plot) if plot else None)
    except (DemoError, SandboxError) as error:
        errors.print(f"fastgshare demo: {error}", markup=False, highlight=False)
        return 1
    except KeyboardInterrupt:  # the sandbox has stopped its processes on the way out
        errors.print("fastgshare demo: interrupted; the tenants and the arbiter are stopped", markup=False,
                     highlight=False)
        return EXIT_INTERRUPTED
