"""The node agent's adapter to the Kubernetes API: the only module that imports ``kubernetes``.

- :func:`load_api_client` (shared, :mod:`fastgshare_kube.client`): ``--kubeconfig``, else in-cluster
  config, else ``~/.kube/config``;
- :class:`NodePods`: a watch-fed cache of the pods bound to this node (list, then watch from
  the list's resourceVersion; relist when the watch expires with 410 Gone), so Allocate reads
  memory rather than listing per call;
- :class:`KubeWriter`: the two writes the agent makes, each touching only its own annotation:
  marking a pod allocated (guarded by resourceVersion, retried on 409) and publishing the
  node's GPU inventory.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from device_plugin.allocation import PodRecord
from fastgshare import keys
from fastgshare_kube.client import KubeConfigError, load_api_client  # noqa: F401 - this adapter's API

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 240
CONFLICT_RETRIES = 5


def missing_node(api: client.ApiClient, node_name: str, wait_s: float, *,
                 sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Why ``node_name`` cannot be this agent's node (it is not in the cluster, even after waiting
    up to ``wait_s`` for the kubelet to register it), else ``None``. An API server that cannot
    answer now is not a reason: the agent's loops retry."""
    deadline = time.monotonic() + wait_s
    delay = 1.0
    while True:
        try:
            client.CoreV1Api(api).read_node(node_name, _request_timeout=(5, 30))
            return None
        except ApiException as error:
            if error.status != 404:
                log.warning("cannot check node=%s now (status=%s %s); going on", node_name, error.status,
                            error.reason)
                return None
        except Exception as error:  # unreachable: the loops retry
            log.warning("cannot check node=%s now (%s); going on", node_name, error)
            return None
        problem = (f"node {node_name!r} is not in the cluster: --node-name (or $NODE_NAME) must be this machine's "
                   "Kubernetes node name (kubectl get nodes; the DaemonSet passes spec.nodeName)")
        left = deadline - time.monotonic()
        if left <= 0:
            return problem
        log.warning("%s; waiting for the kubelet to register it, %.0fs left", problem, left)
        sleep(min(delay, left))
        delay = min(delay * 2, 10.0)


def pod_record(pod: Any) -> PodRecord:
    """The parts of a ``V1Pod`` the node agent needs."""
    containers = pod.spec.containers or []
    gpu_containers = tuple(c.name for c in containers if _requests_vgpu(c))
    return PodRecord(
        uid=pod.metadata.uid,
        namespace=pod.metadata.namespace,
        name=pod.metadata.name,
        node_name=pod.spec.node_name or "",
        phase=(pod.status.phase if pod.status else None) or "Pending",
        resource_version=pod.metadata.resource_version,
        annotations=dict(pod.metadata.annotations or {}),
        gpu_containers=gpu_containers,
        deleting=pod.metadata.deletion_timestamp is not None,
    )


def _requests_vgpu(container: Any) -> bool:
    resources = container.resources
    if resources is None:
        return False
    return any(keys.VGPU_RESOURCE in (section or {}) for section in (resources.limits, resources.requests))


