"""``fastgshare-node-agent`` as a process: help, and clear exits on impossible starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from device_plugin.registration import RegistrationError, register
from tests.builders import TEST_ASSIGNMENT_KEY


def _agent() -> str:
    script = shutil.which("fastgshare-node-agent", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.fail("fastgshare-node-agent is not installed next to this Python; run the install step")
    return script


@pytest.fixture(scope="module")
def key_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("key") / "key"
    path.write_bytes(TEST_ASSIGNMENT_KEY)
    return path


@pytest.fixture(autouse=True)
def _with_the_test_key(key_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "KEY_FLAGS", ["--assignment-key-file", str(key_file)])


KEY_FLAGS: list[str] = []  # the test key's flag, set per test (the agent refuses to start without a key)


def _run(*args: str, env: dict[str, str] | None = None, key: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_agent(), *args, *(KEY_FLAGS if key else [])], capture_output=True, text=True,
                          timeout=60, check=False, env={**os.environ, **(env or {})})


def test_help_documents_every_flag() -> None:
    result = _run("--help")
    assert result.returncode == 0
    for flag in ("--node-name", "--kubeconfig", "--device-plugin-dir", "--state-dir", "--fake-gpus",
                 "--slots-per-gpu", "--hook-library", "--mps-pipe-dir", "--health-recovery-seconds",
                 "--allocate-wait-seconds", "--assignment-key-file", "--unaccounted-threshold"):
        assert flag in result.stdout


def test_without_nvml_and_without_fake_gpus_it_exits_with_a_clear_message(tmp_path: Path) -> None:
    result = _run("--node-name", "n1", "--state-dir", str(tmp_path), "--hook-library", "/bin/true",
                  env={"LD_LIBRARY_PATH": str(tmp_path)})
    assert result.returncode == 1
    assert "no GPUs: NVML failed to initialise" in result.stderr
    assert "pass --fake-gpus SPEC" in result.stderr


@pytest.mark.parametrize(("key", "message"), [
    (None, "--assignment-key-file PATH is required"),
    ("missing", "--assignment-key-file {path}: cannot read the assignment key: No such file or directory"),
    ("short", "--assignment-key-file {path}: the assignment key has 31 bytes; at least 32 are needed"),
])
def test_an_unusable_assignment_key_is_one_line_and_exit_2(tmp_path: Path, key: str | None, message: str) -> None:
    path = tmp_path / "key"
    if key == "short":
        path.write_bytes(b"k" * 31)
    flags = [] if key is None else ["--assignment-key-file", str(path)]
    result = _run("--node-name", "n1", "--fake-gpus", "1x8GiB:10sm", "--state-dir", str(tmp_path), *flags,
                  key=False)
    assert result.returncode == 2
    [line] = result.stderr.strip().splitlines()
    assert message.format(path=path) in line


def test_node_name_is_required(tmp_path: Path) -> None:
    result = _run("--fake-gpus", "1x8GiB:10sm", env={"NODE_NAME": ""})
    assert result.returncode == 2
    assert "--node-name is required" in result.stderr


def test_bad_fake_gpu_spec(tmp_path: Path) -> None:
    result = _run("--node-name", "n1", "--fake-gpus", "lots")
    assert result.returncode == 2
    assert "--fake-gpus: GPU spec \"lots\" is malformed" in result.stderr


def test_missing_hook_library(tmp_path: Path) -> None:
    result = _run("--node-name", "n1", "--fake-gpus", "1x8GiB:10sm", "--state-dir", str(tmp_path),
                  "--hook-library", str(tmp_path / "missing.so"))
    assert result.returncode == 1
    assert "cannot read hook library" in result.stderr


def test_a_kubeconfig_that_is_not_there_is_one_clear_line(tmp_path: Path) -> None:
    """Issue 15, defect 7: it was a traceback ending in 'Invalid kube-config file. No configuration found.'"""
    repo = Path(__file__).resolve().parents[3]
    hook = repo / "vgpu_hook" / "build" / "libfastgshare-hook.so"
    result = _run("--node-name", "n1", "--fake-gpus", "1x8GiB:10sm", "--state-dir", str(tmp_path),
                  "--hook-library", str(hook if hook.exists() else "/bin/true"),
                  "--fake-driver-dir", str(repo / "simgpu" / "build"), "--kubeconfig", "/nonexistent/kubeconfig")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    # One error line (the arbiter starts first and says where it listens, at info level).
    [line] = [line for line in result.stderr.strip().splitlines() if " INFO " not in line]
    assert line.endswith("--kubeconfig /nonexistent/kubeconfig: no such file; pass the path of a kubeconfig "
                         "file, or leave the flag out to use the in-cluster config, else ~/.kube/config")


def test_without_a_kubelet_socket_registration_says_so_at_once(tmp_path: Path) -> None:
    """Issue 15, defect 7: with no kubelet.sock, registering waited out a 10 s deadline and logged
    'DEADLINE_EXCEEDED', again and again. It must name the socket and what to check."""
    with pytest.raises(RegistrationError) as refused:
        register(tmp_path, "fastgshare.sock", timeout_s=30)
    assert str(refused.value) == (
        f"kubelet's device-plugin socket {tmp_path}/kubelet.sock does not exist: is the kubelet running on this "
        "node, and is --device-plugin-dir its device-plugin directory (default /var/lib/kubelet/device-plugins)?")
