"""CPU time the benches report: of one process, and of the whole machine.

On the small shared machine the rates move with whatever else runs; CPU seconds move less, and
say where a phase's time went (the component measured, the API server, the scheduler).
"""

from __future__ import annotations

import os
from pathlib import Path


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far; 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent not idle (nor waiting for I/O) since boot."""
    fields = [int(value) for value in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
