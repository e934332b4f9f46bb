"""How many GPUs each placement method needs, side by side (prints one JSON object).

For the paper's mixed workload and seeded random workloads of 100 and 1,000 pods:

- ``ours_offline``: ``fastgshare pack`` (largest first, Maximal Rectangles + memory, binpack);
- ``ours_online``: the same ledger fed in arrival order, as the scheduler extender sees pods;
- ``lower_bound``: ``max(ceil(sum area / bin area), ceil(sum memory / GPU memory))``;
- ``one_pod_per_gpu``: what the NVIDIA device plugin without sharing needs;
- ``original_rule``: FaST-GShare v2's admission (``sum r*s/100 <= 1`` and memory, first fit,
  arrival order), and ``original_rule_unservable``: how many of its GPUs hold a set that no
  schedule can serve (exact LP test, :mod:`bench.schedulability`).

Run: ``python -m bench.packing [--gpu MODEL] [--seed N]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence

from bench.schedulability import servable
from bench.workloads import paper_workload, random_workload
from fastgshare import keys
from fastgshare.fleet import pack_fleet
from fastgshare.gpu_models import gpu_model_spec
from fastgshare.inventory import GpuSpec
from fastgshare.packing import BIN
from fastgshare.share import ShareSpec

Pods = list[tuple[str, ShareSpec]]


def lower_bound(pods: Pods, gpu: GpuSpec) -> int:
    area = sum(share.area for _, share in pods)
    memory = sum(share.memory_bytes for _, share in pods)
    return max(math.ceil(area / BIN.area), math.ceil(memory / gpu.memory_bytes), 1)


def original_rule(pods: Pods, gpu: GpuSpec) -> list[list[ShareSpec]]:
    """FaST-GShare v2 admission: first GPU where sum(r*s/100) <= 1 and memory fits."""
    gpus: list[list[ShareSpec]] = []
    for _, share in pods:
        for held in gpus:
            compute = sum(s.request_permille * s.sm_percent for s in held) + share.area
            memory = sum(s.memory_bytes for s in held) + share.memory_bytes
            if compute <= keys.TIME_UNITS * keys.SM_UNITS and memory <= gpu.memory_bytes:
                held.append(share)
                break
        else:
            gpus.append([share])
    return gpus


def measure(name: str, pods: Pods, gpu: GpuSpec) -> dict[str, object]:
    started = time.perf_counter()
    offline = pack_fleet(pods, gpu)
    offline_seconds = time.perf_counter() - started
    online = pack_fleet(pods, gpu, largest_first=False)
    original = original_rule(pods, gpu)
    bound = lower_bound(pods, gpu)
    used = len(offline.gpus)
    return {
        "workload": name,
        "pods": len(pods),
        "lower_bound": bound,
        "ours_offline": used,
        "ours_online": len(online.gpus),
        "one_pod_per_gpu": len(pods),
        "original_rule": len(original),
        "original_rule_unservable": sum(1 for held in original if not servable(held)),
        "ours_unservable": sum(1 for ledger in offline.gpus if not servable(list(ledger.pods.values()))),
        "ours_offline_over_bound": round(used / bound - 1, 4),
        "ours_online_over_bound": round(len(online.gpus) / bound - 1, 4),
        "ours_unplaced": len(offline.unplaced),
        "ours_offline_seconds": round(offline_seconds, 3),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu", default="A100-40GB", help="GPU model for the random workloads")
    parser.add_argument("--seed", type=int, default=2023)
    args = parser.parse_args(argv)
    random_gpu = gpu_model_spec(args.gpu)
    results = [measure("paper-mix", paper_workload(), gpu_model_spec("V100-16GB"))]
    results += [measure(f"random-{count}", random_workload(count, args.seed + count), random_gpu)
                for count in (100, 1000)]
    print(json.dumps({"benchmark": "packing", "gpu_random": random_gpu.model, "seed": args.seed,
                      "results": results}, indent=2))


if __name__ == "__main__":
    main()
