"""What ``fastgshare inspect`` reads, all through the API server so it works from a laptop with a
kubeconfig: the nodes' GPU inventories (``fastgshare/gpu_info``), the pods' assignments
(``fastgshare/assignment``) and each node agent's ``/metrics`` through the API server's node proxy
(``/api/v1/nodes/<node>:<port>/proxy/metrics``, the port from the node's ``fastgshare/metrics_port``).

The inspect command's only adapter to Kubernetes; the metrics are parsed with prometheus-client's
text parser. Nodes are scraped in parallel, each with a timeout; a node whose agent does not answer
is shown with the reason, never fails the whole view.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import attrs
import kubernetes.client
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families
from urllib3.exceptions import HTTPError

from fastgshare import keys
from fastgshare.codec import decode_assignment, decode_node_inventory
from fastgshare.errors import CodecError, FastGShareError
from fastgshare_cli.inspection import GpuSample, NodeFacts, NodeSamples, PodFacts, PodSample

SCRAPE_TIMEOUT_S = 5.0
FINISHED_PHASES = ("Succeeded", "Failed")


class ReadError(Exception):
    """The API server refused or failed a read the view cannot do without; the message says which."""


@attrs.frozen(kw_only=True)
class ClusterFacts:
    nodes: list[NodeFacts]
    pods: list[PodFacts]
    samples: dict[str, NodeSamples]


def read_cluster(api: kubernetes.client.ApiClient, *, node: str | None = None) -> ClusterFacts:
    """Every GPU node (or only ``node``), every unfinished pod assigned to one, and each node's metrics."""
    core = kubernetes.client.CoreV1Api(api)
    try:
        nodes = _nodes(core, node)
        pods = _pods(core, node)
    except (HTTPError, OSError) as error:
        raise ReadError(f"cannot reach the API server at {api.configuration.host}: {_cause(error)}") from None
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(nodes)))) as pool:
        scraped = dict(zip((entry.name for entry, _ in nodes), pool.map(lambda n: _scrape(core, n), nodes),
                           strict=True))
    facts = [attrs.evolve(entry, metrics_error=scraped[entry.name][1]) for entry, _ in nodes]
    return ClusterFacts(nodes=facts, pods=pods, samples={name: found[0] for name, found in scraped.items()})


def _nodes(core: kubernetes.client.CoreV1Api, only: str | None) -> list[tuple[NodeFacts, int]]:
    """(facts, metrics port) of every node with a GPU inventory, or of ``only`` whatever it has."""
    try:
        listed = [core.read_node(only)] if only is not None else core.list_node().items
    except ApiException as error:
        if only is not None and error.status == 404:
            raise ReadError(f"--node {only}: no such node") from None
        raise ReadError(f"cannot read nodes: {_api_reason(error)}") from None
    found = []
    for item in listed:
        annotations = (item.metadata.annotations or {}) if item.metadata else {}
        name = str(item.metadata.name) if item.metadata else "?"
        text = annotations.get(keys.NODE_GPU_INFO_ANNOTATION)
        if text is None and only is None:
            continue  # not a GPU node
        port = _port(annotations.get(keys.NODE_METRICS_PORT_ANNOTATION))
        if text is None:
            found.append((NodeFacts(name=name, inventory=None, problem=f"no {keys.NODE_GPU_INFO_ANNOTATION}: "
                                    "no fastgshare node agent runs here"), port))
            continue
        try:
            found.append((NodeFacts(name=name, inventory=decode_node_inventory(text)), port))
        except FastGShareError as error:
            found.append((NodeFacts(name=name, inventory=None, problem=f"unreadable {keys.NODE_GPU_INFO_ANNOTATION}: "
                                    f"{error}"), port))
    return found


