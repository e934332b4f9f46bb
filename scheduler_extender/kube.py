"""The extender's adapter to the Kubernetes API: the only module that imports ``kubernetes``.

- :func:`load_api_client`: ``--kubeconfig``, else in-cluster config, else ``~/.kube/config``;
- :class:`ClusterWatch`: two threads that list, then watch, nodes and pods and feed the
  :class:`~scheduler_extender.state.ClusterState`. Objects are read as raw JSON, not as client
  models: a watch of every pod in a cluster must be cheap. A watch that expires (410 Gone) or
  fails is followed by a fresh list;
- :class:`KubeApi`: the reads and writes of bind (:class:`~scheduler_extender.ports.KubePort`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import urllib3
from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from fastgshare_kube.client import KubeConfigError, load_api_client  # noqa: F401 - this adapter's API
from scheduler_extender.ports import ApiConflict, ApiFailure, PodNotFound
from scheduler_extender.records import PodRecord, RecordError, node_from_json, pod_from_json
from scheduler_extender.state import ClusterState

log = logging.getLogger(__name__)
T = TypeVar("T")

WATCH_TIMEOUT_S = 300  # the server ends each watch after this; we resume from the last version
LIST_PAGE = 500
REQUEST_TIMEOUT = (5.0, 30.0)  # connect, read (seconds) for single calls


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


class ResourceWatch:
    """List-then-watch of one kind, calling ``on_list(items, token)`` and ``on_event(type, object)``."""

    def __init__(self, kind: str, lister: Callable[..., Any], *, begin: Callable[[], int],
                 on_list: Callable[[list[Any], int], None], on_event: Callable[[str, Any], None],
                 stop: threading.Event, retry_delay_s: float) -> None:
        self.kind = kind
        self._lister = lister
        self._begin = begin
        self._on_list = on_list
        self._on_event = on_event
        self._stop = stop
        self._retry_delay_s = retry_delay_s
        self._response: Any = None
        self.thread = threading.Thread(target=self._run, name=f"watch-{kind}", daemon=True)

    def interrupt(self) -> None:
        """Unblock a watch waiting for the next event (used when stopping)."""
        response = self._response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._relist()
                while not self._stop.is_set():
                    version = self._watch(version)
                return
            except _Gone:
                log.info("%s watch expired (410 Gone), listing again", self.kind)
                continue
            except ApiException as error:
                log.warning("%s list/watch failed status=%s reason=%s", self.kind, error.status, error.reason)
            except Exception as error:  # a dropped connection must not end the cache
                if self._stop.is_set():
                    return
                log.warning("%s list/watch failed error=%s: %s", self.kind, type(error).__name__, error)
            self._stop.wait(self._retry_delay_s)

    def _relist(self) -> str:
        token = self._begin()
        items: list[Any] = []
        page_token: str | None = None
        while True:
            response = self._lister(limit=LIST_PAGE, _continue=page_token, _preload_content=False,
                                    _request_timeout=REQUEST_TIMEOUT)
            body = json.loads(response.data)
            items.extend(body.get("items") or [])
            page_token = body["metadata"].get("continue")
            if not page_token:
                break
        self._on_list(items, token)
        log.info("listed %s count=%d", self.kind, len(items))
        return str(body["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str:
        response = self._lister(watch=True, resource_version=version, allow_watch_bookmarks=True,
                                timeout_seconds=WATCH_TIMEOUT_S, _preload_content=False,
                                _request_timeout=(REQUEST_TIMEOUT[0], WATCH_TIMEOUT_S + 30))
        self._response = response
        try:
            for line in iter_resp_lines(response):
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone
                    raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                version = obj.get("metadata", {}).get("resourceVersion") or version
                if kind != "BOOKMARK":
                    self._on_event(kind, obj)
                if self._stop.is_set():
                    break
        finally:
            self._response = None
            response.release_conn()
        return version


class ClusterWatch:
    """Keeps a :class:`ClusterState` current with the API server's nodes and pods."""

    def __init__(self, api: client.ApiClient, state: ClusterState, *, retry_delay_s: float = 1.0) -> None:
        core = client.CoreV1Api(api)
        self._state = state
        self._stop = threading.Event()
        self._watches = (
            ResourceWatch("nodes", core.list_node, begin=lambda: 0, on_list=self._list_nodes,
                           on_event=self._node_event, stop=self._stop, retry_delay_s=retry_delay_s),
            ResourceWatch("pods", core.list_pod_for_all_namespaces, begin=state.begin_relist,
                           on_list=self._list_pods, on_event=self._pod_event, stop=self._stop,
                           retry_delay_s=retry_delay_s),
        )

    def start(self) -> None:
        for resource in self._watches:
            resource.thread.start()

    def stop(self) -> None:
        self._stop.set()
        for resource in self._watches:
            resource.interrupt()
        for resource in self._watches:
            resource.thread.join(timeout=5)

    def _list_nodes(self, items: list[Any], _token: int) -> None:
        self._state.replace_nodes(record for item in items if (record := _read(node_from_json, item)) is not None)

    def _node_event(self, kind: str, obj: Any) -> None:
        record = _read(node_from_json, obj)
        if record is None:
            return
        if kind == "DELETED":
            self._state.delete_node(record.name)
        else:
            self._state.upsert_node(record)

    def _list_pods(self, items: list[Any], token: int) -> None:
        self._state.replace_pods((record for item in items if (record := _read(pod_from_json, item)) is not None),
                                 token)

    def _pod_event(self, kind: str, obj: Any) -> None:
        record = _read(pod_from_json, obj)
        if record is None:
            return
        if kind == "DELETED":
            self._state.delete_pod(record)
        else:
            self._state.upsert_pod(record)


def _read(reader: Callable[[object], T], raw: object) -> T | None:
    try:
        return reader(raw)
    except RecordError as error:
        log.warning("ignoring an object the API server sent: %s", error)
        return None


class KubeApi:
    """Bind's calls to the API server (see :class:`~scheduler_extender.ports.KubePort`)."""

    def __init__(self, api: client.ApiClient) -> None:
        self._core = client.CoreV1Api(api)

    def read_pod(self, namespace: str, name: str) -> PodRecord | None:
        try:
            response = self._call(self._core.read_namespaced_pod, name, namespace)
        except PodNotFound:
            return None
        return pod_from_json(json.loads(response.data))

    def patch_pod_annotation(self, pod: PodRecord, key: str, value: str | None) -> PodRecord:
        body = {"metadata": {"resourceVersion": pod.resource_version, "annotations": {key: value}}}
        response = self._call(self._core.patch_namespaced_pod, pod.name, pod.namespace, body)
        return pod_from_json(json.loads(response.data))

    def create_binding(self, pod: PodRecord, node: str) -> None:
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        self._call(self._core.create_namespaced_binding, pod.namespace, body)

    def _call(self, method: Callable[..., Any], *args: Any) -> Any:
        """Call without the client's model decoding; map failures onto the port's exceptions."""
        try:
            return method(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as error:
            message = _server_message(error)
            if error.status == 404:
                raise PodNotFound(message) from None
            if error.status == 409:
                raise ApiConflict(message) from None
            raise ApiFailure(f"HTTP {error.status}: {message}") from None
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise ApiFailure(f"API server unreachable: {error}") from None


def _server_message(error: ApiException) -> str:
    """The ``message`` of the server's Status body, else the HTTP reason."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return str(json.loads(error.body or "")["message"])
    return str(error.reason)
