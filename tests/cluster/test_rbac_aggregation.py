"""Roles a namespace editor gets (issue 42, item 7): with deploy/crd/roles.yaml applied and the
clusterrole-aggregation controller running, a user who holds only the built-in ``edit`` in one
namespace manages FaSTPods and FaSTFuncs there and nowhere else, and ``view`` only reads them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from kubernetes.client.exceptions import ApiException

from fastgshare import keys
from tests.cluster.conftest import unique_name
from tests.cluster.controlplane import Binaries, ControlPlane, ProcessSet, start_controller_manager, wait_until
from tests.cluster.test_controller import fastpod_body
from tests.cluster.test_controller_deploy import apply
from tests.cluster.test_fastfunc_controller import function_crds  # noqa: F401 - a fixture this module uses

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
EDITOR, VIEWER = "team-b-editor", "team-b-viewer"


@pytest.fixture(scope="module")
def aggregation(cluster_binaries: Binaries, control_plane: ControlPlane, cluster_dir: Path) -> Iterator[None]:
    """kube-controller-manager running only the clusterrole-aggregation controller."""
    processes = ProcessSet()
    try:
        start_controller_manager(cluster_binaries, control_plane, cluster_dir / "aggregation", processes,
                                 controllers=("clusterrole-aggregation",))
        yield
    finally:
        processes.stop_all()


@pytest.fixture
def other_namespace(api_client: kubernetes.client.ApiClient) -> Iterator[str]:
    core = kubernetes.client.CoreV1Api(api_client)
    name = unique_name("other-team")
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def _bind(api_client: kubernetes.client.ApiClient, namespace: str, user: str, cluster_role: str) -> None:
    kubernetes.client.RbacAuthorizationV1Api(api_client).create_namespaced_role_binding(namespace, {
        "metadata": {"name": f"{user}-{cluster_role}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})


@pytest.fixture
def as_user(control_plane: ControlPlane) -> Iterator[Any]:
    """``as_user(name)``: a CustomObjectsApi acting as that user (impersonation); closed afterwards."""
    opened = []

    def make(user: str) -> kubernetes.client.CustomObjectsApi:
        context = control_plane.api_client()
        client = context.__enter__()
        opened.append(context)
        client.set_default_header("Impersonate-User", user)
        return kubernetes.client.CustomObjectsApi(client)

    try:
        yield make
    finally:
        for context in opened:
            context.__exit__(None, None, None)


def _fastfunc(name: str) -> dict[str, Any]:
    return {"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND, "metadata": {"name": name},
            "spec": {"podSpec": {"containers": [{"name": "fn", "image": "registry.invalid/fn:1"}]}, "memory": "1Gi",
                     "fixed": {"quotaRequest": "0.4", "smPartition": 12, "replicas": 1}}}


def _status(call: Any) -> int:
    try:
        call()
    except ApiException as error:
        return int(error.status)
    return 200


def test_a_namespace_editor_manages_fastpods_and_fastfuncs_there_only(
        aggregation: None, function_crds: None, api_client: kubernetes.client.ApiClient,  # noqa: F811
        namespace: str, other_namespace: str, as_user: Any) -> None:
    apply(api_client, DEPLOY / "crd" / "roles.yaml")
    _bind(api_client, namespace, EDITOR, "edit")
    _bind(api_client, namespace, VIEWER, "view")
    editor, viewer = as_user(EDITOR), as_user(VIEWER)
    group, version = keys.API_GROUP, keys.FASTPOD_VERSION

    # the aggregation controller folds fastgshare-edit into edit within moments
    def editor_created() -> bool:
        return _status(lambda: editor.create_namespaced_custom_object(
            group, version, namespace, keys.FASTPOD_PLURAL, fastpod_body("mine", replicas=0))) in (200, 201, 409)

    wait_until(editor_created, what=f"{EDITOR} (edit in {namespace}) may create a FaSTPod there", timeout_s=60)
    assert _status(lambda: editor.create_namespaced_custom_object(
        group, version, namespace, keys.FASTFUNC_PLURAL, _fastfunc("fn"))) == 200
    assert _status(lambda: editor.patch_namespaced_custom_object(
        group, version, namespace, keys.FASTPOD_PLURAL, "mine", {"spec": {"replicas": 1}})) == 200
    assert _status(lambda: editor.list_namespaced_custom_object(group, version, namespace, keys.FASTFUNC_PLURAL)) == 200

    # nowhere else
    assert _status(lambda: editor.create_namespaced_custom_object(
        group, version, other_namespace, keys.FASTPOD_PLURAL, fastpod_body("theirs", replicas=0))) == 403
    assert _status(lambda: editor.create_namespaced_custom_object(
        group, version, other_namespace, keys.FASTFUNC_PLURAL, _fastfunc("fn"))) == 403
    assert _status(lambda: editor.list_namespaced_custom_object(
        group, version, other_namespace, keys.FASTPOD_PLURAL)) == 403
    # and not the controllers' status
    assert _status(lambda: editor.patch_namespaced_custom_object_status(
        group, version, namespace, keys.FASTPOD_PLURAL, "mine", {"status": {"replicas": 9}})) == 403

    # view reads, and only reads
    assert _status(lambda: viewer.list_namespaced_custom_object(group, version, namespace, keys.FASTPOD_PLURAL)) == 200
    assert _status(lambda: viewer.get_namespaced_custom_object(group, version, namespace, keys.FASTFUNC_PLURAL,
                                                               "fn")) == 200
    assert _status(lambda: viewer.create_namespaced_custom_object(
        group, version, namespace, keys.FASTPOD_PLURAL, fastpod_body("viewers", replicas=0))) == 403
    assert _status(lambda: viewer.delete_namespaced_custom_object(
        group, version, namespace, keys.FASTPOD_PLURAL, "mine")) == 403

    assert _status(lambda: editor.delete_namespaced_custom_object(
        group, version, namespace, keys.FASTPOD_PLURAL, "mine")) == 200
