"""deploy/: every manifest is valid against the Kubernetes schemas and follows our rules."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from fastgshare import keys
from tests.deploy_manifests import DEPLOY, kustomization, objects, pod_specs, resource_files

KUBERNETES_VERSION = "1.30.0"
OBJECTS = objects()


def _id(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


# For the user's Prometheus, not applied by `kubectl apply -k deploy/` (tests/unit/deploy/test_monitoring.py).
MONITORING_ADD_ONS = {"podmonitors.yaml", "alert-rules.yaml", "prometheus-scrape-configs.yaml"}


def test_the_kustomization_lists_every_manifest() -> None:
    listed = {path.resolve() for path in resource_files()}
    manifests = {path.resolve() for path in DEPLOY.rglob("*.yaml")
                 if path.name != "kustomization.yaml" and "examples" not in path.parts
                 and not path.name.startswith("kube-scheduler-config")
                 and not (path.parent.name == "monitoring" and path.name in MONITORING_ADD_ONS)}
    assert manifests == listed
    for generator in kustomization()["configMapGenerator"]:
        assert all((DEPLOY / name).exists() for name in generator["files"])


# FaSTPods (deploy/examples) are custom objects: the API server validates them (tests/cluster).
@pytest.mark.parametrize("obj", OBJECTS, ids=_id)
def test_every_object_is_valid_against_the_kubernetes_schema(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def test_everything_lives_in_our_namespace_or_is_cluster_scoped() -> None:
    cluster_scoped = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding",
                      "ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"}
    for obj in OBJECTS:
        namespace = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert namespace is None, _id(obj)
        elif obj["kind"] == "RoleBinding" and namespace == "kube-system":
            assert obj["roleRef"]["name"] == "extension-apiserver-authentication-reader"
        elif namespace == keys.DEFAULT_FUNCTION_NAMESPACE and obj["kind"] in ("Role", "RoleBinding"):
            # the gateway's and the function controller's rights over the functions
            assert obj["metadata"]["name"] in ("fastgshare-gateway", "fastgshare-function-controller"), _id(obj)
        elif namespace == keys.DEFAULT_FUNCTION_NAMESPACE and obj["kind"] == "ResourceQuota":
            assert obj["metadata"]["name"] == "fastgshare-function-vgpu", _id(obj)  # deploy/function-quota.yaml
        else:
            assert namespace == keys.SYSTEM_NAMESPACE, _id(obj)


def test_rbac_is_least_privilege() -> None:
    for obj in OBJECTS:
        for rule in obj.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), f"{_id(obj)} has a wildcard in {field}"
            assert "secrets" not in rule.get("resources", []), f"{_id(obj)} reads secrets"


@pytest.mark.parametrize("obj", [o for o in OBJECTS if pod_specs(o)], ids=_id)
def test_every_container_has_probes_resources_and_no_privilege(obj: dict[str, Any]) -> None:
    for spec in pod_specs(obj):
        for container in spec["containers"]:
            where = f"{_id(obj)} container {container['name']}"
            assert container.get("livenessProbe") or container.get("readinessProbe"), f"{where}: no probe"
            assert {"requests", "limits"} <= set(container.get("resources", {})), f"{where}: resources"
            security = container.get("securityContext", {})
            assert not security.get("privileged"), f"{where} is privileged"
            assert security.get("allowPrivilegeEscalation") is False, where
            assert security.get("capabilities", {}).get("drop") == ["ALL"], where


def test_only_the_node_agent_sees_the_host() -> None:
    for obj in OBJECTS:
        for spec in pod_specs(obj):
            host_paths = [v["hostPath"]["path"] for v in spec.get("volumes", []) if "hostPath" in v]
            if obj["metadata"]["name"] == "fastgshare-node-agent":
                assert spec.get("hostPID") is True  # peer PID -> pod via /proc
                assert sorted(host_paths) == ["/tmp/nvidia-mps", "/var/lib/fastgshare",
                                              "/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources"]
                [agent] = spec["containers"]
                read_only = {m["mountPath"] for m in agent["volumeMounts"] if m.get("readOnly")}
                assert "/var/lib/kubelet/pod-resources" in read_only  # it only asks kubelet
            elif obj["metadata"]["name"] == "fastgshare-mps":
                assert spec.get("hostIPC") is True
                assert "/tmp/nvidia-mps" in host_paths
            else:
                assert not host_paths, _id(obj)
                assert not spec.get("hostPID")
                assert not spec.get("hostNetwork")


def test_the_scheduler_config_is_shipped_in_the_configmap() -> None:
    [config_map] = [o for o in OBJECTS if o["kind"] == "ConfigMap"]
    text = config_map["data"]["kube-scheduler-config.yaml"]
    assert keys.SCHEDULER_NAME in text
    assert keys.VGPU_RESOURCE in text
