"""What ``fastgshare inspect`` reads, all through the API server so it works from a laptop with a
kubeconfig: the nodes' GPU inventories (``fastgshare/gpu_info``), the pods' assignments
(``fastgshare/assignment``) and each node agent's ``/metrics`` through the API server, on the port
from the node's ``fastgshare/metrics_port``: where the agent runs as a pod (the DaemonSet, which has
no hostPort: its metrics are on the pod's own address only) through the pod proxy
(``/api/v1/namespaces/<ns>/pods/<pod>:<port>/proxy/metrics``), else (an agent run as a host process,
``fastgshare cluster up``) through the node proxy (``/api/v1/nodes/<node>:<port>/proxy/metrics``).

The agents serve ``/metrics`` only to a bearer token the API server authenticates and allows
``get`` on that URL (:mod:`fastgshare_kube.metrics_access`). The API server drops the caller's own
``Authorization`` header before it proxies, so :class:`MetricsCredentials` sends a token in
:data:`~fastgshare.keys.METRICS_TOKEN_HEADER`: the kubeconfig's own bearer token where it has one
(the agent then asks about the caller), else a 10-minute token of the ServiceAccount
``fastgshare-system/fastgshare-metrics-reader`` from the TokenRequest API (which needs ``create`` on
``serviceaccounts/token`` there: cluster admins have it).

The inspect command's only adapter to Kubernetes; the metrics are parsed with prometheus-client's
text parser. Nodes are scraped in parallel, each with a timeout; a node whose agent does not answer
is shown with the reason, never fails the whole view.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
from prometheus_client.parser import text_string_to_metric_families

from fastgshare import keys
from fastgshare.codec import decode_assignment, decode_node_inventory
from fastgshare.errors import CodecError, FastGShareError
from fastgshare.model import pod_model
from fastgshare_cli.inspection import GpuSample, NodeFacts, NodeSamples, PodFacts, PodSample
from fastgshare_kube import rest
from fastgshare_kube.errors import UNREACHABLE, ApiError
from fastgshare_kube.metrics_access import DENIAL_PREFIX

SCRAPE_TIMEOUT_S = 5.0
AGENT_POD_SELECTOR = "app.kubernetes.io/name=fastgshare-node-agent"  # deploy/node-agent/daemonset.yaml
FINISHED_PHASES = ("Succeeded", "Failed")


TOKEN_SECONDS = 600  # the shortest token the TokenRequest API gives
TOKEN_RENEW_S = 480  # renewed this long after it was issued


class ReadError(Exception):
    """The API server refused or failed a read the view cannot do without; the message says which."""


class MetricsCredentials:
    """The token shown to the node agents (see the module), kept while it is fresh."""

    def __init__(self, api: rest.ApiClient, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._api = api
        self._clock = clock
        self._lock = threading.Lock()
        self._token: str | None = None
        self._issued = 0.0
        self._problem = ""

    def headers(self) -> tuple[dict[str, str], str]:
        """(the headers to send, why there is no token: empty when there is one)."""
        with self._lock:
            own = own_bearer_token(self._api)
            if own is not None:
                return {keys.METRICS_TOKEN_HEADER: f"Bearer {own}"}, ""
            if self._token is None or self._clock() - self._issued >= TOKEN_RENEW_S:
                self._token, self._problem = self._request()
                self._issued = self._clock()
            if self._token is None:
                return {}, self._problem
            return {keys.METRICS_TOKEN_HEADER: f"Bearer {self._token}"}, ""

    def _request(self) -> tuple[str | None, str]:
        account = f"{keys.SYSTEM_NAMESPACE}/{keys.METRICS_READER_SERVICE_ACCOUNT}"
        try:
            answer = rest.send(self._api, "POST", f"/api/v1/namespaces/{keys.SYSTEM_NAMESPACE}/serviceaccounts/"
                               f"{keys.METRICS_READER_SERVICE_ACCOUNT}/token",
                               {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                "spec": {"expirationSeconds": TOKEN_SECONDS}})
        except ApiError as error:
            if error.status == 404:
                return None, (f"no ServiceAccount {account} to read the metrics as "
                              "(kubectl apply -f deploy/monitoring/metrics-reader.yaml)")
            if error.status == 403:
                return None, (f"your kubeconfig has no bearer token and this account may not create a token for "
                              f"{account} (create on serviceaccounts/token there)")
            return None, f"cannot get a token for {account}: {_api_reason(error)}"
        token = str((answer.get("status") or {}).get("token") or "")
        return (token, "") if token else (None, f"the TokenRequest for {account} gave no token")


def own_bearer_token(api: rest.ApiClient) -> str | None:
    """The bearer token this client authenticates with (a token kubeconfig), None for certificates."""
    for setting in api.configuration.auth_settings().values():
        value = str(setting.get("value") or "")
        if setting.get("in") == "header" and setting.get("key", "").lower() == "authorization" \
                and value.lower().startswith("bearer "):
            return value[len("bearer "):].strip() or None
    return None


@attrs.frozen(kw_only=True)
class ClusterFacts:
    nodes: list[NodeFacts]
    pods: list[PodFacts]
    samples: dict[str, NodeSamples]


def read_cluster(api: rest.ApiClient, *, node: str | None = None,
                 credentials: MetricsCredentials | None = None) -> ClusterFacts:
    """Every GPU node (or only ``node``), every unfinished pod assigned to one, and each node's metrics
    (read with ``credentials``; pass the same object again to keep its token)."""
    core = rest.core_v1(api)
    credentials = credentials or MetricsCredentials(api)
    try:
        nodes = _nodes(core, node)
        pods = _pods(core, node)
    except ApiError as error:
        if error.status == UNREACHABLE:
            raise ReadError(f"cannot reach the API server at {api.configuration.host}: {error.message}") from None
        raise
    agents = _agent_pods(core)
    headers, no_token = credentials.headers() if any(entry.inventory is not None for entry, _ in nodes) else ({}, "")
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(nodes)))) as pool:
        scraped = dict(zip((entry.name for entry, _ in nodes),
                           pool.map(lambda n: _scrape(core, n, agents.get(n[0].name), headers, no_token), nodes),
                           strict=True))
    facts = [attrs.evolve(entry, metrics_error=scraped[entry.name][1]) for entry, _ in nodes]
    return ClusterFacts(nodes=facts, pods=pods, samples={name: found[0] for name, found in scraped.items()})


def _nodes(core: Any, only: str | None) -> list[tuple[NodeFacts, int]]:
    """(facts, metrics port) of every node with a GPU inventory, or of ``only`` whatever it has."""
    try:
        listed = [rest.call(core.read_node, only)] if only is not None else rest.call(core.list_node)["items"]
    except ApiError as error:
        if only is not None and error.status == 404:
            raise ReadError(f"--node {only}: no such node") from None
        if error.status == UNREACHABLE:
            raise
        raise ReadError(f"cannot read nodes: {_api_reason(error)}") from None
    found = []
    for item in listed:
        metadata = item.get("metadata") or {}
        annotations = metadata.get("annotations") or {}
        name = str(metadata.get("name", "?"))
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


def _pods(core: Any, node: str | None) -> list[PodFacts]:
    """Unfinished pods with an assignment, in every namespace: each GPU's free area needs all of them."""
    selector = f"spec.nodeName={node}" if node else ""
    try:
        listed = rest.call(core.list_pod_for_all_namespaces, field_selector=selector)["items"]
    except ApiError as error:
        if error.status == UNREACHABLE:
            raise
        raise ReadError(f"cannot list pods in all namespaces (each GPU's free area needs them): "
                        f"{_api_reason(error)}") from None
    found = []
    for pod in listed:
        metadata = pod.get("metadata") or {}
        text = (metadata.get("annotations") or {}).get(keys.POD_ASSIGNMENT_ANNOTATION)
        phase = str((pod.get("status") or {}).get("phase") or "Pending")
        if text is None or phase in FINISHED_PHASES:
            continue
        try:
            assignment = decode_assignment(text)
        except CodecError:
            continue  # the extender never wrote it; `fastgshare check` explains such pods
        namespace = str(metadata.get("namespace"))
        found.append(PodFacts(namespace=namespace, name=str(metadata.get("name")), phase=phase,
                              assignment=assignment, model=pod_model(metadata.get("annotations") or {}, namespace)))
    return found


