"""The view of ``fastgshare inspect``: every node → GPU → pod, with each pod's configured share
next to the share it got, and each GPU's free time×SM area and memory. Pure: built from facts the
reader (:mod:`fastgshare_cli.cluster_reader`) gathered, rendered as a table or JSON.

- *Configured* comes from each pod's assignment (the extender's annotation): request, limit, SM
  percent and memory limit on one GPU.
- *Free* is what the extender's ledger would leave: the node's GPUs (its ``gpu_info``) with every
  assigned, unfinished pod added, so the figures are the ones placement decisions use (guaranteed
  time × SMs, as a fraction of the GPU's area; memory in bytes, each pod charged its ``gpu_mem``
  and the GPU's CUDA context reserve, which is shown too, and each model on the GPU once).
- *Models* (model sharing, :mod:`fastgshare.model`): the weights the node's store holds once per GPU
  for the pods of one function, each on its own line under its GPU's row (``model ns/fn/name   4 GiB
  4 pods``) and in the JSON as ``models: [{key, bytes, pods}]``: the
  models the pods declare (their ``fastgshare/model`` annotation) and those the store still holds
  (the inventory's ``heldModels``, also in their grace period, with 0 pods).
- *Achieved* is the node agent's ``fastgshare_pod_gpu_time_share`` (GPU time over the last 10 s)
  and ``fastgshare_pod_gpu_memory_used_bytes``. A pod whose achieved share is below its request by
  more than :data:`BELOW_REQUEST_MARGIN` is marked: it was idle, or it was starved (the wait and
  throttling columns of ``-o wide`` tell which).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from fastgshare.codec import PodAssignment
from fastgshare.inventory import NodeInventory
from fastgshare.ledger import NodeState
from fastgshare.model import ModelRef
from fastgshare.quantity import format_bytes
from fastgshare.share import format_fraction

BELOW_REQUEST_MARGIN = 0.03  # 3 points: the arbiter's accuracy on a simulated GPU
BELOW_MARK = "▼"


# --- what the reader gathers ---------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class NodeFacts:
    name: str
    inventory: NodeInventory | None  # None: no usable fastgshare/gpu_info annotation
    problem: str = ""  # why the inventory is missing
    metrics_error: str = ""  # why the node agent's metrics could not be read ("" when they were)


@attrs.frozen(kw_only=True)
class PodFacts:
    namespace: str
    name: str
    phase: str
    assignment: PodAssignment
    model: ModelRef | None = None  # what its fastgshare/model annotation declares

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@attrs.frozen(kw_only=True)
class PodSample:
    """What the node agent measured for one pod on one GPU."""

    share: float | None = None
    memory_used_bytes: int | None = None
    throttled_seconds_total: float | None = None
    wait_seconds_total: float | None = None
    waits: int | None = None


@attrs.frozen(kw_only=True)
class GpuSample:
    busy_share: float | None = None
    healthy: bool | None = None
    memory_allocated_bytes: int | None = None


@attrs.frozen(kw_only=True)
class NodeSamples:
    """One scrape of one node agent: pods keyed by (namespace/name, gpu uuid), GPUs by uuid."""

    pods: Mapping[tuple[str, str], PodSample] = attrs.field(factory=dict)
    gpus: Mapping[str, GpuSample] = attrs.field(factory=dict)


# --- the view ------------------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class PodView:
    namespace: str
    name: str
    phase: str
    request: float
    limit: float
    sm_percent: int
    memory_limit_bytes: int
    achieved: float | None
    memory_used_bytes: int | None
    throttled_seconds_total: float | None
    mean_wait_seconds: float | None

    @property
    def below_request(self) -> bool:
        return self.achieved is not None and self.achieved < self.request - BELOW_REQUEST_MARGIN

    @property
    def parked(self) -> bool:
        """Its assignment gives no GPU time (0/0): it holds its memory until its function wakes it."""
        return self.limit == 0


@attrs.frozen(kw_only=True)
class ModelView:
    """One model on one GPU: charged once, however many of its pods are there."""

    key: str  # namespace/function/name
    bytes: int
    pods: int  # every pod of it on the GPU, also those a --namespace leaves out


@attrs.frozen(kw_only=True)
class GpuView:
    uuid: str
    index: int
    model: str
    healthy: bool
    memory_bytes: int
    free_area: float  # of the GPU's guaranteed time × SM area, 0..1
    free_memory_bytes: int
    context_reserve_bytes: int  # charged per pod, next to its gpu_mem
    busy_share: float | None
    memory_allocated_bytes: int | None
    pod_count: int  # every pod on the GPU, also those a --namespace leaves out of ``pods``
    pods: tuple[PodView, ...]
    models: tuple[ModelView, ...] = ()


@attrs.frozen(kw_only=True)
class NodeView:
    name: str
    problem: str
    metrics_error: str
    gpus: tuple[GpuView, ...]


def build_view(nodes: Sequence[NodeFacts], pods: Sequence[PodFacts], samples: Mapping[str, NodeSamples], *,
               namespace: str | None = None) -> list[NodeView]:
    """Every node (by name) with its GPUs (by index) and their pods (by namespace/name); with
    ``namespace``, only that namespace's pods are listed, but every pod counts in the free area."""
    by_node: dict[str, list[PodFacts]] = {}
    for pod in pods:
        by_node.setdefault(pod.assignment.node_name, []).append(pod)
    return [_node_view(node, by_node.get(node.name, []), samples.get(node.name, NodeSamples()), namespace)
            for node in sorted(nodes, key=lambda n: n.name)]


