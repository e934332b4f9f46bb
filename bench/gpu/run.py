"""The isolation and overhead check on a real NVIDIA GPU (run where one is lent; < 5 minutes).

Builds the hook (``make -C vgpu_hook``; at run time it loads the real ``libcuda.so.1``) and
``bench/gpu/tenant.cu`` (nvcc; a CUDA-runtime program, so the driver is reached through
cudart's dlopen + cuGetProcAddress, the path the hook must catch), starts the arbiter, and runs
the isolation scenarios with real kernels three ways: enforced with the hook's default (a
``cuCtxSynchronize`` when a token ends, so queued kernels cannot run into the next holder's time),
enforced without it (``FASTGSHARE_SYNC_AT_TOKEN_END=0``: launches return at once and the queue
drains after the token), and uncontrolled. Each tenant measures its own kernels with CUDA events
(GPU timestamps). Then the launch overhead (tiny kernels without the hook, with it, and with it but
no sync at token end) and the memory coverage matrix against the real driver and NVML. The two
enforced columns side by side settle whether the sync's cost buys the limit.

Needs only the standard library and attrs besides the project (no Flask, kubernetes, PyYAML).
Run from the repository root: ``python3 bench/gpu/run.py [--seconds S]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from fastgshare_cli.sandbox import build_hook  # noqa: E402 - the path is set just above

GPU = "GPU-real-0"
SCENARIOS = {
    "a-alone-limit-0.3": [("alone", 0.1, 0.3, 0, 0)],
    "b-three-saturating": [("t1", 0.2, 0.3, 0, 0), ("t2", 0.3, 0.5, 0, 0), ("t3", 0.1, 1.0, 0, 0)],
    "c-bursty-beside-saturating": [("bursty", 0.4, 1.0, 100, 100), ("steady", 0.3, 1.0, 0, 0)],
}


def build_tenant(workdir: Path) -> Path:
    binary = workdir / "gpu_tenant"
    nvcc = os.environ.get("NVCC", "nvcc")
    subprocess.run([nvcc, "-O2", "-o", str(binary), str(REPO / "bench" / "gpu" / "tenant.cu")], check=True)
    return binary


def start_arbiter(workdir: Path, tenants: list[tuple[str, float, float, int, int]]) -> subprocess.Popen[str]:
    shares = workdir / "shares.json"
    shares.write_text(json.dumps({"gpus": [{"uuid": GPU, "mps": False}], "pods": [
        {"pod": f"gpu/{name}", "gpu": GPU, "annotations": {
            "fastgshare/gpu_quota_request": str(request), "fastgshare/gpu_quota_limit": str(limit),
            "fastgshare/gpu_sm_partition": "100", "fastgshare/gpu_mem": "8Gi"}}
        for name, request, limit, _, _ in tenants]}))
    process = subprocess.Popen(
        [sys.executable, "-m", "device_plugin.arbiter.standalone", "--socket", str(workdir / "arbiter.sock"),
         "--shares", str(shares), "--trusted-env", "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if process.stdout is None or "arbiter ready" not in process.stdout.readline():
        raise RuntimeError("the arbiter did not start")
    return process


def run_tenants(tenant: Path, hook: Path | None, workdir: Path, tenants: list[tuple[str, float, float, int, int]],
                *, seconds: float, kernel_us: float = 500, sync: bool = True) -> dict[str, dict[str, float]]:
    processes = {}
    for name, _, _, on_ms, off_ms in tenants:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FASTGSHARE_") and k != "LD_PRELOAD"}
        if hook is not None:
            env.update({"LD_PRELOAD": str(hook), "FASTGSHARE_ARBITER_SOCKET": str(workdir / "arbiter.sock"),
                        "FASTGSHARE_POD": f"gpu/{name}", "FASTGSHARE_GPU_UUID": GPU,
                        "FASTGSHARE_SYNC_AT_TOKEN_END": "1" if sync else "0"})
        args = [str(tenant), "--seconds", str(seconds), "--kernel-us", str(kernel_us)]
        if on_ms:
            args += ["--burst-on-ms", str(on_ms), "--burst-off-ms", str(off_ms)]
        processes[name] = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    results = {}
    for name, process in processes.items():
        stdout, _ = process.communicate(timeout=seconds + 120)
        summary = json.loads(stdout.strip().splitlines()[-1])
        results[name] = {"achieved": round(summary["busy_ms"] / summary["wall_ms"], 4),
                         "kernels": summary["kernels"], "first_error": summary["first_error"]}
    return results


def launch_ns(tenant: Path, hook: Path | None, workdir: Path, *, sync: bool = True) -> float:
    tenants = [("overhead", 1.0, 1.0, 0, 0)]
    result = run_tenants(tenant, hook, workdir, tenants, seconds=3, kernel_us=0, sync=sync)["overhead"]
    return round(3e9 / max(int(result["kernels"]), 1), 1)


def memory_matrix() -> object:
    """The memory coverage matrix against the real driver and NVML (every allocation path x every
    way of reaching the driver), as the CI runs it on the fake GPU."""
    result = subprocess.run([sys.executable, "-m", "tests.integration.hook.memory_matrix", "--real", "--json"],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                            timeout=300, check=False)
    try:
        return json.loads(result.stdout)
    except ValueError:
        return {"error": f"exit {result.returncode}: {result.stderr[-2000:]}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    args = parser.parse_args()
    started = time.monotonic()
    hook = build_hook().hook
    report: dict[str, object] = {"benchmark": "gpu-isolation", "seconds_per_run": args.seconds}
    with tempfile.TemporaryDirectory(prefix="fgs-gpu-") as directory:
        workdir = Path(directory)
        tenant = build_tenant(workdir)
        report["gpu"] = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                       capture_output=True, text=True, check=False).stdout.strip()
        scenarios = []
        for name, tenants in SCENARIOS.items():
            enforced = {}
            for sync in (True, False):
                arbiter = start_arbiter(workdir, tenants)
                try:
                    enforced[sync] = run_tenants(tenant, hook, workdir, tenants, seconds=args.seconds, sync=sync)
                finally:
                    arbiter.terminate()
                    arbiter.wait(10)
            uncontrolled = run_tenants(tenant, None, workdir, tenants, seconds=args.seconds)
            scenarios.append({"scenario": name, "tenants": [
                {"tenant": t[0], "request": t[1], "limit": t[2], "enforced": enforced[True][t[0]],
                 "enforced_no_sync_at_token_end": enforced[False][t[0]], "uncontrolled": uncontrolled[t[0]]}
                for t in tenants]})
        report["results"] = scenarios
        arbiter = start_arbiter(workdir, [("overhead", 1.0, 1.0, 0, 0)])
        try:
            report["launch_plus_sync_ns"] = {"no_hook": launch_ns(tenant, None, workdir),
                                             "hook": launch_ns(tenant, hook, workdir),
                                             "hook_no_sync_at_token_end": launch_ns(tenant, hook, workdir, sync=False)}
        finally:
            arbiter.terminate()
            arbiter.wait(10)
    report["memory_matrix"] = memory_matrix()
    report["elapsed_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
