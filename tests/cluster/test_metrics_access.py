"""/metrics behind Kubernetes authentication and authorisation (issue 42, item 5), against the real
API server: the server asks with an account that holds only the built-in ClusterRole
``system:auth-delegator`` (what deploy/*/rbac.yaml binds to our components), and a caller's token
is served only when its user may get the non-resource URL /metrics."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import kubernetes.client
import pytest

from fastgshare import keys
from fastgshare_kube.access_reviews import kubernetes_metrics_access
from fastgshare_kube.client import token_api_client
from fastgshare_kube.health import HealthServer
from fastgshare_kube.metrics_access import DENIAL_PREFIX
from tests.cluster.conftest import unique_name
from tests.cluster.controlplane import ControlPlane

EXPOSITION = b"fastgshare_pod_gpu_time_share{namespace=\"team-a\",pod=\"steady\",gpu=\"GPU-1\"} 0.3\n"


class Accounts:
    def __init__(self, plane: ControlPlane, api: kubernetes.client.ApiClient, namespace: str) -> None:
        self.plane, self.namespace = plane, namespace
        self.core: Any = kubernetes.client.CoreV1Api(api)
        self.rbac: Any = kubernetes.client.RbacAuthorizationV1Api(api)
        self.cluster_objects: list[tuple[str, str]] = []

    def account(self, name: str) -> str:
        """A ServiceAccount of the namespace and a 10-minute token of it."""
        self.core.create_namespaced_service_account(self.namespace, {"metadata": {"name": name}})
        token = self.core.create_namespaced_service_account_token(
            name, self.namespace, kubernetes.client.AuthenticationV1TokenRequest(
                spec=kubernetes.client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
        assert isinstance(token, str)
        return token

    def bind(self, account: str, cluster_role: str) -> None:
        name = unique_name("metrics-access")
        self.rbac.create_cluster_role_binding({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": self.namespace}]})
        self.cluster_objects.append(("binding", name))

    def metrics_reader_role(self) -> str:
        """The rule of deploy/monitoring/metrics-reader.yaml's ClusterRole, under a name of this test."""
        name = unique_name("metrics-reader")
        self.rbac.create_cluster_role({"metadata": {"name": name},
                                       "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]})
        self.cluster_objects.append(("role", name))
        return name

    def cleanup(self) -> None:
        for kind, name in reversed(self.cluster_objects):
            if kind == "binding":
                self.rbac.delete_cluster_role_binding(name)
            else:
                self.rbac.delete_cluster_role(name)


@pytest.fixture
def accounts(control_plane: ControlPlane, api_client: kubernetes.client.ApiClient,
             namespace: str) -> Iterator[Accounts]:
    made = Accounts(control_plane, api_client, namespace)
    try:
        yield made
    finally:
        made.cleanup()


def serve(plane: ControlPlane, component_token: str) -> HealthServer:
    api = token_api_client(plane.host, str(plane.ca_cert), component_token)
    server = HealthServer("127.0.0.1", 0, lambda: True, lambda: (EXPOSITION, "text/plain; version=0.0.4"),
                          access=kubernetes_metrics_access(api))
    server.start()
    return server


def get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode()


def test_only_a_token_allowed_get_on_metrics_reads_them(control_plane: ControlPlane, accounts: Accounts) -> None:
    component = accounts.account("component")
    accounts.bind("component", "system:auth-delegator")
    reader = accounts.account("prometheus")
    accounts.bind("prometheus", accounts.metrics_reader_role())
    tenant = accounts.account("tenant")  # a pod's own token: valid, but not allowed /metrics
    server = serve(control_plane, component)
    try:
        assert get(server.port, "/healthz")[0] == 200  # the kubelet's probes need no token
        status, body = get(server.port, "/metrics")
        assert status == 401
        assert body.startswith(DENIAL_PREFIX)
        assert get(server.port, "/metrics", {"Authorization": "Bearer not-a-token"})[0] == 401
        status, body = get(server.port, "/metrics", {"Authorization": f"Bearer {tenant}"})
        assert status == 403
        assert f"system:serviceaccount:{accounts.namespace}:tenant may not get /metrics" in body
        assert "steady" not in body
        status, body = get(server.port, "/metrics", {"Authorization": f"Bearer {reader}"})
        assert (status, body) == (200, EXPOSITION.decode())
        # what `fastgshare inspect` sends through the API server's proxy, which drops Authorization
        status, body = get(server.port, "/metrics", {keys.METRICS_TOKEN_HEADER: f"Bearer {reader}"})
        assert (status, body) == (200, EXPOSITION.decode())
    finally:
        server.stop()


def test_a_component_that_may_not_ask_answers_503_naming_the_role_it_needs(
        control_plane: ControlPlane, accounts: Accounts) -> None:
    component = accounts.account("unbound")
    reader = accounts.account("prometheus")
    accounts.bind("prometheus", accounts.metrics_reader_role())
    server = serve(control_plane, component)
    try:
        status, body = get(server.port, "/metrics", {"Authorization": f"Bearer {reader}"})
        assert status == 503
        assert "system:auth-delegator" in body
    finally:
        server.stop()