def _node_view(node: NodeFacts, pods: list[PodFacts], samples: NodeSamples, namespace: str | None) -> NodeView:
    if node.inventory is None:
        return NodeView(name=node.name, problem=node.problem, metrics_error=node.metrics_error, gpus=())
    state = NodeState(node.inventory)
    for pod in pods:
        if pod.assignment.gpu_uuid in state.ledgers:
            state.ledgers[pod.assignment.gpu_uuid].add(pod.key, pod.assignment.share, model=pod.model, force=True)
    gpus = []
    for uuid, ledger in state.ledgers.items():
        gpu_sample = samples.gpus.get(uuid, GpuSample())
        on_gpu = sorted((pod for pod in pods if pod.assignment.gpu_uuid == uuid), key=lambda pod: pod.key)
        shown = [pod for pod in on_gpu if namespace is None or pod.namespace == namespace]
        gpus.append(GpuView(
            uuid=uuid, index=ledger.gpu.index, model=ledger.gpu.model,
            healthy=gpu_sample.healthy if gpu_sample.healthy is not None else ledger.gpu.healthy,
            memory_bytes=ledger.gpu.memory_bytes, free_area=max(0.0, 1.0 - ledger.area_fraction),
            free_memory_bytes=max(0, ledger.free_memory), context_reserve_bytes=ledger.gpu.context_reserve_bytes,
            busy_share=gpu_sample.busy_share,
            memory_allocated_bytes=gpu_sample.memory_allocated_bytes, pod_count=len(on_gpu),
            pods=tuple(_pod_view(pod, samples.pods.get((pod.key, uuid), PodSample())) for pod in shown),
            models=tuple(ModelView(key=usage.key, bytes=usage.bytes, pods=usage.pods) for usage in ledger.models)))
    return NodeView(name=node.name, problem=node.problem, metrics_error=node.metrics_error, gpus=tuple(gpus))


def _pod_view(pod: PodFacts, sample: PodSample) -> PodView:
    share = pod.assignment.share
    mean_wait = (sample.wait_seconds_total / sample.waits
                 if sample.wait_seconds_total is not None and sample.waits else None)
    return PodView(namespace=pod.namespace, name=pod.name, phase=pod.phase,
                   request=share.request_permille / 1000, limit=share.limit_permille / 1000,
                   sm_percent=share.sm_percent, memory_limit_bytes=share.memory_bytes,
                   achieved=sample.share, memory_used_bytes=sample.memory_used_bytes,
                   throttled_seconds_total=sample.throttled_seconds_total, mean_wait_seconds=mean_wait)


