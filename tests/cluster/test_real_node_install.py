"""The install tier: fastgshare installed on the real node the way a platform team installs it.

``fastgshare cluster up --from-manifests`` builds the project's image from its Dockerfile
offline, imports it into the node's containerd and runs ``deploy/install.sh`` unchanged: every
component of ours runs as a pod (the node agent's DaemonSet on the simulated GPUs the node's
label asks for, the scheduler Deployment with the extender beside kube-scheduler, the
controllers, the gateway). Tenants are FaSTPods applied with kubectl, scheduled by the deployed
scheduler and extender, served by the deployed node agent. Then an upgrade is rolled out while
they run, and ``deploy/uninstall.sh`` must leave the cluster as it was. Last, FaST-GShare's README
commands run verbatim in their order (``yaml/``, ``install/``: issue 36 item 8) on the same cluster.
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
    describe_pod,
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
              "fastgshare-scheduler", "fastgshare-node-agent", "fastgshare-nats", "fastgshare-queue-worker"}
# Ready once bound to NATS, which they reach by its Service's name: this cluster has no DNS nor
# kube-proxy (docs/cluster.md), so here they run without becoming Ready (install.sh does not wait for them).
UNREACHABLE_HERE = {"fastgshare-queue-worker"}
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
    return set(pods) == COMPONENTS and all(
        ready(pod) if name not in UNREACHABLE_HERE else pod.status.phase == "Running"
        for name, group in pods.items() for pod in group)


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


# --- the seed's README commands (issue 36 item 8) ------------------------------------------------
# A user moving from FaST-GShare starts with its README: apply the FaSTPod CRD, run
# apply_deploy_ctr_mgr_node_daemon.sh, apply the sample FaSTPod in fast-gshare, look at it with
# kubectl get, clean up, then install the function layer, apply the function example and
# uninstall. Each command runs as written, with `bash -c` from the repository root, on this
# module's cluster (after the uninstall test above: it begins with deploy/uninstall.sh --yes, so
# the commands start from a cluster without fastgshare, as a FaST-GShare user's does).
# tests/unit/deploy/test_seed_commands.py keeps yaml/ and install/ in step with deploy/.

SEED_REPO = manifests.REPO
SAMPLE_NAMESPACE = "fast-gshare"
SAMPLE_POD_SHARE = (700, 800)  # yaml/fastpod/testfastpod.yaml: request and limit, permille
FUNCTION = "fake-fn"  # yaml/fastpod/test-fastgshare-fn.yaml (examples/functions/fake-fn-fastpod.yaml)
FUNCTION_REPLICAS = 2
FUNCTION_SHARE = (300, 500)
SEED_WAIT = "300s"  # FASTGSHARE_WAIT_TIMEOUT for install.sh under the scripts: the machine may be loaded


def seed(cluster: Cluster, command: str) -> str:
    """Run one of the seed's commands as written, from the repository root, as a user's shell does
    (kubectl's context: the cluster's kubeconfig; stdin not a terminal). Its output goes to the
    cluster's logs (seed-commands.log); returns its standard output."""
    log = cluster.state_dir / "logs" / "seed-commands.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result = subprocess.run(["bash", "-c", command], cwd=SEED_REPO, capture_output=True, text=True, timeout=900,
                            check=False, stdin=subprocess.DEVNULL,
                            env={**manifests.kubectl_env(cluster.kubeconfig), "FASTGSHARE_WAIT_TIMEOUT": SEED_WAIT})
    with log.open("a") as out:
        out.write(f"$ {command}\n{result.stdout}{result.stderr}(exit {result.returncode})\n")
    assert result.returncode == 0, f"{command} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
    print(f"{command}: done in {time.monotonic() - started:.1f} s")
    return result.stdout


def wait_for_vgpus(cluster: Cluster, core: kubernetes.client.CoreV1Api) -> None:
    """The deployed node agent has registered the simulated GPUs' vGPUs with the kubelet again."""
    def advertised() -> bool:
        allocatable = core.read_node(cluster.node_name).status.allocatable or {}
        return int(allocatable.get(keys.VGPU_RESOURCE, "0")) == 2 * keys.DEFAULT_SLOTS_PER_GPU

    wait_until(advertised, what=f"{keys.VGPU_RESOURCE} on {cluster.node_name}", timeout_s=120)


def wait_until_as_before(cluster: Cluster, before: set[str], after: str) -> None:
    """Every object of the install tier's snapshot kinds, node label and annotation as ``before``."""
    found: list[set[str]] = []

    def same() -> bool:
        found.append(snapshot(cluster))
        return found[-1] == before

    try:
        wait_until(same, what=f"the cluster as before the seed's commands, after {after}", timeout_s=180,
                   interval_s=2)
    except TimeoutError:
        pytest.fail(f"after {after}: left {sorted(found[-1] - before)}, gone {sorted(before - found[-1])}",
                    pytrace=False)


