"""The controller's Kubernetes adapter: how refusals become :class:`ApiError` s that name the field."""

from __future__ import annotations

import json

import kubernetes.client
import pytest
from kubernetes.client.rest import ApiException

from fastpod_crd_controller.errors import ApiError
from fastpod_crd_controller.kube import KubeClient, api_error


def unreachable_client() -> kubernetes.client.ApiClient:
    configuration = kubernetes.client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # never reached: the client refuses the body first
    return kubernetes.client.ApiClient(configuration)


def test_a_body_the_client_refuses_is_a_422_naming_each_field() -> None:
    """Issue 15, defect 2: the client's own check used to escape as a traceback and be retried."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "x-"},
            "spec": {"metadata": {"labels": {"a": "b"}}, "containers": [{"name": "a", "image": "b", "bogus": 1}]}}
    with pytest.raises(ApiError) as refused:
        KubeClient(unreachable_client()).create_pod("team-a", body)
    assert refused.value.status == 422
    assert dict(refused.value.causes) == {
        "spec.metadata": "unknown field (not part of the Kubernetes object)",
        "spec.containers[0].bogus": "unknown field (not part of the Kubernetes object)"}


def test_the_api_servers_causes_are_kept() -> None:
    status = {"kind": "Status", "message": 'Pod "x" is invalid', "details": {"causes": [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers[0].image"}]}}
    error = ApiException(status=422, reason="Unprocessable Entity")
    error.body = json.dumps(status)
    translated = api_error(error)
    assert (translated.status, translated.message) == (422, 'Pod "x" is invalid')
    assert translated.causes == (("spec.containers[0].image", "Required value"),)


def test_a_checked_body_skips_the_clients_check_and_goes_to_the_server() -> None:
    """The controller passes ``checked`` for the 2nd, 3rd, ... pod of a body the first create got through."""
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "x-"},
            "spec": {"containers": [{"name": "a", "image": "b", "bogus": 1}]}}
    with pytest.raises(ApiError) as failed:
        KubeClient(unreachable_client()).create_pod("team-a", body, checked=True)
    assert failed.value.status == 0  # sent (and nobody answered), not refused by the client
