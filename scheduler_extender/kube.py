"""The extender's adapter to the Kubernetes layer (:mod:`fastgshare_kube`): the only extender module
that reaches the API.

- :func:`load_api_client` (shared): ``--kubeconfig``, else in-cluster config, else ``~/.kube/config``;
- :class:`ClusterWatch`: two :class:`~fastgshare_kube.reflector.Reflector` s (the layer's one
  list/watch loop) that list, then watch, nodes and pods and feed the
  :class:`~scheduler_extender.state.ClusterState`, turning the API's dicts into the extender's
  records. Objects are read as raw JSON, not as client models: a watch of every pod in a cluster
  must be cheap. A watch that expires (410 Gone) or fails is followed by a fresh list;
- :class:`KubeApi`: the reads and writes of bind (:class:`~scheduler_extender.ports.KubePort`:
  one Binding that also carries the assignment annotation),
  the layer's :class:`~fastgshare_kube.errors.ApiError` mapped onto the port's outcomes, and
  the events on pods.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

from fastgshare_kube import rest
from fastgshare_kube.access_reviews import kubernetes_metrics_access  # noqa: F401 - this adapter's API
from fastgshare_kube.client import ApiClient, KubeConfigError, load_api_client  # noqa: F401 - this adapter's API
from fastgshare_kube.errors import ApiError
from fastgshare_kube.reflector import Reflector
from fastgshare_kube.rest import RawListWatch
from scheduler_extender.ports import ApiConflict, ApiFailure, PodNotFound
from scheduler_extender.records import PodRecord, RecordError, node_from_json, pod_from_json
from scheduler_extender.state import ClusterState

log = logging.getLogger(__name__)
T = TypeVar("T")

WATCH_TIMEOUT_S = 300  # the server ends each watch after this; we resume from the last version
REQUEST_TIMEOUT = (5.0, 30.0)  # connect, read (seconds) for single calls
STORED_NODE_TIMEOUT = (1.0, 1.5)  # the webhook's read of a node, inside the API server's 3 s for the review


class _Nodes:
    """The node reflector's sink: node dicts into the state's node records."""

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self._state.replace_nodes(record for item in objects if (record := _read(node_from_json, item)) is not None)
        log.info("listed nodes count=%d", len(objects))

    def upsert(self, obj: Mapping[str, Any]) -> None:
        if (record := _read(node_from_json, obj)) is not None:
            self._state.upsert_node(record)

    def delete(self, obj: Mapping[str, Any]) -> None:
        if (record := _read(node_from_json, obj)) is not None:
            self._state.delete_node(record.name)


class PodFollower(Protocol):
    """Hears every pod after the state has (the live share changes)."""

    def notice(self, pod: PodRecord) -> None: ...

    def forget(self, pod: PodRecord) -> None: ...


class _Pods:
    """The pod reflector's list/watch and sink in one: each list starts with the state's relist
    token (:meth:`~scheduler_extender.state.ClusterState.begin_relist`), taken before the list is
    asked for, so binds made meanwhile survive the list that cannot know them yet. Every pod is
    then shown to the ``follower``, if any."""

    def __init__(self, state: ClusterState, source: RawListWatch, follower: PodFollower | None = None) -> None:
        self._state = state
        self._source = source
        self._token = 0
        self._follower = follower

    def list(self) -> tuple[list[dict[str, Any]], str]:
        self._token = self._state.begin_relist()
        return self._source.list()

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        return self._source.watch(resource_version, timeout_s)

    def close(self) -> None:
        self._source.close()

    def replace(self, objects: builtins.list[dict[str, Any]]) -> None:
        records = [record for item in objects if (record := _read(pod_from_json, item)) is not None]
        self._state.replace_pods(records, self._token)
        log.info("listed pods count=%d", len(objects))
        if self._follower is not None:
            for record in records:
                self._follower.notice(record)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        if (record := _read(pod_from_json, obj)) is not None:
            self._state.upsert_pod(record)
            if self._follower is not None:
                self._follower.notice(record)

    def delete(self, obj: Mapping[str, Any]) -> None:
        if (record := _read(pod_from_json, obj)) is not None:
            self._state.delete_pod(record)
            if self._follower is not None:
                self._follower.forget(record)


class ClusterWatch:
    """Keeps a :class:`ClusterState` current with the API server's nodes and pods."""

    def __init__(self, api: ApiClient, state: ClusterState, *, retry_delay_s: float = 1.0,
                 max_retry_delay_s: float = 30.0, follower: PodFollower | None = None) -> None:
        core = rest.core_v1(api)
        pods = _Pods(state, RawListWatch(core.list_pod_for_all_namespaces), follower)
        options: dict[str, Any] = {"retry_delay_s": retry_delay_s, "max_retry_delay_s": max_retry_delay_s,
                                   "watch_timeout_s": WATCH_TIMEOUT_S}
        self._reflectors = (Reflector("nodes", RawListWatch(core.list_node), _Nodes(state), **options),
                            Reflector("pods", pods, pods, **options))

    def start(self) -> None:
        for reflector in self._reflectors:
            reflector.start()

    def stop(self) -> None:
        for reflector in self._reflectors:
            reflector.stop()


