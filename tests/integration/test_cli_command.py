"""The installed ``fastgshare`` console script, run as a real process, as the README shows it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
