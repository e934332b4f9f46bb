"""The installed ``fastgshare`` console script, run as a real process, as the README shows it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastgshare import __version__

REPO = Path(__file__).resolve().parents[2]


def _command() -> list[str]:
    script = shutil.which("fastgshare", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.fail("the fastgshare console script is not installed next to this Python; run the install step")
    return [script]


def test_readme_main_command_packs_the_paper_workload_on_one_gpu() -> None:
    result = subprocess.run([*_command(), "pack", "--gpu", "V100-16GB", "examples/paper-workload.yaml"],
                            cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert "8 pods on 1 x V100-16GB" in result.stdout


@pytest.mark.parametrize("subcommand", [[], ["check"], ["pack"]])
def test_help(subcommand: list[str]) -> None:
    result = subprocess.run([*_command(), *subcommand, "--help"], capture_output=True, text=True, timeout=120,
                            check=False)
    assert result.returncode == 0
    assert "usage: fastgshare" in result.stdout


def test_check_from_stdin_fails_on_an_invalid_share() -> None:
    manifest = "kind: FaSTPod\nmetadata: {name: x, annotations: {fastgshare/gpu_mem: '1'}}\nspec: {replicas: 1}\n"
    result = subprocess.run([*_command(), "check", "-"], input=manifest, capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 1
    assert "fastgshare/gpu_quota_request: is required" in result.stderr


def test_demo_runs_three_tenants_and_writes_a_plot(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    result = subprocess.run([*_command(), "demo", "--seconds", "3", "--plot", str(plot)], cwd=REPO,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    assert "achieved share of GPU time (measured by the fake GPU)" in result.stdout
    for tenant in ("resnet", "bert", "bursty"):
        assert tenant in result.stdout
    assert "above its limit" not in result.stdout
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(("args", "message"), [
    (["--tenant", "x:0.9:0.5:50"], "need a name, 0 <= request <= limit <= 1"),
    (["--tenant", "x:a:b:c"], "must be numbers"),
    (["--tenant", "nocolons"], "is malformed; allowed: NAME:REQUEST:LIMIT:SM"),
    (["--seconds", "1"], "--seconds must be at least 2"),
])
def test_demo_rejects_bad_arguments_clearly(args: list[str], message: str) -> None:
    result = subprocess.run([*_command(), "demo", *args], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 1
    assert message in result.stderr


def test_check_in_a_pipe_keeps_file_names_whole(tmp_path: Path) -> None:
    """Issue 15, defect 6: piped, the table squeezed file names into a column one letter wide."""
    path = tmp_path / "a-rather-long-directory-name-for-manifests" / "inference-workload-resnet.yaml"
    path.parent.mkdir()
    path.write_text((REPO / "deploy" / "examples" / "testfastpod.yaml").read_text())
    env = {key: value for key, value in os.environ.items() if key not in ("COLUMNS", "LINES")}
    result = subprocess.run([*_command(), "check", str(path)], capture_output=True, text=True, timeout=120,
                            check=False, env=env)
    assert result.returncode == 0, result.stderr
    assert str(path) in result.stdout


CONSOLE_SCRIPTS = ["fastgshare", "fastgshare-node-agent", "fastgshare-arbiter", "fastgshare-controller",
                   "fastgshare-extender"]


@pytest.mark.parametrize("script", CONSOLE_SCRIPTS)
def test_every_command_tells_its_version(script: str) -> None:
    """Issue 15, defect 8: no command had --version."""
    path = shutil.which(script, path=str(Path(sys.executable).parent))
    assert path is not None, f"{script} is not installed"
    result = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{script} {__version__}"


# Starts a command with SIGINT ignored, as a shell without job control starts background commands
# (exec keeps an ignored signal ignored).
IGNORING_SIGINT = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                   "os.execv(sys.argv[1], sys.argv[1:])"]


@pytest.mark.parametrize("sigint_ignored_at_start", [False, True])
def test_ctrl_c_stops_the_demo_cleanly(sigint_ignored_at_start: bool) -> None:
    """Issue 15, defect 8: Ctrl-C in demo printed a traceback. The terminal sends SIGINT to the
    whole foreground process group; the demo must stop its tenants and arbiter and say so, also
    when it was started with SIGINT ignored (it then ran on to the end)."""
    wrapper = IGNORING_SIGINT if sigint_ignored_at_start else []
    process = subprocess.Popen([*wrapper, *_command(), "demo", "--seconds", "60"], cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "running 3 tenants" in line:
                break
        time.sleep(2)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1] == "fastgshare demo: interrupted; the tenants and the arbiter are stopped"
    with pytest.raises(ProcessLookupError):
        os.killpg(process.pid, 0)  # nothing of the demo is left running


ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]\n" for i in range(8))
HOSTILE_DOCUMENTS = [
    pytest.param("[" * 5000 + "]" * 5000, "nested deeper than 100 levels", id="deep-nesting"),
    pytest.param("kind: List\nitems:\n" + "".join(f"{'  ' * i}- kind: List\n{'  ' * i}  items:\n" for i in range(400))
                 + "  " * 400 + "- {}\n", "nested deeper than 100 levels", id="400-nested-lists"),
    pytest.param("&a [*a]\n", "YAML aliases (*name) are not allowed in manifests", id="self-referencing-alias"),
    pytest.param(ALIAS_BOMB, "YAML aliases (*name) are not allowed in manifests", id="alias-bomb"),
]


@pytest.mark.parametrize(("text", "message"), HOSTILE_DOCUMENTS)
def test_check_refuses_hostile_yaml_in_one_line(tmp_path: Path, text: str, message: str) -> None:
    """Issue 15, defect 9: recursion tracebacks, and an alias bomb that hung check."""
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    result = subprocess.run([*_command(), "check", str(path)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert message in result.stderr
    assert str(path) in result.stderr


def test_pack_refuses_a_workload_too_large_to_place(tmp_path: Path) -> None:
    """Issue 15, defect 9: replicas 1e11 ran until killed."""
    path = tmp_path / "huge.yaml"
    path.write_text((REPO / "deploy" / "examples" / "testfastpod.yaml").read_text().replace(
        "replicas: 1", "replicas: 100000000000"))
    result = subprocess.run([*_command(), "pack", "--gpu", "T4", str(path)], capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == ("fastgshare pack: the workload has 100000000000 pods; pack places at most "
                                     "100000 (lower the counts or replicas)")


def test_check_refuses_a_file_too_large_to_be_a_manifest(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("x: " + "y" * (17 * 2**20))
    result = subprocess.run([*_command(), "check", str(path)], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 1
    assert f"{path}: larger than 16 MiB; allowed: manifests up to 16 MiB" in result.stderr
