"""Arbiter token round trip and throughput (prints one JSON object).

Starts ``fastgshare-arbiter`` (the node agent's arbiter code, standalone) with one MPS GPU and
N pods of 1 % SM each, so all may hold tokens at once and the figures show the arbiter's own
cost, not waiting for the GPU. Each client is a process with the Python client
(:class:`~device_plugin.arbiter.client.HookClient`). Two ways:

- closed loop, 1, 8 and 64 clients: ask for a token, "use" it (tokens are the 20 µs minimum),
  ask again. The throughput (``grants_per_s``; the best is ``peak_grants_per_s``); by Little's law
  the latency is clients ÷ throughput, so it says little about what one tenant waits;
- open loop, 64 clients each renewing every 10 ms (6,400 grants/s offered): what a tenant waits
  for a token at a realistic renewal rate (``round_trip_us_p99``). A client that falls behind
  does not catch up in a burst: it skips the missed slots.

Run: ``python -m bench.arbiter``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from device_plugin.arbiter.client import HookClient
from fastgshare import keys

GPU = "GPU-bench-0"


def _client(socket_path: str, pod: str, seconds: float, interval_s: float | None,
            results: multiprocessing.Queue) -> None:
    """Ask for tokens for ``seconds``: back to back, or one every ``interval_s`` (open loop)."""
    client = HookClient(Path(socket_path))
    client.hello(pod, GPU)
    latencies = []
    used = 0
    start = time.monotonic()
    deadline = start + seconds
    next_at = start
    while (now := time.monotonic()) < deadline:
        if interval_s is not None:
            if now < next_at:
                time.sleep(next_at - now)
            next_at += interval_s * max(1, int((time.monotonic() - next_at) // interval_s) + 1)
        started = time.perf_counter_ns()
        used = client.token(used)
        latencies.append(time.perf_counter_ns() - started)
    client.close()
    results.put(latencies)


def _shares_file(path: Path, clients: int) -> None:
    pods = [{"pod": f"bench/c{i}", "gpu": GPU, "annotations": {
        keys.GPU_QUOTA_REQUEST: "0", keys.GPU_QUOTA_LIMIT: "1", keys.GPU_SM_PARTITION: "1", keys.GPU_MEM: "1Mi"}}
        for i in range(clients)]
    path.write_text(json.dumps({"gpus": [{"uuid": GPU, "mps": True}], "pods": pods}))


def measure(clients: int, seconds: float, interval_s: float | None = None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="fgs-bench-") as directory:
        socket_path, shares = Path(directory) / "arbiter.sock", Path(directory) / "shares.json"
        _shares_file(shares, clients)
        arbiter = subprocess.Popen(
            [sys.executable, "-m", "device_plugin.arbiter.standalone", "--socket", str(socket_path),
             "--shares", str(shares), "--trusted-env", "--min-token-ms", "0.02", "--log-level", "warning"],
            stdout=subprocess.PIPE, text=True)
        try:
            ready = arbiter.stdout.readline() if arbiter.stdout else ""
            if "arbiter ready" not in ready:
                raise RuntimeError(f"fastgshare-arbiter did not start (said {ready!r})")
            results: multiprocessing.Queue = multiprocessing.Queue()
            workers = [multiprocessing.Process(target=_client, args=(str(socket_path), f"bench/c{i}", seconds,
                                                                     interval_s, results)) for i in range(clients)]
            for worker in workers:
                worker.start()
            latencies = sorted(ns for _ in workers for ns in results.get(timeout=seconds + 60))
            for worker in workers:
                worker.join()
        finally:
            arbiter.terminate()
            arbiter.wait(10)
    return {
        "clients": clients,
        **({"interval_ms": round(interval_s * 1000, 3), "offered_grants_per_s": round(clients / interval_s)}
           if interval_s is not None else {}),
        "grants": len(latencies),
        "grants_per_s": round(len(latencies) / seconds),
        "round_trip_us_p50": round(statistics.median(latencies) / 1000, 1),
        "round_trip_us_p99": round(latencies[int(len(latencies) * 0.99)] / 1000, 1),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--interval-ms", type=float, default=10.0, help="open loop: each client's renewal period")
    args = parser.parse_args(argv)
    closed = [measure(clients, args.seconds) for clients in (1, 8, 64)]
    open_loop = measure(64, args.seconds, interval_s=args.interval_ms / 1000)
    print(json.dumps({"benchmark": "arbiter", "cpus": os.cpu_count(), "client": "python",
                      "peak_grants_per_s": max(int(str(result["grants_per_s"])) for result in closed),
                      "results": [*closed, open_loop]}, indent=2))


if __name__ == "__main__":
    main()
