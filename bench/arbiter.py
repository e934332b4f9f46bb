"""Arbiter token throughput and round trip (prints one JSON object).

Starts ``fastgshare-arbiter`` (the node agent's arbiter code, standalone) with one MPS GPU and
N pods of request 0, limit 1 and 1 % SM each: a limit of 1 never throttles and N <= 100 such
pods fit on the SMs together, so every request is granted at once and the figures show the
arbiter's own cost (read, decide, reply: the hot path every renewal takes), not waiting for the
GPU or for a share. Tokens are the 20 µs minimum (``--min-token-ms 0.02``) so they have ended
before the next request, as with a client that renews when its token is over.

The clients are ``bench/arbiter_load.c``, built here with the hook's own client code
(``vgpu_hook/src/arbiter_client.c``) for connect and HELLO: one C thread drives all N
connections with epoll, so on its own core it is not the bottleneck. Two ways:

- closed loop, 1, 8 and 64 clients: ask for a token, "use" it, ask again. The throughput
  (``grants_per_s``; the best is ``peak_grants_per_s``); by Little's law the latency is
  clients ÷ throughput, so it says little about what one tenant waits;
- open loop, 64 clients each renewing every 10 ms at a random phase (6,400 grants/s offered):
  what a tenant waits for a token at a realistic renewal rate (``round_trip_us_p99``, from the
  request's send to the grant's receipt). A client that falls behind skips the missed slots.

Each result also gives the arbiter's CPU time per grant (``arbiter_cpu_us_per_grant``): the
machine is shared and small, so the rates move with what else runs; the CPU cost does less.

The same two loads (64 clients) then run against ``bench/null_arbiter.c``, a C server that
answers every TOKEN at once with no policy and no accounting (``null_arbiter``): the protocol's
floor on this machine, what unix sockets, wake-ups and the load generator cost, as
``bench.null_extender`` is for the extender.

Run: ``python -m bench.arbiter``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from bench.c_programs import HOOK_SOURCE, ROOT, compile_program
from bench.cpu import process_cpu_seconds
from fastgshare import keys

GPU = "GPU-bench-0"
LOAD_SOURCE = ROOT / "bench" / "arbiter_load.c"
NULL_SOURCE = ROOT / "bench" / "null_arbiter.c"


def build_load(directory: Path) -> Path:
    """Compile the C load generator with the hook's client code; returns the binary."""
    return compile_program(directory / "arbiter_load", LOAD_SOURCE, HOOK_SOURCE / "arbiter_client.c")


def build_null_arbiter(directory: Path) -> Path:
    """Compile the policy-free C server (the floor); returns the binary."""
    return compile_program(directory / "null_arbiter", NULL_SOURCE)


def _shares_file(path: Path, clients: int) -> None:
    pods = [{"pod": f"bench/c{i}", "gpu": GPU, "annotations": {
        keys.GPU_QUOTA_REQUEST: "0", keys.GPU_QUOTA_LIMIT: "1", keys.GPU_SM_PARTITION: "1", keys.GPU_MEM: "1Mi"}}
        for i in range(clients)]
    path.write_text(json.dumps({"gpus": [{"uuid": GPU, "mps": True}], "pods": pods}))


def measure(load: Path, clients: int, seconds: float, interval_s: float | None = None,
            null_arbiter: Path | None = None) -> dict[str, object]:
    """One load against fastgshare-arbiter, or against ``null_arbiter`` when given."""
    with tempfile.TemporaryDirectory(prefix="fgs-bench-") as directory:
        socket_path, shares = Path(directory) / "arbiter.sock", Path(directory) / "shares.json"
        _shares_file(shares, clients)
        command = [str(null_arbiter), str(socket_path)] if null_arbiter is not None else [
            sys.executable, "-m", "device_plugin.arbiter.standalone", "--socket", str(socket_path),
            "--shares", str(shares), "--trusted-env", "--min-token-ms", "0.02", "--log-level", "warning"]
        arbiter = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        try:
            ready = arbiter.stdout.readline() if arbiter.stdout else ""
            if "arbiter ready" not in ready:
                raise RuntimeError(f"{command[0]} did not start (said {ready!r})")
            interval_us = 0.0 if interval_s is None else interval_s * 1e6
            cpu_before = process_cpu_seconds(arbiter.pid)
            out = subprocess.run([str(load), str(socket_path), "bench/c", GPU, str(clients), str(seconds),
                                  str(interval_us)], check=True, capture_output=True, text=True, timeout=seconds + 60)
            cpu_s = process_cpu_seconds(arbiter.pid) - cpu_before
            result = json.loads(out.stdout)
        finally:
            arbiter.terminate()
            arbiter.wait(10)
    return {
        "clients": clients,
        **({"interval_ms": round(interval_s * 1000, 3), "offered_grants_per_s": round(clients / interval_s)}
           if interval_s is not None else {}),
        "grants": result["grants"],
        "grants_per_s": result["grants_per_s"],
        **{key: result[key] for key in ("round_trip_us_p50", "round_trip_us_p99", "round_trip_us_p999",
                                        "round_trip_us_max")},
        # The arbiter's own CPU time per grant (user + system, HELLOs and warm-up included): what
        # the hot path costs, less sensitive than the rates to what else runs on the machine.
        "arbiter_cpu_us_per_grant": round(cpu_s * 1e6 / max(1, int(result["grants_total"])), 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--interval-ms", type=float, default=10.0, help="open loop: each client's renewal period")
    args = parser.parse_args(argv)
    interval_s = args.interval_ms / 1000
    with tempfile.TemporaryDirectory(prefix="fgs-bench-load-") as build:
        load, null = build_load(Path(build)), build_null_arbiter(Path(build))
        closed = [measure(load, clients, args.seconds) for clients in (1, 8, 64)]
        open_loop = measure(load, 64, args.seconds, interval_s=interval_s)
        floor = [measure(load, 64, args.seconds, null_arbiter=null),
                 measure(load, 64, args.seconds, interval_s=interval_s, null_arbiter=null)]
    print(json.dumps({"benchmark": "arbiter", "cpus": os.cpu_count(), "client": "c (bench/arbiter_load.c)",
                      "peak_grants_per_s": max(int(str(result["grants_per_s"])) for result in closed),
                      "round_trip_us_p99": open_loop["round_trip_us_p99"],
                      "null_arbiter_peak_grants_per_s": floor[0]["grants_per_s"],
                      "null_arbiter_round_trip_us_p99": floor[1]["round_trip_us_p99"],
                      "results": [*closed, open_loop], "null_arbiter": floor}, indent=2))


if __name__ == "__main__":
    main()
