"""What the simulated GPU says each process used: the :class:`~device_plugin.gpu_usage.ProcessGpuTime`
adapter over the simulated driver's own accounting, for nodes whose GPUs are simulated.

The simulated ``libcuda.so.1`` counts each process's busy time (kernels running) in the GPU's
state file, whether or not the process went through the hook; the slot lock file names each
slot's holder by its pid in the reader's PID namespace (the host's: the agent runs with hostPID).
That is the simulated counterpart of NVML's per-process utilisation with host pids.

The one module of the agent that imports :mod:`simgpu` (an exception to the import contract
"only the user command uses the simulated GPU's Python side", declared in pyproject.toml): the
state file's layout lives in :mod:`simgpu.state` alone, and the simulated NVML cannot serve the
agent instead, as it reads one GPU directory per process (``FASTGSHARE_FAKE_GPU_DIR`` at
``nvmlInit``) and would name processes by their pids inside their pods.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

from device_plugin.gpu_usage import ProcessTime
from simgpu.state import FakeGpuStateError, read_state, slot_holders

_Process = tuple[int, int]  # (slot, first_start_ns): one process's slot, not a later reuse of it


class SimulatedProcessGpuTime:
    """Busy time per host pid on each simulated GPU (``gpu_dirs``: uuid -> its state directory)."""

    def __init__(self, gpu_dirs: Mapping[str, Path], clock: Callable[[], float] = time.monotonic) -> None:
        self._dirs = dict(gpu_dirs)
        self._clock = clock
        self._last: dict[str, dict[_Process, int]] | None = None
        self._last_at = 0.0

    def read(self) -> ProcessTime | None:
        now = self._clock()
        busy = {gpu: self._busy(directory) for gpu, directory in self._dirs.items()}
        last, elapsed = self._last, now - self._last_at
        self._last = {gpu: {process: ns for process, (_pid, ns) in procs.items()} for gpu, procs in busy.items()}
        self._last_at = now
        if last is None:
            return None
        seconds: dict[str, dict[int, float]] = {}
        for gpu, procs in busy.items():
            before = last.get(gpu, {})
            by_pid = seconds.setdefault(gpu, {})
            for process, (pid, ns) in procs.items():
                used = ns - before.get(process, 0)  # a process new since the last reading: all of it
                if used > 0:
                    by_pid[pid] = by_pid.get(pid, 0.0) + used / 1e9
        return ProcessTime(elapsed_s=elapsed, seconds=seconds)

    @staticmethod
    def _busy(directory: Path) -> dict[_Process, tuple[int, int]]:
        """(slot, start) -> (host pid, busy ns) of every live process on the GPU in ``directory``."""
        holders = slot_holders(directory)
        if not holders:
            return {}
        try:
            snapshot = read_state(directory)
        except FakeGpuStateError:
            return {}
        return {(proc.slot, proc.first_start_ns): (holders[proc.slot], proc.busy_ns)
                for proc in snapshot.procs if proc.alive and holders.get(proc.slot, 0) > 0}