def _port(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() and 0 < int(text) < 65536 \
        else keys.DEFAULT_NODE_METRICS_PORT


def _pods(core: kubernetes.client.CoreV1Api, node: str | None) -> list[PodFacts]:
    """Unfinished pods with an assignment, in every namespace: each GPU's free area needs all of them."""
    selector = f"spec.nodeName={node}" if node else ""
    try:
        listed = core.list_pod_for_all_namespaces(field_selector=selector).items
    except ApiException as error:
        raise ReadError(f"cannot list pods in all namespaces (each GPU's free area needs them): "
                        f"{_api_reason(error)}") from None
    found = []
    for pod in listed:
        meta, status = pod.metadata, pod.status
        text = ((meta.annotations or {}) if meta else {}).get(keys.POD_ASSIGNMENT_ANNOTATION)
        phase = str(status.phase) if status is not None and status.phase else "Pending"
        if meta is None or text is None or phase in FINISHED_PHASES:
            continue
        try:
            assignment = decode_assignment(text)
        except CodecError:
            continue  # the extender never wrote it; `fastgshare check` explains such pods
        found.append(PodFacts(namespace=str(meta.namespace), name=str(meta.name), phase=phase,
                              assignment=assignment))
    return found


def _scrape(core: kubernetes.client.CoreV1Api, node: tuple[NodeFacts, int]) -> tuple[NodeSamples, str]:
    facts, port = node
    if facts.inventory is None:
        return NodeSamples(), ""
    try:
        text = core.connect_get_node_proxy_with_path(f"{facts.name}:{port}", "metrics",
                                                     _request_timeout=SCRAPE_TIMEOUT_S)
    except ApiException as error:
        return NodeSamples(), f"the node agent's metrics on port {port}: {_api_reason(error)}"
    except (HTTPError, OSError) as error:
        return NodeSamples(), f"the node agent's metrics on port {port}: {error}"
    try:
        return parse_node_metrics(str(text)), ""
    except ValueError as error:
        return NodeSamples(), f"the node agent's metrics on port {port} do not parse: {error}"


def parse_node_metrics(text: str) -> NodeSamples:
    """A node agent's exposition as per-pod and per-GPU samples."""
    pods: dict[tuple[str, str], dict[str, float]] = {}
    gpus: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if "pod" in labels and "gpu" in labels:
                key = (f"{labels.get('namespace', '')}/{labels['pod']}", labels["gpu"])
                pods.setdefault(key, {})[sample.name] = sample.value
            elif "gpu" in labels and sample.name.startswith("fastgshare_gpu_"):
                gpus.setdefault(labels["gpu"], {})[sample.name] = sample.value
    return NodeSamples(
        pods={key: PodSample(
            share=values.get("fastgshare_pod_gpu_time_share"),
            memory_used_bytes=_int(values.get("fastgshare_pod_gpu_memory_used_bytes")),
            throttled_seconds_total=values.get("fastgshare_pod_gpu_throttled_seconds_total"),
            wait_seconds_total=values.get("fastgshare_pod_gpu_token_wait_seconds_sum"),
            waits=_int(values.get("fastgshare_pod_gpu_token_wait_seconds_count")),
        ) for key, values in pods.items()},
        gpus={uuid: GpuSample(
            busy_share=values.get("fastgshare_gpu_time_busy_share"),
            healthy=None if "fastgshare_gpu_healthy" not in values else values["fastgshare_gpu_healthy"] >= 1,
            memory_allocated_bytes=_int(values.get("fastgshare_gpu_memory_allocated_bytes")),
        ) for uuid, values in gpus.items()})


def _cause(error: Exception) -> str:
    """The innermost reason of a urllib3 error (MaxRetryError wraps the refused connection)."""
    reason = getattr(error, "reason", None)
    return str(reason) if reason is not None else str(error)


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _api_reason(error: ApiException) -> str:
    reason = f"{error.status} {error.reason}"
    if error.status == 403:
        return f"{reason}: this account may not; it needs get/list on nodes and pods and get on nodes/proxy"
    return reason
