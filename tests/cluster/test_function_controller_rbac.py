"""The function controller runs with exactly the rights deploy/function-controller/rbac.yaml grants
(impersonating its service account): a Role in the function namespace, cluster-wide reads for the
GPU fit check only (issue 37, item 6). It watches the function namespace by default, runs a
FaSTFunc there, and may not touch Services or ConfigMaps anywhere else."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fastfunc_controller.main import build_parser, run
from fastgshare import keys
from tests.cluster.controlplane import ControlPlane, wait_until
from tests.cluster.test_controller_deploy import apply
from tests.cluster.test_fastfunc_controller import Functions, condition, function_crds  # noqa: F401 - a fixture

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVICE_ACCOUNT = f"system:serviceaccount:{keys.SYSTEM_NAMESPACE}:fastgshare-function-controller"
NAMESPACE = keys.DEFAULT_FUNCTION_NAMESPACE


@pytest.fixture
def as_function_controller(control_plane: ControlPlane, api_client: kubernetes.client.ApiClient,
                           function_crds: None) -> Iterator[kubernetes.client.ApiClient]:  # noqa: F811
    apply(api_client, DEPLOY / "namespace.yaml")
    apply(api_client, DEPLOY / "function-controller" / "rbac.yaml")
    with control_plane.api_client() as client:
        client.set_default_header("Impersonate-User", SERVICE_ACCOUNT)
        yield client


def _status(call: Callable[[], object]) -> int:
    try:
        call()
    except ApiException as error:
        return int(error.status)
    return 200


def test_the_function_controller_cannot_change_services_or_read_configmaps_outside_its_namespace(
        as_function_controller: kubernetes.client.ApiClient) -> None:
    core = kubernetes.client.CoreV1Api(as_function_controller)
    assert _status(core.list_service_for_all_namespaces) == 403
    assert _status(lambda: core.list_namespaced_service("default")) == 403
    assert _status(lambda: core.read_namespaced_config_map("kube-root-ca.crt", "default")) == 403
    assert _status(lambda: core.list_namespaced_service(NAMESPACE)) == 200


def test_the_function_controller_works_with_exactly_its_rbac(as_function_controller: kubernetes.client.ApiClient,
                                                             api_client: kubernetes.client.ApiClient) -> None:
    functions = Functions(api_client, NAMESPACE)
    # no --namespace: the function namespace is the default; leader election in our namespace
    args = build_parser().parse_args(["--leader-elect", "--lease-namespace", keys.SYSTEM_NAMESPACE,
                                      "--identity", "rbac-test"])
    stopping = threading.Event()
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(run(args, stopping, as_function_controller)),
                              name="function-controller", daemon=True)
    thread.start()
    try:
        functions.create("rbac", {"quotaRequest": "0.4", "smPartition": 12, "replicas": 1})
        functions.wait_for_fastpods({"rbac-q40-s12"})
        wait_until(lambda: "rbac" in functions.services(), what="the Service rbac", timeout_s=60)
        functions.wait_for_status("rbac", lambda s: condition(s, "Ready").get("status") == "False", "its status")
        functions.patch("rbac", {"spec": {"fixed": {"smPartition": 24}}})
        functions.wait_for_fastpods({"rbac-q40-s24"})  # a FaSTPod replaced: create and delete
        wait_until(lambda: "rbac-q40-s12" not in functions.fastpods(), what="the old FaSTPod deleted", timeout_s=60)
    finally:
        stopping.set()
        thread.join(60)
        custom = kubernetes.client.CustomObjectsApi(api_client)
        for plural in (keys.FASTFUNC_PLURAL, keys.FASTPOD_PLURAL):
            custom.delete_collection_namespaced_custom_object(keys.API_GROUP, keys.FASTFUNC_VERSION, NAMESPACE,
                                                              plural)
        if _status(lambda: kubernetes.client.CoreV1Api(api_client).delete_namespaced_service(
                "rbac", NAMESPACE, _preload_content=False)) \
                not in (200, 404):
            pytest.fail("cannot delete the Service rbac")
    assert result == [0], "the function controller did not stop cleanly"
