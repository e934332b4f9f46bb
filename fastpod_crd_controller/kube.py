"""The controller's adapter to the Kubernetes layer (:mod:`fastgshare_kube`): the only controller
module that reaches the API.

- :func:`load_api_client` (shared, :mod:`fastgshare_kube.client`): ``--kubeconfig``, else in-cluster
  config, else ``~/.kube/config``;
- :func:`fastpod_source`, :func:`pod_source`: the :class:`~fastgshare_kube.rest.RawListWatch` es the
  reflectors run. The controller works on the API's dicts, so there are no records to map;
- :class:`KubeClient`: the writes (:class:`~fastpod_crd_controller.ports.KubePort`) and the
  Lease calls (:class:`~fastgshare_kube.leader.LeasePort`).

Every failure leaves as :class:`~fastgshare_kube.errors.ApiError` (see :mod:`fastgshare_kube.rest`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastgshare import keys
from fastgshare_kube import client as shared_client
from fastgshare_kube import rest
from fastgshare_kube.access_reviews import kubernetes_metrics_access  # noqa: F401 - this adapter's API
from fastgshare_kube.rest import RawListWatch, api_error, client_refusal  # noqa: F401 - this adapter's API
from fastpod_crd_controller.errors import ConfigError

ApiClient = shared_client.ApiClient  # for annotations in modules that do not import the layer's client


def load_api_client(kubeconfig: str | None) -> ApiClient:
    """The shared client loading (:mod:`fastgshare_kube.client`); fails with :class:`ConfigError`."""
    try:
        return shared_client.load_api_client(kubeconfig)
    except shared_client.KubeConfigError as error:
        raise ConfigError(str(error)) from None


def fastpod_source(api: ApiClient, namespace: str | None) -> RawListWatch:
    """FaSTPods of ``namespace``, or of all namespaces."""
    custom = rest.custom_objects(api)
    if namespace:
        return RawListWatch(custom.list_namespaced_custom_object, group=keys.FASTPOD_GROUP,
                            version=keys.FASTPOD_VERSION, namespace=namespace, plural=keys.FASTPOD_PLURAL)
    return RawListWatch(custom.list_cluster_custom_object, group=keys.FASTPOD_GROUP,
                        version=keys.FASTPOD_VERSION, plural=keys.FASTPOD_PLURAL)


def pod_source(api: ApiClient, namespace: str | None) -> RawListWatch:
    """Pods carrying the FaSTPod name label (only the controller's pods), of one or all namespaces."""
    core = rest.core_v1(api)
    if namespace:
        return RawListWatch(core.list_namespaced_pod, namespace=namespace, label_selector=keys.FASTPOD_NAME_LABEL)
    return RawListWatch(core.list_pod_for_all_namespaces, label_selector=keys.FASTPOD_NAME_LABEL)


class KubeClient(rest.Leases, rest.Events):
    """The controller's writes, its event writes and its Lease calls."""

    def __init__(self, api: ApiClient) -> None:
        rest.Leases.__init__(self, api)
        rest.Events.__init__(self, api)
        self._core = rest.core_v1(api)

    def create_pod(self, namespace: str, body: Mapping[str, Any], *, checked: bool = False) -> dict[str, Any]:
        """The client checks a body against its models before sending it (a refusal is a 422, see
        :func:`~fastgshare_kube.rest.client_refusal`); a ``checked`` body is sent as it is, by
        :func:`~fastgshare_kube.rest.send` (the check and the client's generated layer cost about a
        third of a create's client CPU)."""
        if checked:
            return rest.send(self._api, "POST", rest.namespaced_path("v1", namespace, "pods"), body)
        return rest.call(self._core.create_namespaced_pod, namespace, rest.raw(body))

    def patch_pod(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        rest.send(self._api, "PATCH", rest.namespaced_path("v1", namespace, "pods", name), body,
                  content_type=rest.MERGE_PATCH)

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        rest.send(self._api, "DELETE", rest.namespaced_path("v1", namespace, "pods", name),
                  {"preconditions": {"uid": uid}})

    def patch_fastpod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        rest.send(self._api, "PATCH", rest.namespaced_path(keys.FASTPOD_API_VERSION, namespace, keys.FASTPOD_PLURAL,
                                                           name, "status"),
                  {"status": dict(status)}, content_type=rest.MERGE_PATCH)
