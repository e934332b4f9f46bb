"""The node agent's adapter to the Kubernetes layer (:mod:`fastgshare_kube`): the only node-agent
module that reaches the API.

- :func:`load_api_client` (shared, :mod:`fastgshare_kube.client`): ``--kubeconfig``, else in-cluster
  config, else ``~/.kube/config``;
- :class:`NodePods`: a watch-fed cache of the pods bound to this node, kept by the layer's one
  list/watch loop (:class:`~fastgshare_kube.reflector.Reflector`: list, then watch from the list's
  resourceVersion; bookmarks move the version on; relist when the watch expires with 410 Gone), so
  Allocate reads memory rather than listing per call. Each pod is turned into a
  :class:`~device_plugin.allocation.NodePod` once, when it arrives, its assignment vetted there
  (:func:`~device_plugin.allocation.vetted`: the extender's signature, the pod's own share). A
  pod that had a trusted assignment keeps it when the annotation is rewritten with one the agent
  does not trust, and a Warning event on the pod says so (issue 42, row 2);
- :class:`KubeWriter`: the agent's writes: marking a pod allocated (one annotation, guarded by
  resourceVersion, retried on 409), publishing the node's GPU inventory (its own annotations),
  and Warning events on pods (a refused assignment, a container refused at
  :meth:`~device_plugin.servicer.DevicePluginServicer.PreStartContainer`, an SM partition MPS cannot
  apply), and Normal events on its Node (MPS started or stopped). It deletes no pod.

Pods are read as the API's JSON, not as client models; failures are the layer's
:class:`~fastgshare_kube.errors.ApiError`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from device_plugin.allocation import NodePod, vetted
from fastgshare import keys
from fastgshare.assignment_signature import AssignmentTrust
from fastgshare_kube import rest
from fastgshare_kube.access_reviews import kubernetes_metrics_access  # noqa: F401 - this adapter's API
from fastgshare_kube.client import ApiClient, KubeConfigError, load_api_client  # noqa: F401 - this adapter's API
from fastgshare_kube.errors import ApiError
from fastgshare_kube.events import NORMAL, WARNING, EventRecorder, EventSink
from fastgshare_kube.reflector import Reflector
from fastgshare_kube.rest import RawListWatch

log = logging.getLogger(__name__)

EVENT_COMPONENT = "fastgshare-node-agent"
REASON_ASSIGNMENT_REFUSED = "AssignmentRefused"
WATCH_TIMEOUT_S = 240
CONFLICT_RETRIES = 5
REQUEST_TIMEOUT = (5.0, 30.0)
NODE_EVENTS_NAMESPACE = "default"  # where events on cluster-scoped objects (a Node) live


def node_label(api: ApiClient, node_name: str, key: str) -> str | None:
    """The value of label ``key`` on node ``node_name``; None if the node or the label is not there
    (or the API cannot answer now)."""
    try:
        node = rest.call(rest.core_v1(api).read_node, node_name, timeout_s=REQUEST_TIMEOUT)
    except ApiError as error:
        log.warning("cannot read node=%s (%s)", node_name, error)
        return None
    labels: dict[str, str] = (node.get("metadata") or {}).get("labels") or {}
    return labels.get(key)


def missing_node(api: ApiClient, node_name: str, wait_s: float, *,
                 sleep: Callable[[float], None] = time.sleep) -> str | None:
    """Why ``node_name`` cannot be this agent's node (it is not in the cluster, even after waiting
    up to ``wait_s`` for the kubelet to register it), else ``None``. An API server that cannot
    answer now is not a reason: the agent's loops retry."""
    core = rest.core_v1(api)
    deadline = time.monotonic() + wait_s
    delay = 1.0
    while True:
        try:
            rest.call(core.read_node, node_name, timeout_s=REQUEST_TIMEOUT)
            return None
        except ApiError as error:
            if not error.not_found:
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


