"""Isolation accuracy: the GPU time each tenant really got, with the arbiter and without.

Real processes: tenants (``vgpu_hook/build/tenant``) run fake kernels on the fake GPU, with the
C hook and ``fastgshare-arbiter`` ("enforced") or with neither ("uncontrolled", what sharing
does without us). The fake GPU's own accounting measures each tenant's busy time. Scenarios:

a. one tenant alone, limit 0.3 (HAMi-style limits fail here: nobody else to compete with);
b. three saturating tenants, request/limit 0.2/0.3, 0.3/0.5, 0.1/1.0;
c. a bursty tenant (100 ms on, 100 ms off) beside a saturating one;
d. two tenants at SM 50, with MPS on (they run together) and off (they take turns);
e. one tenant alone at 0.25 whose kernels take 10 ms: the last kernel of each token runs past its
   end, and the arbiter's credit pays the overrun back (admitted by the window's usage alone, it
   got ~113 % of its limit).

Prints one JSON object. Per enforced tenant, ``floor`` is its request times the fraction of
time it wants the GPU, and ``error`` is how far ``achieved`` lies outside ``[floor, limit]``
(positive above the limit, negative below the floor, 0 inside). Scenario a also shows how
close a capped tenant runs to its limit.
Run: ``python -m bench.isolation [--seconds S]``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence

from fastgshare_cli.sandbox import TenantSpec, build_hook, measure_shares, sandbox

SCENARIOS: dict[str, tuple[list[TenantSpec], bool]] = {
    "a-alone-limit-0.3": ([TenantSpec(name="alone", request=0.1, limit=0.3)], True),
    "b-three-saturating": ([TenantSpec(name="t1", request=0.2, limit=0.3),
                            TenantSpec(name="t2", request=0.3, limit=0.5),
                            TenantSpec(name="t3", request=0.1, limit=1.0)], True),
    "c-bursty-beside-saturating": ([TenantSpec(name="bursty", request=0.4, limit=1.0, burst_on_ms=100,
                                               burst_off_ms=100),
                                    TenantSpec(name="steady", request=0.3, limit=1.0)], True),
    "d-sm50-mps-on": ([TenantSpec(name="h1", request=0.5, limit=1.0, sm=50),
                       TenantSpec(name="h2", request=0.5, limit=1.0, sm=50)], True),
    "d-sm50-mps-off": ([TenantSpec(name="h1", request=0.5, limit=1.0, sm=50),
                        TenantSpec(name="h2", request=0.5, limit=1.0, sm=50)], False),
    "e-10ms-kernels-limit-0.25": ([TenantSpec(name="long", request=0.25, limit=0.25, kernel_us=10_000)], True),
}


def tenant_report(spec: TenantSpec, achieved: float, enforced: bool) -> dict[str, object]:
    """Achieved share against the bounds that apply: never above the limit; at least the request
    while the tenant wants the GPU (a bursty tenant wants it only its on-fraction of the time)."""
    report: dict[str, object] = {"tenant": spec.name, "request": spec.request, "limit": spec.limit, "sm": spec.sm,
                                 "achieved": round(achieved, 4)}
    if enforced:
        duty = spec.burst_on_ms / (spec.burst_on_ms + spec.burst_off_ms) if spec.burst_on_ms else 1.0
        floor = spec.request * duty
        report["floor"] = round(floor, 4)
        report["vs_limit"] = round(achieved - spec.limit, 4)
        report["error"] = round(achieved - spec.limit if achieved > spec.limit else min(0.0, achieved - floor), 4)
    return report


def run(seconds: float) -> dict[str, object]:
    build = build_hook()
    results = []
    for name, (specs, mps) in SCENARIOS.items():
        row: dict[str, object] = {"scenario": name, "mps": mps}
        for enforced in (True, False):
            with sandbox(build, specs, mps=mps, arbiter=enforced) as box:
                shares = measure_shares(box, specs, seconds, hook=enforced)
            row["enforced" if enforced else "uncontrolled"] = [
                tenant_report(spec, shares[spec.name], enforced) for spec in specs]
        results.append(row)
    errors = [abs(float(t["error"])) for row in results for t in row["enforced"]]  # type: ignore[attr-defined]
    return {"benchmark": "isolation", "seconds_per_run": seconds, "max_abs_error": round(max(errors), 4),
            "results": results}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each run (default: %(default)s)")
    print(json.dumps(run(parser.parse_args(argv).seconds), indent=2))


if __name__ == "__main__":
    main()
