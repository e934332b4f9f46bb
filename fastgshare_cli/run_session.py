"""The state that every ``fastgshare run`` of one user on this machine shares: one arbiter, one GPU.

Two runs at once share one GPU: they meet in a per-user directory, ``$FASTGSHARE_RUN_DIR`` if
set, else ``$XDG_RUNTIME_DIR/fastgshare-run``, else ``/tmp/fastgshare-run-<uid>``; mode 0700,
and one that belongs to another user (or is a symlink) is refused. In it:

``lock``
    ``flock``'d by a run while it joins or leaves, so starting and stopping the arbiter never race.
``gpu.json``, ``gpu/``
    The GPU the runs use, fixed by the first run (a later run's different ``--gpu`` is refused),
    and the simulated GPU's directory (``FASTGSHARE_FAKE_GPU_DIR``).
``runs/<pid>.json``
    One per run: its pod (``run/<pid>``) and share. The run holds an ``flock`` on its file while
    it lives (the kernel drops it however the run ends), so a run killed by SIGKILL is dropped by
    the next one that looks.
``a<N>.sock``, ``shares-<N>.json``, ``usage-<N>.json``, ``arbiter-<N>.log``, ``arbiter.json``
    Generation N of the arbiter (``fastgshare-arbiter``, trusted-env mode, in a session of its
    own so a Ctrl-C in one run's terminal does not stop it): its socket, its shares file (one
    entry per live run), its usage file (each pod's GPU time and token waits, rewritten about once
    a second), its log, and its pid.
``arbiter.sock``
    A symlink to the current generation's socket: what every hook connects to.

The first run starts generation 1. A run that joins or leaves while the arbiter lives rewrites its
shares file (whole: the arbiter reads the old file or the new one) and sends it SIGHUP: the arbiter
reads the file again and serves it from then on, its connections and usage history untouched. A
joining run starts CMD only once the arbiter knows its pod: it says HELLO as the pod (asking again,
with SIGHUP again, until the answer is OK, for at most ``ARBITER_RELOAD_TIMEOUT_S``). The last run to
leave stops the arbiter and removes the directory. A run also checks about once a second that the
arbiter still lives, and starts a new generation if it was killed (with every live run's share; the
hooks reconnect to it as after a node agent's restart, and the new arbiter's usage starts at zero).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path

import attrs

from fastgshare import keys, protocol
from fastgshare.errors import InvalidShareSpec
from fastgshare.share import ShareSpec, format_fraction, parse_share, share_annotations
from fastgshare_cli.run_gpu import GpuChoice
from fastgshare_cli.sandbox import write_shares

STATE_DIR_ENV = "FASTGSHARE_RUN_DIR"
SOCKET_NAME = keys.ARBITER_SOCKET_NAME
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the terminating NUL
ARBITER_START_TIMEOUT_S = 30.0
ARBITER_STOP_TIMEOUT_S = 10.0
ARBITER_RELOAD_TIMEOUT_S = 10.0
RELOAD_RETRY_S = 0.05
RELOAD_SIGNAL_AGAIN_S = 0.5
ArbiterCommand = Callable[[Path, Path, Path], list[str]]  # (socket, shares file, usage file) -> argv


class SessionError(RuntimeError):
    """The shared state cannot be used or the arbiter cannot be started; the message is one line."""


class GpuConflict(SessionError):
    """A run asked for another GPU than the one the runs already going use."""

    def __init__(self, current: GpuChoice) -> None:
        self.current = current
        super().__init__(f"the runs already going on this machine use GPU {current.spec!r}")


@attrs.frozen
class RunEntry:
    """One run as the others see it: its file's name, its pod key, its share."""

    name: str
    pod: str
    share: ShareSpec

    def to_json(self) -> dict[str, object]:
        return {"pod": self.pod, "share": share_annotations(self.share)}

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, object]) -> RunEntry:
        annotations = data["share"]
        if not isinstance(annotations, dict):
            raise ValueError(f"share is {annotations!r}, not a mapping")
        return cls(name, str(data["pod"]), parse_share(annotations))


@attrs.frozen
class ArbiterRecord:
    pid: int
    generation: int


@attrs.define(eq=False)
class Membership:
    """A run that has joined: its entry, the GPU (the session's), and its locked file, held until it leaves."""

    entry: RunEntry
    gpu: GpuChoice
    run_fd: int
    warnings: list[str] = attrs.field(factory=list)
    left: bool = False


