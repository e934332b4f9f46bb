"""The arbiter's ledger on disk, so a restarted node agent knows what the running pods hold.

What is kept: every pod the arbiter knows (GPU, pod key, UID, memory limit, time share) and,
per process (the peer PID the kernel gave), the bytes it holds reserved. The shares let a
restarted arbiter serve the pods it knew before the agent has its pod cache again. Time tokens
are not kept: the scheduling window is 100 ms, far shorter than a restart, and a hook asks
for a new token when it reconnects.

Written on every change of the ledger, before the reply that depends on it goes out,
atomically: a temporary file in the same directory, written whole (short writes continued),
fsynced, renamed over the old one (``os.replace``: a reader sees the old or the new file, never
half of one), and the directory fsynced, so the rename itself survives a crash of the machine as
well as of the agent. The file carries a SHA-256 of its content: a file that is short, corrupt
or unchecked (an older version) is discarded with one log line and moved aside
(``*.unreadable``), and the arbiter starts with an empty ledger (reconnecting hooks say what they
hold with MEM_RESTORE).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import attrs

from device_plugin.durable_file import replace_durably
from fastgshare.arbitration import TimeShare

log = logging.getLogger(__name__)

STATE_VERSION = 2  # 2: with "sha256"
STATE_FILE_NAME = "arbiter-state.json"


@attrs.frozen
class SavedPod:
    gpu: str
    pod: str
    memory_limit_bytes: int
    held: dict[int, int]  # peer pid -> bytes it holds reserved
    share: TimeShare | None = None
    uid: str = ""  # the pod's UID, when the arbiter found the pod by its cgroup


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[SavedPod]:
        """The saved pods; none when there is no file. An unreadable file is set aside (and said)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return []
        try:
            data = json.loads(raw.decode())
            if data.get("version") != STATE_VERSION:
                raise ValueError(f"version {data.get('version')!r}, expected {STATE_VERSION}")
            if data.get("sha256") != _checksum(data["pods"]):
                raise ValueError("its checksum does not match its content")
            return [SavedPod(str(entry["gpu"]), str(entry["pod"]), int(entry["memory_limit_bytes"]),
                             {int(pid): int(size) for pid, size in entry["held"].items() if int(size) > 0},
                             TimeShare(*(int(v) for v in entry["share"])) if entry.get("share") else None,
                             str(entry.get("uid", "")))
                    for entry in data["pods"]]
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
            aside = self.path.with_suffix(".unreadable")
            os.replace(self.path, aside)
            log.error("arbiter state %s is unreadable (%s); moved to %s, starting with an empty ledger",
                      self.path, error, aside)
            return []

    def save(self, pods: Iterable[SavedPod]) -> None:
        """Replace the file with these pods, atomically and durably (see the module's docstring)."""
        entries: list[dict[str, object]] = [
            {"gpu": pod.gpu, "pod": pod.pod, "uid": pod.uid, "memory_limit_bytes": pod.memory_limit_bytes,
             "share": [pod.share.request_permille, pod.share.limit_permille, pod.share.sm_percent]
             if pod.share else None,
             "held": {str(pid): size for pid, size in sorted(pod.held.items())}} for pod in pods]
        data = {"version": STATE_VERSION, "sha256": _checksum(entries), "pods": entries}
        encoded = json.dumps(data, separators=(",", ":")).encode()
        try:
            replace_durably(self.path, encoded)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_durably(self.path, encoded)


def _checksum(pods: object) -> str:
    """SHA-256 of the pods' canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(pods, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
