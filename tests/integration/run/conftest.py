"""``fastgshare run`` as real processes: the command (``python -m fastgshare_cli run``), its arbiter, the
simulated GPU and the ``tenant`` workload, in a state directory of the test's own.

Every run is started in a process group of its own (the run and CMD); the fixture kills those
groups, and every arbiter whose command line names the test's state directory (they run in
sessions of their own), also when a test fails.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from fastgshare_cli.run_session import STATE_DIR_ENV
from fastgshare_cli.sandbox import HookBuild, SandboxError, build_hook

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def hook_build() -> HookBuild:
    try:
        return build_hook()
    except SandboxError as error:
        pytest.fail(str(error))


class Runs:
    """Starts ``fastgshare run`` processes sharing the state directory ``state``."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("FASTGSHARE_")}
        environ.update({STATE_DIR_ENV: str(self.state), **(env or {})})
        process = subprocess.Popen([sys.executable, "-m", "fastgshare_cli", "run", *argv], cwd=REPO, env=environ,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.started.append(process)
        return process

    def run(self, *argv: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
        process = self.start(*argv)
        stdout, stderr = process.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)

    def wait_registered(self, process: subprocess.Popen[str], timeout_s: float = 60) -> None:
        """Until the run has joined (its entry is in the state directory)."""
        entry = self.state / "runs" / f"{process.pid}.json"
        deadline = time.monotonic() + timeout_s
        while not entry.exists():
            assert process.poll() is None, f"the run exited ({process.returncode}): {process.communicate()}"
            assert time.monotonic() < deadline, "the run did not join in time"
            time.sleep(0.05)

    def arbiters(self) -> list[int]:
        """The pids of the arbiters serving this state directory (any generation, alive and not zombies)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                command = (entry / "cmdline").read_bytes()
                status = (entry / "stat").read_text()
            except OSError:
                continue
            if (b"device_plugin.arbiter.standalone" in command and str(self.state).encode() in command
                    and not status[status.rfind(")") + 2:].startswith("Z")):
                found.append(int(entry.name))
        return found

    def cleanup(self) -> None:
        for process in self.started:
            if process.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
            process.communicate(timeout=30)
        for pid in self.arbiters():
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def runs() -> Iterator[Runs]:
    top = Path(tempfile.mkdtemp(prefix="fgr-", dir="/tmp"))  # short: the arbiter's socket path has 107 bytes
    manager = Runs(top / "state")
    try:
        yield manager
    finally:
        manager.cleanup()
        shutil.rmtree(top, ignore_errors=True)


def last_json(stdout: str) -> dict[str, Any]:
    """The run's ``-o json`` object: the last line of its stdout."""
    summary: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    return summary
