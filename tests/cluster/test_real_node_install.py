"""The install tier: fastgshare installed on the real node the way a platform team installs it.

``fastgshare cluster up --from-manifests`` builds the project's image from its Dockerfile
offline, imports it into the node's containerd and runs ``deploy/install.sh`` unchanged: every
component of ours runs as a pod (the node agent's DaemonSet on the simulated GPUs the node's
label asks for, the scheduler Deployment with the extender beside kube-scheduler, the
controllers, the gateway). Tenants are FaSTPods applied with kubectl, scheduled by the deployed
scheduler and extender, served by the deployed node agent. Then an upgrade is rolled out while
they run, and ``deploy/uninstall.sh`` must leave the cluster as it was.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare_cluster import cluster as local_cluster
from fastgshare_cluster import manifests
from fastgshare_cluster.cluster import Cluster, ClusterError, Options
from fastgshare_cluster.controlplane import Binaries
from fastgshare_cluster.image_build import IMAGE
from fastgshare_cluster.images import FAKE_FN_IMAGE_SHORT, kube_scheduler_image
from fastgshare_cluster.processes import wait_until
from tests.cluster import controlplane
from tests.cluster.real_node import (  # noqa: F401 - fixtures
    apply,
    assert_tenants_never_failed,
    assignment_of,
    busy_by_pod,
    fastpod,
    gateway_credentials,
    http,
    measure_shares,
    real_node_core,
    real_node_test_namespace,
    running_pods,
    share_annotations,
)

pytestmark = pytest.mark.realnode

NAMESPACE = manifests.NAMESPACE
COMPONENTS = {"fastgshare-controller", "fastgshare-function-controller", "fastgshare-gateway",
              "fastgshare-scheduler", "fastgshare-node-agent"}
SHARES = {"small": (0.2, 0.3, 30, "1Gi"), "medium": (0.3, 0.5, 30, "1Gi"), "burst": (0.1, 1.0, 30, "1Gi")}
TOLERANCE = 0.03  # points of GPU time
UPGRADE_IMAGE = "ghcr.io/fastgshare/fastgshare:0.1.1-upgrade"


@pytest.fixture(scope="module")
def real_cluster(cluster_binaries: Binaries, real_node_turn: None,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """This module's cluster: ``cluster up --from-manifests`` (instead of conftest's host processes)."""
    controlplane.install_emergency_cleanup()
    state_dir = tmp_path_factory.mktemp("installed-cluster")
    lines: list[str] = []
    try:
        running = local_cluster.up(Options(state_dir=state_dir, die_with_parent=True, say=lines.append,
                                           from_manifests=True))
    except ClusterError as error:
        pytest.fail(f"fastgshare cluster up --from-manifests failed:\n{error}\n" + "\n".join(lines), pytrace=False)
    print("\n".join(lines))
    try:
        yield running
    finally:
        problems = local_cluster.down(state_dir, say=lines.append)
        assert not problems, f"cluster down left: {problems}"


def kubectl(cluster: Cluster, *args: str, env: dict[str, str] | None = None, timeout_s: float = 600) -> str:
    result = subprocess.run(["kubectl", *args], env={**manifests.kubectl_env(cluster.kubeconfig), **(env or {})},
                            capture_output=True, text=True, timeout=timeout_s, check=False)
    assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def deploy_script(cluster: Cluster, script: str, *args: str, env: dict[str, str] | None = None) -> float:
    """Run deploy/<script> as a user does; its output goes to the cluster's logs. Seconds it took."""
    return manifests.run_script(script, cluster.kubeconfig, *args, say=print, env=env,
                                log_path=cluster.state_dir / "logs" / "install.log")


def component_pods(core: kubernetes.client.CoreV1Api) -> dict[str, list[kubernetes.client.V1Pod]]:
    """Our namespace's pods by component (their app.kubernetes.io/name label)."""
    found: dict[str, list[kubernetes.client.V1Pod]] = {}
    for pod in core.list_namespaced_pod(NAMESPACE).items:
        found.setdefault((pod.metadata.labels or {}).get("app.kubernetes.io/name", "?"), []).append(pod)
    return found


