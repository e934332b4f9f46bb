"""The seed's README commands (FaST-GShare's), verbatim from the repository root: yaml/ and install/.

Issue 36 item 8: a user moving from FaST-GShare starts with them, and each failed. They are thin
entry points onto deploy/ and examples/: the CRD and the function example are symlinks (git keeps
them, ``kubectl apply -f`` follows them), the scripts run deploy/install.sh and deploy/uninstall.sh,
and the one new manifest, the sample FaSTPod in namespace ``fast-gshare``, runs the simulated tenant
image. These tests keep them in step with deploy/; the real-node tier runs the commands for real
(tests/cluster/test_real_node_install.py, its last test).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from fastgshare import keys
from fastgshare_cli.main import main
from fastgshare_cluster import images
from tests.deploy_manifests import DEPLOY, objects

REPO = DEPLOY.parent
FAKE_KUBECTL = Path(__file__).with_name("fake_kubectl.sh")

# FaST-GShare's README, in its order (docs/install.md "Coming from FaST-GShare").
SEED_COMMANDS = (
    "kubectl apply -f ./yaml/crds/fastpod_crd.yaml",
    "bash ./yaml/fastgshare/apply_deploy_ctr_mgr_node_daemon.sh",
    "kubectl apply -f ./yaml/fastpod/testfastpod.yaml",
    "kubectl get pods -n fast-gshare",
    "kubectl get fastpods -n fast-gshare",
    "bash ./yaml/fastgshare/clean_deploy_ctr_mgr_node_daemon.sh",
    "bash ./install/install_fast-gshare-fn.sh",
    "kubectl apply -f yaml/fastpod/test-fastgshare-fn.yaml",
    "bash ./install/uninstall_fast-gshare-fn.sh",
)
SAMPLE = REPO / "yaml" / "fastpod" / "testfastpod.yaml"
FUNCTION_SAMPLE = REPO / "yaml" / "fastpod" / "test-fastgshare-fn.yaml"
CLEAN = REPO / "yaml" / "fastgshare" / "clean_deploy_ctr_mgr_node_daemon.sh"
SAMPLE_NAMESPACE = "fast-gshare"
ENTRY_DIRS = (REPO / "yaml", REPO / "install")


def named_paths(command: str) -> list[Path]:
    """The repository files a seed command names (after ``-f``, or the script ``bash`` runs)."""
    words = shlex.split(command)
    if words[0] == "bash":
        return [REPO / words[1]]
    return [REPO / words[index + 1] for index, word in enumerate(words) if word == "-f"]


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def entry_files() -> list[Path]:
    return sorted(path for folder in ENTRY_DIRS for path in folder.rglob("*") if not path.is_dir())


@pytest.mark.parametrize("command", [c for c in SEED_COMMANDS if named_paths(c)])
def test_every_file_a_seed_command_names_is_there(command: str) -> None:
    for path in named_paths(command):
        assert path.is_file(), f"{command}: {path.relative_to(REPO)} is missing"


def test_the_entry_points_are_symlinks_into_the_repo_or_scripts_or_the_sample() -> None:
    """No second copy: every manifest under yaml/ is a symlink to deploy/ or examples/, except the
    sample FaSTPod (which no deploy/ file holds: it runs the simulated tenant in fast-gshare)."""
    found = entry_files()
    assert found, "yaml/ and install/ are empty"
    for path in found:
        name = path.relative_to(REPO)
        if path.is_symlink():
            target = path.resolve()
            assert target.is_file(), f"{name} -> {os.readlink(path)} does not resolve"
            assert target.is_relative_to(DEPLOY) or target.is_relative_to(REPO / "examples"), \
                f"{name} -> {target}: outside deploy/ and examples/"
            assert not Path(os.readlink(path)).is_absolute(), f"{name}: an absolute link breaks in another clone"
        elif path.suffix == ".yaml":
            assert path == SAMPLE, f"{name}: a manifest that is not a symlink into deploy/ or examples/"
        else:
            assert path.suffix in (".sh", ".md"), f"{name}: neither a script, a manifest nor a README"
    assert (REPO / "yaml/crds/fastpod_crd.yaml").resolve() == DEPLOY / "crd" / "fastpods.yaml"


def test_the_sample_holds_nothing_deploy_installs() -> None:
    installed = {(o["kind"], o["metadata"]["name"]) for o in objects()}
    for doc in documents(SAMPLE):
        assert (doc["kind"], doc["metadata"]["name"]) not in installed, f"{doc['kind']} {doc['metadata']['name']}"


def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> the openAPIV3Schema of each CRD in deploy/crd."""
    found = {}
    for path in (DEPLOY / "crd").glob("*.yaml"):
        for doc in documents(path):
            if doc["kind"] != "CustomResourceDefinition":
                continue
            spec = doc["spec"]
            for version in spec["versions"]:
                found[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = \
                    version["schema"]["openAPIV3Schema"]
    return found


def pruned(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Fields the API server would drop silently (not in a structural schema that keeps unknowns)."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and "properties" not in schema:
        return []
    if isinstance(value, dict) and "properties" in schema:
        dropped = []
        for key, item in value.items():
            if key in schema["properties"]:
                dropped += pruned(item, schema["properties"][key], f"{where}.{key}")
            elif isinstance(schema.get("additionalProperties"), dict):
                dropped += pruned(item, schema["additionalProperties"], f"{where}.{key}")
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                dropped.append(f"{where}.{key}".lstrip("."))
        return dropped
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [problem for index, item in enumerate(value) for problem in pruned(item, schema["items"],
                                                                                  f"{where}[{index}]")]
    return []


@pytest.mark.parametrize("path", [SAMPLE, FUNCTION_SAMPLE], ids=lambda path: path.name)
def test_the_samples_are_valid_against_our_crds(path: Path) -> None:
    schemas = crd_schemas()
    custom = [doc for doc in documents(path) if doc["apiVersion"].startswith(keys.FASTPOD_GROUP + "/")]
    assert custom, f"{path.name}: no FaSTPod or FaSTFunc"
    for doc in custom:
        schema = schemas[(doc["apiVersion"], doc["kind"])]
        jsonschema.Draft4Validator(schema).validate(doc)
        assert pruned(doc, schema) == [], f"{path.name}: fields the API server would drop"


def test_the_samples_pass_fastgshare_check(capsys: pytest.CaptureFixture[str]) -> None:
    """The share rules, and each podSpec against the Pod schema (fastgshare check, as a user runs it)."""
    assert main(["check", str(SAMPLE), str(FUNCTION_SAMPLE)]) == 0, capsys.readouterr().err


def test_the_sample_makes_its_namespace_before_the_fastpod_in_it() -> None:
    namespace, fastpod = documents(SAMPLE)
    assert (namespace["kind"], namespace["metadata"]["name"]) == ("Namespace", SAMPLE_NAMESPACE)
    assert (fastpod["kind"], fastpod["metadata"]["namespace"]) == (keys.FASTPOD_KIND, SAMPLE_NAMESPACE)
    # the clean-up command deletes the namespace by this label
    script = CLEAN.read_text()
    assert re.search(rf"^SAMPLE_NAMESPACE={SAMPLE_NAMESPACE}$", script, re.M)
    [(label, value)] = namespace["metadata"]["labels"].items()
    assert label == "app.kubernetes.io/part-of"
    assert re.search(rf"^PART_OF={value}$", script, re.M)


def test_the_function_sample_lives_where_deploy_makes_the_function_namespace() -> None:
    [fastpod] = documents(FUNCTION_SAMPLE)
    assert fastpod["metadata"]["namespace"] == keys.DEFAULT_FUNCTION_NAMESPACE
    assert ("Namespace", keys.DEFAULT_FUNCTION_NAMESPACE) in {(o["kind"], o["metadata"]["name"]) for o in objects()}


def test_the_samples_run_images_the_one_machine_cluster_imports() -> None:
    imported = {images.TENANT_IMAGE, images.FAKE_FN_IMAGE}
    for path in (SAMPLE, FUNCTION_SAMPLE):
        for doc in documents(path):
            for container in doc.get("spec", {}).get("podSpec", {}).get("containers", []):
                assert container["image"] in imported, f"{path.name}: {container['image']}"
                assert container.get("imagePullPolicy") == "IfNotPresent", path.name


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
@pytest.mark.parametrize("command", [c for c in SEED_COMMANDS if c.startswith("kubectl apply")])
def test_kubectl_reads_the_files_the_apply_commands_name(command: str) -> None:
    """The real kubectl (no cluster: --local) through the symlinks: the objects of the target files."""
    [path] = named_paths(command)
    result = subprocess.run(["kubectl", "annotate", "--local", "-f", str(path.relative_to(REPO)), "-o", "name",
                             "seed=read"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert [line.lower() for line in result.stdout.split()] == [kubectl_name(d) for d in documents(path.resolve())]


def kubectl_name(obj: dict[str, Any]) -> str:
    """What ``kubectl -o name`` prints for the object: kind.group/name (kind/name for the core group)."""
    group = obj["apiVersion"].rpartition("/")[0]
    return f"{obj['kind'].lower()}{'.' + group if group else ''}/{obj['metadata']['name']}"


def fake_kubectl(tmp_path: Path, namespace_part_of: str = "") -> dict[str, str]:
    """PATH with tests/unit/deploy/fake_kubectl.sh as kubectl, which also answers the label of
    namespace fast-gshare with ``namespace_part_of``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text("#!/usr/bin/env bash\n"
                       f'if [[ "$*" == "get namespace {SAMPLE_NAMESPACE} "* ]]; then\n'
                       '    echo "kubectl $*" >>"$FAKE_LOG"; printf %s "$NAMESPACE_PART_OF"; exit 0\n'
                       "fi\n"
                       f'exec bash {shlex.quote(str(FAKE_KUBECTL))} "$@"\n')
    kubectl.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(tmp_path / "kubectl.log"),
            "FAKE_VERSION": "v1.20.2", "FASTGSHARE_WAIT_TIMEOUT": "1s", "NAMESPACE_PART_OF": namespace_part_of}


def run_seed(command: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The command as written, from the repository root, stdin not a terminal; and its kubectl calls."""
    result = subprocess.run(["bash", "-c", command], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=120, check=False, stdin=subprocess.DEVNULL)
    log = Path(env["FAKE_LOG"])
    return result, log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize("command", ["bash ./yaml/fastgshare/apply_deploy_ctr_mgr_node_daemon.sh",
                                     "bash ./install/install_fast-gshare-fn.sh"])
def test_the_install_commands_run_deploy_install_sh(tmp_path: Path, command: str) -> None:
    result, calls = run_seed(command, fake_kubectl(tmp_path))
    assert result.returncode == 0, result.stderr
    assert f"kubectl kustomize {DEPLOY}" in calls  # install.sh applies the kustomization
    assert "fastgshare is installed" in result.stdout
    assert Path(f"{tmp_path / 'kubectl.log'}.applied").exists()


def test_the_install_commands_pass_install_sh_its_options(tmp_path: Path) -> None:
    result, calls = run_seed("bash ./install/install_fast-gshare-fn.sh --no-such-flag", fake_kubectl(tmp_path))
    assert result.returncode != 0
    assert result.stderr.strip() == "install.sh: unknown argument '--no-such-flag'; allowed: --rotate-webhook-cert"
    assert calls == []


@pytest.mark.parametrize(("part_of", "namespace_deleted"), [("fastgshare", True), ("", False), ("someone", False)])
def test_the_clean_command_uninstalls_without_asking_then_deletes_the_samples_namespace(
        tmp_path: Path, part_of: str, namespace_deleted: bool) -> None:
    env = fake_kubectl(tmp_path, part_of)
    env["FAKE_FASTPODS"] = f"{SAMPLE_NAMESPACE} test-fastpod"
    result, calls = run_seed("bash ./yaml/fastgshare/clean_deploy_ctr_mgr_node_daemon.sh", env)
    assert result.returncode == 0, result.stderr
    deletions = [call for call in calls if " delete " in call]
    expected = [f"kubectl -n {SAMPLE_NAMESPACE} delete fastpod test-fastpod --wait=true",
                f"kubectl delete -k {DEPLOY} --ignore-not-found=true --wait=true"]
    if namespace_deleted:
        expected.append(f"kubectl delete namespace {SAMPLE_NAMESPACE} --ignore-not-found=true --wait=true")
    assert deletions == expected


def test_the_clean_command_takes_no_argument(tmp_path: Path) -> None:
    result, calls = run_seed("bash ./yaml/fastgshare/clean_deploy_ctr_mgr_node_daemon.sh --keep",
                             fake_kubectl(tmp_path))
    assert result.returncode == 2
    assert result.stderr.strip() == ("clean_deploy_ctr_mgr_node_daemon.sh: unknown argument '--keep'; "
                                     "it takes none (-h for help)")
    assert calls == []


def test_the_function_uninstall_command_removes_the_function_sample_with_everything(tmp_path: Path) -> None:
    env = fake_kubectl(tmp_path)
    env["FAKE_FASTPODS"] = f"{keys.DEFAULT_FUNCTION_NAMESPACE} fake-fn"
    result, calls = run_seed("bash ./install/uninstall_fast-gshare-fn.sh", env)
    assert result.returncode == 0, result.stderr
    assert [call for call in calls if " delete " in call] == [
        f"kubectl -n {keys.DEFAULT_FUNCTION_NAMESPACE} delete fastpod fake-fn --wait=true",
        f"kubectl delete -k {DEPLOY} --ignore-not-found=true --wait=true"]  # the namespace fast-gshare-fn too
