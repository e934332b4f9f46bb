"""What fake-fn (``simgpu/workloads/fake_fn.c``) answers about its model, computed the way it computes
it, so that a test or a bench can check an answer's ``model`` object against the weights' file: the
window of the weights it read back from the GPU for its request ``seq``, and the window's FNV-1a 64."""

from __future__ import annotations


def fnv1a64(data: bytes) -> str:
    """FNV-1a 64 of ``data`` as 16 lowercase hex digits (fake-fn's ``model.fnv1a64``)."""
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{value:016x}"


def window(size: int, seq: int) -> tuple[int, int]:
    """The (offset, length) of the weights fake-fn reads back for its answer ``seq``."""
    offset = (seq * 65537 * 4096) % size // 4096 * 4096
    return offset, min(4096, size - offset)
