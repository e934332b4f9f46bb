"""The pure pod builder, asserted as exact dicts: the whole podSpec kept, only our additions made."""

from __future__ import annotations

import copy
from typing import Any

from fastgshare import keys
from fastpod_crd_controller.builder import PodConfig, make_pod
from fastpod_crd_controller.spec import parse_fastpod
from tests.builders import share_annotations
from tests.unit.fastpod_crd_controller.objects import CONTAINER, UID, fastpod

DOWNWARD_ENV = [
    {"name": "FASTGSHARE_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "FASTGSHARE_POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    {"name": "FASTGSHARE_POD", "value": "$(FASTGSHARE_POD_NAMESPACE)/$(FASTGSHARE_POD_NAME)"},
]
OWNER = {"apiVersion": "fastgshare.caps.in.tum/v1", "kind": "FaSTPod", "name": "web", "uid": UID,
         "controller": True, "blockOwnerDeletion": True}


def build(obj: dict[str, Any], config: PodConfig | None = None) -> tuple[dict[str, Any], str]:
    spec = parse_fastpod(obj)
    return make_pod(spec, config or PodConfig()), spec.revision


def test_the_pod_of_a_minimal_fastpod() -> None:
    pod, revision = build(fastpod())
    assert pod == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-",
            "namespace": "team-a",
            "labels": {"fastgshare.caps.in.tum/fastpod": "web", "fastgshare.caps.in.tum/revision": revision},
            "annotations": {
                "fastgshare/gpu_quota_request": "0.4",
                "fastgshare/gpu_quota_limit": "0.8",
                "fastgshare/gpu_sm_partition": "50",
                "fastgshare/gpu_mem": "1073741824",
            },
            "ownerReferences": [OWNER],
        },
        "spec": {
            "containers": [{
                "name": "server",
                "image": "registry.example/resnet:1",
                "resources": {"limits": {"fastgshare.caps.in.tum/vgpu": "1"}},
                "env": DOWNWARD_ENV,
            }],
            "schedulerName": "fastgshare-scheduler",
        },
    }


FULL_POD_SPEC: dict[str, Any] = {
    "initContainers": [{"name": "fetch-model", "image": "busybox:1.36", "command": ["sh", "-c", "cp /src/* /models"],
                        "volumeMounts": [{"name": "models", "mountPath": "/models"}]}],
    "containers": [
        {"name": "server", "image": "registry.example/resnet:1", "imagePullPolicy": "Always",
         "args": ["--port", "5000"], "ports": [{"containerPort": 5000, "name": "http"}],
         "env": [{"name": "BATCH", "value": "8"}],
         "resources": {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"memory": "8Gi"}},
         "readinessProbe": {"tcpSocket": {"port": 5000}, "periodSeconds": 5},
         "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True}],
         "securityContext": {"allowPrivilegeEscalation": False}},
        {"name": "metrics", "image": "registry.example/exporter:2", "imagePullPolicy": "IfNotPresent"},
    ],
    "volumes": [{"name": "models", "emptyDir": {}}],
    "nodeSelector": {"gpu": "present"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                           "labelSelector": {"matchLabels": {"app": "web"}}}}]}},
    "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
    "serviceAccountName": "inference",
    "imagePullSecrets": [{"name": "registry-credentials"}],
    "restartPolicy": "Always",
    "terminationGracePeriodSeconds": 10,
    "priorityClassName": "inference-high",
    "dnsPolicy": "ClusterFirst",
    "hostNetwork": False,
    "x-future-field": {"kept": True},
}


def test_every_field_of_the_pod_spec_is_kept() -> None:
    pod, _ = build(fastpod(pod_spec=copy.deepcopy(FULL_POD_SPEC),
                           annotations={**share_annotations(), keys.GPU_CONTAINERS_ANNOTATION: "server"}))
    server = {**FULL_POD_SPEC["containers"][0],
              "resources": {"requests": {"cpu": "2", "memory": "4Gi", "fastgshare.caps.in.tum/vgpu": "1"},
                            "limits": {"memory": "8Gi", "fastgshare.caps.in.tum/vgpu": "1"}},
              "env": [{"name": "BATCH", "value": "8"}, *DOWNWARD_ENV]}
    assert pod["spec"] == {**FULL_POD_SPEC, "containers": [server, FULL_POD_SPEC["containers"][1]],
                           "schedulerName": "fastgshare-scheduler"}


