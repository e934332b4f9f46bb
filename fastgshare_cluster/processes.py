"""Child processes of a local cluster: start with a log file, wait for health, stop by PID.

Used by ``fastgshare cluster`` (processes that outlive the command, recorded by PID in the
cluster's state file) and by the test tier (children that die with the test process). A
:class:`ProcessSet` stops what it started in reverse order; :func:`install_emergency_cleanup`
makes that happen on interpreter exit and SIGTERM too.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 10.0


class ProcessFailed(Exception):
    """A process exited or never became healthy; the message carries its log tail."""


# Listening ports are picked below Linux's ephemeral range (32768-60999 by default): a port the
# kernel hands out (bind to 0) is one it may also give any outgoing connection as its source port
# before our server binds it ("Address already in use" in a CI run).
PORT_RANGE = (20_000, 32_000)


# Ports this process handed out, oldest first (a dict keeps insertion order). A process started
# without waiting binds its port a moment later; until then the port still looks free, so without
# this memory the next call could hand it out again (a CI run's kube-controller-manager lost its
# port to the extender started right after it). The oldest are forgotten past REMEMBERED_PORTS.
REMEMBERED_PORTS = 2_000
_handed_out: dict[int, None] = {}


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago, outside the ephemeral
    range, and not handed out by an earlier call in this process."""
    chosen: list[int] = []
    with contextlib.ExitStack() as stack:
        while len(chosen) < count:
            port = random.randrange(*PORT_RANGE)
            if port in chosen or port in _handed_out:
                continue
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            chosen.append(port)
    for port in chosen:
        _handed_out[port] = None
    while len(_handed_out) > REMEMBERED_PORTS:
        del _handed_out[next(iter(_handed_out))]
    return chosen


def _die_with_parent(args: list[str]) -> list[str]:
    """Prefix ``args`` so the kernel SIGTERMs the process if the test process dies first.

    ``setpriv`` (util-linux) sets the parent-death signal and execs, keeping the PID; a
    ``preexec_fn`` would do the same but is unsafe in a process with threads.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *args] if setpriv else args


class ManagedProcess:
    """One child process with its own log file, stopped by PID."""

    def __init__(self, name: str, args: list[str], log_path: Path, *, die_with_parent: bool = True,
                 env: Mapping[str, str] | None = None):
        self.name = name
        self.args = list(args)  # as given (without the parent-death prefix)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                _die_with_parent(args) if die_with_parent else args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only the parent, which stops us in order
                env=None if env is None else {**os.environ, **env},
            )
        self.start_time = process_start_time(self.popen.pid)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the process's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as error:
            return f"(log {self.log_path} unreadable: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def fatal_lines(self) -> list[str]:
        """The log's fatal lines (klog's ``F0102 ...``), which a goroutine dump would bury."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [line for line in lines if re.match(r"F\d{4} ", line)][:3]

    def check_running(self) -> None:
        """Raise :class:`ProcessFailed` with the log tail if the process has exited."""
        code = self.popen.poll()
        if code is not None:
            fatal = "".join(f"{line}\n" for line in self.fatal_lines())
            raise ProcessFailed(
                f"{self.name} (pid {self.pid}) exited with code {code}; log {self.log_path}\n{fatal}last lines:\n"
                f"{self.log_tail(20 if fatal else 40)}"
            )

    def stop(self) -> None:
        """SIGTERM, wait up to :data:`STOP_GRACE_S`, then SIGKILL; a no-op once it has exited."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.terminate()
        try:
            self.popen.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait()


class ProcessSet:
    """The processes one fixture started, stopped in reverse start order."""

    def __init__(self, *, die_with_parent: bool = True) -> None:
        self._processes: list[ManagedProcess] = []
        self._die_with_parent = die_with_parent
        _LIVE_SETS.append(self)

    def start(self, name: str, args: list[str], log_path: Path, env: Mapping[str, str] | None = None
              ) -> ManagedProcess:
        process = ManagedProcess(name, args, log_path, die_with_parent=self._die_with_parent, env=env)
        self._processes.append(process)
        return process

    def get(self, name: str) -> ManagedProcess | None:
        """The latest process started under ``name``."""
        return next((p for p in reversed(self._processes) if p.name == name), None)

    def release(self) -> list[ManagedProcess]:
        """Forget the processes without stopping them (they outlive this set); returns them."""
        released, self._processes = self._processes, []
        if self in _LIVE_SETS:
            _LIVE_SETS.remove(self)
        return released

    def stop_all(self) -> None:
        """Stop every process; safe to call more than once and from any cleanup path."""
        while self._processes:
            self._processes.pop().stop()
        if self in _LIVE_SETS:
            _LIVE_SETS.remove(self)


_LIVE_SETS: list[ProcessSet] = []


def _stop_everything() -> None:
    for process_set in reversed(list(_LIVE_SETS)):
        process_set.stop_all()


def _on_sigterm(_signum: int, _frame: object) -> None:
    # Unwind like Ctrl-C: pytest stops the session and runs the finalizers, then atexit runs.
    raise KeyboardInterrupt


def install_emergency_cleanup() -> None:
    """Stop all children at interpreter exit, and treat SIGTERM like Ctrl-C."""
    atexit.register(_stop_everything)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def wait_until(condition: Callable[[], bool], *, what: str, timeout_s: float,
               watched: ManagedProcess | None = None, interval_s: float = 0.25) -> None:
    """Poll ``condition`` until it holds, else raise :class:`TimeoutError`.

    With ``watched``, raise :class:`ProcessFailed` (with the log tail) as soon as it exits.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if watched is not None:
            watched.check_running()
        if condition():
            return
        if time.monotonic() > deadline:
            tail = f"; last lines of {watched.log_path}:\n{watched.log_tail()}" if watched else ""
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}{tail}")
        time.sleep(interval_s)


# Health probes only; the API clients verify the server's certificate.
_UNVERIFIED_TLS = ssl.create_default_context()
_UNVERIFIED_TLS.check_hostname = False
_UNVERIFIED_TLS.verify_mode = ssl.CERT_NONE


def http_ok(url: str, token: str | None = None) -> bool:
    """True if a GET of ``url`` answers 200 (TLS not verified: used for health endpoints)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5, context=_UNVERIFIED_TLS) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def process_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (field 22 of ``/proc/PID/stat``), or
    None if it is gone: with the PID it names one process, whatever PIDs are reused later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def is_running(pid: int, start_time: int | None) -> bool:
    """True if the process that had ``pid`` and ``start_time`` still runs (zombies do not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[0] not in ("Z", "X") and (start_time is None or int(fields[19]) == start_time)


def stop_recorded(pid: int, start_time: int | None, grace_s: float = STOP_GRACE_S) -> bool:
    """SIGTERM a process this program started earlier (not our child), wait up to ``grace_s``,
    then SIGKILL. Returns False if it was already gone."""
    if not is_running(pid, start_time):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while is_running(pid, start_time):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + grace_s
        time.sleep(0.05)
    return True
