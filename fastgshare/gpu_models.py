"""Nominal figures of common datacenter GPUs, for planning without a cluster.

Memory is the marketed size (the driver reports slightly less); SM counts are the full
product's. Used by ``fastgshare pack --gpu MODEL``; a GPU spec string such as
``16GiB:80sm`` covers anything not listed.
"""

from __future__ import annotations

from fastgshare.errors import InvalidInventory
from fastgshare.inventory import GPU_SPEC_HELP, GpuSpec, parse_gpu_spec

GiB = 2**30

KNOWN_MODELS: dict[str, tuple[int, int]] = {
    # name: (memory bytes, SM count)
    "T4": (16 * GiB, 40),
    "V100-16GB": (16 * GiB, 80),
    "V100-32GB": (32 * GiB, 80),
    "A10": (24 * GiB, 72),
    "L4": (24 * GiB, 58),
    "A100-40GB": (40 * GiB, 108),
    "A100-80GB": (80 * GiB, 108),
    "H100-80GB": (80 * GiB, 132),
    "H200": (141 * 10**9, 132),
}


def gpu_model_spec(name: str) -> GpuSpec:
    """One GPU of a known model (case-insensitive), or of a spec like ``"16GiB:80sm"``."""
    for model, (memory, sms) in KNOWN_MODELS.items():
        if model.lower() == name.strip().lower():
            return GpuSpec(count=1, model=model, memory_bytes=memory, sm_count=sms)
    try:
        return parse_gpu_spec(name if "x" in name.rsplit("=", maxsplit=1)[-1] else f"1x{name}")
    except InvalidInventory:
        known = ", ".join(KNOWN_MODELS)
        raise InvalidInventory(
            f'GPU model "{name}" is unknown; allowed: one of {known}, or a spec {GPU_SPEC_HELP}'
        ) from None
