"""Calling the API server through the official client, as plain JSON, with one error type.

- :func:`core_v1`, :func:`custom_objects`, :func:`coordination_v1`, :func:`apiextensions_v1`: the
  generated API groups, so a
  service's adapter names the calls it makes without importing ``kubernetes``;
- :func:`call`: one request, its answer as a dict (``_preload_content=False``: bodies are not
  turned into client models, which saves most of the client's CPU time), with a request timeout;
  :func:`call_text` for an answer that is not JSON;
- :func:`send`: one write whose body the caller built, by path, through the client's own
  connection pool, headers and credentials but not its generated layer (argument checks, a walk
  of the body, parameter assembly): the writes a service makes per pod;
- :class:`RawListWatch`: list (paged) and watch one resource as dicts, the
  :class:`~fastgshare_kube.reflector.ListWatch` that :class:`~fastgshare_kube.reflector.Reflector`
  runs.

Every ``ApiException`` and urllib3/socket error leaves this module as
:class:`~fastgshare_kube.errors.ApiError` (status 0 when nothing answered), and so does a body the
client itself refuses before sending it (since release 37 the client checks bodies against its
models: an unknown field such as ``spec.metadata`` in a pod): a 422 naming each field, as the API
server would.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson
import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from fastgshare_kube.errors import INVALID, UNREACHABLE, ApiError

PAGE_SIZE = 500
CONNECT_TIMEOUT_S = 10
REQUEST_TIMEOUT_S = 30
LIST_TIMEOUT_S = 120
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

ApiClient = client.ApiClient


def core_v1(api: ApiClient) -> Any:
    return client.CoreV1Api(api)


def custom_objects(api: ApiClient) -> Any:
    return client.CustomObjectsApi(api)


def coordination_v1(api: ApiClient) -> Any:
    return client.CoordinationV1Api(api)


def apiextensions_v1(api: ApiClient) -> Any:
    return client.ApiextensionsV1Api(api)


def admissionregistration_v1(api: ApiClient) -> Any:
    return client.AdmissionregistrationV1Api(api)


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
def translated() -> Iterator[None]:
    """Turn the client's failures inside the block into :class:`ApiError`."""
    try:
        yield
    except ApiException as error:
        raise api_error(error) from None
    except (urllib3.exceptions.HTTPError, OSError) as error:  # no answer at all
        raise ApiError(UNREACHABLE, "Unreachable", str(error)) from None
    except ValueError as error:
        if (refusal := client_refusal(error)) is None:
            raise
        raise refusal from None


def raw(body: Mapping[str, Any]) -> Any:
    """A request body as a plain dict; the client serializes dicts as they are, no model needed."""
    return dict(body)


def call(method: Callable[..., Any], *args: Any, timeout_s: float | tuple[float, float] = REQUEST_TIMEOUT_S,
         **kwargs: Any) -> dict[str, Any]:
    """``method(*args, **kwargs)`` of a generated API, its answer as a dict; failures as :class:`ApiError`."""
    with translated():
        response = method(*args, **kwargs, _preload_content=False, _request_timeout=timeout_s)
        body: dict[str, Any] = decode_json(response.data) if response.data else {}
    return body


def namespaced_path(group_version: str, namespace: str, resource: str, name: str | None = None,
                    subresource: str | None = None) -> str:
    """The API path of a namespaced resource for :func:`send`: ``namespaced_path("v1", "a", "pods",
    "p", "binding")`` is ``/api/v1/namespaces/a/pods/p/binding`` (``v1`` is the core group, others
    are ``group/version``); names are quoted."""
    parts = ["/api/v1" if group_version == "v1" else f"/apis/{group_version}", "namespaces",
             urllib.parse.quote(namespace, safe=""), resource]
    if name is not None:
        parts.append(urllib.parse.quote(name, safe=""))
    if subresource:
        parts.append(subresource)
    return "/".join(parts)


