"""Cost of the hook per kernel launch: the same program with and without it, in one run.

The tenant program launches N empty kernels (0 µs) on the simulated GPU and waits for them once, at
the end (``--sync end``; the simulated GPU's launches are asynchronous, with a bounded queue), so
the time per launch is the launch path itself: the simulated driver alone ("no_hook"), and through the C hook holding a
token ("hook"): one clock read and one atomic load per launch, plus a token renewal (a round
trip to the arbiter) every window. Two hook settings: the default 100 ms window, and a 10 s
window where the run holds one token throughout (the pure hot path). Each figure is the
median of ``--repeats`` runs. Run: ``python -m bench.hook_overhead``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence

from fastgshare_cli.sandbox import HookBuild, TenantSpec, build_hook, sandbox

SPEC = TenantSpec(name="overhead", request=1.0, limit=1.0)


def ns_per_launch(build: HookBuild, launches: int, repeats: int, *, hook: bool, window_ms: float) -> float:
    samples = []
    with sandbox(build, [SPEC], arbiter=hook, window_ms=window_ms) as box:
        for _ in range(repeats):
            summary = box.run_tenant(SPEC, "--launches", str(launches), "--duration-us", "0", "--sync", "end",
                                     hook=hook)
            if summary["launches"] != launches:
                raise RuntimeError(f"tenant launched {summary['launches']} of {launches}: {summary}")
            samples.append(float(summary["elapsed_s"]) * 1e9 / launches)  # type: ignore[arg-type]
    return statistics.median(samples)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--launches", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    build = build_hook()
    plain = ns_per_launch(build, args.launches, args.repeats, hook=False, window_ms=100)
    held = ns_per_launch(build, args.launches, args.repeats, hook=True, window_ms=10_000)
    default = ns_per_launch(build, args.launches, args.repeats, hook=True, window_ms=100)
    print(json.dumps({
        "benchmark": "hook_overhead", "launches": args.launches, "repeats": args.repeats,
        "ns_per_launch": {"no_hook": round(plain, 1), "hook_token_held": round(held, 1),
                          "hook_default_window": round(default, 1)},
        "overhead_ns": {"token_held": round(held - plain, 1), "default_window": round(default - plain, 1)},
    }, indent=2))


if __name__ == "__main__":
    main()
