"""The FaSTPod controller against the real v1.20 API server (and the garbage collector).

The controller runs in-process through its composition root (``main.run``) with its real
adapters, watching only the test's namespace. The CRD is the one in ``deploy/crd``. Without a
kubelet pods never run: tests make a pod "scheduled" and "ready" by binding it to a fake node
and writing its status, as kube-scheduler and kubelet would. Fixtures shared by the other
``test_controller_*`` modules (as plain functions and classes) live here.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from fastgshare import keys
from fastpod_crd_controller.main import build_parser, run
from tests.cluster.controlplane import ControlPlane, wait_until

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "deploy" / "crd" / "fastpods.yaml"
EXAMPLES = REPO / "deploy" / "examples"
GROUP, VERSION, PLURAL = keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, keys.FASTPOD_PLURAL
SHARE = {keys.GPU_QUOTA_REQUEST: "0.3", keys.GPU_QUOTA_LIMIT: "0.6", keys.GPU_SM_PARTITION: "40",
         keys.GPU_MEM: "2Gi"}


# --- fixtures and helpers shared by the controller's cluster tests ------------------------------
def install_fastpod_crd(api_client: kubernetes.client.ApiClient) -> None:
    """Install the CRD from deploy/crd (unless it is there) and wait until it is Established."""
    extensions = kubernetes.client.ApiextensionsV1Api(api_client)
    body = yaml.safe_load(CRD_FILE.read_text())
    try:
        extensions.create_custom_resource_definition(body)
    except ApiException as error:
        if error.status != 409:
            raise

    def established() -> bool:
        crd = extensions.read_custom_resource_definition(keys.FASTPOD_CRD_NAME)
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_until(established, what="the FaSTPod CRD to be Established", timeout_s=60)


@pytest.fixture(scope="session")
def fastpod_crd(api_client: kubernetes.client.ApiClient) -> None:
    install_fastpod_crd(api_client)


class Cluster:
    """The API calls the tests make, on one namespace."""

    def __init__(self, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.core = kubernetes.client.CoreV1Api(api)
        self.custom = kubernetes.client.CustomObjectsApi(api)

    def create_fastpod(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                             PLURAL, body)
        return result

    def fastpod(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        return result

    def patch_fastpod(self, name: str, patch: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name, patch)

    def delete_fastpod(self, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)

    def scale(self, name: str, replicas: int) -> dict[str, Any]:
        self.custom.patch_namespaced_custom_object_scale(GROUP, VERSION, self.namespace, PLURAL, name,
                                                         {"spec": {"replicas": replicas}})
        result: dict[str, Any] = self.custom.get_namespaced_custom_object_scale(GROUP, VERSION, self.namespace,
                                                                                PLURAL, name)
        return result

    def pods(self, fastpod: str) -> list[kubernetes.client.V1Pod]:
        """The live pods of ``fastpod`` (terminating ones left out)."""
        items = self.core.list_namespaced_pod(self.namespace,
                                              label_selector=f"{keys.FASTPOD_NAME_LABEL}={fastpod}").items
        return [pod for pod in items if pod.metadata.deletion_timestamp is None]

    def pod_names(self, fastpod: str) -> set[str]:
        return {pod.metadata.name for pod in self.pods(fastpod)}

    def wait_for_pods(self, fastpod: str, count: int, timeout_s: float = 60) -> list[kubernetes.client.V1Pod]:
        wait_until(lambda: len(self.pods(fastpod)) == count, what=f"{count} pods of FaSTPod {fastpod}",
                   timeout_s=timeout_s)
        return self.pods(fastpod)

    def wait_for_status(self, name: str, check: Callable[[dict[str, Any]], bool], what: str,
                        timeout_s: float = 60) -> dict[str, Any]:
        wait_until(lambda: check(self.fastpod(name).get("status") or {}), what=f"FaSTPod {name}: {what}",
                   timeout_s=timeout_s)
        status: dict[str, Any] = self.fastpod(name)["status"]
        return status

    def bind_and_ready(self, pod: str, node: str) -> None:
        """What kube-scheduler and kubelet would do: bind the pod, then report it Running and Ready."""
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self.core.create_namespaced_pod_binding(pod, self.namespace, binding, _preload_content=False)
        self.core.patch_namespaced_pod_status(pod, self.namespace, {"status": {
            "phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})

    def events(self, name: str, reason: str) -> list[kubernetes.client.CoreV1Event]:
        selector = f"involvedObject.name={name},involvedObject.kind=FaSTPod,reason={reason}"
        return list(self.core.list_namespaced_event(self.namespace, field_selector=selector).items)


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def fastpod_body(name: str, replicas: int = 3, annotations: dict[str, str] | None = None,
                 pod_spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
        "metadata": {"name": name, "annotations": dict(SHARE if annotations is None else annotations)},
        "spec": {"replicas": replicas, "podSpec": pod_spec or {"containers": [
            {"name": "server", "image": "registry.invalid/resnet:1", "ports": [{"containerPort": 5000}]}]}},
    }


@contextlib.contextmanager
def running_controller(plane: ControlPlane, namespace: str, *flags: str,
                       api: kubernetes.client.ApiClient | None = None) -> Iterator[None]:
    """The controller (its real ``run``) in a thread, watching ``namespace``; stopped cleanly after."""
    args = build_parser().parse_args(["--kubeconfig", str(plane.kubeconfig), "--namespace", namespace, *flags])
    stopping = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(run(args, stopping, api=api)), name="controller",
                              daemon=True)
    thread.start()
    try:
        yield
    finally:
        stopping.set()
        thread.join(60)
    assert result == [0], "the controller did not stop cleanly"


@pytest.fixture
def cluster(api_client: kubernetes.client.ApiClient, namespace: str, fastpod_crd: None) -> Cluster:
    return Cluster(api_client, namespace)


@pytest.fixture
def controller(control_plane: ControlPlane, namespace: str, fastpod_crd: None) -> Iterator[None]:
    with running_controller(control_plane, namespace, "--no-leader-elect"):
        yield


# --- the tests ------------------------------------------------------------------------------------
def test_applying_the_example_gives_pods_of_the_right_shape(cluster: Cluster, controller: None) -> None:
    body = yaml.safe_load((EXAMPLES / "testfastpod.yaml").read_text())
    body["spec"]["replicas"] = 3
    created = cluster.create_fastpod(body)
    pods = cluster.wait_for_pods("test-fastpod", 3)
    for pod in pods:
        assert pod.metadata.generate_name == "test-fastpod-"
        [owner] = pod.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "FaSTPod", "test-fastpod", created["metadata"]["uid"], True)
        assert pod.metadata.labels["app"] == "test-fastpod"
        assert {k: pod.metadata.annotations[k] for k in keys.SHARE_ANNOTATIONS} == {
            k: body["metadata"]["annotations"][k] for k in keys.SHARE_ANNOTATIONS}
        assert (pod.spec.scheduler_name, pod.spec.host_ipc) == (keys.SCHEDULER_NAME, None)  # hostIPC is opt-in
        [container] = pod.spec.containers
        assert container.resources.limits == {keys.VGPU_RESOURCE: "1"}
        assert container.ports[0].container_port == 5000
        assert container.ports[0].host_port is None
        assert container.volume_mounts[0].mount_path == "/models/"
        assert pod.spec.volumes[0].host_path.path == "/models/"
        env = {e.name: e for e in container.env}
        assert env[keys.ENV_POD].value == "$(FASTGSHARE_POD_NAMESPACE)/$(FASTGSHARE_POD_NAME)"
        assert env[keys.ENV_POD_NAME].value_from.field_ref.field_path == "metadata.name"
    status = cluster.wait_for_status("test-fastpod", lambda s: s.get("replicas") == 3, "3 replicas")
    assert status["selector"] == "app=test-fastpod"
    assert status["observedGeneration"] == created["metadata"]["generation"]
    assert sorted(p["name"] for p in status["pods"]) == sorted(p.metadata.name for p in pods)
    assert condition(status, "InvalidSpec")["status"] == "False"


def test_kubectl_columns_show_desired_ready_and_the_share(cluster: Cluster, controller: None) -> None:
    cluster.create_fastpod(fastpod_body("columns", replicas=2))
    cluster.wait_for_status("columns", lambda s: s.get("replicas") == 2, "2 replicas")
    table = cluster.custom.list_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL,
        _headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}, _preload_content=False)
    parsed = yaml.safe_load(table.data)
    columns = [c["name"] for c in parsed["columnDefinitions"]]
    assert columns == ["Name", "Desired", "Ready", "Request", "Limit", "SM", "Memory", "Age"]
    assert parsed["rows"][0]["cells"][:7] == ["columns", 2, 0, "0.3", "0.6", "40", "2 GiB"]


def test_scaling_through_the_scale_subresource_keeps_the_ready_pods(cluster: Cluster, controller: None,
                                                                    make_gpu_node: Callable[..., Any]) -> None:
    cluster.create_fastpod(fastpod_body("scaled", replicas=3))
    pods = cluster.wait_for_pods("scaled", 3)
    node = make_gpu_node(1).metadata.name
    keep = sorted(pod.metadata.name for pod in pods)[:2]
    for name in keep:
        cluster.bind_and_ready(name, node)
    cluster.wait_for_status("scaled", lambda s: s.get("readyReplicas") == 2, "2 ready")

    scale = cluster.scale("scaled", 5)
    assert scale["spec"]["replicas"] == 5
    cluster.wait_for_pods("scaled", 5)
    scale = cluster.scale("scaled", 2)
    wait_until(lambda: cluster.pod_names("scaled") == set(keep), what="the two ready pods to be the ones left",
               timeout_s=60)
    cluster.wait_for_status("scaled", lambda s: s.get("replicas") == 2, "2 replicas")
    scale = cluster.custom.get_namespaced_custom_object_scale(GROUP, VERSION, cluster.namespace, PLURAL, "scaled")
    assert (scale["spec"]["replicas"], scale["status"]["replicas"]) == (2, 2)
    assert scale["status"]["selector"] == "fastgshare.caps.in.tum/fastpod=scaled"
    status = cluster.fastpod("scaled")["status"]
    assert condition(status, "Available") == {**condition(status, "Available"), "status": "True",
                                              "message": "2 of 2 replicas ready"}
    assert {p["node"] for p in status["pods"]} == {node}


def test_a_pod_deleted_by_hand_is_replaced(cluster: Cluster, controller: None) -> None:
    cluster.create_fastpod(fastpod_body("phoenix", replicas=2))
    before = {pod.metadata.name for pod in cluster.wait_for_pods("phoenix", 2)}
    victim = sorted(before)[0]
    cluster.core.delete_namespaced_pod(victim, cluster.namespace)
    wait_until(lambda: len(cluster.pod_names("phoenix")) == 2 and victim not in cluster.pod_names("phoenix"),
               what="a replacement pod", timeout_s=60)
    assert len(cluster.pod_names("phoenix") & before) == 1


def test_an_invalid_annotation_is_reported_and_fixing_it_recovers(cluster: Cluster, controller: None) -> None:
    cluster.create_fastpod(fastpod_body("broken", replicas=2, annotations={**SHARE, keys.GPU_SM_PARTITION: "150"}))
    status = cluster.wait_for_status("broken", lambda s: condition(s, "InvalidSpec").get("status") == "True",
                                     "InvalidSpec")
    message = ('fastgshare/gpu_sm_partition: "150" is out of range; allowed: an integer percent of the SMs, '
               '1..100 (e.g. "50")')
    assert condition(status, "InvalidSpec")["reason"] == "InvalidShareAnnotations"
    assert condition(status, "InvalidSpec")["message"] == message
    wait_until(lambda: len(cluster.events("broken", "InvalidSpec")) == 1, what="the Warning event", timeout_s=30)
    [event] = cluster.events("broken", "InvalidSpec")
    assert (event.type, event.message, event.source.component) == ("Warning", message, "fastgshare-controller")
    time.sleep(2)  # the controller has had time to act on it: still nothing
    assert cluster.pods("broken") == []

    cluster.patch_fastpod("broken", {"metadata": {"annotations": {keys.GPU_SM_PARTITION: "50"}}})
    cluster.wait_for_pods("broken", 2)
    status = cluster.wait_for_status("broken", lambda s: condition(s, "InvalidSpec").get("status") == "False",
                                     "InvalidSpec cleared")
    assert condition(status, "InvalidSpec")["reason"] == "Valid"
    assert len(cluster.events("broken", "InvalidSpec")) == 1


def test_the_schema_rejects_what_it_can(cluster: Cluster) -> None:
    for replicas in (-1, "three"):
        body = fastpod_body("schema")
        body["spec"]["replicas"] = replicas
        with pytest.raises(ApiException) as rejected:
            cluster.create_fastpod(body)
        assert rejected.value.status == 422
        assert "spec.replicas" in rejected.value.body
    body = fastpod_body("schema")
    body["spec"]["podSpec"] = {"containers": []}
    with pytest.raises(ApiException) as rejected:
        cluster.create_fastpod(body)
    assert "spec.podSpec.containers" in rejected.value.body
    del body["spec"]["replicas"]
    body["spec"]["podSpec"] = {"containers": [{"name": "x", "image": "y"}], "unknownButKept": {"a": 1}}
    stored = cluster.create_fastpod(body)
    assert stored["spec"]["replicas"] == 1
    assert stored["spec"]["podSpec"]["unknownButKept"] == {"a": 1}


def test_a_changed_sm_share_replaces_the_pods(cluster: Cluster, controller: None) -> None:
    cluster.create_fastpod(fastpod_body("rolling", replicas=3))
    old = {pod.metadata.name for pod in cluster.wait_for_pods("rolling", 3)}
    cluster.patch_fastpod("rolling", {"metadata": {"annotations": {keys.GPU_SM_PARTITION: "60"}}})

    def replaced() -> bool:
        pods = cluster.pods("rolling")
        return (len(pods) == 3 and not {p.metadata.name for p in pods} & old
                and all(p.metadata.annotations[keys.GPU_SM_PARTITION] == "60" for p in pods))

    wait_until(replaced, what="3 pods with the new share", timeout_s=60)
    status = cluster.wait_for_status("rolling", lambda s: s.get("updatedReplicas") == 3 and s.get("replicas") == 3,
                                     "3 updated replicas")
    assert condition(status, "Progressing")["reason"] == "ReplicasUpToDate"


def test_a_changed_time_quota_updates_the_pods_in_place(cluster: Cluster, controller: None) -> None:
    cluster.create_fastpod(fastpod_body("in-place", replicas=2))
    old = {pod.metadata.uid for pod in cluster.wait_for_pods("in-place", 2)}
    cluster.patch_fastpod("in-place", {"metadata": {"annotations": {keys.GPU_QUOTA_LIMIT: "0.4"}}})

    def updated() -> bool:
        pods = cluster.pods("in-place")
        return {p.metadata.uid for p in pods} == old and all(
            p.metadata.annotations[keys.GPU_QUOTA_LIMIT] == "0.4" for p in pods)

    wait_until(updated, what="the same 2 pods with the new limit", timeout_s=60)
    status = cluster.wait_for_status("in-place", lambda s: s.get("updatedReplicas") == 2, "2 updated replicas")
    assert {p.metadata.labels[keys.REVISION_LABEL] for p in cluster.pods("in-place")} == {status["revision"]}


@pytest.mark.usefixtures("controller_manager")
def test_deleting_the_fastpod_collects_its_pods(cluster: Cluster, controller: None) -> None:
    cluster.create_fastpod(fastpod_body("doomed", replicas=3))
    cluster.wait_for_pods("doomed", 3)
    cluster.delete_fastpod("doomed")
    wait_until(lambda: not cluster.core.list_namespaced_pod(
        cluster.namespace, label_selector=f"{keys.FASTPOD_NAME_LABEL}=doomed").items,
        what="the garbage collector to delete the pods", timeout_s=90)


def test_the_pod_spec_reaches_the_pod_whole(cluster: Cluster, controller: None) -> None:
    pod_spec = {
        "initContainers": [{"name": "fetch", "image": "busybox:1.36", "command": ["true"]}],
        "containers": [{"name": "server", "image": "registry.invalid/s:1", "env": [{"name": "BATCH", "value": "8"}]},
                       {"name": "sidecar", "image": "registry.invalid/e:1"}],
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"gpu": "present"}, "serviceAccountName": "inference", "restartPolicy": "OnFailure",
        "priority": 0, "terminationGracePeriodSeconds": 7, "securityContext": {"runAsUser": 1000},
        "imagePullSecrets": [{"name": "regcred"}],
    }
    annotations = {**SHARE, "fastgshare/gpu_containers": "server"}
    cluster.create_fastpod(fastpod_body("whole", replicas=1, annotations=annotations,
                                        pod_spec=copy.deepcopy(pod_spec)))
    [pod] = cluster.wait_for_pods("whole", 1)
    raw = cluster.api.sanitize_for_serialization(pod)["spec"]
    for field in ("initContainers", "tolerations", "nodeSelector", "serviceAccountName", "restartPolicy",
                  "terminationGracePeriodSeconds", "securityContext", "imagePullSecrets"):
        value = raw[field]
        if field in ("initContainers", "tolerations"):  # the API server adds defaults (and 2 tolerations)
            value = [{k: v for k, v in item.items() if k in pod_spec[field][0]} for item in value[:1]]
        assert value == pod_spec[field], field
    server, sidecar = raw["containers"]
    assert server["resources"]["limits"] == {keys.VGPU_RESOURCE: "1"}
    assert server["env"][0] == {"name": "BATCH", "value": "8"}
    assert "resources" not in sidecar or keys.VGPU_RESOURCE not in (sidecar["resources"].get("limits") or {})


def test_a_pod_spec_the_client_refuses_is_reported_at_once(cluster: Cluster, controller: None) -> None:
    """Issue 15, defect 2: ``podSpec.metadata.labels`` (a field a PodSpec has not) stalled the
    controller silently; it must say which field, as a condition and a Warning event, within seconds."""
    pod_spec = {"metadata": {"labels": {"app": "x"}},
                "containers": [{"name": "server", "image": "registry.invalid/s:1"}]}
    cluster.create_fastpod(fastpod_body("stray", replicas=1, pod_spec=pod_spec))
    status = cluster.wait_for_status("stray", lambda s: condition(s, "InvalidSpec").get("status") == "True",
                                     "InvalidSpec", timeout_s=20)
    assert "spec.podSpec.metadata" in condition(status, "InvalidSpec")["message"]
    wait_until(lambda: len(cluster.events("stray", "InvalidSpec")) == 1, what="the Warning event", timeout_s=20)
    [event] = cluster.events("stray", "InvalidSpec")
    assert event.type == "Warning"
    assert "spec.podSpec.metadata" in event.message
    assert cluster.pods("stray") == []


def test_a_missing_lease_namespace_stops_the_controller_saying_how_to_fix_it(
        control_plane: ControlPlane, namespace: str, fastpod_crd: None, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 15, defect 7: a Lease namespace that does not exist was retried forever, vaguely."""
    args = build_parser().parse_args(["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace,
                                      "--lease-namespace", "no-such-namespace"])
    result: list[int] = []
    stopping = threading.Event()
    thread = threading.Thread(target=lambda: result.append(run(args, stopping)), daemon=True)
    thread.start()
    thread.join(30)
    stopping.set()
    assert result == [1]
    assert ("the leader-election namespace 'no-such-namespace' does not exist; create it, pass "
            "--lease-namespace NAMESPACE, or --no-leader-elect for a single replica") in caplog.text


def test_kubectl_shows_memory_readably(cluster: Cluster, controller: None) -> None:
    """Issue 15, defect 8: the Memory column showed the annotation's raw bytes (2700000000)."""
    cluster.create_fastpod(fastpod_body("bytes", replicas=1, annotations={**SHARE, keys.GPU_MEM: "2700000000"}))
    cluster.wait_for_status("bytes", lambda s: s.get("replicas") == 1, "1 replica")
    table = cluster.custom.list_namespaced_custom_object(
        GROUP, VERSION, cluster.namespace, PLURAL,
        _headers={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"}, _preload_content=False)
    parsed = yaml.safe_load(table.data)
    memory = [c["name"] for c in parsed["columnDefinitions"]].index("Memory")
    assert parsed["rows"][0]["cells"][memory] == "2.515 GiB"