def default_state_dir(environ: Mapping[str, str]) -> Path:
    """``$FASTGSHARE_RUN_DIR``, else ``$XDG_RUNTIME_DIR/fastgshare-run`` (when it is a directory of
    this user's), else ``/tmp/fastgshare-run-<uid>``."""
    if override := environ.get(STATE_DIR_ENV):
        return Path(override)
    runtime = environ.get("XDG_RUNTIME_DIR")
    if runtime:
        with suppress(OSError):
            info = os.stat(runtime)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
                return Path(runtime) / "fastgshare-run"
    return Path("/tmp") / f"fastgshare-run-{os.getuid()}"


class RunSession:
    """The shared directory ``directory``; ``arbiter_command`` builds the arbiter's command line."""

    def __init__(self, directory: Path, arbiter_command: ArbiterCommand) -> None:
        self.directory = directory
        self._command = arbiter_command
        self._started: dict[int, subprocess.Popen[bytes]] = {}  # arbiters this process started, to reap them

    @property
    def socket(self) -> Path:
        """What hooks connect to (a symlink to the current generation's socket)."""
        return self.directory / SOCKET_NAME

    @property
    def gpu_dir(self) -> Path:
        """The simulated GPU's directory."""
        return self.directory / "gpu"

    @property
    def _runs(self) -> Path:
        return self.directory / "runs"

    # --- joining and leaving ---------------------------------------------------------
    def join(self, name: str, pod: str, wanted: GpuChoice, *, explicit_gpu: bool,
             share_for: Callable[[GpuChoice], ShareSpec]) -> Membership:
        """Register the run ``pod`` (its share computed for the session's GPU by ``share_for``) and serve
        every live run's share. :class:`GpuConflict` if ``explicit_gpu`` and the session's GPU differs."""
        with self._locked():
            runs = self._live_runs()
            if runs:
                gpu = self._read_gpu() or wanted
                if explicit_gpu and not gpu.same_device(wanted):
                    raise GpuConflict(gpu)
            else:
                self._reset()
                gpu = wanted
                _write_json(self.directory / "gpu.json", gpu.to_json())
            entry = RunEntry(name, pod, share_for(gpu))
            run_fd = self._register(entry)
            try:
                self._update(gpu, [*runs, entry], joining=entry)
            except BaseException:
                self._unregister(entry, run_fd)
                if runs:
                    with suppress(OSError):
                        self._withdraw(gpu, runs)
                else:
                    self._reset()
                raise
        membership = Membership(entry, gpu, run_fd)
        requested = sum(run.share.request_permille for run in [*runs, entry])
        if requested > keys.TIME_UNITS:
            membership.warnings.append(
                f"the {len(runs) + 1} runs on this GPU request {format_fraction(requested)} of its time together; "
                "their requests cannot all be guaranteed (each still stays under its limit)")
        return membership

    def leave(self, membership: Membership) -> None:
        """The run is done: drop its entry; the last run stops the arbiter and removes the directory."""
        if membership.left:
            return
        with self._locked():
            self._unregister(membership.entry, membership.run_fd)
            membership.left = True
            runs = self._live_runs()
            if not runs:
                self._stop_all()
                self._remove_all()
                return
            self._withdraw(membership.gpu, runs)

    def usage_file(self) -> Path | None:
        """The current arbiter generation's usage file (None before the first run starts one)."""
        record = self._read_arbiter()
        return self._usage_of(record.generation) if record is not None else None

    def ask_usage(self) -> bool:
        """Ask the arbiter to write its usage file at once (SIGUSR1); False if it is not running."""
        record = self._read_arbiter()
        if record is None or not self._is_arbiter(record):
            return False
        try:
            os.kill(record.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return False
        return True

    def check_arbiter(self, membership: Membership) -> str | None:
        """Start a new arbiter generation if the current one is gone (killed); a line saying so, or None."""
        for pid, process in list(self._started.items()):  # reap the ones a joining run stopped
            if process.poll() is not None:
                del self._started[pid]
        record = self._read_arbiter()
        if record is not None and self._is_arbiter(record):
            return None
        with self._locked():
            record = self._read_arbiter()
            if record is not None and self._is_arbiter(record):
                return None
            self._serve(membership.gpu, self._live_runs())
            new = self._read_arbiter()
        was = f" (pid {record.pid})" if record is not None else ""
        return f"the arbiter{was} had stopped; started it again (pid {new.pid if new else '?'})"

    # --- the directory and its lock ------------------------------------------------------
    @contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold ``lock``. A run that removed the directory meanwhile unlinked the file this one waited
        on: then the lock is taken again on the new file."""
        lock = self.directory / "lock"
        while True:
            self._prepare()
            try:
                fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            except FileNotFoundError:  # the directory went with the last run meanwhile
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                try:
                    current = os.stat(lock)
                except FileNotFoundError:
                    current = None
            except BaseException:
                os.close(fd)
                raise
            if current is not None and (current.st_dev, current.st_ino) == (held.st_dev, held.st_ino):
                break
            os.close(fd)
        try:
            yield
        finally:
            os.close(fd)

    def _prepare(self) -> None:
        """Create the directory (0700) or check that it is a directory of this user's."""
        try:
            self.directory.mkdir(mode=0o700, parents=True)
        except FileExistsError:
            pass
        except OSError as error:
            raise SessionError(f"cannot create {self.directory}: {error.strerror}; set {STATE_DIR_ENV} to a "
                               "directory of yours") from None
        info = os.lstat(self.directory)
        if not stat.S_ISDIR(info.st_mode):
            raise SessionError(f"{self.directory} is not a directory (a symlink or a file); remove it or set "
                               f"{STATE_DIR_ENV}")
        if info.st_uid != os.getuid():
            raise SessionError(f"{self.directory} belongs to user id {info.st_uid}, not to you ({os.getuid()}): "
                               f"fastgshare run keeps its state only in a directory of yours; set {STATE_DIR_ENV}")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(self.directory, 0o700)
        longest = self.directory / "a999999.sock"
        if len(str(longest)) > MAX_SOCKET_PATH:
            raise SessionError(f"{self.directory} is too long a path for the arbiter's unix socket (at most "
                               f"{MAX_SOCKET_PATH - len(longest.name) - 1} characters); set {STATE_DIR_ENV} to "
                               "a shorter one")

    def _reset(self) -> None:
        """No run is live: stop a leftover arbiter and start from an empty directory."""
        self._stop_all()
        self._remove_contents()
        self._runs.mkdir(mode=0o700)
        self.gpu_dir.mkdir(mode=0o700)

    def _remove_contents(self) -> None:
        for path in self.directory.iterdir():
            if path.name == "lock":
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)

    def _remove_all(self) -> None:
        self._remove_contents()
        (self.directory / "lock").unlink(missing_ok=True)
        with suppress(OSError):  # something new in it: leave it
            self.directory.rmdir()

    # --- the runs ------------------------------------------------------------------------
    def _register(self, entry: RunEntry) -> int:
        path = self._runs / f"{entry.name}.json"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            raise SessionError(f"{path} already exists: another run has this name") from None
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(entry.to_json()).encode())
        return fd

    def _unregister(self, entry: RunEntry, run_fd: int) -> None:
        (self._runs / f"{entry.name}.json").unlink(missing_ok=True)
        os.close(run_fd)

    def _live_runs(self) -> list[RunEntry]:
        """The runs whose process still holds its file's lock; the files of the others are removed."""
        live = []
        for path in sorted(self._runs.glob("*.json")) if self._runs.is_dir() else []:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    entry = _read_entry(path)
                    if entry is not None:
                        live.append(entry)
                    continue
                path.unlink(missing_ok=True)  # its run is gone
            finally:
                os.close(fd)
        return live

    def _read_gpu(self) -> GpuChoice | None:
        data = _read_json(self.directory / "gpu.json")
        try:
            return GpuChoice.from_json(data) if data is not None else None
        except (KeyError, TypeError, ValueError):
            return None

    # --- the arbiter ---------------------------------------------------------------------
    def _update(self, gpu: GpuChoice, runs: list[RunEntry], *, joining: RunEntry) -> None:
        """Serve ``runs``: the arbiter that lives reloads its shares and is asked until it knows
        ``joining``; without one (the first run, or it was killed) a new generation starts."""
        record = self._read_arbiter()
        if record is None or not self._is_arbiter(record):
            self._serve(gpu, runs)
            return
        self._write_shares(record.generation, gpu, runs)
        self._reload(record, joining.pod, gpu.uuid)

    def _withdraw(self, gpu: GpuChoice, runs: list[RunEntry]) -> None:
        """A run left: the arbiter that lives reloads the shares of ``runs`` (not waited for); without one,
        the next run's check starts one with them."""
        record = self._read_arbiter()
        if record is not None and self._is_arbiter(record):
            self._write_shares(record.generation, gpu, runs)
            with suppress(ProcessLookupError):
                os.kill(record.pid, signal.SIGHUP)

    def _reload(self, record: ArbiterRecord, pod: str, gpu_uuid: str) -> None:
        """SIGHUP the arbiter, then say HELLO as ``pod`` until the arbiter answers OK (it took the file),
        signalling again every ``RELOAD_SIGNAL_AGAIN_S``; :class:`SessionError` after the timeout."""
        sock = self._socket_of(record.generation)
        deadline = time.monotonic() + ARBITER_RELOAD_TIMEOUT_S
        signalled = float("-inf")
        while True:
            now = time.monotonic()
            if now - signalled >= RELOAD_SIGNAL_AGAIN_S:
                try:
                    os.kill(record.pid, signal.SIGHUP)
                except ProcessLookupError:
                    raise SessionError(f"fastgshare-arbiter (pid {record.pid}) exited while it took the run's "
                                       f"share: {_last_line(self.directory / f'arbiter-{record.generation}.log')}"
                                       ) from None
                signalled = now
            answer = hello_answer(sock, pod, gpu_uuid)
            if answer is None:
                return
            if time.monotonic() > deadline:
                raise SessionError(f"fastgshare-arbiter (pid {record.pid}) did not take the run's share within "
                                   f"{ARBITER_RELOAD_TIMEOUT_S:.0f} s (HELLO as {pod}: {answer}); its log: "
                                   f"{self.directory / f'arbiter-{record.generation}.log'}")
            time.sleep(RELOAD_RETRY_S)

    def _serve(self, gpu: GpuChoice, runs: list[RunEntry]) -> None:
        """Start the next arbiter generation serving ``runs``, point the socket at it, stop the old one."""
        old = self._read_arbiter()
        generation = old.generation + 1 if old is not None else 1
        record = self._start(gpu, runs, generation)
        link = self.directory / f"{SOCKET_NAME}.{generation}"
        link.unlink(missing_ok=True)
        os.symlink(self._socket_of(generation).name, link)
        os.replace(link, self.socket)
        _write_json(self.directory / "arbiter.json", {"pid": record.pid, "generation": record.generation})
        if old is not None:
            self._stop(old)
            for path in self._files_of(old.generation):
                path.unlink(missing_ok=True)

    def _write_shares(self, generation: int, gpu: GpuChoice, runs: list[RunEntry]) -> Path:
        """The shares file of ``generation`` with every run's share, replaced whole."""
        shares = self.directory / f"shares-{generation}.json"
        write_shares(shares, gpu.uuid, gpu.mps, {run.pod: share_annotations(run.share) for run in runs})
        return shares

    def _start(self, gpu: GpuChoice, runs: list[RunEntry], generation: int) -> ArbiterRecord:
        sock, shares = self._socket_of(generation), self._write_shares(generation, gpu, runs)
        log = self.directory / f"arbiter-{generation}.log"
        sock.unlink(missing_ok=True)
        with log.open("wb") as output:
            process = subprocess.Popen(self._command(sock, shares, self._usage_of(generation)),
                                       stdin=subprocess.DEVNULL, stdout=output,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        self._started[process.pid] = process
        deadline = time.monotonic() + ARBITER_START_TIMEOUT_S
        while not _connectable(sock):
            if process.poll() is not None:
                raise SessionError(f"fastgshare-arbiter exited with status {process.returncode} before listening: "
                                   f"{_last_line(log)}")
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                raise SessionError(f"fastgshare-arbiter did not listen on {sock} within "
                                   f"{ARBITER_START_TIMEOUT_S:.0f} s: {_last_line(log)}")
            time.sleep(0.02)
        return ArbiterRecord(process.pid, generation)

    def _stop(self, record: ArbiterRecord | None) -> None:
        """Stop the arbiter of ``record`` if it still runs (SIGTERM, then SIGKILL after 10 s)."""
        if record is None:
            return
        for signum, timeout_s in ((signal.SIGTERM, ARBITER_STOP_TIMEOUT_S), (signal.SIGKILL, 2.0)):
            if not self._is_arbiter(record):
                break
            with suppress(ProcessLookupError):
                os.kill(record.pid, signum)
            deadline = time.monotonic() + timeout_s
            while self._is_arbiter(record) and time.monotonic() < deadline:
                time.sleep(0.02)
        process = self._started.pop(record.pid, None)
        if process is not None:
            with suppress(subprocess.TimeoutExpired):
                process.wait(1)

    def _stop_all(self) -> None:
        """Stop every arbiter serving this directory: the recorded one and any a run killed while it
        joined left unrecorded (found by the socket on their command line)."""
        for record in [*filter(None, [self._read_arbiter()]), *self._unrecorded_arbiters()]:
            self._stop(record)

    def _unrecorded_arbiters(self) -> list[ArbiterRecord]:
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = [os.fsdecode(arg) for arg in (entry / "cmdline").read_bytes().split(b"\0")]
            except OSError:
                continue
            for flag, value in itertools.pairwise(command):
                path = Path(value)
                if (flag == "--socket" and path.parent == self.directory and path.name.startswith("a")
                        and path.name.endswith(".sock") and path.name[1:-5].isdigit()):
                    found.append(ArbiterRecord(int(entry.name), int(path.name[1:-5])))
        return found

    def _is_arbiter(self, record: ArbiterRecord) -> bool:
        """Whether ``record``'s pid is still that arbiter (not a zombie, not a reused pid)."""
        process = self._started.get(record.pid)
        if process is not None and process.poll() is not None:
            return False
        try:
            command = Path(f"/proc/{record.pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{record.pid}/stat").read_text()
        except OSError:
            return False
        zombie = status[status.rfind(")") + 2:].startswith("Z")
        return not zombie and os.fsencode(str(self._socket_of(record.generation))) in command

    def _read_arbiter(self) -> ArbiterRecord | None:
        data = _read_json(self.directory / "arbiter.json")
        try:
            return ArbiterRecord(int(str(data["pid"])), int(str(data["generation"]))) if data is not None else None
        except (KeyError, TypeError, ValueError):
            return None

    def _socket_of(self, generation: int) -> Path:
        return self.directory / f"a{generation}.sock"

    def _usage_of(self, generation: int) -> Path:
        return self.directory / f"usage-{generation}.json"

    def _files_of(self, generation: int) -> list[Path]:
        return [self._socket_of(generation), self.directory / f"shares-{generation}.json",
                self._usage_of(generation), self.directory / f"arbiter-{generation}.log"]


def _read_entry(path: Path) -> RunEntry | None:
    data = _read_json(path)
    try:
        return RunEntry.from_json(path.stem, data) if data is not None else None
    except (KeyError, TypeError, ValueError, InvalidShareSpec):
        return None


def _read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _write_json(path: Path, data: Mapping[str, object]) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data))
    os.replace(partial, path)


def hello_answer(sock: Path, pod: str, gpu_uuid: str, timeout_s: float = 1.0) -> str | None:
    """Say HELLO to the arbiter on ``sock`` as ``pod`` on ``gpu_uuid``: None if it answers OK, else
    what it said (its refusal, or why there was no answer). The connection is closed at once."""
    request = protocol.encode_frame(protocol.MessageType.HELLO, 1, protocol.Hello(os.getpid(), pod, gpu_uuid).encode())
    reader = protocol.FrameReader()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout_s)
        try:
            connection.connect(str(sock))
            connection.sendall(request)
            while True:
                data = connection.recv(protocol.MAX_FRAME)
                if not data:
                    return "the arbiter closed the connection"
                for frame in reader.feed(data):
                    if frame.type == protocol.MessageType.HELLO | protocol.REPLY_BIT:
                        return None
                    if frame.type == protocol.MessageType.ERROR:
                        return protocol.ErrorReply.decode(frame.payload).message
                    return f"an answer of type {frame.type}"
        except (OSError, protocol.ProtocolError, ValueError) as error:
            return f"{type(error).__name__}: {error}"


def _connectable(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(nothing logged)"
