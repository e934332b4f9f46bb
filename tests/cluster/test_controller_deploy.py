"""The deploy/ manifests against the real API server: the controller runs with exactly the rights
its RBAC grants (impersonating its service account), and every manifest passes validation."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import kubernetes.utils
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from fastgshare import keys
from fastpod_crd_controller.spec import parse_fastpod
from tests.cluster.controlplane import ControlPlane, wait_until
from tests.cluster.test_controller import (
    Cluster,
    condition,
    fastpod_body,
    install_fastpod_crd,
    running_controller,
)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVICE_ACCOUNT = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:fastgshare-controller"


def documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def apply(api: kubernetes.client.ApiClient, path: Path) -> None:
    """Create every object of ``path`` that does not exist yet."""
    for doc in documents(path):
        try:
            kubernetes.utils.create_from_dict(api, doc)
        except kubernetes.utils.FailToCreateError as error:
            if any(e.status != 409 for e in error.api_exceptions):
                raise


@pytest.fixture
def as_controller(control_plane: ControlPlane, api_client: kubernetes.client.ApiClient
                  ) -> Iterator[kubernetes.client.ApiClient]:
    """A client that acts as the controller's service account, its RBAC applied."""
    install_fastpod_crd(api_client)
    apply(api_client, DEPLOY / "namespace.yaml")
    apply(api_client, DEPLOY / "controller" / "rbac.yaml")
    with control_plane.api_client() as client:
        client.set_default_header("Impersonate-User", SERVICE_ACCOUNT)
        yield client


def test_the_rbac_has_no_wildcards() -> None:
    for doc in documents(DEPLOY / "controller" / "rbac.yaml"):
        for rule in doc.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (doc["metadata"]["name"], field)


def test_the_controller_works_with_exactly_its_rbac(as_controller: kubernetes.client.ApiClient,
                                                    api_client: kubernetes.client.ApiClient,
                                                    control_plane: ControlPlane, namespace: str) -> None:
    with pytest.raises(ApiException) as refused:  # the impersonation is in force
        kubernetes.client.CoreV1Api(as_controller).list_namespaced_secret(namespace)
    assert refused.value.status == 403
    cluster = Cluster(api_client, namespace)
    with running_controller(control_plane, namespace, "--lease-namespace", keys.SYSTEM_NAMESPACE,
                            api=as_controller):
        cluster.create_fastpod(fastpod_body("rbac", replicas=2))
        cluster.wait_for_pods("rbac", 2)
        cluster.wait_for_status("rbac", lambda s: s.get("replicas") == 2, "2 replicas")
        cluster.scale("rbac", 1)
        cluster.wait_for_pods("rbac", 1)
        cluster.patch_fastpod("rbac", {"metadata": {"annotations": {keys.GPU_MEM: "a lot"}}})
        cluster.wait_for_status("rbac", lambda s: condition(s, "InvalidSpec").get("status") == "True", "InvalidSpec")
        wait_until(lambda: bool(cluster.events("rbac", "InvalidSpec")), what="the Warning event", timeout_s=30)
        assert cluster.events("rbac", "SuccessfulCreate")
        assert cluster.events("rbac", "SuccessfulDelete")
    lease = kubernetes.client.CoordinationV1Api(api_client).read_namespaced_lease("fastgshare-controller",
                                                                                  keys.SYSTEM_NAMESPACE)
    assert lease.spec.holder_identity in ("", None)  # released on the clean stop


def test_the_deployment_and_the_examples_pass_server_side_validation(api_client: kubernetes.client.ApiClient,
                                                                     namespace: str) -> None:
    install_fastpod_crd(api_client)
    apply(api_client, DEPLOY / "namespace.yaml")
    [deployment] = documents(DEPLOY / "controller" / "deployment.yaml")
    created = kubernetes.client.AppsV1Api(api_client).create_namespaced_deployment(
        keys.SYSTEM_NAMESPACE, deployment, dry_run="All")
    assert created.spec.replicas == 2
    assert created.spec.template.spec.service_account_name == "fastgshare-controller"
    custom = kubernetes.client.CustomObjectsApi(api_client)
    fastpods = 0
    for path in sorted((DEPLOY / "examples").glob("*.yaml")):
        for doc in documents(path):
            if doc["kind"] != keys.FASTPOD_KIND:
                kubernetes.utils.create_from_dict(api_client, doc, namespace=namespace, dry_run="All")
                continue
            stored = custom.create_namespaced_custom_object(keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, namespace,
                                                            keys.FASTPOD_PLURAL, doc, dry_run="All")
            parse_fastpod(stored)  # and the controller finds nothing wrong with it
            fastpods += 1
    assert fastpods == 2
