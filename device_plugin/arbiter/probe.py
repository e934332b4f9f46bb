"""Does the arbiter answer on its socket? The node agent's liveness check (``/healthz``).

Connects through the socket's *path*, as a hook does, so it notices what an in-process check
cannot: the file removed, or replaced by another process's socket (the peer must be this
process, by ``SO_PEERCRED``), or an arbiter loop that no longer answers (a ``PING`` round trip).
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from device_plugin.arbiter.identity import peer_pid
from fastgshare import protocol
from fastgshare.protocol import MessageType, ProtocolError


def arbiter_problem(socket_path: Path, expected_pid: int | None = None, timeout_s: float = 1.0) -> str | None:
    """None when the arbiter of process ``expected_pid`` (default: this one) answers a PING at
    ``socket_path``; else what is wrong, in words."""
    expected = os.getpid() if expected_pid is None else expected_pid
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
            connection.settimeout(timeout_s)
            connection.connect(str(socket_path))
            owner = peer_pid(connection)
            if owner != expected:
                return f"{socket_path} is served by pid {owner}, not by the arbiter (pid {expected})"
            connection.sendall(protocol.encode_frame(MessageType.PING, 1))
            reader = protocol.FrameReader()
            frames: list[protocol.Frame] = []
            while not frames:
                data = connection.recv(64)
                if not data:
                    return f"the arbiter at {socket_path} closed the connection without answering PING"
                frames = reader.feed(data)
    except (OSError, ProtocolError) as error:
        return f"the arbiter at {socket_path} does not answer: {error}"
    if frames[0].type != MessageType.PING | protocol.REPLY_BIT:
        return f"the arbiter at {socket_path} answered PING with message type {frames[0].type}"
    return None
