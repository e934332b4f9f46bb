"""deploy/uninstall.sh against a fake kubectl (tests/unit/deploy/fake_kubectl.sh).

Issue 15, defect 5: it deleted every FaSTPod in every namespace without asking and left the
``fastgshare/gpu_info`` node annotations behind (and, found by the install tier,
``fastgshare/metrics_port``). It must say what it will delete, ask (or take
``--yes``), and remove what fastgshare added.
"""

from __future__ import annotations

import os
import pty
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
UNINSTALL = REPO / "deploy" / "uninstall.sh"
FAKE_KUBECTL = Path(__file__).with_name("fake_kubectl.sh")
FASTPODS = "team-a resnet\nteam-b bert"


def environment(tmp_path: Path, **env: str) -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "kubectl").exists():
        (bin_dir / "kubectl").symlink_to(FAKE_KUBECTL)
    log = tmp_path / "kubectl.log"
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log), **env}, log


def uninstall(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run uninstall.sh with stdin not a terminal; returns the result and the kubectl calls."""
    full_env, log = environment(tmp_path, **env)
    result = subprocess.run(["bash", str(UNINSTALL), *args], capture_output=True, text=True, timeout=60,
                            check=False, env=full_env, stdin=subprocess.DEVNULL)
    return result, log.read_text().splitlines() if log.exists() else []


def deletions(calls: list[str]) -> list[str]:
    return [call for call in calls if " delete " in f" {call} " or " annotate " in f" {call} "]


def test_without_yes_and_no_terminal_it_says_what_it_would_delete_and_deletes_nothing(tmp_path: Path) -> None:
    result, calls = uninstall(tmp_path, FAKE_FASTPODS=FASTPODS, FAKE_ANNOTATED="gpu-1 gpu-2")
    assert result.returncode == 2
    assert "FaSTPod team-a/resnet (and its pods)" in result.stdout
    assert "FaSTPod team-b/bert (and its pods)" in result.stdout
    assert "the fastgshare/gpu_info and fastgshare/metrics_port annotations of node gpu-1" in result.stdout
    assert "namespace fastgshare-system" in result.stdout
    assert result.stderr.strip() == ("uninstall.sh: not confirmed, nothing deleted; "
                                     "run deploy/uninstall.sh --yes to delete the above")
    assert deletions(calls) == []


def test_with_yes_it_deletes_the_fastpods_then_the_components_then_the_annotations(tmp_path: Path) -> None:
    result, calls = uninstall(tmp_path, "--yes", FAKE_FASTPODS=FASTPODS, FAKE_ANNOTATED="gpu-1 gpu-2")
    assert result.returncode == 0, result.stderr
    done = deletions(calls)
    assert done[0] == "kubectl -n team-a delete fastpod resnet --wait=true"
    assert done[1] == "kubectl -n team-b delete fastpod bert --wait=true"
    assert done[2].startswith("kubectl delete -k ")  # the node agent goes before its annotations
    assert done[3:] == ["kubectl annotate node gpu-1 fastgshare/gpu_info- fastgshare/metrics_port-",
                        "kubectl annotate node gpu-2 fastgshare/gpu_info- fastgshare/metrics_port-"]
    assert "fastgshare is uninstalled" in result.stdout


def test_without_the_crd_there_are_no_fastpods_to_delete(tmp_path: Path) -> None:
    result, calls = uninstall(tmp_path, "--yes")
    assert result.returncode == 0, result.stderr
    assert not [call for call in calls if "fastpod" in call and "delete" in call]


@pytest.mark.parametrize(("answer", "deleted"), [("n\n", False), ("yes\n", True)])
def test_on_a_terminal_it_asks(tmp_path: Path, answer: str, deleted: bool) -> None:
    env, log = environment(tmp_path, FAKE_FASTPODS=FASTPODS, FAKE_ANNOTATED="gpu-1")
    controller, terminal = pty.openpty()
    with subprocess.Popen(["bash", str(UNINSTALL)], stdin=terminal, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as process:
        os.write(controller, answer.encode())
        out, err = process.communicate(timeout=60)
    os.close(controller)
    os.close(terminal)
    assert "Delete all of this? [y/N]" in err  # read -p prompts on stderr
    assert "This deletes, in this order:" in out
    assert bool(deletions(log.read_text().splitlines())) is deleted
    assert (process.returncode == 0) is deleted, err


def test_an_unknown_argument_is_named(tmp_path: Path) -> None:
    result, calls = uninstall(tmp_path, "--yess")
    assert result.returncode == 2
    assert result.stderr.strip() == "uninstall.sh: unknown argument '--yess'; usage: deploy/uninstall.sh [--yes]"
    assert calls == []