def pod_record(pod: Mapping[str, Any], trust: AssignmentTrust) -> NodePod:
    """The parts of a pod (the API's JSON) the node agent needs, its assignment vetted with ``trust``."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or []
    return vetted(NodePod(
        uid=str(metadata.get("uid") or ""),
        namespace=str(metadata.get("namespace") or ""),
        name=str(metadata.get("name") or ""),
        node_name=str(spec.get("nodeName") or ""),
        phase=str((pod.get("status") or {}).get("phase") or "Pending"),
        resource_version=str(metadata.get("resourceVersion") or ""),
        annotations={str(key): str(value) for key, value in (metadata.get("annotations") or {}).items()},
        gpu_containers=tuple(str(c.get("name")) for c in containers if _requests_vgpu(c)),
        deleting=metadata.get("deletionTimestamp") is not None,
        controller=next((f"{ref.get('kind')}/{ref.get('name')}" for ref in metadata.get("ownerReferences") or []
                         if ref.get("controller")), None),
    ), trust)


def pod_object(pod: NodePod) -> dict[str, Any]:
    """What an event names about the pod."""
    return {"metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid,
                         "resourceVersion": pod.resource_version}}


def keep_trusted(record: NodePod, known: NodePod | None) -> tuple[NodePod, str | None]:
    """``record``, keeping ``known``'s trusted assignment if the new one is not trusted (the agent
    enforces what it served, not what an annotation says later), and the Warning to report on the
    pod, if any: once per distinct refused assignment of a pod that requests the vGPU resource.
    A signed assignment older than the one served is not trusted either: the extender stamps every
    change of a pod's share later than the assignment it replaces, so an older one written back
    (a replay with the webhook down) is told apart."""
    if (record.assignment is not None and known is not None and known.assignment is not None
            and record.assignment.assigned_at_ms < known.assignment.assigned_at_ms):
        record = attrs.evolve(record, assignment=None, assignment_problem=(
            f"it was assigned at {record.assignment.assigned_at_ms} ms, before the assignment the node agent "
            f"serves ({known.assignment.assigned_at_ms} ms): an older assignment written back"))
    text = record.annotations.get(keys.POD_ASSIGNMENT_ANNOTATION)
    report = None
    if (record.assignment_problem is not None and record.gpu_containers
            and (known is None or known.annotations.get(keys.POD_ASSIGNMENT_ANNOTATION) != text)):
        report = f"fastgshare: the node agent does not serve this pod's {keys.POD_ASSIGNMENT_ANNOTATION}: " \
                 f"{record.assignment_problem}"
    if record.assignment is None and known is not None and known.assignment is not None:
        kept = known.assignment
        record = attrs.evolve(record, assignment=kept)
        if report is not None:
            report += (f"; it keeps GPU {kept.gpu_uuid} with {kept.share.describe()}, as the scheduler extender "
                       "assigned (share changes go through the share annotations)")
    return record, report


def _requests_vgpu(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    return any(keys.VGPU_RESOURCE in (resources.get(section) or {}) for section in ("limits", "requests"))


class NodePods:
    """Pods bound to one node, kept current by a background list-and-watch thread (the reflector's
    :class:`~fastgshare_kube.reflector.Sink`)."""

    def __init__(self, api: ApiClient, node_name: str, *, trust: AssignmentTrust,
                 report: Callable[[NodePod, str], None] | None = None, retry_delay_s: float = 1.0,
                 max_retry_delay_s: float = 30.0) -> None:
        self._node_name = node_name
        self._trust = trust
        self._report = report  # a Warning about a pod's refused assignment (called outside the lock)
        self._pods: dict[str, NodePod] = {}
        self._version = 0  # bumped on every change, for wait_for_change
        self._binds_seen = 0  # pods seen arriving on this node by the watch (their bound_seq)
        self._synced = False
        self._changed = threading.Condition()
        source = RawListWatch(rest.core_v1(api).list_pod_for_all_namespaces,
                              field_selector=f"spec.nodeName={node_name}")
        self._reflector = Reflector(f"pods-{node_name}", source, self, retry_delay_s=retry_delay_s,
                                    max_retry_delay_s=max_retry_delay_s, watch_timeout_s=WATCH_TIMEOUT_S)

    def start(self) -> None:
        self._reflector.start()

    def stop(self) -> None:
        self._reflector.stop()

    def wait_synced(self, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._synced, timeout=timeout_s)

    def snapshot(self) -> tuple[int, list[NodePod]]:
        """The change counter and the pods as of now."""
        with self._changed:
            return self._version, list(self._pods.values())

    def wait_for_change(self, seen_version: int, timeout_s: float) -> bool:
        """Block until the cache differs from ``seen_version`` (True) or the timeout passes."""
        with self._changed:
            return self._changed.wait_for(lambda: self._version != seen_version, timeout=timeout_s)

    def binds_seen(self) -> int:
        """How many pods the watch has seen arriving on this node; the next one gets this as its
        ``bound_seq``."""
        with self._changed:
            return self._binds_seen

    # --- the reflector's sink -------------------------------------------------------------------
    def replace(self, objects: list[dict[str, Any]]) -> None:
        """A (re)list: pods known before keep their place in the bind order; new ones have none
        (they may have arrived in any order while the watch was down)."""
        records = [pod_record(obj, self._trust) for obj in objects]
        reports = []
        with self._changed:
            pods = {}
            for record in records:
                kept, report = keep_trusted(record, self._pods.get(record.uid))
                pods[record.uid] = attrs.evolve(kept, bound_seq=self._bound_seq_of(record.uid))
                if report is not None:
                    reports.append((kept, report))
            self._pods = pods
            self._synced = True
            self._bump()
        for pod, report in reports:
            self._warn(pod, report)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        """A pod changed, or arrived: the field selector shows a pod when it is bound here, so a pod
        new to the cache takes the next place in the bind order."""
        record = pod_record(obj, self._trust)
        with self._changed:
            known = record.uid in self._pods
            seq = self._bound_seq_of(record.uid) if known else self._binds_seen
            if not known:
                self._binds_seen += 1
            record, report = keep_trusted(record, self._pods.get(record.uid))
            self._pods[record.uid] = attrs.evolve(record, bound_seq=seq)
            self._bump()
        if report is not None:
            self._warn(record, report)

    def _warn(self, pod: NodePod, message: str) -> None:
        log.warning("pod=%s %s", pod.key, message)
        if self._report is not None:
            self._report(pod, message)

    def _bound_seq_of(self, uid: str) -> int | None:
        known = self._pods.get(uid)
        return None if known is None else known.bound_seq

    def delete(self, obj: Mapping[str, Any]) -> None:
        uid = str((obj.get("metadata") or {}).get("uid") or "")
        with self._changed:
            self._pods.pop(uid, None)
            self._bump()

    def _bump(self) -> None:
        self._version += 1
        self._changed.notify_all()


class NodeEvents:
    """The :class:`~fastgshare_kube.events.EventSink` for events on a Node: a cluster-scoped
    object's events live in namespace ``default``, their ``involvedObject`` has no namespace, and
    its uid is the node's name, as the kubelet writes them (``kubectl describe node`` finds them so)."""

    def __init__(self, sink: EventSink) -> None:
        self._sink = sink

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        involved = {key: value for key, value in body["involvedObject"].items() if key != "namespace"}
        self._sink.create_event(NODE_EVENTS_NAMESPACE, {**body, "metadata": {**body["metadata"],
                                                                               "namespace": NODE_EVENTS_NAMESPACE},
                                                         "involvedObject": involved})

    def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self._sink.patch_event(NODE_EVENTS_NAMESPACE, name, body)


