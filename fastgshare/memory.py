"""The pod-wide GPU memory ledger the arbiter keeps for each pod.

All processes of a pod share the pod's ``fastgshare/gpu_mem``. A hook reserves before every
allocation and releases after every free; a reservation that would pass the limit is
refused (the hook then returns ``CUDA_ERROR_OUT_OF_MEMORY``, the process keeps running).
Reservations are kept per process, so when a process exits or its connection drops, exactly
what it held is returned.

Pure: processes are opaque hashable keys chosen by the caller.
"""

from __future__ import annotations

from collections.abc import Hashable

from fastgshare.errors import FastGShareError


class MemoryLedgerError(FastGShareError):
    """A negative size or limit."""


class PodMemoryLedger:
    def __init__(self, limit_bytes: int) -> None:
        self._check(limit_bytes, "limit")
        self.limit_bytes = limit_bytes
        self._held: dict[Hashable, int] = {}

    @property
    def used_bytes(self) -> int:
        return sum(self._held.values())

    def held_by(self, process: Hashable) -> int:
        return self._held.get(process, 0)

    def reserve(self, process: Hashable, size: int) -> bool:
        """Reserve ``size`` bytes for ``process`` if the pod stays within its limit."""
        self._check(size, "size")
        if self.used_bytes + size > self.limit_bytes:
            return False
        self._held[process] = self._held.get(process, 0) + size
        return True

    def restore(self, process: Hashable, size: int) -> None:
        """Charge ``size`` bytes the process already holds (reserved before the arbiter restarted),
        without the limit check: the memory is in use whether or not it fits."""
        self._check(size, "size")
        if size:
            self._held[process] = self._held.get(process, 0) + size

    def release(self, process: Hashable, size: int) -> int:
        """Give back up to ``size`` bytes the process holds; returns what was released."""
        self._check(size, "size")
        held = self._held.get(process, 0)
        released = min(size, held)
        if held - released:
            self._held[process] = held - released
        else:
            self._held.pop(process, None)
        return released

    def release_process(self, process: Hashable) -> int:
        """The process is gone: everything it held is free again."""
        return self._held.pop(process, 0)

    def set_limit(self, limit_bytes: int) -> None:
        """A new limit; what is already reserved stays, new reservations must fit it."""
        self._check(limit_bytes, "limit")
        self.limit_bytes = limit_bytes

    @staticmethod
    def _check(value: int, what: str) -> None:
        if value < 0:
            raise MemoryLedgerError(f"{what} must be >= 0 bytes, got {value}")
