"""The controller's adapter to the Kubernetes API: the only module that imports ``kubernetes``.

- :func:`load_api_client` (shared, :mod:`fastgshare_kube.client`): ``--kubeconfig``, else in-cluster
  config, else ``~/.kube/config``;
- :class:`RawListWatch`: list (paged) and watch one resource as plain JSON dicts, the
  :class:`~fastpod_crd_controller.reflector.ListWatch` the reflectors use. Bodies are not
  turned into client models: the controller works on dicts, and skipping the models saves
  most of the client's CPU time;
- :class:`KubeClient`: the writes (:class:`~fastpod_crd_controller.ports.KubePort`) and the
  Lease calls (:class:`~fastpod_crd_controller.ports.LeasePort`).

Every ``ApiException`` leaves this module as :class:`~fastpod_crd_controller.errors.ApiError`,
and so does a body the client itself refuses before sending it (since release 37 the client
checks bodies against its models: an unknown field such as ``spec.metadata`` in a pod): a 422
naming each field, as the API server would.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from fastgshare import keys
from fastgshare_kube import client as shared_client
from fastpod_crd_controller.errors import INVALID, ApiError, ConfigError

PAGE_SIZE = 500
CONNECT_TIMEOUT_S = 10
REQUEST_TIMEOUT_S = 30
MERGE_PATCH = "application/merge-patch+json"

ApiClient = client.ApiClient  # for annotations in modules that must not import kubernetes


def load_api_client(kubeconfig: str | None) -> ApiClient:
    """The shared client loading (:mod:`fastgshare_kube.client`), its failure as our :class:`ConfigError`."""
    try:
        return shared_client.load_api_client(kubeconfig)
    except shared_client.KubeConfigError as error:
        raise ConfigError(str(error)) from None


def api_error(error: ApiException) -> ApiError:
    """The :class:`ApiError` of a client exception, with the server's ``Status`` message and causes."""
    message = ""
    causes: tuple[tuple[str, str], ...] = ()
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        status = json.loads(error.body or "")
        message = str(status.get("message", ""))
        causes = tuple((str(cause.get("field", "")), str(cause.get("message", "")))
                       for cause in (status.get("details") or {}).get("causes") or [])
    return ApiError(int(error.status or 0), str(error.reason or ""), message or str(error.body or ""), causes)


def client_refusal(error: ValueError) -> ApiError | None:
    """The 422 :class:`ApiError` of a body the client refused (a pydantic ``ValidationError``:
    it has ``errors()``), each problem under its field path in the body; ``None`` for other errors."""
    errors = getattr(error, "errors", None)
    if not callable(errors):
        return None
    causes = []
    for item in errors():
        location = list(item.get("loc") or ())[1:]  # the first step is the argument (the body)
        field = "".join(f"[{step}]" if isinstance(step, int) else f".{step}" for step in location).lstrip(".")
        if item.get("type") == "extra_forbidden":
            problem = "unknown field (not part of the Kubernetes object)"
        else:
            problem = f"{item.get('msg', 'invalid')} (got {str(item.get('input'))[:60]!r})"
        causes.append((field, problem))
    message = "; ".join(f"{field}: {problem}" for field, problem in causes)
    return ApiError(INVALID, "Invalid", f"the Kubernetes client refused the body: {message}", tuple(causes))


@contextlib.contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except ApiException as error:
        raise api_error(error) from None
    except (urllib3.exceptions.HTTPError, OSError) as error:  # no answer at all
        raise ApiError(0, "Unreachable", str(error)) from None
    except ValueError as error:
        if (refusal := client_refusal(error)) is None:
            raise
        raise refusal from None


def _raw(body: Mapping[str, Any]) -> Any:
    """A request body as a plain dict; the client serializes dicts as they are, no model needed."""
    return dict(body)


