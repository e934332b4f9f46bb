"""`fastgshare cluster down` kills what `up` left behind (containerd shims, unrecorded components),
and nothing else: not a user's `tail -f` of a log in the state directory, nor the shell that runs
`down` with `--state-dir` on its command line."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastgshare_cluster.node import kill_leftovers


def started(args: list[str]) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.1)
    return process


def exited_within(process: subprocess.Popen[bytes], seconds: float) -> bool:
    try:
        process.wait(seconds)
    except subprocess.TimeoutExpired:
        return False
    return True


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_a_shim_naming_the_state_dir_is_killed_and_a_users_processes_are_not(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "logs").mkdir(parents=True)
    (state / "logs" / "kubelet.log").write_text("")
    shim_binary = tmp_path / "containerd-shim-runc-v2"
    shutil.copy(shutil.which("sleep") or "/bin/sleep", shim_binary)
    shim = started([str(shim_binary), "300", f"-address={state}/containerd.sock"])
    reader = started(["tail", "-f", str(state / "logs" / "kubelet.log")])
    shell = started(["sh", "-c", f"sleep 300; echo --state-dir {state}"])
    try:
        kill_leftovers(state)
        assert exited_within(shim, 5)
        assert not exited_within(reader, 0.5), "a user's tail -f of a log was killed"
        assert not exited_within(shell, 0.1), "a shell that names the state dir was killed"
    finally:
        for process in (shim, reader, shell):
            process.kill()
            process.wait()


def test_the_caller_and_its_ancestors_are_never_killed(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    script = (f"from pathlib import Path; from fastgshare_cluster.node import kill_leftovers; "
              f"kill_leftovers(Path({str(state)!r})); print('alive')")
    # bash -c '<python naming the state dir>': the parent shell names it too
    result = subprocess.run(["bash", "-c", f"{sys.executable} -c \"{script}\"; echo shell-alive"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.stdout.split() == ["alive", "shell-alive"], result


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="needs /proc")
def test_a_model_store_worker_naming_the_state_dir_is_killed_and_another_python_module_is_not(tmp_path: Path) -> None:
    """The node agent's model-store workers run in a session of their own (they outlive the agent by
    design), so ``down`` finds them by their module and the state directory on their command line."""
    state = tmp_path / "state"
    state.mkdir()
    fake_worker = tmp_path / "device_plugin" / "models"
    fake_worker.mkdir(parents=True)
    for package in (tmp_path / "device_plugin", fake_worker):
        (package / "__init__.py").write_text("")
    (fake_worker / "worker.py").write_text("import time\ntime.sleep(300)\n")
    (tmp_path / "other.py").write_text("import time\ntime.sleep(300)\n")
    worker = subprocess.Popen([sys.executable, "-m", "device_plugin.models.worker", "--socket", f"{state}/m.sock"],
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    other = subprocess.Popen([sys.executable, "-m", "other", str(state)], cwd=tmp_path,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    try:
        kill_leftovers(state)
        assert exited_within(worker, 5)
        assert not exited_within(other, 0.5), "another python -m program naming the state dir was killed"
    finally:
        for process in (worker, other):
            process.kill()
            process.wait()
