"""The function controller's adapter to the Kubernetes layer (:mod:`fastgshare_kube`): the only
module of the controller that reaches the API.

- :func:`load_api_client`: ``--kubeconfig``, else in-cluster config, else ``~/.kube/config``;
- :func:`fastfunc_source`, :func:`fastpod_source`, :func:`service_source`, :func:`pod_source`: what
  the reflectors list and watch, as dicts: every FaSTFunc, and the FaSTPods, Services and pods
  carrying the function label; :func:`sources`: the four, one of each per function namespace (the
  controller's rights are a Role in each, so nothing is listed or watched cluster-wide), or
  cluster-wide ones for ``--all-namespaces``;
- :class:`KubeClient`: the writes (FaSTPods, Services, FaSTFunc status), the profile ConfigMap's
  GET, events and Leases;
- :func:`check_crd`: whether the FaSTFunc CRD is installed, to say so in one line at start;
- :meth:`KubeClient.free_space`: every GPU node's inventory and every bound pod's assignment (and
  model, ``fastgshare/model``), read when a scale-up adds pods (the autoscaler's fit check).

Every failure leaves as :class:`~fastgshare_kube.errors.ApiError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fastgshare import keys
from fastgshare.codec import PodAssignment, decode_assignment, decode_node_inventory
from fastgshare.errors import FastGShareError
from fastgshare.inventory import NodeInventory
from fastgshare.model import ModelRef, pod_model
from fastgshare.scaling_fit import FreeSpace
from fastgshare_kube import client as shared_client
from fastgshare_kube import rest
from fastgshare_kube.errors import ApiError, KubeConfigError
from fastgshare_kube.rest import RawListWatch

ApiClient = shared_client.ApiClient
JSON_PATCH = rest.JSON_PATCH
FINISHED_PHASES = ("Succeeded", "Failed")


def load_api_client(kubeconfig: str | None) -> ApiClient:
    """The shared client loading; fails with :class:`KubeConfigError` saying what to fix."""
    return shared_client.load_api_client(kubeconfig)


def _custom_source(api: ApiClient, plural: str, namespace: str | None, **params: Any) -> RawListWatch:
    custom = rest.custom_objects(api)
    group, version = keys.API_GROUP, keys.FASTFUNC_VERSION
    if namespace:
        return RawListWatch(custom.list_namespaced_custom_object, group=group, version=version, namespace=namespace,
                            plural=plural, **params)
    return RawListWatch(custom.list_cluster_custom_object, group=group, version=version, plural=plural, **params)


def fastfunc_source(api: ApiClient, namespace: str | None) -> RawListWatch:
    return _custom_source(api, keys.FASTFUNC_PLURAL, namespace)


def fastpod_source(api: ApiClient, namespace: str | None) -> RawListWatch:
    """FaSTPods with the function label (the controller's children, and nothing else)."""
    return _custom_source(api, keys.FASTPOD_PLURAL, namespace, label_selector=keys.FUNCTION_LABEL)


def service_source(api: ApiClient, namespace: str | None) -> RawListWatch:
    core = rest.core_v1(api)
    if namespace:
        return RawListWatch(core.list_namespaced_service, namespace=namespace, label_selector=keys.FUNCTION_LABEL)
    return RawListWatch(core.list_service_for_all_namespaces, label_selector=keys.FUNCTION_LABEL)


def pod_source(api: ApiClient, namespace: str | None) -> RawListWatch:
    """Pods with the function label: the FaSTPod controller copies it from the child FaSTPods."""
    core = rest.core_v1(api)
    if namespace:
        return RawListWatch(core.list_namespaced_pod, namespace=namespace, label_selector=keys.FUNCTION_LABEL)
    return RawListWatch(core.list_pod_for_all_namespaces, label_selector=keys.FUNCTION_LABEL)


Source = RawListWatch | dict[str, RawListWatch]  # cluster-wide, or one per namespace


@attrs.frozen
class Sources:
    """What the controller's four caches list and watch (see :meth:`Controller.start`)."""

    fastfuncs: Source
    fastpods: Source
    services: Source
    pods: Source


def sources(api: ApiClient, namespaces: Sequence[str] | None) -> Sources:
    """One source of each kind per namespace of ``namespaces``; cluster-wide ones for ``None``."""
    if namespaces is None:
        return Sources(fastfunc_source(api, None), fastpod_source(api, None), service_source(api, None),
                       pod_source(api, None))
    return Sources({ns: fastfunc_source(api, ns) for ns in namespaces},
                   {ns: fastpod_source(api, ns) for ns in namespaces},
                   {ns: service_source(api, ns) for ns in namespaces},
                   {ns: pod_source(api, ns) for ns in namespaces})


def check_crd(api: ApiClient, namespace: str | None = None) -> str | None:
    """None if FaSTFuncs can be listed (in ``namespace``, else cluster-wide); else one line saying
    why not and what to do."""
    custom = rest.custom_objects(api)
    try:
        if namespace:
            rest.call(custom.list_namespaced_custom_object, keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, namespace,
                      keys.FASTFUNC_PLURAL, limit=1)
        else:
            rest.call(custom.list_cluster_custom_object, keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION,
                      keys.FASTFUNC_PLURAL, limit=1)
    except ApiError as error:
        if error.not_found:
            return (f"the FaSTFunc CRD {keys.FASTFUNC_CRD_NAME} is not installed; install it with "
                    "kubectl apply -f deploy/crd/fastfuncs.yaml")
        if error.status == 403:
            return None  # a namespaced account may not list cluster-wide: the reflector says more
        if error.unreachable:
            return f"the API server does not answer: {error.message}; check --kubeconfig and the server"
    return None


class KubeClient(rest.Leases, rest.Events):
    """The controller's writes, its events and its Lease calls."""

    def __init__(self, api: ApiClient) -> None:
        rest.Leases.__init__(self, api)
        rest.Events.__init__(self, api)
        self._custom = rest.custom_objects(api)
        self._core_api = rest.core_v1(api)

    def create_fastpod(self, namespace: str, body: Mapping[str, Any]) -> None:
        rest.call(self._custom.create_namespaced_custom_object, keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, namespace,
                  keys.FASTPOD_PLURAL, rest.raw(body))

    def patch_fastpod(self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]) -> None:
        """Apply a JSON patch (RFC 6902) to a FaSTPod."""
        rest.call(self._custom.patch_namespaced_custom_object, keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, namespace,
                  keys.FASTPOD_PLURAL, name, [dict(op) for op in operations], _content_type=JSON_PATCH)

    def delete_fastpod(self, namespace: str, name: str, uid: str) -> None:
        """Delete a FaSTPod only if it still has ``uid``; its pods go in the background (garbage collector)."""
        rest.call(self._custom.delete_namespaced_custom_object, keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, namespace,
                  keys.FASTPOD_PLURAL, name, body=rest.raw({"preconditions": {"uid": uid},
                                                            "propagationPolicy": "Background"}))

    def create_service(self, namespace: str, body: Mapping[str, Any]) -> None:
        rest.call(self._core_api.create_namespaced_service, namespace, rest.raw(body))

    def patch_service(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        rest.call(self._core_api.patch_namespaced_service, name, namespace, rest.raw(body),
                  _content_type=rest.MERGE_PATCH)

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A ConfigMap as a dict (a function's profile), or None when there is none."""
        try:
            found = rest.call(self._core_api.read_namespaced_config_map, name, namespace)
        except ApiError as error:
            if error.not_found:
                return None
            raise
        return found

    def patch_fastfunc_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        rest.call(self._custom.patch_namespaced_custom_object_status, keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION,
                  namespace, keys.FASTFUNC_PLURAL, name, {"status": dict(status)}, _content_type=rest.MERGE_PATCH)

    def free_space(self) -> FreeSpace:
        """Every GPU's ledger from the nodes' inventories and the unfinished pods' assignments
        (unreadable annotations are skipped: the extender and ``fastgshare check`` report them)."""
        inventories: list[NodeInventory] = []
        for node in rest.call(self._core_api.list_node)["items"]:
            text = ((node.get("metadata") or {}).get("annotations") or {}).get(keys.NODE_GPU_INFO_ANNOTATION)
            if text is not None:
                try:
                    inventories.append(decode_node_inventory(text))
                except FastGShareError:
                    continue
        assigned: list[tuple[str, PodAssignment]] = []
        models: dict[str, ModelRef] = {}
        for pod in rest.call(self._core_api.list_pod_for_all_namespaces)["items"]:
            metadata = pod.get("metadata") or {}
            annotations = metadata.get("annotations") or {}
            text = annotations.get(keys.POD_ASSIGNMENT_ANNOTATION)
            if text is None or (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
                continue
            key = f"{metadata.get('namespace')}/{metadata.get('name')}"
            try:
                assigned.append((key, decode_assignment(text)))
            except FastGShareError:
                continue
            if (model := pod_model(annotations, str(metadata.get("namespace", "")))) is not None:
                models[key] = model
        return FreeSpace.of(inventories, assigned, models)

__all__ = ["ApiClient", "ApiError", "KubeClient", "KubeConfigError", "RawListWatch", "Source", "Sources", "check_crd",
           "fastfunc_source", "fastpod_source", "load_api_client", "pod_source", "service_source", "sources"]
