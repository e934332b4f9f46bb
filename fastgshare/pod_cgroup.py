"""Which pod a cgroup path names: the pure parsing of ``/proc/<pid>/cgroup`` that the node agent
(:mod:`device_plugin.arbiter.identity`: who is on the other end of a hook connection) and ``fastgshare
cluster shares`` (:mod:`fastgshare_cli.pod_shares`) share. It reads nothing.

Only kubelet's own layouts are accepted, with the pod directly below ``kubepods`` or its QoS
class (a ``pod<uid>`` anywhere else, such as a self-made cgroup or a host ``pod<uid>.scope``,
names no pod). Whatever the runtime (containerd, CRI-O, docker) puts below the pod's cgroup is
the pod's:

* cgroupfs driver (v1 and v2): ``/kubepods[/burstable|/besteffort]/pod<uid>[/...]``, at the
  root of the hierarchy (kubelet's default ``--cgroup-root``);
* systemd driver: ``/[<root>.slice/...]<root->kubepods.slice[/<root->kubepods-<qos>.slice]
  /<root->kubepods[-<qos>]-pod<uid with _>.slice[/...]``, where the slices above
  ``kubepods`` are systemd's own chain for the cgroup root (``kubelet.slice/
  kubelet-kubepods.slice`` for ``--cgroup-root=/kubelet``, as kind does).

The UID is a lower-case UUID, as the API server makes them (a static pod's hash is kubelet's own
UID, which no API pod has). Every line of the file that names a pod must name the same one (v1
has a line per hierarchy; lines at ``/``, for controllers the runtime leaves alone, name none).

A path seen from another cgroup namespace starts with ``/..`` (on cgroup v2 the agent's
container has a namespace of its own and sees the tenants relative to its own cgroup): after at
least two ``..`` (one level up is still the agent's own pod) it must start at one of the levels
above (``kubepods``, the QoS class or the pod itself). ``..``, ``.`` or an empty component
anywhere else names no pod. docs/node-agent.md ("Which pod a process belongs to") lists the
recorded formats the tests pin.
"""

from __future__ import annotations

import re

_UID = r"[0-9a-f]{8}{s}[0-9a-f]{4}{s}[0-9a-f]{4}{s}[0-9a-f]{4}{s}[0-9a-f]{12}"
_QOS = ("burstable", "besteffort")
_CGROUPFS_POD = re.compile("pod(" + _UID.replace("{s}", "-") + ")")
_PREFIX = r"(?P<prefix>(?:[a-z0-9_]+-)*)"
_SYSTEMD_KUBEPODS = re.compile(_PREFIX + r"kubepods\.slice")
_SYSTEMD_QOS = re.compile(_PREFIX + r"kubepods-(?P<qos>burstable|besteffort)\.slice")
# A reader in its own cgroup namespace is a container of a pod (the node agent's): one level up
# from it is still its own pod, so another pod's path climbs at least to the reader's pod's parent.
_MIN_LEVELS_UP = 2
_SYSTEMD_POD = re.compile(_PREFIX + r"kubepods(?:-(?P<qos>burstable|besteffort))?-pod(?P<uid>"
                          + _UID.replace("{s}", "_") + r")\.slice")


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
    if not path.startswith("/") or path == "/":
        return None
    parts = path[1:].split("/")
    levels_up = 0
    while levels_up < len(parts) and parts[levels_up] == "..":
        levels_up += 1
    if 0 < levels_up < _MIN_LEVELS_UP:
        return None
    parts = parts[levels_up:]
    if not parts or any(part in ("", ".", "..") for part in parts):
        return None  # the kernel writes neither "//" nor "." nor ".." after the leading ones
    return _cgroupfs_pod(parts, levels_up > 0) or _systemd_pod(parts, levels_up > 0)


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