def _read(reader: Callable[[object], T], raw: object) -> T | None:
    try:
        return reader(raw)
    except RecordError as error:
        log.warning("ignoring an object the API server sent: %s", error)
        return None


class KubeApi(rest.Events):
    """Bind's calls to the API server (see :class:`~scheduler_extender.ports.KubePort`), and the
    event writes (:class:`~fastgshare_kube.events.EventSink`) of the live share changes."""

    def __init__(self, api: ApiClient) -> None:
        super().__init__(api)
        self._core = rest.core_v1(api)

    def read_node(self, name: str) -> Mapping[str, object] | None:
        """The node as stored (for the webhook, see :mod:`scheduler_extender.admission`); None when it
        cannot be read."""
        try:  # within the webhook's own 3 s (timeoutSeconds in deploy/scheduler/webhook.yaml)
            return rest.call(self._core.read_node, name, timeout_s=STORED_NODE_TIMEOUT)
        except ApiError:
            return None

    def read_pod(self, namespace: str, name: str) -> PodRecord | None:
        try:
            body = self._call(lambda: rest.call(self._core.read_namespaced_pod, name, namespace,
                                                timeout_s=REQUEST_TIMEOUT))
        except PodNotFound:
            return None
        return pod_from_json(body)

    def patch_pod_annotation(self, pod: PodRecord, key: str, value: str | None) -> PodRecord:
        return self.patch_pod_annotations(pod, {key: value})

    def patch_pod_annotations(self, pod: PodRecord, annotations: Mapping[str, str | None]) -> PodRecord:
        body = {"metadata": {"resourceVersion": pod.resource_version, "annotations": dict(annotations)}}
        return pod_from_json(self._call(lambda: rest.call(self._core.patch_namespaced_pod, pod.name, pod.namespace,
                                                          body, timeout_s=REQUEST_TIMEOUT)))

    def create_binding(self, pod: PodRecord, node: str, annotations: Mapping[str, str] | None = None) -> None:
        metadata: dict[str, Any] = {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid}
        if pod.resource_version:
            metadata["resourceVersion"] = pod.resource_version  # a precondition from 1.23 on, ignored before
        if annotations:
            metadata["annotations"] = dict(annotations)
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        # A body of our own making, sent past the client's generated layer (its argument check alone
        # was ~5 % of the extender's CPU in a profile under bench.scheduling_throughput); the API
        # server validates it.
        path = rest.namespaced_path("v1", pod.namespace, "pods", pod.name, "binding")
        self._call(lambda: rest.send(self._api, "POST", path, body, timeout_s=REQUEST_TIMEOUT))

    def _call(self, request: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """Make one request; map failures onto the port's exceptions."""
        try:
            return request()
        except ApiError as error:
            message = error.message or error.reason
            if error.unreachable:
                raise ApiFailure(f"API server unreachable: {message}", error.status) from None
            if error.not_found:
                raise PodNotFound(message) from None
            if error.conflict:
                raise ApiConflict(message) from None
            raise ApiFailure(f"HTTP {error.status}: {message}", error.status) from None