def send(api: ApiClient, method: str, path: str, body: Mapping[str, Any] | None = None, *,
         content_type: str = JSON, timeout_s: float | tuple[float, float] = REQUEST_TIMEOUT_S) -> dict[str, Any]:
    """``method`` on the API server's ``path`` (see :func:`namespaced_path`) with a JSON ``body``;
    its answer as a dict, failures as :class:`ApiError`, as from :func:`call`.

    The request goes through the same ``rest_client`` (pool, TLS, proxy, retries) with the same
    default headers and credentials (a refreshing token is refreshed) as a generated call, but
    skips the generated layer: its argument check, its walk of the body and its parameter
    assembly. One pod create took 1.40 ms of client CPU through that layer, 1.10 without the
    check, 0.95 here. Nothing checks the body on the client: for bodies the caller builds itself
    or has sent before."""
    headers = {**api.default_headers, "Accept": JSON, "Content-Type": content_type}
    for setting in api.configuration.auth_settings().values():
        if setting.get("in") == "header" and setting.get("value"):
            headers[setting["key"]] = setting["value"]
    with translated():
        response = api.rest_client.request(method, api.configuration.host + path, headers=headers,
                                           body=dict(body) if body is not None else None,
                                           _request_timeout=timeout_s)
        data = response.read()
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
    answer: dict[str, Any] = decode_json(data) if data else {}
    return answer


def call_text(method: Callable[..., Any], *args: Any, timeout_s: float | tuple[float, float] = REQUEST_TIMEOUT_S,
              **kwargs: Any) -> str:
    """``method(*args, **kwargs)`` whose answer is not JSON (a proxied ``/metrics``), as text."""
    with translated():
        response = method(*args, **kwargs, _preload_content=False, _request_timeout=timeout_s)
        return bytes(response.data or b"").decode(errors="replace")


def decode_json(text: bytes | str) -> Any:
    """An API answer or watch event: orjson, 2-3 times faster than ``json`` on pod objects; what it
    refuses (``NaN``) is decoded by ``json``. orjson reads an integer beyond 64 bits as a float; the
    API server sends none (typed fields are int64, and it decodes an unstructured number that
    overflows int64 as a float64 itself)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


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
            page = call(self._list_call, **self._params, **page_params,
                        timeout_s=(CONNECT_TIMEOUT_S, LIST_TIMEOUT_S))
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items, str(page["metadata"]["resourceVersion"])

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        with translated():
            response = self._list_call(**self._params, watch=True, resource_version=resource_version,
                                       timeout_seconds=timeout_s, allow_watch_bookmarks=True,
                                       _preload_content=False,
                                       _request_timeout=(CONNECT_TIMEOUT_S, timeout_s + 30))
        with self._lock:
            self._response = response
        try:
            with translated():
                for line in iter_resp_lines(response):
                    if line.strip():
                        yield decode_json(line)
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
        elif response is not None and callable(getattr(response, "shutdown", None)):
            with contextlib.suppress(Exception):
                response.shutdown()


class Leases:
    """The :class:`~fastgshare_kube.leader.LeasePort` over the API: ``coordination.k8s.io/v1`` Leases as dicts."""

    def __init__(self, api: ApiClient) -> None:
        self._coordination = coordination_v1(api)

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return call(self._coordination.read_namespaced_lease, name, namespace)
        except ApiError as error:
            if error.not_found:
                return None
            raise

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return call(self._coordination.create_namespaced_lease, namespace, raw(body))

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return call(self._coordination.replace_namespaced_lease, name, namespace, raw(body))


class Events:
    """The :class:`~fastgshare_kube.events.EventSink` over the API: core ``v1`` Events."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        send(self._api, "POST", namespaced_path("v1", namespace, "events"), body)

    def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        send(self._api, "PATCH", namespaced_path("v1", namespace, "events", name), body, content_type=MERGE_PATCH)
