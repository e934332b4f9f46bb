"""Who is on the other end of a hook connection.

In a cluster the pod is not taken on trust: the kernel tells the peer's PID
(``SO_PEERCRED``), and ``/proc/<pid>/cgroup`` names the pod's cgroup, which carries the pod
UID (:mod:`fastgshare.pod_cgroup` parses it: kubelet's layouts only, cgroupfs and systemd
drivers, cgroup v1 and v2). The trusted-env mode takes the pod from the hook's HELLO instead,
for the local demo and tests only.

Only :func:`pod_uid_of_pid` reads ``/proc``. The UID is not the end of it: the arbiter serves
only a UID that is a pod on this node with an assignment (``ShareBook.pod_of_uid``).
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from fastgshare.pod_cgroup import pod_uid_from_cgroup, pod_uid_from_path

__all__ = ["peer_pid", "pod_uid_from_cgroup", "pod_uid_from_path", "pod_uid_of_pid"]


def peer_pid(connection: socket.socket) -> int:
    """The PID of the process that opened ``connection`` (a unix socket)."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", credentials)
    return int(pid)


def pod_uid_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The pod UID of process ``pid`` from its cgroup file, or None (no such process, or no pod)."""
    try:
        return pod_uid_from_cgroup((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None