def test_by_default_every_container_gets_a_gpu_slot() -> None:
    pod_spec = {"containers": [dict(CONTAINER), {"name": "warmup", "image": "w:1"}]}
    pod, _ = build(fastpod(pod_spec=pod_spec))
    assert [c["resources"] for c in pod["spec"]["containers"]] == [{"limits": {keys.VGPU_RESOURCE: "1"}}] * 2


def test_only_the_listed_gpu_containers_get_a_slot_and_the_env() -> None:
    pod_spec = {"containers": [dict(CONTAINER), {"name": "sidecar", "image": "envoy:1"}]}
    pod, _ = build(fastpod(pod_spec=pod_spec,
                           annotations={**share_annotations(), keys.GPU_CONTAINERS_ANNOTATION: " server "}))
    assert pod["spec"]["containers"][1] == {"name": "sidecar", "image": "envoy:1"}
    assert pod["spec"]["containers"][0]["resources"] == {"limits": {keys.VGPU_RESOURCE: "1"}}
    assert pod["metadata"]["annotations"][keys.GPU_CONTAINERS_ANNOTATION] == " server "


def test_what_the_pod_spec_sets_itself_wins() -> None:
    container = {**CONTAINER, "env": [{"name": "FASTGSHARE_POD", "value": "fixed/name"}],
                 "resources": {"limits": {keys.VGPU_RESOURCE: "3"}}}
    pod, _ = build(fastpod(pod_spec={"containers": [container], "schedulerName": "gpu-profile-b", "hostIPC": False}))
    assert pod["spec"]["schedulerName"] == "gpu-profile-b"
    assert pod["spec"]["hostIPC"] is False
    [built] = pod["spec"]["containers"]
    assert built["env"] == [{"name": "FASTGSHARE_POD", "value": "fixed/name"}, *DOWNWARD_ENV[:2]]
    assert built["resources"] == {"limits": {keys.VGPU_RESOURCE: "1"}}  # one slot per container, always


def test_pods_get_no_host_ipc_unless_the_pod_spec_opts_in() -> None:
    """Issue 15, defect 10: hostIPC was injected into every pod, which Pod Security's baseline forbids."""
    pod, _ = build(fastpod(), PodConfig())
    assert "hostIPC" not in pod["spec"]
    opted_in = {"containers": [dict(CONTAINER)], "hostIPC": True}
    pod, _ = build(fastpod(pod_spec=opted_in), PodConfig())
    assert pod["spec"]["hostIPC"] is True


def test_configured_scheduler_and_host_ipc_for_every_pod() -> None:
    pod, _ = build(fastpod(), PodConfig(scheduler_name="my-scheduler", host_ipc=True))
    assert pod["spec"]["schedulerName"] == "my-scheduler"
    assert pod["spec"]["hostIPC"] is True


def test_labels_come_from_the_fastpod_and_the_selector_and_annotations_skip_bookkeeping() -> None:
    annotations = {**share_annotations(), "prometheus.io/scrape": "true",
                   "kubectl.kubernetes.io/last-applied-configuration": "{...}",
                   keys.POD_ASSIGNMENT_ANNOTATION: '{"forged": true}'}
    pod, revision = build(fastpod(labels={"team": "vision"}, selector={"matchLabels": {"app": "web"}},
                                  annotations=annotations))
    assert pod["metadata"]["labels"] == {"team": "vision", "app": "web", keys.FASTPOD_NAME_LABEL: "web",
                                         keys.REVISION_LABEL: revision}
    assert pod["metadata"]["annotations"] == {**share_annotations(), "prometheus.io/scrape": "true"}


def test_the_builder_leaves_the_fastpod_untouched() -> None:
    obj = fastpod(pod_spec=copy.deepcopy(FULL_POD_SPEC))
    before = copy.deepcopy(obj)
    build(obj)
    assert obj == before