def _agent_pods(core: Any) -> dict[str, tuple[str, str]]:
    """node -> (namespace, name) of the running node agent pod there; empty where none can be listed
    (agents run as host processes, or this account may not list them: the node proxy is tried)."""
    try:
        listed = rest.call(core.list_pod_for_all_namespaces, label_selector=AGENT_POD_SELECTOR)["items"]
    except ApiError:
        return {}
    found = {}
    for pod in listed:
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        if (pod.get("status") or {}).get("phase") == "Running" and spec.get("nodeName"):
            found[str(spec["nodeName"])] = (str(metadata.get("namespace")), str(metadata.get("name")))
    return found


def _scrape(core: Any, node: tuple[NodeFacts, int], agent_pod: tuple[str, str] | None,
            headers: dict[str, str], no_token: str) -> tuple[NodeSamples, str]:
    facts, port = node
    if facts.inventory is None:
        return NodeSamples(), ""
    try:
        if agent_pod is not None:
            namespace, pod = agent_pod
            text = rest.call_text(core.connect_get_namespaced_pod_proxy_with_path, f"{pod}:{port}", namespace,
                                  "metrics", timeout_s=SCRAPE_TIMEOUT_S, _headers=headers)
        else:
            text = rest.call_text(core.connect_get_node_proxy_with_path, f"{facts.name}:{port}", "metrics",
                                  timeout_s=SCRAPE_TIMEOUT_S, _headers=headers)
    except ApiError as error:
        if error.message.startswith(DENIAL_PREFIX):
            refusal = error.message.removeprefix(DENIAL_PREFIX).strip()
            return NodeSamples(), (f"the node agent refused its metrics: {refusal}"
                                   + (f"; {no_token}" if no_token else ""))
        return NodeSamples(), f"the node agent's metrics on port {port}: {_api_reason(error)}"
    try:
        return parse_node_metrics(text), ""
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


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)


def _api_reason(error: ApiError) -> str:
    if error.status == UNREACHABLE:
        return error.message
    reason = f"{error.status} {error.reason}"
    if error.status == 403:
        return (f"{reason}: this account may not; it needs get/list on nodes and pods, and get on pods/proxy "
                "(agent pods) or nodes/proxy (agents run as host processes)")
    return reason
