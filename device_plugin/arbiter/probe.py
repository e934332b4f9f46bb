"""Does the arbiter answer? The node agent's liveness check (``/healthz``).

An arbiter running in this process (the node agent's) is probed on a path of its own that no
tenant can reach or queue in front of: a socketpair handed to the native engine, which answers
the probe's PING itself and says how long the Python side has not taken its events (a stuck loop
fails the check; a tenant's flood does not, since the engine answers PINGs and takes each pod's
events in turn). The tenants' socket is checked by its *path*, as a hook reaches it: the file
removed, or replaced by another socket (another inode), fails the check.

An arbiter in another process (``expected_pid``) is probed as before: through the socket's path,
the peer must be that process (``SO_PEERCRED``) and answer a PING.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from device_plugin.arbiter.identity import peer_pid
from fastgshare import protocol
from fastgshare.protocol import MessageType, ProtocolError

DEFAULT_STALLED_AFTER_S = 5.0  # Python not taking the engine's events for this long fails the check

LocalProbe = Callable[[float, float], "str | None"]  # (timeout_s, stalled_after_s) -> problem
_local: dict[Path, LocalProbe] = {}
_local_lock = threading.Lock()


def serve(socket_path: Path, check: LocalProbe) -> None:
    """An arbiter of this process serves ``socket_path``: probes of that path go to ``check``."""
    with _local_lock:
        _local[socket_path] = check


def unserve(socket_path: Path, check: LocalProbe) -> None:
    with _local_lock:
        if _local.get(socket_path) == check:
            del _local[socket_path]


def arbiter_problem(socket_path: Path, expected_pid: int | None = None, timeout_s: float = 1.0,
                    stalled_after_s: float = DEFAULT_STALLED_AFTER_S) -> str | None:
    """None when the arbiter of process ``expected_pid`` (default: this one) serves ``socket_path``
    and answers; else what is wrong, in words."""
    if expected_pid is None or expected_pid == os.getpid():
        with _local_lock:
            check = _local.get(socket_path)
        if check is not None:
            return check(timeout_s, stalled_after_s)
    return _remote_problem(socket_path, os.getpid() if expected_pid is None else expected_pid, timeout_s)


def ping_for_stall(connection: socket.socket, timeout_s: float) -> int | str:
    """PING over the probe's socketpair: the engine's answer (ns Python has stalled), or what failed."""
    try:
        connection.settimeout(timeout_s)
        connection.sendall(protocol.encode_frame(MessageType.PING, 1))
        frame = _one_frame(connection)
    except (OSError, ProtocolError) as error:
        return str(error)
    if frame is None:
        return "it closed the probe's connection"
    if frame.type != MessageType.PING | protocol.REPLY_BIT or len(frame.payload) != 8:
        return f"it answered PING with message type {frame.type} and {len(frame.payload)} bytes"
    return protocol.decode_u64(frame.payload)


def served_by(socket_path: Path) -> str:
    """Who answers at ``socket_path`` now, in words (for a replaced socket)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(0.5)
            connection.connect(str(socket_path))
            return f"served by pid {peer_pid(connection)}"
    except OSError as error:
        return f"nobody answers there ({error.strerror or error})"


def _one_frame(connection: socket.socket) -> protocol.Frame | None:
    reader = protocol.FrameReader()
    frames: list[protocol.Frame] = []
    while not frames:
        data = connection.recv(64)
        if not data:
            return None
        frames = reader.feed(data)
    return frames[0]


def _remote_problem(socket_path: Path, expected: int, timeout_s: float) -> str | None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout_s)
            connection.connect(str(socket_path))
            owner = peer_pid(connection)
            if owner != expected:
                return f"{socket_path} is served by pid {owner}, not by the arbiter (pid {expected})"
            connection.sendall(protocol.encode_frame(MessageType.PING, 1))
            frame = _one_frame(connection)
    except (OSError, ProtocolError) as error:
        return f"the arbiter at {socket_path} does not answer: {error}"
    if frame is None:
        return f"the arbiter at {socket_path} closed the connection without answering PING"
    if frame.type != MessageType.PING | protocol.REPLY_BIT:
        return f"the arbiter at {socket_path} answered PING with message type {frame.type}"
    return None
