"""deploy/ against the real API server: every object passes server-side validation (dry run).

The namespace and the CRD are created for real (the namespaced objects and the example
FaSTPods need them); everything else is a dry run, so the test leaves no workloads behind.
The v1.20 server knows every kind we ship.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.utils
import pytest
import yaml

from fastgshare import keys
from fastgshare_cluster.processes import ProcessFailed
from tests.cluster.conftest import MakeGpuNode, StartScheduler
from tests.cluster.controlplane import ControlPlane, wait_until
from tests.deploy_manifests import DEPLOY, objects

INSTALL = DEPLOY / "install.sh"


def _create(api_client: kubernetes.client.ApiClient, obj: dict[str, Any], **kwargs: Any) -> None:
    try:
        kubernetes.utils.create_from_dict(api_client, obj, **kwargs)
    except kubernetes.utils.FailToCreateError as error:
        if any(e.status != 409 for e in error.api_exceptions):
            raise


def _established(api_client: kubernetes.client.ApiClient, name: str) -> bool:
    crd = kubernetes.client.ApiextensionsV1Api(api_client).read_custom_resource_definition(name)
    return any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or []))


def test_every_deploy_object_passes_server_side_validation(api_client: kubernetes.client.ApiClient) -> None:
    everything = objects()
    for obj in everything:
        if obj["kind"] in ("Namespace", "CustomResourceDefinition"):
            _create(api_client, obj)
    crd = next(o for o in everything if o["kind"] == "CustomResourceDefinition")["metadata"]["name"]
    wait_until(lambda: _established(api_client, crd), what=f"CRD {crd}", timeout_s=30)
    for obj in everything:
        if obj["kind"] not in ("Namespace", "CustomResourceDefinition"):
            _create(api_client, obj, dry_run="All")


@pytest.mark.parametrize("path", sorted((DEPLOY / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_the_examples_are_accepted(api_client: kubernetes.client.ApiClient, namespace: str, path: Path) -> None:
    test_every_deploy_object_passes_server_side_validation(api_client)
    custom = kubernetes.client.CustomObjectsApi(api_client)
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        if doc["kind"] != keys.FASTPOD_KIND:
            _create(api_client, doc, namespace=namespace, dry_run="All")
            continue
        group, version = doc["apiVersion"].split("/")
        custom.create_namespaced_custom_object(group, version, namespace, keys.FASTPOD_PLURAL, doc, dry_run="All")


def test_install_picks_the_scheduler_config_the_real_scheduler_reads(api_client: kubernetes.client.ApiClient,
                                                                    start_scheduler: StartScheduler) -> None:
    """Issue 15, defect 4: install.sh asks the server its version and picks the configuration that
    kube-scheduler of that version reads; the real v1.20 scheduler runs it (and refuses the v1 form)."""
    git_version = kubernetes.client.VersionApi(api_client).get_code().git_version
    document = json.dumps({"gitVersion": git_version})
    chosen = subprocess.run(["bash", "-c", f'source "{INSTALL}" && scheduler_config_for "$(version_from_json "$1")"',
                             "install.sh", document], capture_output=True, text=True, timeout=30, check=True)
    config = chosen.stdout.strip()
    [config_map] = [o for o in objects() if o["kind"] == "ConfigMap"]
    start_scheduler(config_map["data"][config])  # raises with the scheduler's log if it refuses it
    with pytest.raises(ProcessFailed, match=r"no kind .KubeSchedulerConfiguration. is registered"):
        start_scheduler(config_map["data"]["kube-scheduler-config.yaml"])


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl on PATH, as uninstall.sh does")
def test_uninstall_finds_and_removes_the_node_annotations_on_the_real_server(
        control_plane: ControlPlane, core: kubernetes.client.CoreV1Api, make_gpu_node: MakeGpuNode) -> None:
    """Issue 15, defect 5: uninstall.sh's node functions with the real kubectl and API server; the
    annotation goes, the node's other annotations stay, nodes without it are left alone."""
    ours = make_gpu_node(1).metadata.name
    core.patch_node(ours, {"metadata": {"annotations": {"team.example/owner": "ml"}}})
    other = make_gpu_node(1).metadata.name
    core.patch_node(other, {"metadata": {"annotations": {keys.NODE_GPU_INFO_ANNOTATION: None}}})
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)}

    def uninstall_function(*words: str) -> str:
        return subprocess.run(["bash", "-c", f'source "{DEPLOY / "uninstall.sh"}" && "$@"', "uninstall.sh", *words],
                              capture_output=True, text=True, timeout=60, check=True, env=env).stdout

    listed = uninstall_function("annotated_nodes").split()
    assert ours in listed
    assert other not in listed
    uninstall_function("remove_node_annotation", ours)
    annotations = core.read_node(ours).metadata.annotations or {}
    assert keys.NODE_GPU_INFO_ANNOTATION not in annotations
    assert annotations["team.example/owner"] == "ml"
    assert ours not in uninstall_function("annotated_nodes").split()