def ready_pods(core: kubernetes.client.CoreV1Api, namespace: str, count: int) -> list[kubernetes.client.V1Pod]:
    """``count`` pods of the namespace running and Ready (their readiness probes pass)."""
    running_pods(core, namespace, count, timeout_s=180)

    def pods() -> list[kubernetes.client.V1Pod]:
        return list(core.list_namespaced_pod(namespace).items)

    try:
        wait_until(lambda: len(pods()) == count and all(ready(pod) for pod in pods()),
                   what=f"{count} Ready pods in {namespace}", timeout_s=120)
    except TimeoutError as error:
        raise TimeoutError(f"{error}; pods: {[describe_pod(pod) for pod in pods()]}") from None
    return pods()


def test_the_seed_commands_work_verbatim_in_their_order(real_cluster: Cluster,
                                                       core: kubernetes.client.CoreV1Api) -> None:
    uninstall_and_wait(real_cluster, core)  # a cluster without fastgshare, as the seed's user has
    before = snapshot(real_cluster)

    seed(real_cluster, "kubectl apply -f ./yaml/crds/fastpod_crd.yaml")
    crds = json.loads(kubectl(real_cluster, "get", "crd", "-o", "json"))["items"]
    assert [crd["metadata"]["name"] for crd in crds if crd["spec"]["group"] == keys.FASTPOD_GROUP] == [
        f"{keys.FASTPOD_PLURAL}.{keys.FASTPOD_GROUP}"]  # the FaSTPod CRD only, as the seed's step 1

    seed(real_cluster, "bash ./yaml/fastgshare/apply_deploy_ctr_mgr_node_daemon.sh")
    assert all_ready(core), {name: [p.status.phase for p in group] for name, group in component_pods(core).items()}
    wait_for_vgpus(real_cluster, core)

    seed(real_cluster, "kubectl apply -f ./yaml/fastpod/testfastpod.yaml")
    [pod] = running_pods(core, SAMPLE_NAMESPACE, 1, timeout_s=180)
    assert pod.spec.scheduler_name == keys.SCHEDULER_NAME
    share = assignment_of(pod).share
    assert (share.request_permille, share.limit_permille) == SAMPLE_POD_SHARE
    time.sleep(2)
    achieved = measure_shares(real_cluster, {assignment_of(pod).gpu_uuid}, 15)
    print(f"the sample FaSTPod's share over 15 s: {achieved}")
    request, limit = (permille / 1000 for permille in SAMPLE_POD_SHARE)
    assert request - TOLERANCE <= achieved[pod.metadata.uid] <= limit + TOLERANCE, achieved

    pods_table = seed(real_cluster, "kubectl get pods -n fast-gshare").splitlines()
    assert pods_table[0].split()[:3] == ["NAME", "READY", "STATUS"]
    # NAME READY STATUS RESTARTS: the tenant has no readiness probe, so running is ready
    assert [line.split()[:4] for line in pods_table[1:]] == [[pod.metadata.name, "1/1", "Running", "0"]], pods_table
    fastpods_table = seed(real_cluster, "kubectl get fastpods -n fast-gshare").splitlines()
    assert [line.split()[0] for line in fastpods_table[1:]] == ["test-fastpod"], fastpods_table
    assert_tenants_never_failed(real_cluster, core, SAMPLE_NAMESPACE)

    seed(real_cluster, "bash ./yaml/fastgshare/clean_deploy_ctr_mgr_node_daemon.sh")
    wait_until_as_before(real_cluster, before, "clean_deploy_ctr_mgr_node_daemon.sh")

    seed(real_cluster, "bash ./install/install_fast-gshare-fn.sh")
    assert all_ready(core)
    wait_for_vgpus(real_cluster, core)

    seed(real_cluster, "kubectl apply -f yaml/fastpod/test-fastgshare-fn.yaml")
    namespace = keys.DEFAULT_FUNCTION_NAMESPACE
    function_pods = ready_pods(core, namespace, FUNCTION_REPLICAS)
    for function_pod in function_pods:
        assert function_pod.spec.scheduler_name == keys.SCHEDULER_NAME
        share = assignment_of(function_pod).share
        assert (share.request_permille, share.limit_permille) == FUNCTION_SHARE
    gateway_pod = next(pod for pod in component_pods(core)["fastgshare-gateway"] if ready(pod))
    answers: list[tuple[int, bytes]] = []

    def answered() -> bool:
        answers.append(http(f"http://{gateway_pod.status.pod_ip}:8080/function/{FUNCTION}", method="POST",
                            body=b"from the seed's commands"))
        return answers[-1][0] == 200

    wait_until(answered, what=f"a 200 from {FUNCTION} through the deployed gateway", timeout_s=120, interval_s=1)
    answer = json.loads(answers[-1][1])
    assert answer["echo"] == "from the seed's commands"
    assert answer["pod"] in {f"{namespace}/{function_pod.metadata.name}" for function_pod in function_pods}

    seed(real_cluster, "bash ./install/uninstall_fast-gshare-fn.sh")
    wait_until_as_before(real_cluster, before, "uninstall_fast-gshare-fn.sh")
