"""The admission webhooks on the real API server (issue 15, "validation at kubectl apply"; issue 36
item 6, "pods find our scheduler").

The extender runs as a local process with ``--webhook-listen`` and a self-signed certificate; the
ValidatingWebhookConfiguration is the shipped one (deploy/scheduler/webhook.yaml) with its
clientConfig pointed at that process (url + caBundle) and scoped to the test's namespace, so no
other test's objects reach it. Creating an invalid FaSTPod or Pod fails with the message of
``fastgshare check``; a valid one is created; with the webhook down, failurePolicy Ignore lets
objects through, as docs/security.md says (the scheduler-time checks refuse them later).

The system annotations (``fastgshare/assignment`` and the others of ``keys.SYSTEM_*_ANNOTATIONS``)
are refused from the cluster admin of the control plane, on pods and nodes, and allowed from the
extender's service account, authenticated with a token from the TokenRequest API (issue 37 item 2).
The extender runs with unsigned assignments here: signing is not the webhook's concern.

The MutatingWebhookConfiguration is the shipped one too, pointed and scoped the same way: a pod
created with the vGPU resource and no scheduler is stored with ``schedulerName:
fastgshare-scheduler``; one naming another scheduler keeps it, and the create's answer carries the
webhook's warning (a ``Warning`` header, as kubectl prints it).
"""

from __future__ import annotations

import base64
import copy
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from fastgshare import keys
from fastgshare.assignment_signature import ALLOW_UNSIGNED_FLAG
from fastgshare_kube.client import token_api_client
from tests.cluster.controlplane import ControlPlane, free_ports, wait_until
from tests.cluster.test_controller import fastpod_crd  # noqa: F401  (a fixture)
from tests.integration.scheduler_extender.harness import ExtenderProcess

REPO = Path(__file__).resolve().parents[2]
WEBHOOK_FILE = REPO / "deploy" / "scheduler" / "webhook.yaml"
GROUP, VERSION, PLURAL = keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, keys.FASTPOD_PLURAL
SHARE = {keys.GPU_QUOTA_REQUEST: "0.3", keys.GPU_QUOTA_LIMIT: "0.6", keys.GPU_SM_PARTITION: "40",
         keys.GPU_MEM: "2Gi"}
SCOPE_LABEL = "fastgshare-webhook-test"


@attrs.frozen
class Webhook:
    extender: ExtenderProcess
    config_name: str


def fastpod(name: str, **share: str) -> dict[str, Any]:
    return {"apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
            "metadata": {"name": name, "annotations": {**SHARE, **share}},
            "spec": {"replicas": 1, "podSpec": {"containers": [{"name": "c", "image": "busybox"}]}}}


