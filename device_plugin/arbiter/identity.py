"""Who is on the other end of a hook connection.

In a cluster the pod is not taken on trust: the kernel tells the peer's PID
(``SO_PEERCRED``), and ``/proc/<pid>/cgroup`` names the pod's cgroup, which carries the pod
UID. The trusted-env mode takes the pod from the hook's HELLO instead, for the local demo and
tests only.

Only kubelet's own layouts are accepted, with the pod directly below ``kubepods`` or its QoS
class (a ``pod<uid>`` anywhere else, such as a self-made cgroup or a host
``pod<uid>.scope``, names no pod):

* cgroupfs driver (v1 and v2): ``/kubepods[/burstable|/besteffort]/pod<uid>[/...]``, at the
  root of the hierarchy (kubelet's default ``--cgroup-root``);
* systemd driver: ``/[<root>.slice/...]<root->kubepods.slice[/<root->kubepods-<qos>.slice]
  /<root->kubepods[-<qos>]-pod<uid with _>.slice[/...]``, where the slices above
  ``kubepods`` are systemd's own chain for the cgroup root (``kubelet.slice/
  kubelet-kubepods.slice`` for ``--cgroup-root=/kubelet``, as kind does).

A path seen from another cgroup namespace starts with ``/..`` (a containerised agent with a
private cgroup namespace sees the tenants relative to its own cgroup): after the ``..``
components it must start at one of the levels above (``kubepods``, the QoS class or the pod
itself). Every line of the file that names a pod must name the same one.
"""

from __future__ import annotations

import re
import socket
import struct
from pathlib import Path

_UID = r"[0-9a-f]{8}{s}[0-9a-f]{4}{s}[0-9a-f]{4}{s}[0-9a-f]{4}{s}[0-9a-f]{12}"
_QOS = ("burstable", "besteffort")
_CGROUPFS_POD = re.compile("pod(" + _UID.replace("{s}", "-") + ")")
_PREFIX = r"(?P<prefix>(?:[a-z0-9_]+-)*)"
_SYSTEMD_KUBEPODS = re.compile(_PREFIX + r"kubepods\.slice")
_SYSTEMD_QOS = re.compile(_PREFIX + r"kubepods-(?P<qos>burstable|besteffort)\.slice")
_SYSTEMD_POD = re.compile(_PREFIX + r"kubepods(?:-(?P<qos>burstable|besteffort))?-pod(?P<uid>"
                          + _UID.replace("{s}", "_") + r")\.slice")


def peer_pid(connection: socket.socket) -> int:
    """The PID of the process that opened ``connection`` (a unix socket)."""
    credentials = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, _uid, _gid = struct.unpack("3i", credentials)
    return int(pid)


def _whole(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    return pattern.fullmatch(text)


def _cgroupfs_pod(parts: list[str], relative: bool) -> str | None:
    """``kubepods[/qos]/pod<uid>/...``; relative paths may start below ``kubepods``."""
    index = 0
    if parts[:1] == ["kubepods"]:
        index = 1
    elif not relative:
        return None
    if index < len(parts) and parts[index] in _QOS:
        index += 1
    if index < len(parts) and (match := _whole(_CGROUPFS_POD, parts[index])):
        return match.group(1)
    return None


def _systemd_pod(parts: list[str], relative: bool) -> str | None:  # noqa: PLR0911 - one return per rule
    """``[chain/]<p>kubepods.slice[/<p>kubepods-<qos>.slice]/<p>kubepods[-<qos>]-pod<uid>.slice/...``."""
    index, prefix, qos = 0, None, None
    top = next((n for n, part in enumerate(parts) if _whole(_SYSTEMD_KUBEPODS, part)), None)
    if not relative:
        if top is None:
            return None
        prefix = _whole(_SYSTEMD_KUBEPODS, parts[top]).group("prefix")  # type: ignore[union-attr]
        chain = prefix.rstrip("-").split("-") if prefix else []
        if parts[:top] != ["-".join(chain[:n + 1]) + ".slice" for n in range(len(chain))]:
            return None  # kubepods.slice must sit in systemd's own chain of slices for its name
        index = top + 1
    elif top == 0:
        prefix, index = _whole(_SYSTEMD_KUBEPODS, parts[0]).group("prefix"), 1  # type: ignore[union-attr]
    if index < len(parts) and (match := _whole(_SYSTEMD_QOS, parts[index])) is not None:
        if prefix is not None and match.group("prefix") != prefix:
            return None
        prefix, qos, index = match.group("prefix"), match.group("qos"), index + 1
    if index >= len(parts) or (match := _whole(_SYSTEMD_POD, parts[index])) is None:
        return None
    if prefix is not None and match.group("prefix") != prefix:
        return None
    pod_qos = match.group("qos")
    if pod_qos != qos and not (relative and index == 0):  # a pod's slice names its QoS slice
        return None
    return match.group("uid").replace("_", "-")


def pod_uid_from_path(path: str) -> str | None:
    """The pod UID of one cgroup path, if it is inside a pod in one of kubelet's layouts."""
    if not path.startswith("/"):
        return None
    parts = [part for part in path.split("/") if part]
    relative = False
    while parts[:1] == [".."]:
        parts.pop(0)
        relative = True
    if not parts or ".." in parts or "." in parts:
        return None
    return _cgroupfs_pod(parts, relative) or _systemd_pod(parts, relative)


def pod_uid_from_cgroup(text: str) -> str | None:
    """The pod UID in the contents of ``/proc/<pid>/cgroup``, or None if it names no pod (or
    its lines name different pods)."""
    found = set()
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        uid = pod_uid_from_path(fields[2])
        if uid is not None:
            found.add(uid)
    return found.pop() if len(found) == 1 else None


def pod_uid_of_pid(pid: int, proc: Path = Path("/proc")) -> str | None:
    try:
        return pod_uid_from_cgroup((proc / str(pid) / "cgroup").read_text())
    except OSError:
        return None