def _json(response: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(response.data)
    return body


class RawListWatch:
    """List and watch one resource through a generated ``list_*`` call, as dicts."""

    def __init__(self, list_call: Callable[..., Any], **params: Any) -> None:
        self._list_call = list_call
        self._params = params
        self._lock = threading.Lock()
        self._response: Any = None

    def list(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token = None
        while True:
            page_params = {"limit": PAGE_SIZE, **({"_continue": token} if token else {})}
            with _translated():
                page = _json(self._list_call(**self._params, **page_params, _preload_content=False,
                                             _request_timeout=(CONNECT_TIMEOUT_S, 120)))
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, str(page["metadata"]["resourceVersion"])

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        with _translated():
            response = self._list_call(**self._params, watch=True, resource_version=resource_version,
                                       timeout_seconds=timeout_s, allow_watch_bookmarks=True,
                                       _preload_content=False,
                                       _request_timeout=(CONNECT_TIMEOUT_S, timeout_s + 30))
        with self._lock:
            self._response = response
        try:
            for line in iter_resp_lines(response):
                if line.strip():
                    yield json.loads(line)
        finally:
            with self._lock:
                self._response = None
            response.release_conn()

    def close(self) -> None:
        """Unblock a watch read in another thread by shutting its socket down."""
        with self._lock:
            response = self._response
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def fastpod_source(api: client.ApiClient, namespace: str | None) -> RawListWatch:
    """FaSTPods of ``namespace``, or of all namespaces."""
    custom = client.CustomObjectsApi(api)
    if namespace:
        return RawListWatch(custom.list_namespaced_custom_object, group=keys.FASTPOD_GROUP,
                            version=keys.FASTPOD_VERSION, namespace=namespace, plural=keys.FASTPOD_PLURAL)
    return RawListWatch(custom.list_cluster_custom_object, group=keys.FASTPOD_GROUP,
                        version=keys.FASTPOD_VERSION, plural=keys.FASTPOD_PLURAL)


def pod_source(api: client.ApiClient, namespace: str | None) -> RawListWatch:
    """Pods carrying the FaSTPod name label (only the controller's pods), of one or all namespaces."""
    core = client.CoreV1Api(api)
    if namespace:
        return RawListWatch(core.list_namespaced_pod, namespace=namespace, label_selector=keys.FASTPOD_NAME_LABEL)
    return RawListWatch(core.list_pod_for_all_namespaces, label_selector=keys.FASTPOD_NAME_LABEL)


class KubeClient:
    """The controller's writes and its Lease calls."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)
        self._custom = client.CustomObjectsApi(api)
        self._coordination = client.CoordinationV1Api(api)

    def create_pod(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        with _translated():
            return _json(self._core.create_namespaced_pod(namespace, _raw(body), _preload_content=False,
                                                          _request_timeout=REQUEST_TIMEOUT_S))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        with _translated():
            self._core.delete_namespaced_pod(name, namespace, body=_raw({"preconditions": {"uid": uid}}),
                                             _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)

    def patch_fastpod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        with _translated():
            self._custom.patch_namespaced_custom_object_status(
                keys.FASTPOD_GROUP, keys.FASTPOD_VERSION, namespace, keys.FASTPOD_PLURAL, name,
                {"status": dict(status)}, _content_type=MERGE_PATCH, _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_S)

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        with _translated():
            self._core.create_namespaced_event(namespace, _raw(body), _preload_content=False,
                                               _request_timeout=REQUEST_TIMEOUT_S)

    def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        with _translated():
            self._core.patch_namespaced_event(name, namespace, _raw(body), _content_type=MERGE_PATCH,
                                              _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S)

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            with _translated():
                return _json(self._coordination.read_namespaced_lease(name, namespace, _preload_content=False,
                                                                      _request_timeout=REQUEST_TIMEOUT_S))
        except ApiError as error:
            if error.not_found:
                return None
            raise

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        with _translated():
            return _json(self._coordination.create_namespaced_lease(namespace, _raw(body), _preload_content=False,
                                                                    _request_timeout=REQUEST_TIMEOUT_S))

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        with _translated():
            return _json(self._coordination.replace_namespaced_lease(name, namespace, _raw(body),
                                                                     _preload_content=False,
                                                                     _request_timeout=REQUEST_TIMEOUT_S))
