"""Workloads for the packing benchmark: the paper's mix and seeded random inference mixes.

The random mix follows the shapes of the FaST-GShare paper's profiling grid (time quotas
0.1..1, SM partitions 6..100 %) and the memory of common inference models: mostly small
CNNs and speech models, a quarter transformers, a few large models, and some best-effort
batch pods. A seed fixes the draw, so runs compare like with like.
"""

from __future__ import annotations

import random

from fastgshare.share import ShareSpec

GiB = 2**30

# (weight, request choices in permille, SM choices, memory range in MiB)
PROFILES: tuple[tuple[float, tuple[int, ...], tuple[int, ...], tuple[int, int]], ...] = (
    (0.40, (100, 200, 300, 400), (6, 12, 24), (800, 2_048)),          # CNN classifiers
    (0.20, (200, 300, 400, 500), (12, 24, 30), (1_536, 3_072)),       # speech / RNN
    (0.25, (300, 400, 500, 600), (24, 40, 50), (2_048, 5_120)),       # BERT-class transformers
    (0.10, (500, 600, 800, 1000), (50, 60, 80, 100), (5_120, 20_480)),  # large models
    (0.05, (0,), (100,), (1_024, 4_096)),                             # best-effort batch
)


def share(request: int, sm: int, memory: int, limit: int | None = None) -> ShareSpec:
    return ShareSpec(request_permille=request, limit_permille=limit or max(request, 1000 if request == 0 else request),
                     sm_percent=sm, memory_bytes=memory)


def paper_workload() -> list[tuple[str, ShareSpec]]:
    """4 x ResNet (12 % SM, 0.4), 2 x RNNT (24 %, 0.4), 2 x BERT (50 %, 0.6) of the paper."""
    pods = [(f"resnet-{i}", share(400, 12, 3 * GiB // 2)) for i in range(4)]
    pods += [(f"rnnt-{i}", share(400, 24, 3 * GiB // 2)) for i in range(2)]
    pods += [(f"bert-{i}", share(600, 50, 5 * GiB // 2)) for i in range(2)]
    return pods


def random_workload(count: int, seed: int) -> list[tuple[str, ShareSpec]]:
    """``count`` pods drawn from :data:`PROFILES`, in arrival order."""
    rng = random.Random(seed)
    weights = [profile[0] for profile in PROFILES]
    pods = []
    for i in range(count):
        _, requests, sms, (low, high) = rng.choices(PROFILES, weights)[0]
        memory = rng.randrange(low, high + 1, 128) * 2**20
        pods.append((f"pod-{i}", share(rng.choice(requests), rng.choice(sms), memory)))
    return pods
