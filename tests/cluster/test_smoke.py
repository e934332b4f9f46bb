"""The cluster tier is a real control plane: the API-server semantics our services rely on hold.

Watches, optimistic concurrency, 410 Gone after compaction, CRD schema validation, the real
kube-scheduler placing a vGPU pod on a fake GPU node, and the garbage collector.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from fastgshare import keys
from fastgshare.codec import decode_node_inventory
from tests.cluster.conftest import MakeGpuNode, StartScheduler, unique_name
from tests.cluster.controlplane import ControlPlane, wait_until

CRD_GROUP = "cluster-tier.fastgshare.test"
NAMED_PROFILE = "fastgshare-test-profile"


def pod_manifest(name: str, *, vgpu: int | None = None, scheduler: str | None = None,
                 owner: kubernetes.client.V1ObjectMeta | None = None) -> dict[str, object]:
    """A pod that no kubelet will run (none exists); optionally asking for vGPU slots."""
    container: dict[str, object] = {"name": "main", "image": "registry.invalid/none:0"}
    if vgpu is not None:
        container["resources"] = {"limits": {keys.VGPU_RESOURCE: str(vgpu)}, "requests": {"cpu": "10m"}}
    metadata: dict[str, object] = {"name": name}
    if owner is not None:
        metadata["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner.name,
                                        "uid": owner.uid}]
    spec: dict[str, object] = {"containers": [container]}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def test_kubeconfig_reaches_the_api_server(control_plane: ControlPlane) -> None:
    with kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig)) as client:
        version = kubernetes.client.VersionApi(client).get_code()  # TLS verified against the CA
    assert version.git_version == "v1.20.2"
    assert control_plane.host.startswith("https://127.0.0.1:")


def test_watch_sees_pod_added_then_modified(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    start = core.list_namespaced_pod(namespace).metadata.resource_version
    core.create_namespaced_pod(namespace, pod_manifest("watched"))
    core.patch_namespaced_pod("watched", namespace, {"metadata": {"labels": {"step": "patched"}}})

    seen: list[tuple[str, str | None]] = []
    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_pod, namespace, resource_version=start, timeout_seconds=60):
        pod = event["object"]
        seen.append((event["type"], pod.metadata.labels and pod.metadata.labels.get("step")))
        if event["type"] == "MODIFIED":
            stream.stop()
    assert seen == [("ADDED", None), ("MODIFIED", "patched")]


def test_replace_with_stale_resource_version_conflicts(core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "cm"}, "data": {"k": "1"}})
    stale = core.read_namespaced_config_map("cm", namespace)
    core.patch_namespaced_config_map("cm", namespace, {"data": {"k": "2"}})

    stale.data = {"k": "3"}
    with pytest.raises(ApiException) as caught:
        core.replace_namespaced_config_map("cm", namespace, stale)
    assert caught.value.status == 409
    assert "the object has been modified" in caught.value.body
    assert core.read_namespaced_config_map("cm", namespace).data == {"k": "2"}


def _event(name: str, namespace: str) -> dict[str, object]:
    return {"metadata": {"name": name}, "involvedObject": {"kind": "Pod", "name": "x", "namespace": namespace},
            "reason": "Test", "message": "written by the cluster tier", "type": "Normal"}


def test_watch_from_compacted_resource_version_is_gone(control_plane: ControlPlane,
                                                      core: kubernetes.client.CoreV1Api, namespace: str) -> None:
    # Events bypass the API server's watch cache, so watches read etcd's history directly.
    # (Pods and nodes are watch-cached: on a young cluster even resourceVersion "1" is valid.)
    start = core.list_namespaced_event(namespace).metadata.resource_version
    for name in ("first", "second"):
        core.create_namespaced_event(namespace, _event(name, namespace))

    names = []
    stream = watch.Watch()
    for event in stream.stream(core.list_namespaced_event, namespace, resource_version=start, timeout_seconds=60):
        names.append(event["object"].metadata.name)
        if len(names) == 2:
            stream.stop()
    assert names == ["first", "second"]

    control_plane.compact_etcd()
    with pytest.raises(ApiException) as caught:
        for _ in watch.Watch().stream(core.list_namespaced_event, namespace, resource_version=start,
                                      timeout_seconds=30):
            pass
    assert caught.value.status == 410


@pytest.fixture
def widget_crd(api_client: kubernetes.client.ApiClient) -> Iterator[str]:
    """A namespaced CRD ``widgets`` whose ``spec.replicas`` must be an integer >= 0."""
    extensions = kubernetes.client.ApiextensionsV1Api(api_client)
    name = f"widgets.{CRD_GROUP}"
    schema = {"type": "object", "properties": {"spec": {
        "type": "object",
        "properties": {"replicas": {"type": "integer", "minimum": 0}},
        "required": ["replicas"],
    }}}
    extensions.create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": name},
        "spec": {
            "group": CRD_GROUP, "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": True, "storage": True,
                          "schema": {"openAPIV3Schema": schema}}],
        },
    })

    def established() -> bool:
        conditions = extensions.read_custom_resource_definition(name).status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    wait_until(established, what=f"CRD {name} Established", timeout_s=60)
    yield "widgets"
    extensions.delete_custom_resource_definition(name)


def test_crd_schema_rejects_invalid_object(api_client: kubernetes.client.ApiClient, namespace: str,
                                           widget_crd: str) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)

    def widget(name: str, replicas: int) -> dict[str, object]:
        return {"apiVersion": f"{CRD_GROUP}/v1", "kind": "Widget", "metadata": {"name": name},
                "spec": {"replicas": replicas}}

    def created(body: dict[str, object]) -> bool:
        try:
            custom.create_namespaced_custom_object(CRD_GROUP, "v1", namespace, widget_crd, body)
        except ApiException as error:
            if error.status == 404:  # the new resource is not served yet
                return False
            raise
        return True

    wait_until(lambda: created(widget("good", 0)), what="creating a valid Widget", timeout_s=60)
    with pytest.raises(ApiException) as caught:
        custom.create_namespaced_custom_object(CRD_GROUP, "v1", namespace, widget_crd, widget("bad", -1))
    assert caught.value.status == 422
    assert "spec.replicas" in caught.value.body


def _scheduled_node(core: kubernetes.client.CoreV1Api, name: str, namespace: str) -> str | None:
    return core.read_namespaced_pod(name, namespace).spec.node_name


def _unschedulable(core: kubernetes.client.CoreV1Api, name: str, namespace: str) -> bool:
    conditions = core.read_namespaced_pod(name, namespace).status.conditions or []
    return any(c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
               for c in conditions)


def test_scheduler_places_vgpu_pods_on_the_fake_gpu_node(
        core: kubernetes.client.CoreV1Api, namespace: str, make_gpu_node: MakeGpuNode,
        start_scheduler: StartScheduler) -> None:
    node = make_gpu_node(2, slots_per_gpu=4)
    assert node.status.allocatable[keys.VGPU_RESOURCE] == "8"
    assert decode_node_inventory(node.metadata.annotations[keys.NODE_GPU_INFO_ANNOTATION]).advertised_slots == 8
    assert not node.spec.taints
    start_scheduler({"profiles": [{"schedulerName": "default-scheduler"}, {"schedulerName": NAMED_PROFILE}]})

    core.create_namespaced_pod(namespace, pod_manifest("default-profile", vgpu=1))
    core.create_namespaced_pod(namespace, pod_manifest("named-profile", vgpu=1, scheduler=NAMED_PROFILE))
    core.create_namespaced_pod(namespace, pod_manifest("too-big", vgpu=9))

    for pod in ("default-profile", "named-profile"):
        wait_until(lambda pod=pod: _scheduled_node(core, pod, namespace) is not None,
                   what=f"pod {pod} to be scheduled", timeout_s=120)
        assert _scheduled_node(core, pod, namespace) == node.metadata.name
    wait_until(lambda: _unschedulable(core, "too-big", namespace),
               what="pod too-big to be marked Unschedulable", timeout_s=120)
    assert _scheduled_node(core, "too-big", namespace) is None


def test_garbage_collector_deletes_pod_of_deleted_owner(controller_manager: None, core: kubernetes.client.CoreV1Api,
                                                        namespace: str) -> None:
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}}).metadata
    core.create_namespaced_pod(namespace, pod_manifest("dependent", owner=owner))
    core.create_namespaced_pod(namespace, pod_manifest("independent"))

    core.delete_namespaced_config_map("owner", namespace)

    def dependent_gone() -> bool:
        try:
            core.read_namespaced_pod("dependent", namespace)
        except ApiException as error:
            if error.status == 404:
                return True
            raise
        return False

    wait_until(dependent_gone, what="the garbage collector to delete pod dependent", timeout_s=120)
    assert core.read_namespaced_pod("independent", namespace).metadata.deletion_timestamp is None


def _listening_addresses(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process ``pid`` holds."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed since the listing: it held no listening socket we need
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address_hex, port_hex = local.split(":")
                raw = bytes.fromhex(address_hex)
                # /proc stores the address as 32-bit words in host (little-endian) order
                address = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.append((str(ipaddress.ip_address(address)), int(port_hex, 16)))
    return found


def _is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or (mapped is not None and mapped.is_loopback)


def test_every_process_of_the_tier_listens_on_loopback_only(control_plane: ControlPlane, controller_manager: None,
                                                            start_scheduler: StartScheduler) -> None:
    scheduler = start_scheduler({"profiles": [{"schedulerName": unique_name("listen-check")}]})
    children = [int(path.name) for path in Path("/proc").iterdir()
                if path.name.isdigit() and _parent_pid(int(path.name)) == os.getpid()]
    assert scheduler.pid in children
    listening = {pid: _listening_addresses(pid) for pid in children}
    assert sum(len(addresses) for addresses in listening.values()) >= 5  # etcd x2, apiserver, cm, scheduler
    exposed = {pid: [a for a in addresses if not _is_loopback(a[0])] for pid, addresses in listening.items()}
    assert not any(exposed.values()), exposed


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])
