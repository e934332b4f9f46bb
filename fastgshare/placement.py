"""Placement policies: which GPU of a node takes a pod, and how good a node is for it.

``binpack`` (the default) fills GPUs: it prefers the GPU left with the least free time x SM
area (for best-effort pods: the least free memory), and among nodes those with fewer empty
GPUs, so whole GPUs stay free for big pods. ``spread`` does the opposite to reduce
interference. Both are deterministic: equal inputs give equal answers, ties go to the lower
GPU index.

Node scores are integers 0..10, the range kube-scheduler extenders use.

Model sharing (:mod:`fastgshare.model`): a pod that declares a model costs a GPU that already
holds it (a pod of it there, or the node's store keeps it) only its own ``gpu_mem`` and context
reserve. The policies prefer such a GPU, each in its own way:

- ``binpack`` makes it the *first* key among the GPUs of a node that fit, ahead of the fill, and
  gives the node a score bonus of the model's share of the GPU's memory (at least one point): a
  pod that joins its model saves the model's bytes, which is what packing is for when memory
  binds, as it does for inference pods. Choosing a fuller GPU instead would load a second copy.
- ``spread`` makes it the first *tie-breaker*, after the fill, and gives no bonus: spread exists
  to keep pods apart, and the pods of one function are the ones that interfere most when they
  run together, so their memory saving must not undo it. Pods of different models spread as
  before; between GPUs equally loaded the one holding the model wins.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable

import attrs

from fastgshare.errors import InvalidPolicy
from fastgshare.ledger import Fit, GpuLedger, NodeState, Rejection
from fastgshare.model import ModelRef
from fastgshare.packing import BIN
from fastgshare.quantity import format_bytes
from fastgshare.share import ShareSpec, format_fraction

MAX_SCORE = 10


class Policy(enum.Enum):
    BINPACK = "binpack"
    SPREAD = "spread"


DEFAULT_POLICY = Policy.BINPACK


def parse_policy(text: str) -> Policy:
    """The policy called ``text``; the error names the allowed values."""
    try:
        return Policy(text.strip().lower())
    except ValueError:
        allowed = ", ".join(f'"{p.value}"' for p in Policy)
        shown = text if len(text) <= 40 else f"{text[:37]}..."  # a hostile value must not make a huge message
        raise InvalidPolicy(f'placement policy "{shown}" is unknown; allowed: {allowed}') from None


@attrs.frozen
class GpuChoice:
    """A GPU that can take the pod, and its load once the pod is on it (fractions 0..1)."""

    uuid: str
    index: int
    area_after: float
    memory_after: float
    best_effort: bool
    holds_model: bool = False  # the pod's model is already on the GPU: it costs nothing more there

    @property
    def fill_after(self) -> float:
        """The load the policy looks at: time x SM area, or memory for best-effort pods."""
        return self.memory_after if self.best_effort else self.area_after


@attrs.frozen
class NodeVerdict:
    """Whether a node can take a pod: the chosen GPU, or why every GPU refused."""

    node: str
    choice: GpuChoice | None
    refusals: tuple[tuple[GpuLedger, Fit], ...]
    reason: str

    @property
    def fits(self) -> bool:
        return self.choice is not None


def evaluate_node(node: NodeState, share: ShareSpec, policy: Policy = DEFAULT_POLICY,
                  model: ModelRef | None = None) -> NodeVerdict:
    """Pick the GPU of ``node`` that ``policy`` prefers for ``share`` (of ``model``), or say why none fits."""
    candidates: list[GpuChoice] = []
    refusals: list[tuple[GpuLedger, Fit]] = []
    for ledger in node.ledgers.values():
        fit = ledger.check(share, model)
        if fit.ok:
            candidates.append(_choice(ledger, share, model))
        else:
            refusals.append((ledger, fit))
    if not candidates:
        return NodeVerdict(node.name, None, tuple(refusals), _refusal_reason(node, share, refusals, model))
    return NodeVerdict(node.name, max(candidates, key=_gpu_preference(policy)), tuple(refusals), "")


def choose_gpu(
    ledgers: Iterable[GpuLedger], share: ShareSpec, policy: Policy = DEFAULT_POLICY,
    model: ModelRef | None = None,
) -> GpuLedger | None:
    """The ledger ``policy`` prefers among those ``share`` (of ``model``) fits, or ``None``."""
    by_uuid = {ledger.gpu.uuid: ledger for ledger in ledgers if ledger.fits(share, model)}
    if not by_uuid:
        return None
    best = max((_choice(ledger, share, model) for ledger in by_uuid.values()), key=_gpu_preference(policy))
    return by_uuid[best.uuid]


def score_node(node: NodeState, share: ShareSpec, policy: Policy = DEFAULT_POLICY,
               model: ModelRef | None = None) -> int:
    """0..10: how much ``policy`` likes placing ``share`` (of ``model``) on ``node`` (0 if it does not fit)."""
    verdict = evaluate_node(node, share, policy, model)
    if verdict.choice is None:
        return 0
    healthy = sum(1 for ledger in node.ledgers.values() if ledger.gpu.healthy)
    chosen = node.ledgers[verdict.choice.uuid]
    empty_after = node.empty_gpu_count() - (1 if chosen.is_empty else 0)
    empty_fraction = empty_after / healthy
    fill = verdict.choice.fill_after
    if policy is Policy.BINPACK:
        raw = 0.75 * fill + 0.25 * (1 - empty_fraction)
    else:
        raw = 0.75 * (1 - fill) + 0.25 * empty_fraction
    score = max(0, min(MAX_SCORE, math.floor(raw * MAX_SCORE + 0.5)))
    if policy is Policy.BINPACK and model is not None and verdict.choice.holds_model:
        score = min(MAX_SCORE, score + model_bonus(model, chosen))
    return score


def model_bonus(model: ModelRef, ledger: GpuLedger) -> int:
    """The points ``binpack`` adds to a node whose chosen GPU already holds the pod's model: the
    model's share of that GPU's memory (the memory the placement saves), on the 0..10 scale, at least 1."""
    return max(1, math.floor(model.bytes / ledger.gpu.memory_bytes * MAX_SCORE + 0.5))


def _choice(ledger: GpuLedger, share: ShareSpec, model: ModelRef | None = None) -> GpuChoice:
    width, height = ledger.rectangle_size(share)
    area = 0 if share.is_best_effort else width * height
    return GpuChoice(
        uuid=ledger.gpu.uuid,
        index=ledger.gpu.index,
        area_after=(ledger.used_area + area) / BIN.area,
        memory_after=(ledger.committed_memory + ledger.memory_charge(share, model)) / ledger.gpu.memory_bytes,
        best_effort=share.is_best_effort,
        holds_model=ledger.holds_model(model),
    )


def _gpu_preference(policy: Policy) -> Callable[[GpuChoice], tuple[bool | float | int, ...]]:
    """A sort key; the maximum is the preferred GPU. Holding the pod's model comes first under
    ``binpack`` and right after the fill under ``spread`` (see the module's docstring)."""
    if policy is Policy.BINPACK:
        return lambda c: (c.holds_model, c.fill_after, c.memory_after, -c.index)
    return lambda c: (-c.fill_after, c.holds_model, -c.memory_after, -c.index)


def _refusal_reason(node: NodeState, share: ShareSpec, refusals: list[tuple[GpuLedger, Fit]],
                    model: ModelRef | None = None) -> str:
    """One line a user can act on, summarising why each GPU refused."""
    if not node.ledgers:
        return "node has no GPUs in its inventory"
    by_kind: dict[Rejection, list[tuple[GpuLedger, Fit]]] = {}
    for ledger, fit in refusals:
        if fit.rejection is not None:
            by_kind.setdefault(fit.rejection, []).append((ledger, fit))
    parts = []
    if unhealthy := by_kind.get(Rejection.UNHEALTHY):
        parts.append(f"GPU {_indexes(unhealthy)} unhealthy")
    if full := by_kind.get(Rejection.NO_SLOT):
        parts.append(f"GPU {_indexes(full)} out of pod slots")
    if memory := by_kind.get(Rejection.MEMORY):
        largest = max(max(ledger.free_memory, 0) for ledger, _ in memory)
        parts.append(f"needs {format_bytes(share.memory_bytes)} of GPU memory{_model_words(model, memory)}"
                     f"{_reserve_words(memory)}, largest free {format_bytes(largest)}")
    if compute := by_kind.get(Rejection.COMPUTE):
        if all(ledger.gpu.mps_enabled and not ledger.overcommitted for ledger, _ in compute):
            parts.append(f"no GPU with {share.sm_percent} percent of its SMs free for "
                         f"{format_fraction(share.request_permille)} of the time")
        else:
            parts.extend(fit.message for _, fit in compute)
    return "; ".join(parts)


def _model_words(model: ModelRef | None, refusals: list[tuple[GpuLedger, Fit]]) -> str:
    """`` + model ns/fn/vit 4 GiB (on none of them yet)``, or naming the GPUs that lack it where some
    hold it; "" where the pod declares none or every GPU refusing it holds it."""
    if model is None:
        return ""
    lacking = [(ledger, fit) for ledger, fit in refusals if not ledger.holds_model(model)]
    if not lacking:
        return ""
    where = "on none of them yet" if len(lacking) == len(refusals) else f"not yet on GPU {_indexes(lacking)}"
    return f" + model {model.key} {format_bytes(model.bytes)} ({where})"


def _reserve_words(refusals: list[tuple[GpuLedger, Fit]]) -> str:
    """`` + 300 MiB context reserve`` (the range where the GPUs differ); "" where no GPU has one."""
    reserves = sorted({ledger.gpu.context_reserve_bytes for ledger, _ in refusals})
    if reserves[-1] == 0:
        return ""
    low, high = format_bytes(reserves[0]), format_bytes(reserves[-1])
    return f" + {low} context reserve" if low == high else f" + {low} to {high} context reserve"


def _indexes(items: list[tuple[GpuLedger, Fit]]) -> str:
    return ", ".join(str(ledger.gpu.index) for ledger, _ in items)

