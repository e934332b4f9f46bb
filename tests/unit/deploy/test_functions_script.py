"""deploy/functions.sh against a fake kubectl (tests/unit/deploy/fake_kubectl.sh): the function
components install and uninstall on their own; uninstall says what it deletes, asks (or takes
``--yes``), deletes the FaSTFuncs before the components, and keeps the function namespace."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.unit.deploy.test_uninstall_script import REPO, deletions, environment

SCRIPT = REPO / "deploy" / "functions.sh"
FASTFUNCS = "fast-gshare-fn resnet\nteam-a bert"


def run(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    full_env, log = environment(tmp_path, **env)
    result = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False,
                            env=full_env, stdin=subprocess.DEVNULL)
    return result, log.read_text().splitlines() if log.exists() else []


def test_uninstall_without_yes_says_what_it_would_delete_and_deletes_nothing(tmp_path: Path) -> None:
    result, calls = run(tmp_path, "uninstall", FAKE_FASTFUNCS=FASTFUNCS)
    assert result.returncode == 2
    assert "FaSTFunc fast-gshare-fn/resnet (and its FaSTPods, pods and Service)" in result.stdout
    assert "FaSTFunc team-a/bert" in result.stdout
    assert "It keeps the namespace fast-gshare-fn" in result.stdout
    assert "run deploy/functions.sh uninstall --yes" in result.stderr
    assert deletions(calls) == []


def test_uninstall_with_yes_deletes_the_functions_first_then_the_components_then_the_crd(tmp_path: Path) -> None:
    result, calls = run(tmp_path, "uninstall", "--yes", FAKE_FASTFUNCS=FASTFUNCS)
    assert result.returncode == 0, result.stderr
    done = deletions(calls)
    assert done[:2] == ["kubectl -n fast-gshare-fn delete fastfunc resnet --wait=true",
                        "kubectl -n team-a delete fastfunc bert --wait=true"]
    deleted_files = [call.split(" -f ")[1].split()[0].removeprefix(f"{REPO}/deploy/") for call in done[2:]]
    assert deleted_files == ["gateway/deployment.yaml", "gateway/rbac.yaml", "function-controller/deployment.yaml",
                             "function-controller/rbac.yaml", "queue/worker.yaml", "queue/nats.yaml",
                             "queue/networkpolicy.yaml", "queue/rbac.yaml", "crd/fastfuncs.yaml"]
    assert not any("namespace.yaml" in call for call in calls)  # fastgshare-system and the functions' namespace stay


def test_install_applies_the_namespace_crd_and_components_and_waits(tmp_path: Path) -> None:
    result, calls = run(tmp_path, "install", FAKE_VERSION="v1.20.2")
    assert result.returncode == 0, result.stderr
    applied = [call for call in calls if call.startswith("kubectl apply")]
    assert "namespace.yaml" in applied[0]
    assert "crd/fastfuncs.yaml" in applied[0]
    assert any("rollout status deployment/fastgshare-gateway" in call for call in calls)


def test_an_unknown_action_is_named(tmp_path: Path) -> None:
    result, _ = run(tmp_path, "remove")
    assert result.returncode == 2
    assert result.stderr.strip() == ("functions.sh: usage: deploy/functions.sh install | uninstall [--yes] "
                                     "(got 'remove')")
