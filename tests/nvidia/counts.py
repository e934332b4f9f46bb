"""The hook's and the simulated driver's call counts, per process, and their comparison.

The hook writes how often it forwarded each hooked entry point to the driver
(vgpu_hook/src/counts.c: ``$FASTGSHARE_HOOK_COUNTS_DIR/hook-<pid>.json``), the simulated driver how
often it served each of its entry points (simgpu/driver/served.c:
``$FASTGSHARE_FAKE_GPU_SERVED_DIR/served-<pid>.json``), both at process exit. For every allocation,
free and launch entry point the hook wraps, the two must be equal: a call the driver served more
often than the hook forwarded it reached the driver around the hook (through cuGetProcAddress,
dlsym or dlvsym). Both sides name a call by its exported symbol (the hook's wrapper and the
driver's function are both ``cuMemAlloc_v2``); :data:`DRIVER_NAMES` maps any driver function that
serves an entry point under another name.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from tests.integration.hook.symbols import hooked_symbols

ENV_HOOK_COUNTS_DIR = "FASTGSHARE_HOOK_COUNTS_DIR"
ENV_SERVED_DIR = "FASTGSHARE_FAKE_GPU_SERVED_DIR"

# Hooked rows that are not an allocation, free or launch: the resolver and the memory views.
_NOT_COUNTED = frozenset({"cuGetProcAddress", "cuGetProcAddress_v2", "cuMemGetInfo", "cuMemGetInfo_v2",
                          "cuDeviceTotalMem", "cuDeviceTotalMem_v2"})

# The driver's name for a call -> the exported entry point's name (both the same today).
DRIVER_NAMES: Mapping[str, str] = {}


def counted_entry_points() -> frozenset[str]:
    """Every allocation, free and launch entry point the hook wraps (hooked_symbols.def)."""
    return frozenset(row.symbol for row in hooked_symbols() if row.base is not None) - _NOT_COUNTED


@attrs.frozen
class CallCounts:
    """One process's counts: what the hook forwarded and what the driver served, by entry point."""

    pid: int
    hook: Mapping[str, int] | None  # None: the process wrote no hook file (no hook, or killed)
    served: Mapping[str, int] | None  # None: no served file (driver never loaded, or killed)

    def mismatches(self) -> dict[str, tuple[int, int]]:
        """``{entry point: (forwarded by the hook, served by the driver)}`` where the two differ."""
        hook, served = self.hook or {}, self.served or {}
        return {name: (hook.get(name, 0), served.get(name, 0)) for name in sorted(counted_entry_points())
                if hook.get(name, 0) != served.get(name, 0)}

    def describe(self) -> str:
        """One line per difference, or what file is missing."""
        if self.hook is None or self.served is None:
            missing = [what for what, counts in (("hook", self.hook), ("served", self.served)) if counts is None]
            return f"pid {self.pid}: no {' and no '.join(missing)} counts file"
        return "; ".join(f"pid {self.pid}: {name} forwarded by the hook {hook}, served by the driver {served}"
                         for name, (hook, served) in self.mismatches().items())


def _read(path: Path) -> dict[str, int] | None:
    if not path.exists():
        return None
    counts: dict[str, int] = json.loads(path.read_text())
    return counts


def read_counts(hook_dir: Path, served_dir: Path, pid: int) -> CallCounts:
    """The two counts files of process ``pid``, the driver's names mapped to the entry points'."""
    served = _read(served_dir / f"served-{pid}.json")
    if served is not None:
        mapped: dict[str, int] = {}
        for name, count in served.items():
            key = DRIVER_NAMES.get(name, name)
            mapped[key] = mapped.get(key, 0) + count
        served = mapped
    return CallCounts(pid, _read(hook_dir / f"hook-{pid}.json"), served)


def pids_with_counts(*directories: Path) -> set[int]:
    """Every pid that left a hook or served file in ``directories``."""
    return {int(path.stem.split("-", 1)[1]) for directory in directories
            for path in directory.glob("*-*.json") if path.stem.split("-", 1)[1].isdigit()}


def assert_counts_match(hook_dir: Path, served_dir: Path, pids: Iterable[int]) -> list[CallCounts]:
    """Every process in ``pids`` wrote both files and they agree on every counted entry point."""
    all_counts = [read_counts(hook_dir, served_dir, pid) for pid in sorted(pids)]
    problems = [counts.describe() for counts in all_counts
                if counts.hook is None or counts.served is None or counts.mismatches()]
    assert not problems, "the hook's and the driver's call counts differ: " + " | ".join(problems)
    return all_counts