class NodePods:
    """Pods bound to one node, kept current by a background list-and-watch thread."""

    def __init__(self, api: client.ApiClient, node_name: str, *, retry_delay_s: float = 1.0) -> None:
        self._core = client.CoreV1Api(api)
        self._node_name = node_name
        self._retry_delay_s = retry_delay_s
        self._pods: dict[str, PodRecord] = {}
        self._version = 0  # bumped on every change, for wait_for_change
        self._synced = False
        self._changed = threading.Condition()
        self._stop = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"pods-{node_name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(timeout=5)

    def wait_synced(self, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._synced, timeout=timeout_s)

    def snapshot(self) -> tuple[int, list[PodRecord]]:
        """The change counter and the pods as of now."""
        with self._changed:
            return self._version, list(self._pods.values())

    def wait_for_change(self, seen_version: int, timeout_s: float) -> bool:
        """Block until the cache differs from ``seen_version`` (True) or the timeout passes."""
        with self._changed:
            return self._changed.wait_for(lambda: self._version != seen_version, timeout=timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                resource_version = self._relist()
                while not self._stop.is_set():
                    resource_version = self._watch_from(resource_version)
            except ApiException as error:
                if error.status == 410:
                    log.info("pod watch expired (410 Gone), relisting node=%s", self._node_name)
                    continue
                log.warning("pod watch failed node=%s status=%s reason=%s", self._node_name, error.status,
                            error.reason)
            except Exception as error:  # a dropped connection must not end the cache
                if self._stop.is_set():
                    return
                log.warning("pod watch failed node=%s error=%s", self._node_name, error)
            self._stop.wait(self._retry_delay_s)

    def _selector(self) -> str:
        return f"spec.nodeName={self._node_name}"

    def _relist(self) -> str:
        listing: Any = self._core.list_pod_for_all_namespaces(field_selector=self._selector())
        with self._changed:
            self._pods = {pod.metadata.uid: pod_record(pod) for pod in listing.items}
            self._synced = True
            self._bump()
        return str(listing.metadata.resource_version)

    def _watch_from(self, resource_version: str) -> str:
        self._watch = watch.Watch()
        for event in self._watch.stream(self._core.list_pod_for_all_namespaces, field_selector=self._selector(),
                                        resource_version=resource_version, timeout_seconds=WATCH_TIMEOUT_S,
                                        allow_watch_bookmarks=True):
            kind = event["type"]
            # Read the version from the raw JSON: a BOOKMARK's object stays a dict (only its
            # resourceVersion is set), and it only moves the next watch's starting point on.
            raw_metadata = (event.get("raw_object") or {}).get("metadata") or {}
            resource_version = str(raw_metadata.get("resourceVersion") or resource_version)
            if kind == "BOOKMARK":
                continue
            record = pod_record(event["object"])
            with self._changed:
                if kind == "DELETED":
                    self._pods.pop(record.uid, None)
                else:
                    self._pods[record.uid] = record
                self._bump()
            if self._stop.is_set():
                break
        return resource_version

    def _bump(self) -> None:
        self._version += 1
        self._changed.notify_all()


class KubeWriter:
    """The node agent's writes, each limited to the annotation it owns."""

    def __init__(self, api: client.ApiClient, *, sleep: Callable[[float], None] = time.sleep,
                 node_annotations: Mapping[str, str] | None = None) -> None:
        self._core = client.CoreV1Api(api)
        self._sleep = sleep
        self._node_annotations = dict(node_annotations or {})  # published with the inventory

    def mark_allocated(self, pod: PodRecord, value: str) -> bool:
        """Set the allocated annotation if the pod is still the one we served.

        The patch carries the pod's resourceVersion, so a concurrent change makes it fail with
        409; then the pod is re-read and the patch retried. False if the pod is gone or was
        replaced (another uid) meanwhile.
        """
        resource_version = pod.resource_version
        for attempt in range(CONFLICT_RETRIES):
            body = {"metadata": {"resourceVersion": resource_version,
                                 "annotations": {keys.POD_ALLOCATED_ANNOTATION: value}}}
            try:
                self._core.patch_namespaced_pod(pod.name, pod.namespace, body)
                return True
            except ApiException as error:
                if error.status == 404:
                    return False
                if error.status != 409:
                    raise
            current = self._read_pod(pod)
            if current is None or current.metadata.uid != pod.uid:
                return False
            if keys.POD_ALLOCATED_ANNOTATION in (current.metadata.annotations or {}):
                return True
            resource_version = current.metadata.resource_version
            log.info("pod=%s conflict marking allocated, retrying attempt=%d", pod.key, attempt + 1)
            self._sleep(0.05 * (attempt + 1))
        log.warning("pod=%s could not be marked allocated after %d conflicts", pod.key, CONFLICT_RETRIES)
        return False

    def publish_inventory(self, node_name: str, payload: str) -> bool:
        """Write the node's inventory annotation (and the agent's other node annotations, such as
        its metrics port) if they differ; True if a write was made."""
        node: Any = self._core.read_node(node_name)
        wanted = {keys.NODE_GPU_INFO_ANNOTATION: payload, **self._node_annotations}
        current = node.metadata.annotations or {}
        if all(current.get(key) == value for key, value in wanted.items()):
            return False
        self._core.patch_node(node_name, {"metadata": {"annotations": wanted}})
        return True

    def _read_pod(self, pod: PodRecord) -> Any:
        try:
            return self._core.read_namespaced_pod(pod.name, pod.namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