def gpu_pod(name: str, **share: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": {**SHARE, **share}},
            "spec": {"schedulerName": keys.SCHEDULER_NAME, "containers": [
                {"name": "c", "image": "busybox", "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}]}}


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
                    "-out", str(cert), "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def webhook_configuration(name: str, url: str, ca: bytes, namespace_scope: str,
                          kind: str = "ValidatingWebhookConfiguration") -> dict[str, Any]:
    """The shipped configuration of ``kind``, pointed at ``url`` (each webhook at its shipped path)
    and scoped to the test's namespace (and, for cluster-scoped kinds, which no namespaceSelector
    limits, to objects labelled with it)."""
    shipped = next(doc for doc in yaml.safe_load_all(WEBHOOK_FILE.read_text()) if doc["kind"] == kind)
    config = copy.deepcopy(shipped)
    config["metadata"]["name"] = name
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": base64.b64encode(ca).decode()}
        hook["namespaceSelector"] = {"matchLabels": {SCOPE_LABEL: namespace_scope}}
        if any(rule.get("scope") == "Cluster" for rule in hook["rules"]):
            hook["objectSelector"] = {"matchLabels": {SCOPE_LABEL: namespace_scope}}
    return config


@pytest.fixture
def webhook(control_plane: ControlPlane, api_client: kubernetes.client.ApiClient, namespace: str,
            tmp_path: Path, fastpod_crd: None) -> Iterator[Webhook]:  # noqa: F811
    core = kubernetes.client.CoreV1Api(api_client)
    core.patch_namespace(namespace, {"metadata": {"labels": {SCOPE_LABEL: namespace}}})
    cert, key = self_signed(tmp_path)
    port, webhook_port = free_ports(2)
    extender = ExtenderProcess(control_plane.kubeconfig, port, tmp_path / "extender.log", extra_args=[
        ALLOW_UNSIGNED_FLAG, "--webhook-listen", f"127.0.0.1:{webhook_port}", "--webhook-cert", str(cert),
        "--webhook-key", str(key)])
    registrations: Any = kubernetes.client.AdmissionregistrationV1Api(api_client)  # raw dict bodies
    name, mutating = f"fastgshare-validate-{namespace}", f"fastgshare-mutate-{namespace}"
    url = f"https://127.0.0.1:{webhook_port}"
    try:
        extender.start()
        registrations.create_validating_webhook_configuration(
            webhook_configuration(name, url, cert.read_bytes(), namespace))
        registrations.create_mutating_webhook_configuration(
            webhook_configuration(mutating, url, cert.read_bytes(), namespace, "MutatingWebhookConfiguration"))
        yield Webhook(extender, name)
    finally:
        try:
            for delete, registered in ((registrations.delete_mutating_webhook_configuration, mutating),
                                       (registrations.delete_validating_webhook_configuration, name)):
                try:
                    delete(registered)
                except ApiException as error:
                    if error.status != 404:
                        raise
        finally:
            extender.stop()


def create_fastpod(api_client: kubernetes.client.ApiClient, namespace: str, body: dict[str, Any],
                   dry_run: bool = False) -> None:
    custom: Any = kubernetes.client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body,
                                           **({"dry_run": "All"} if dry_run else {}))


def denial(call: Any) -> str:
    """The API server's message when ``call`` is refused; '' when it succeeds."""
    try:
        call()
    except ApiException as error:
        return str(yaml.safe_load(error.body or "{}").get("message", ""))
    return ""


def wait_for_webhook(api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    """The API server picks up a new configuration within a second or so: probe with a dry run."""
    bad = fastpod("probe", **{keys.GPU_SM_PARTITION: "0"})
    wait_until(lambda: bool(denial(lambda: create_fastpod(api_client, namespace, bad, dry_run=True))),
               what="the API server to call the webhook", timeout_s=30)


def test_an_invalid_fastpod_is_refused_at_apply_with_the_message_of_check(
        webhook: Webhook, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    wait_for_webhook(api_client, namespace)
    message = denial(lambda: create_fastpod(api_client, namespace, fastpod("bad", **{keys.GPU_SM_PARTITION: "150"})))
    assert message == ('admission webhook "fastpods.validate.fastgshare.caps.in.tum" denied the request: '
                       'fastgshare: FaSTPod/bad: fastgshare/gpu_sm_partition: "150" is out of range; allowed: an '
                       'integer percent of the SMs, 1..100 (e.g. "50")')
    typo = fastpod("typo")
    typo["metadata"]["annotations"][keys.GPU_QUOTA_REQUEST + "s"] = typo["metadata"]["annotations"].pop(
        keys.GPU_QUOTA_REQUEST)
    message = denial(lambda: create_fastpod(api_client, namespace, typo))
    assert "fastgshare/gpu_quota_requests" in message
    assert "did you mean fastgshare/gpu_quota_request" in message
    custom: Any = kubernetes.client.CustomObjectsApi(api_client)
    objects = custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL)
    assert objects["items"] == []  # nothing was created


def test_a_valid_fastpod_passes_and_an_invalid_update_is_refused(
        webhook: Webhook, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    wait_for_webhook(api_client, namespace)
    create_fastpod(api_client, namespace, fastpod("good"))
    custom: Any = kubernetes.client.CustomObjectsApi(api_client)
    patch = {"metadata": {"annotations": {keys.GPU_QUOTA_LIMIT: "0.1"}}}  # below the request 0.3
    message = denial(lambda: custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "good", patch))
    assert message.startswith('admission webhook "fastpods.validate.fastgshare.caps.in.tum" denied the request: '
                              "fastgshare: FaSTPod/good: ")
    assert keys.GPU_QUOTA_LIMIT in message
    stored = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "good")
    assert stored["metadata"]["annotations"][keys.GPU_QUOTA_LIMIT] == "0.6"


def test_an_invalid_gpu_pod_is_refused_and_a_plain_pod_passes(
        webhook: Webhook, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    wait_for_webhook(api_client, namespace)
    core: Any = kubernetes.client.CoreV1Api(api_client)  # raw dict bodies
    message = denial(lambda: core.create_namespaced_pod(namespace, gpu_pod("bad", **{keys.GPU_MEM: "lots"})))
    assert message.startswith('admission webhook "pods.validate.fastgshare.caps.in.tum" denied the request: '
                              "fastgshare: Pod/bad: fastgshare/gpu_mem: ")
    core.create_namespaced_pod(namespace, gpu_pod("good"))
    core.create_namespaced_pod(namespace, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                                           "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert sorted(pod.metadata.name for pod in core.list_namespaced_pod(namespace).items) == ["good", "plain"]


def test_with_the_webhook_down_objects_are_admitted_as_failure_policy_ignore_says(
        webhook: Webhook, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    wait_for_webhook(api_client, namespace)
    webhook.extender.stop()
    # Nothing listens now: the API server's call fails and Ignore admits the object.
    create_fastpod(api_client, namespace, fastpod("unchecked", **{keys.GPU_SM_PARTITION: "150"}))
    custom: Any = kubernetes.client.CustomObjectsApi(api_client)
    stored = custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "unchecked")
    assert stored["metadata"]["annotations"][keys.GPU_SM_PARTITION] == "150"


ASSIGNMENT = '{"v":1,"node":"n","gpu":"GPU-forged","request":1000}'
EXTENDER_USER = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:{keys.SCHEDULER_SERVICE_ACCOUNT}"


def test_an_admin_may_not_write_an_assignment_on_a_pod(
        webhook: Webhook, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    wait_for_webhook(api_client, namespace)
    core: Any = kubernetes.client.CoreV1Api(api_client)  # raw dict bodies
    forged = gpu_pod("forged", **{keys.POD_ASSIGNMENT_ANNOTATION: ASSIGNMENT})
    message = denial(lambda: core.create_namespaced_pod(namespace, forged))
    assert message.startswith('admission webhook "pods.validate.fastgshare.caps.in.tum" denied the request: '
                              f'fastgshare: Pod/forged: user "admin" may not set {keys.POD_ASSIGNMENT_ANNOTATION}: '
                              f"only {EXTENDER_USER}, ")
    core.create_namespaced_pod(namespace, gpu_pod("running"))
    patch = {"metadata": {"annotations": {keys.POD_ASSIGNMENT_ANNOTATION: ASSIGNMENT}}}
    message = denial(lambda: core.patch_namespaced_pod("running", namespace, patch))
    assert f'user "admin" may not set {keys.POD_ASSIGNMENT_ANNOTATION}' in message
    core.patch_namespaced_pod("running", namespace, {"metadata": {"labels": {"app": "relabelled"}}})
    stored = core.read_namespaced_pod("running", namespace)
    assert keys.POD_ASSIGNMENT_ANNOTATION not in (stored.metadata.annotations or {})


@pytest.fixture
def extender_account(api_client: kubernetes.client.ApiClient, control_plane: ControlPlane,
                     namespace: str) -> Iterator[kubernetes.client.ApiClient]:
    """A client authenticated as the extender's ServiceAccount (a TokenRequest token), allowed by RBAC
    to patch pods in ``namespace``."""
    core: Any = kubernetes.client.CoreV1Api(api_client)  # raw dict bodies
    rbac: Any = kubernetes.client.RbacAuthorizationV1Api(api_client)  # raw dict bodies
    try:
        core.create_namespace({"metadata": {"name": keys.SYSTEM_NAMESPACE}})  # kept: other tests may use it
    except ApiException as error:
        if error.status != 409:
            raise
    try:
        core.create_namespaced_service_account(keys.SYSTEM_NAMESPACE,
                                               {"metadata": {"name": keys.SCHEDULER_SERVICE_ACCOUNT}})
        created_account = True
    except ApiException as error:
        if error.status != 409:
            raise
        created_account = False
    try:
        rbac.create_namespaced_role(namespace, {"metadata": {"name": "patch-pods"}, "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]})
        rbac.create_namespaced_role_binding(namespace, {
            "metadata": {"name": "extender-patches-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "patch-pods"},
            "subjects": [{"kind": "ServiceAccount", "name": keys.SCHEDULER_SERVICE_ACCOUNT,
                          "namespace": keys.SYSTEM_NAMESPACE}]})
        token = core.create_namespaced_service_account_token(
            keys.SCHEDULER_SERVICE_ACCOUNT, keys.SYSTEM_NAMESPACE,
            kubernetes.client.AuthenticationV1TokenRequest(
                spec=kubernetes.client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
        assert isinstance(token, str)
        with token_api_client(control_plane.host, str(control_plane.ca_cert), token) as client:
            yield client
    finally:
        if created_account:
            core.delete_namespaced_service_account(keys.SCHEDULER_SERVICE_ACCOUNT, keys.SYSTEM_NAMESPACE)


def test_the_extenders_service_account_may_write_it_and_an_admin_may_not_remove_it(
        webhook: Webhook, api_client: kubernetes.client.ApiClient, extender_account: kubernetes.client.ApiClient,
        namespace: str) -> None:
    wait_for_webhook(api_client, namespace)
    core: Any = kubernetes.client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, gpu_pod("placed"))
    as_extender: Any = kubernetes.client.CoreV1Api(extender_account)
    patch = {"metadata": {"annotations": {keys.POD_ASSIGNMENT_ANNOTATION: ASSIGNMENT}}}
    as_extender.patch_namespaced_pod("placed", namespace, patch)
    stored = core.read_namespaced_pod("placed", namespace)
    assert stored.metadata.annotations[keys.POD_ASSIGNMENT_ANNOTATION] == ASSIGNMENT
    removal = {"metadata": {"annotations": {keys.POD_ASSIGNMENT_ANNOTATION: None}}}
    message = denial(lambda: core.patch_namespaced_pod("placed", namespace, removal))
    assert f'user "admin" may not remove {keys.POD_ASSIGNMENT_ANNOTATION}' in message
    # the pod's own share stays the user's to change
    core.patch_namespaced_pod("placed", namespace, {"metadata": {"annotations": {keys.GPU_QUOTA_LIMIT: "0.5"}}})


def test_an_admin_may_not_forge_a_nodes_inventory(
        webhook: Webhook, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    """A node created with an inventory by anyone but the node agent is refused; other node writes pass.

    Node updates are judged the same way (tests/unit/scheduler_extender/test_admission_system_annotations.py),
    but this tier's kube-apiserver 1.20.2 sends node UPDATE reviews whose oldObject already holds the
    new annotations (pods are not affected), so an update cannot be told from a no-op here.
    """
    wait_for_webhook(api_client, namespace)
    core: Any = kubernetes.client.CoreV1Api(api_client)
    name = f"{namespace}-node"[:63]
    forged = {"metadata": {"name": name, "labels": {SCOPE_LABEL: namespace},
                           "annotations": {keys.NODE_GPU_INFO_ANNOTATION: '{"v":1}'}}}
    message = denial(lambda: core.create_node(forged))
    assert message.startswith('admission webhook "nodes.validate.fastgshare.caps.in.tum" denied the request: '
                              f'fastgshare: Node/{name}: user "admin" may not set {keys.NODE_GPU_INFO_ANNOTATION}: '
                              f"only {EXTENDER_USER}, ")
    core.create_node({"metadata": {"name": name, "labels": {SCOPE_LABEL: namespace}}})
    try:
        core.patch_node(name, {"metadata": {"labels": {"zone": "a"}}})  # other node writes pass
    finally:
        core.delete_node(name)


# --- issue 36 item 6: pods find our scheduler ---------------------------------------------------

def vgpu_pod(name: str, scheduler: str | None) -> dict[str, Any]:
    pod = gpu_pod(name)
    if scheduler is None:
        del pod["spec"]["schedulerName"]
    else:
        pod["spec"]["schedulerName"] = scheduler
    return pod


def create_pod(api_client: kubernetes.client.ApiClient, namespace: str, body: dict[str, Any],
               dry_run: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The pod as the API server stored (or, dry run, would store) it, and the create's warnings."""
    core: Any = kubernetes.client.CoreV1Api(api_client)  # raw dict bodies
    response = core.create_namespaced_pod(namespace, body, _preload_content=False,
                                          **({"dry_run": "All"} if dry_run else {}))
    return yaml.safe_load(response.data), list(response.headers.getlist("Warning"))  # urllib3's HTTPHeaderDict


def wait_for_mutation(api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    """The API server picks up the mutating configuration on its own time: probe with a dry run."""
    wait_until(lambda: create_pod(api_client, namespace, vgpu_pod("probe", None), dry_run=True)[0]["spec"]
               .get("schedulerName") == keys.SCHEDULER_NAME, what="the API server to call the mutating webhook",
               timeout_s=30)


def test_a_vgpu_pod_without_a_scheduler_is_given_ours_and_another_scheduler_is_kept_with_a_warning(
        webhook: Webhook, api_client: kubernetes.client.ApiClient, namespace: str) -> None:
    wait_for_webhook(api_client, namespace)
    wait_for_mutation(api_client, namespace)
    core: Any = kubernetes.client.CoreV1Api(api_client)
    routed, warnings = create_pod(api_client, namespace, vgpu_pod("routed", None))
    assert routed["spec"]["schedulerName"] == keys.SCHEDULER_NAME
    assert warnings == []
    assert core.read_namespaced_pod("routed", namespace).spec.scheduler_name == keys.SCHEDULER_NAME
    named_default, _ = create_pod(api_client, namespace, vgpu_pod("named-default", "default-scheduler"))
    assert named_default["spec"]["schedulerName"] == keys.SCHEDULER_NAME

    kept, warnings = create_pod(api_client, namespace, vgpu_pod("elsewhere", "volcano"))
    assert kept["spec"]["schedulerName"] == "volcano"
    assert core.read_namespaced_pod("elsewhere", namespace).spec.scheduler_name == "volcano"
    assert len(warnings) == 1
    assert f"asks for {keys.VGPU_RESOURCE} but schedulerName is" in warnings[0]
    assert "volcano" in warnings[0]

    plain, warnings = create_pod(api_client, namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}})
    assert (plain["spec"]["schedulerName"], warnings) == ("default-scheduler", [])  # never patched