class KubeWriter:
    """The node agent's writes, each limited to the annotation it owns."""

    def __init__(self, api: ApiClient, *, sleep: Callable[[float], None] = time.sleep,
                 node_annotations: Mapping[str, str] | None = None, instance: str = "") -> None:
        self._api = api
        self._core = rest.core_v1(api)
        self._events = EventRecorder(rest.Events(api), component=EVENT_COMPONENT, instance=instance,
                                     api_version="v1", kind="Pod")
        self._node_events = EventRecorder(NodeEvents(rest.Events(api)), component=EVENT_COMPONENT, instance=instance,
                                          api_version="v1", kind="Node")
        self._sleep = sleep
        self._node_annotations = dict(node_annotations or {})  # published with the inventory

    def mark_allocated(self, pod: NodePod, value: str) -> bool:
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
                rest.send(self._api, "PATCH", rest.namespaced_path("v1", pod.namespace, "pods", pod.name), body,
                          content_type=rest.MERGE_PATCH)  # one write a pod: past the client's generated layer
                return True
            except ApiError as error:
                if error.not_found:
                    return False
                if not error.conflict:
                    raise
            current = self._read_pod(pod)
            metadata = (current or {}).get("metadata") or {}
            if current is None or metadata.get("uid") != pod.uid:
                return False
            if keys.POD_ALLOCATED_ANNOTATION in (metadata.get("annotations") or {}):
                return True
            resource_version = str(metadata.get("resourceVersion") or "")
            log.info("pod=%s conflict marking allocated, retrying attempt=%d", pod.key, attempt + 1)
            self._sleep(0.05 * (attempt + 1))
        log.warning("pod=%s could not be marked allocated after %d conflicts", pod.key, CONFLICT_RETRIES)
        return False

    def warn(self, pod: NodePod, reason: str, message: str) -> None:
        """A Warning event on ``pod`` in the background (kubelet may be waiting on the caller; the
        recorder logs a failed write and aggregates repeats)."""
        threading.Thread(target=self._events.event, args=(pod_object(pod), WARNING, reason, message),
                         name="pod-event", daemon=True).start()

    def node_event(self, node_name: str, reason: str, message: str) -> None:
        """A Normal event on node ``node_name`` (the recorder logs a failed write)."""
        self._node_events.event({"metadata": {"name": node_name, "uid": node_name}}, NORMAL, reason, message)

    def publish_inventory(self, node_name: str, payload: str) -> bool:
        """Write the node's inventory annotation (and the agent's other node annotations, such as
        its metrics port) if they differ; True if a write was made."""
        node = rest.call(self._core.read_node, node_name)
        wanted = {keys.NODE_GPU_INFO_ANNOTATION: payload, **self._node_annotations}
        current = (node.get("metadata") or {}).get("annotations") or {}
        if all(current.get(key) == value for key, value in wanted.items()):
            return False
        rest.call(self._core.patch_node, node_name, {"metadata": {"annotations": wanted}})
        return True

    def _read_pod(self, pod: NodePod) -> dict[str, Any] | None:
        try:
            return rest.call(self._core.read_namespaced_pod, pod.name, pod.namespace)
        except ApiError as error:
            if error.not_found:
                return None
            raise