# --- rendering -----------------------------------------------------------------------------------
def to_json(view: Sequence[NodeView]) -> dict[str, object]:
    """The view as plain data; shares as fractions 0..1, memory in bytes, ``null`` when unmeasured."""
    return {"nodes": [{
        "name": node.name, "problem": node.problem or None, "metricsError": node.metrics_error or None,
        "gpus": [{
            "uuid": gpu.uuid, "index": gpu.index, "model": gpu.model, "healthy": gpu.healthy,
            "memoryBytes": gpu.memory_bytes, "freeArea": round(gpu.free_area, 4),
            "freeMemoryBytes": gpu.free_memory_bytes, "contextReserveBytes": gpu.context_reserve_bytes,
            "busyShare": gpu.busy_share,
            "memoryAllocatedBytes": gpu.memory_allocated_bytes, "podCount": gpu.pod_count,
            "models": [{"key": model.key, "bytes": model.bytes, "pods": model.pods} for model in gpu.models],
            "pods": [{
                "namespace": pod.namespace, "name": pod.name, "phase": pod.phase,
                "configured": {"request": pod.request, "limit": pod.limit, "smPercent": pod.sm_percent,
                               "memoryBytes": pod.memory_limit_bytes},
                "achieved": {"share": pod.achieved, "memoryUsedBytes": pod.memory_used_bytes,
                             "throttledSecondsTotal": pod.throttled_seconds_total,
                             "meanTokenWaitSeconds": pod.mean_wait_seconds},
                "belowRequest": pod.below_request,
                "parked": pod.parked,
            } for pod in gpu.pods],
        } for gpu in node.gpus],
    } for node in view]}


GPU_COLUMNS = ("NODE", "GPU", "MODEL", "HEALTH", "PODS", "BUSY", "FREE AREA", "FREE MEMORY", "CTX RESERVE",
               "MEMORY HELD")
PARKED_MARK = "parked"
MODEL_MARK = "model"
POD_COLUMNS = ("POD", "NODE", "GPU", "REQUEST", "LIMIT", "ACHIEVED", "SM", "MEMORY", "MEM USED")
WIDE_POD_COLUMNS = (*POD_COLUMNS, "PHASE", "THROTTLED", "MEAN WAIT")


def gpu_rows(view: Sequence[NodeView]) -> list[tuple[str, ...]]:
    """One row per GPU: its pods, how busy it was, the area and memory the ledger has free, the context
    reserve each pod is charged and the memory its pods hold; a node without a usable inventory gets a
    row saying why. (:func:`render_table` puts each GPU's models under its row.)"""
    rows: list[tuple[str, ...]] = []
    for node in view:
        if node.problem:
            rows.append((node.name, "-", f"({node.problem})", "", "", "", "", "", "", ""))
        for gpu in node.gpus:
            rows.append((node.name, str(gpu.index), gpu.model, "ok" if gpu.healthy else "UNHEALTHY",
                         str(gpu.pod_count), _share(gpu.busy_share), f"{gpu.free_area:.0%}",
                         format_bytes(gpu.free_memory_bytes), format_bytes(gpu.context_reserve_bytes),
                         _bytes(gpu.memory_allocated_bytes)))
    return rows


