"""Who is on the other end of a hook connection.

In a cluster the pod is not taken on trust: the kernel tells the peer's PID
(``SO_PEERCRED``), and ``/proc/<pid>/cgroup`` names the pod's cgroup, which carries the pod
UID (``.../kubepods/burstable/pod<uid>/<container>`` with cgroupfs, or
``...kubepods-burstable-pod<uid with _>.slice/...`` with systemd). The trusted-env mode
takes the pod from the hook's HELLO instead, for the local demo and tests only.
"""

from __future__ import annotations

import re
import socket
import struct
from pathlib import Path

_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def peer_pid(connection: socket.socket) -> int:
    """The PID of the process that opened ``connection`` (a unix socket)."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", credentials)
    return int(pid)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in the contents of ``/proc/<pid>/cgroup``, or None if it names no pod."""
    for line in text.splitlines():
        match = _POD_UID.search(line)
        if match:
            return match.group(1).replace("_", "-")
    return None


def pod_uid_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    try:
        return pod_uid_from_cgroup((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None