def ready(pod: kubernetes.client.V1Pod) -> bool:
    return pod.metadata.deletion_timestamp is None and any(
        c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def all_ready(core: kubernetes.client.CoreV1Api) -> bool:
    pods = component_pods(core)
    return set(pods) == COMPONENTS and all(ready(pod) for group in pods.values() for pod in group)


def test_install_makes_every_component_ready_from_the_image_built_offline(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api) -> None:
    state = json.loads((real_cluster.state_dir / "cluster.json").read_text())
    image = state["image"]
    print(f"image {image['tag']}: {image['size_bytes'] / 2**20:.0f} MiB, built in {image['build_seconds']} s "
          f"(+ {image['base_seconds']} s for the base); install.sh until every component was Ready: "
          f"{state['install_seconds']} s; cluster up in {state['up_seconds']} s")
    # install.sh waits for each component with FASTGSHARE_WAIT_TIMEOUT=120s and fails otherwise.
    assert all_ready(core), {name: [p.status.phase for p in group] for name, group in component_pods(core).items()}
    pods = component_pods(core)
    assert {c.image for c in pods["fastgshare-node-agent"][0].spec.containers} == {IMAGE}
    assert {c.image for c in pods["fastgshare-scheduler"][0].spec.containers} == {
        IMAGE, kube_scheduler_image(manifests.K8S_VERSION)}
    assert "fastgshare-mps" not in pods  # simulated GPUs model MPS; the DaemonSet skips their nodes
    node = core.read_node(real_cluster.node_name)
    assert int(node.status.allocatable[keys.VGPU_RESOURCE]) == 2 * 16  # the default 2 simulated GPUs
    inventory = json.loads(node.metadata.annotations[keys.NODE_GPU_INFO_ANNOTATION])
    assert len(inventory["gpus"]) == 2, inventory


def test_fastpods_applied_with_kubectl_get_their_shares_through_the_deployed_components(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    apply(real_cluster, namespace, *(fastpod(name, share_annotations(*share), {"TENANT_KERNEL_US": "2000"})
                                     for name, share in SHARES.items()))
    pods = running_pods(core, namespace, len(SHARES), timeout_s=120)
    by_uid = {pod.metadata.uid: pod for pod in pods}
    for pod in pods:
        assert pod.spec.scheduler_name == "fastgshare-scheduler"
        assignment_of(pod)  # the deployed extender chose the GPU and recorded it
    gpus = {assignment_of(pod).gpu_uuid for pod in pods}
    time.sleep(2)
    achieved = measure_shares(real_cluster, gpus, 15)
    report = {by_uid[uid].metadata.labels["app"]: round(share, 3) for uid, share in achieved.items()}
    print(f"shares through the deployed components over 15 s: {report}")
    assert set(achieved) == set(by_uid), report
    for uid, share in achieved.items():
        request, limit, _sm, _memory = SHARES[by_uid[uid].metadata.labels["app"]]
        assert request - TOLERANCE <= share <= limit + TOLERANCE, report


def test_a_function_deployed_through_the_deployed_gateway_answers_and_is_deleted(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api) -> None:
    """The gateway pod's OpenFaaS provider API, as faas-cli uses it: the function controller and the
    FaSTPod controller of the install make its pod, the deployed scheduler places it, and the
    gateway routes to it."""
    gateway_pod = next(pod for pod in component_pods(core)["fastgshare-gateway"] if ready(pod))
    gateway = f"http://{gateway_pod.status.pod_ip}:8080"
    namespace = keys.DEFAULT_FUNCTION_NAMESPACE
    deployment = {"service": "echo", "image": FAKE_FN_IMAGE_SHORT, "namespace": namespace,
                  "envVars": {"FAKE_FN_GPU_MS": "2"},
                  "annotations": {keys.GPU_QUOTA_REQUEST: "0.2", keys.GPU_QUOTA_LIMIT: "0.4",
                                  keys.GPU_SM_PARTITION: "30", keys.GPU_MEM: "256Mi"}}
    # /system/* needs the credentials install.sh put in Secret basic-auth, as faas-cli login reads them
    assert http(f"{gateway}/system/functions", method="POST", body=json.dumps(deployment).encode())[0] == 401
    admin = gateway_credentials(core)
    status, body = http(f"{gateway}/system/functions", method="POST", body=json.dumps(deployment).encode(),
                        auth=admin)
    assert status == 202, body
    answers: list[tuple[int, bytes]] = []

    def answered() -> bool:
        answers.append(http(f"{gateway}/function/echo/infer", method="POST", body=b"through the install"))
        return answers[-1][0] == 200

    wait_until(answered, what="a 200 from the function through the deployed gateway", timeout_s=180, interval_s=1)
    assert json.loads(answers[-1][1])["echo"] == "through the install"
    [pod] = core.list_namespaced_pod(namespace, label_selector=f"{keys.FUNCTION_LABEL}=echo").items
    assert pod.spec.scheduler_name == "fastgshare-scheduler"
    assert assignment_of(pod).share.limit_permille == 400
    status, body = http(f"{gateway}/system/functions", method="DELETE",
                        body=json.dumps({"functionName": "echo", "namespace": namespace}).encode(), auth=admin)
    assert status == 202, body
    wait_until(lambda: not core.list_namespaced_pod(namespace).items, what=f"no pods left in {namespace}",
               timeout_s=120)


def test_an_upgrade_rolls_the_node_agent_while_tenants_run_without_an_error_and_shares_hold(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    """The new tag (the same image, tagged anew in the node's containerd: what a pull would leave)
    applied with install.sh: the DaemonSet replaces the agent's pod while three tenants launch."""
    apply(real_cluster, namespace, *(fastpod(name, share_annotations(*share), {"TENANT_KERNEL_US": "2000"})
                                     for name, share in SHARES.items()))
    pods = running_pods(core, namespace, len(SHARES), timeout_s=120)
    gpus = {assignment_of(pod).gpu_uuid for pod in pods}
    [old_agent] = component_pods(core)["fastgshare-node-agent"]
    ctr = shutil.which("ctr") or "ctr"
    subprocess.run([ctr, "--address", str(real_cluster.containerd_socket), "--namespace", "k8s.io", "images", "tag",
                    "--force", IMAGE, UPGRADE_IMAGE], check=True, capture_output=True, timeout=60)
    busy_before = {uid: ns for gpu in gpus for uid, ns in busy_by_pod(real_cluster, gpu).items()}
    started = time.monotonic()
    seconds = deploy_script(real_cluster, "install.sh", env={"FASTGSHARE_IMAGE": UPGRADE_IMAGE,
                                                             "FASTGSHARE_WAIT_TIMEOUT": "300s"})
    # install.sh returns once every component runs the new image and is Ready
    [new_agent] = component_pods(core)["fastgshare-node-agent"]
    assert new_agent.metadata.uid != old_agent.metadata.uid
    assert new_agent.spec.containers[0].image == UPGRADE_IMAGE
    assert ready(new_agent)
    assert {c.image for group in component_pods(core).values() for p in group for c in p.spec.containers
            if "fastgshare/fastgshare" in c.image and p.metadata.deletion_timestamp is None} == {UPGRADE_IMAGE}

    def all_launching() -> bool:
        now = {uid: ns for gpu in gpus for uid, ns in busy_by_pod(real_cluster, gpu).items()}
        return all(now[pod.metadata.uid] > busy_before[pod.metadata.uid] for pod in pods)

    wait_until(all_launching, what="every tenant launching on the new agent", timeout_s=60)
    print(f"install.sh with the new tag rolled every component in {seconds:.0f} s "
          f"(tenants launching again {time.monotonic() - started:.0f} s after it began)")
    by_uid = {pod.metadata.uid: pod for pod in pods}
    achieved = measure_shares(real_cluster, gpus, 10)
    report = {by_uid[uid].metadata.labels["app"]: round(share, 3) for uid, share in achieved.items()}
    print(f"shares after the upgrade over 10 s: {report}")
    for uid, share in achieved.items():
        request, limit, _sm, _memory = SHARES[by_uid[uid].metadata.labels["app"]]
        assert request - TOLERANCE <= share <= limit + TOLERANCE, report
    assert_tenants_never_failed(real_cluster, core, namespace)


# What uninstall.sh must take away: objects of these kinds, and the nodes' labels and annotations.
SNAPSHOT_KINDS = ("namespaces", "customresourcedefinitions", "clusterroles", "clusterrolebindings", "roles",
                  "rolebindings", "serviceaccounts", "configmaps", "secrets", "services", "deployments",
                  "daemonsets", "leases", "validatingwebhookconfigurations", "mutatingwebhookconfigurations",
                  "priorityclasses", "networkpolicies")


def snapshot(cluster: Cluster) -> set[str]:
    """Every object of :data:`SNAPSHOT_KINDS` and every node label and annotation, one string each."""
    listed: dict[str, Any] = json.loads(kubectl(cluster, "get", ",".join(SNAPSHOT_KINDS), "--all-namespaces",
                                                "-o", "json"))
    found = {f"{o['kind']} {o['metadata'].get('namespace', '')}/{o['metadata']['name']}" for o in listed["items"]}
    for node in json.loads(kubectl(cluster, "get", "nodes", "-o", "json"))["items"]:
        meta = node["metadata"]
        found |= {f"node {meta['name']} label {key}" for key in meta.get("labels") or {}}
        found |= {f"node {meta['name']} annotation {key}" for key in meta.get("annotations") or {}}
    return found


def uninstall_and_wait(cluster: Cluster, core: kubernetes.client.CoreV1Api) -> None:
    deploy_script(cluster, "uninstall.sh", "--yes")
    wait_until(lambda: not any(ns.metadata.name in (NAMESPACE, keys.DEFAULT_FUNCTION_NAMESPACE)
                               for ns in core.list_namespace().items),
               what=f"namespaces {NAMESPACE} and {keys.DEFAULT_FUNCTION_NAMESPACE} gone", timeout_s=120)


def test_uninstall_leaves_nothing_of_ours_and_install_works_again(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api) -> None:
    uninstall_and_wait(real_cluster, core)
    clean = snapshot(real_cluster)
    users = f"node {real_cluster.node_name} label {keys.SIMULATED_GPUS_LABEL}"  # the user's setting, not ours
    ours = sorted(entry for entry in clean - {users}
                  if "fastgshare" in entry.replace(real_cluster.node_name, "<node>"))  # the node is named so
    assert not ours, f"uninstall.sh left: {ours}"

    seconds = deploy_script(real_cluster, "install.sh", env={"FASTGSHARE_WAIT_TIMEOUT": "120s"})
    assert all_ready(core)
    print(f"install.sh again after uninstall.sh: every component Ready in {seconds:.0f} s")
    uninstall_and_wait(real_cluster, core)
    assert snapshot(real_cluster) == clean
