"""The share of GPU time and the memory each pod gets on a node's simulated GPUs, measured by
the simulated GPU itself, outside the pods.

Each GPU's state file counts every process's busy time and memory; its lock file tells which
host process holds each slot (:func:`simgpu.state.slot_holders`), and that process's
cgroup names its pod (:mod:`fastgshare.pod_cgroup`, the node agent's own reading: kubelet's
layouts only): the way NVML's per-process accounting and host PIDs identify a pod's use of a
real GPU. Run it on the node, as root; for a node of a local cluster that lives in a cgroup of
its own (``fastgshare cluster up --nodes N``), pass that cgroup as ``node_cgroup``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import attrs

from fastgshare.pod_cgroup import pod_uid_from_cgroup
from simgpu.state import FakeGpuStateError, read_state, slot_holders


@attrs.frozen
class PodUse:
    """What one pod's live processes hold on one simulated GPU."""

    busy_ns: int
    memory_bytes: int


def _below(text: str, node_cgroup: str) -> str:
    """``/proc/<pid>/cgroup`` as seen from a cgroup namespace rooted at ``node_cgroup``."""
    if node_cgroup in ("", "/"):
        return text
    prefix = "/" + node_cgroup.strip("/")
    lines = []
    for line in text.splitlines():
        head, _, path = line.rpartition(":")
        if path == prefix or path.startswith(prefix + "/"):
            lines.append(f"{head}:{path[len(prefix):] or '/'}")
    return "\n".join(lines)


def pod_of_pid(pid: int, node_cgroup: str = "/") -> str | None:
    """The UID of the Kubernetes pod whose cgroup holds the host process ``pid``, on the node whose
    cgroups are below ``node_cgroup``."""
    try:
        return pod_uid_from_cgroup(_below(Path(f"/proc/{pid}/cgroup").read_text(), node_cgroup))
    except OSError:
        return None


def use_by_pod(gpu_dir: Path, node_cgroup: str = "/") -> dict[str, PodUse]:
    """Pod UID -> busy time and memory of its live processes on the simulated GPU in ``gpu_dir``."""
    holders = slot_holders(gpu_dir)
    if not holders:
        return {}
    try:
        snapshot = read_state(gpu_dir)
    except FakeGpuStateError:
        return {}
    use: dict[str, PodUse] = {}
    for record in snapshot.procs:
        uid = pod_of_pid(holders[record.slot], node_cgroup) if record.alive and record.slot in holders else None
        if uid is not None:
            before = use.get(uid, PodUse(0, 0))
            use[uid] = PodUse(before.busy_ns + record.busy_ns, before.memory_bytes + record.mem_used)
    return use


def measure_shares(gpu_dirs: Iterable[Path], seconds: float, node_cgroups: Iterable[str] | None = None
                   ) -> dict[str, float]:
    """Pod UID -> share of GPU time its processes got over the next ``seconds`` (0..1 per GPU);
    ``node_cgroups``: each GPU's node's cgroup (default: ``/`` for all)."""
    dirs = list(gpu_dirs)
    roots = list(node_cgroups) if node_cgroups is not None else ["/"] * len(dirs)

    def busy() -> dict[str, int]:
        return {uid: use.busy_ns for gpu, root in zip(dirs, roots, strict=True)
                for uid, use in use_by_pod(gpu, root).items()}

    before, started = busy(), time.monotonic()
    time.sleep(seconds)
    after, elapsed = busy(), time.monotonic() - started
    return {uid: (after[uid] - before.get(uid, 0)) / 1e9 / elapsed for uid in after}
