"""The CUDA context reserve: the ``--context-reserve`` flag (the node agent publishes it per GPU;
``fastgshare plan`` plans with it) and the default per GPU generation it means by ``auto``.

Every process that uses a GPU holds a CUDA context there: the driver's own state, the loaded
kernel images and the local-memory (stack) reservation for every thread the GPU can run at once.
None of it passes through the hook's allocation calls, so a pod's ``gpu_mem`` does not cover it;
the extender charges each pod ``gpu_mem`` plus the reserve its GPU publishes
(:attr:`fastgshare.inventory.GpuDevice.context_reserve_bytes`).

``auto`` picks a figure per generation, from the GPU's model name. Hopper's is measured (the GPU-day
script's part ``c_context_memory`` on an H200, ``bench/gpu/memory.py``, docs/benchmarks.md); the
others are estimates, to be replaced by what that part measures on them: the local-memory
reservation (SMs x resident threads per SM x the default 1 KiB stack) of the generation's
largest data-centre part, plus about 150 MiB for the context itself and lazily loaded modules
(CUDA 12), rounded up. A model no pattern knows gets the largest figure. The simulated GPU charges
no context memory, so ``auto`` is 0 there; a quantity given to the flag applies to every GPU,
simulated or not.
"""

from __future__ import annotations

import re

import attrs

from fastgshare.inventory import GpuDevice
from fastgshare.quantity import format_bytes, parse_bytes

MiB = 2**20
AUTO = "auto"
CONTEXT_RESERVE_HELP = ('a byte quantity such as 300Mi (0: none), or "auto": a default per GPU generation on '
                        "real GPUs, 0 on simulated ones")


@attrs.frozen
class Generation:
    """A GPU generation, the model names that belong to it and its default reserve."""

    name: str
    pattern: re.Pattern[str]
    reserve_bytes: int


# First match wins; the names are NVML's (e.g. "Tesla V100-SXM2-16GB", "NVIDIA H100 80GB HBM3").
GENERATIONS: tuple[Generation, ...] = (
    # Measured: 527 MiB a process on an H200 (driver 580.159.04, CUDA 13; the GPU day's c_context_memory,
    # docs/benchmarks.md), rounded up to 544 MiB (H100, GH200 alike: 132 SMs x 2048 threads x 1 KiB).
    Generation("Hopper", re.compile(r"\bG?H(?:100|200|800|20)\b", re.IGNORECASE), 544 * MiB),
    # L40S: 142 SMs x 1536 threads x 1 KiB = 213 MiB, + ~150 MiB -> 384 MiB.
    Generation("Ada", re.compile(r"\bL(?:4|20|40S?)\b|\bRTX 40[5-9]0|\bAda\b", re.IGNORECASE), 384 * MiB),
    # A100: 108 SMs x 2048 threads x 1 KiB = 216 MiB, + ~150 MiB -> 384 MiB.
    Generation("Ampere", re.compile(r"\bA(?:100|800|40|30|16|10G?|2)\b|\bRTX A\d{4}\b|\bRTX 30[5-9]0",
                                    re.IGNORECASE), 384 * MiB),
    # V100: 80 SMs x 2048 threads x 1 KiB = 160 MiB, + ~150 MiB -> 320 MiB.
    Generation("Volta", re.compile(r"\bG?V100\b|\bTITAN V\b", re.IGNORECASE), 320 * MiB),
    # T4: 40 SMs x 1024 threads x 1 KiB = 40 MiB, + ~150 MiB -> 256 MiB.
    Generation("Turing", re.compile(r"\bT4\b|\bRTX 20[6-8]0|\bGTX 16[5-6]0|\bTITAN RTX\b|\bQuadro RTX\b",
                                    re.IGNORECASE), 256 * MiB),
)
UNKNOWN_MODEL_RESERVE = max(generation.reserve_bytes for generation in GENERATIONS)


class InvalidContextReserve(ValueError):
    """A ``--context-reserve`` value that is neither a byte quantity nor ``auto``, or one a GPU cannot hold."""


@attrs.frozen
class ContextReserve:
    """What ``--context-reserve`` asked for: a number of bytes for every GPU, or ``None`` for ``auto``."""

    bytes: int | None

    def for_gpu(self, gpu: GpuDevice, *, simulated: bool) -> int:
        """The reserve of ``gpu``: the given bytes; for ``auto``, 0 on a simulated GPU, else its generation's."""
        if self.bytes is not None:
            return self.bytes
        return 0 if simulated else reserve_of_model(gpu.model)


def parse_context_reserve(text: str) -> ContextReserve:
    """``auto``, ``0`` or a byte quantity (``300Mi``, ``1Gi``, bytes); the error names the flag and what is allowed."""
    value = text.strip()
    if value.lower() == AUTO:
        return ContextReserve(None)
    if value == "0":
        return ContextReserve(0)
    count = parse_bytes(value)
    if count is None:
        raise InvalidContextReserve(f"--context-reserve {text!r} is not allowed: expected {CONTEXT_RESERVE_HELP}")
    return ContextReserve(count)


def reserve_of_model(model: str) -> int:
    """The ``auto`` reserve of a real GPU named ``model``: its generation's, else the largest figure."""
    generation = generation_of(model)
    return generation.reserve_bytes if generation is not None else UNKNOWN_MODEL_RESERVE


def generation_of(model: str) -> Generation | None:
    """The generation a GPU's model name belongs to, or None if no pattern knows it."""
    return next((generation for generation in GENERATIONS if generation.pattern.search(model)), None)


def with_context_reserve(gpus: tuple[GpuDevice, ...], reserve: ContextReserve, *,
                         simulated: bool) -> tuple[GpuDevice, ...]:
    """The GPUs with their reserve set; :class:`InvalidContextReserve` if one is not below a GPU's memory."""
    placed = []
    for gpu in gpus:
        count = reserve.for_gpu(gpu, simulated=simulated)
        if count >= gpu.memory_bytes:
            raise InvalidContextReserve(
                f"--context-reserve {format_bytes(count)} is not allowed for GPU {gpu.index} ({gpu.model}, "
                f"{format_bytes(gpu.memory_bytes)}): the reserve must be less than the GPU's memory")
        placed.append(attrs.evolve(gpu, context_reserve_bytes=count))
    return tuple(placed)


def describe(gpus: tuple[GpuDevice, ...]) -> str:
    """``0:512 MiB,1:512 MiB``: each GPU's reserve, for the agent's start line."""
    return ",".join(f"{gpu.index}:{format_bytes(gpu.context_reserve_bytes)}" for gpu in gpus)