def pod_rows(view: Sequence[NodeView], *, wide: bool = False, qualify: bool = True) -> list[tuple[str, ...]]:
    """One row per pod, node by node and GPU by GPU: configured next to achieved; a pod below its
    request is marked with :data:`BELOW_MARK`. Pods are ``namespace/name`` unless ``qualify`` is
    false (one namespace is shown, as ``kubectl -n``)."""
    rows: list[tuple[str, ...]] = []
    for node in view:
        for gpu in node.gpus:
            for pod in gpu.pods:
                achieved = _share(pod.achieved) + (f" {BELOW_MARK}" if pod.below_request else "")
                if pod.parked:
                    achieved = PARKED_MARK
                name = f"{pod.namespace}/{pod.name}" if qualify else pod.name
                row: tuple[str, ...] = (name, node.name, str(gpu.index),
                       format_fraction(round(pod.request * 1000)), format_fraction(round(pod.limit * 1000)),
                       achieved, f"{pod.sm_percent}%", format_bytes(pod.memory_limit_bytes),
                       _bytes(pod.memory_used_bytes))
                if wide:
                    row = (*row, pod.phase, _seconds(pod.throttled_seconds_total), _seconds(pod.mean_wait_seconds))
                rows.append(row)
    return rows


def render_table(view: Sequence[NodeView], *, wide: bool = False, qualify: bool = True) -> str:
    """The GPUs, then the pods, as kubectl prints tables: left-aligned columns three spaces apart;
    then a line for each node whose metrics could not be read."""
    parts = [_gpu_table(view)]
    pods = pod_rows(view, wide=wide, qualify=qualify)
    parts.append(_columns(WIDE_POD_COLUMNS if wide else POD_COLUMNS, pods) if pods else "No GPU pods.")
    notes = [f"node {node.name}: no metrics ({node.metrics_error}); ACHIEVED and MEM USED show -"
             for node in view if node.metrics_error and node.gpus]
    if any(gpu.models for node in view for gpu in node.gpus):
        notes.append(f"{MODEL_MARK} rows: the weights the node's model store holds once on the GPU above for the pods "
                     "of one function,\n  charged once in its FREE MEMORY (0 pods: kept for its grace period).")
    parked = [pod for node in view for gpu in node.gpus for pod in gpu.pods if pod.parked]
    if parked:
        notes.append(f"{PARKED_MARK}: {len(parked)} pods with no GPU time (time quota 0/0) hold "
                     f"{format_bytes(sum(pod.memory_limit_bytes for pod in parked))} of GPU memory until a request "
                     "wakes them (spec.scaling.parked).")
    if any(pod.below_request for node in view for gpu in node.gpus for pod in gpu.pods):
        notes.append(f"{BELOW_MARK} below its request over the last 10 s: idle, or starved. In -o wide, THROTTLED is "
                     "time spent waiting\n  for its own limit, MEAN WAIT the mean wait for a token.")
    return "\n\n".join(parts) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


def model_lines(gpu: GpuView) -> list[str]:
    """The GPU's models, one line each: ``model team-a/vit-fn/vit   4 GiB   4 pods``."""
    return [f"{MODEL_MARK} {model.key}   {format_bytes(model.bytes)}   {model.pods} pod{'' if model.pods == 1 else 's'}"
            for model in gpu.models]


def _gpu_table(view: Sequence[NodeView]) -> str:
    """The GPU rows in columns, each GPU's :func:`model_lines` under its row from the MODEL column on
    (outside the columns, so a long model key does not widen the table)."""
    rows = gpu_rows(view)
    under: list[list[str]] = []
    for node in view:
        if node.problem:
            under.append([])
        under.extend(model_lines(gpu) for gpu in node.gpus)
    widths = _widths(GPU_COLUMNS, rows)
    indent = " " * (widths[0] + widths[1] + 6)
    lines = [_line(GPU_COLUMNS, widths)]
    for row, models in zip(rows, under, strict=True):
        lines.append(_line(row, widths))
        lines.extend(indent + text for text in models)
    return "\n".join(lines)


def _columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = _widths(header, rows)
    return "\n".join(_line(line, widths) for line in (header, *rows))


def _widths(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(cell) for cell in column) for column in zip(header, *rows, strict=True)]


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "   ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True)).rstrip()


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _bytes(value: int | None) -> str:
    return "-" if value is None else format_bytes(value)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.1f} s"
