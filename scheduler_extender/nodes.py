"""One node as the extender's cache holds it: its GPU inventory and the ledgers of its GPUs.

A :class:`NodeEntry` is never changed once the cache has published it: placing or removing
a pod builds a new entry (copy-on-write), so filter and prioritize read entries without the
cache lock while binds and watch events replace them. Verdicts and scores an entry computes
are remembered on it per (share, policy, model), so the many pods of one FaSTPod, which ask for
the same share and declare the same model, are judged once per node state; a new entry starts
with none. Each pod is recorded with the model it declares, which its GPU's ledger charges once
however many of its pods are there (:class:`fastgshare.ledger.GpuLedger`).

The core's ledger keeps a private cache while checking a fit, so every computation on an
entry's ledgers runs under the entry's own lock.

Every entry with an inventory carries a :attr:`NodeEntry.signature`, computed when it is built
(so before it is published, off the request path): an id of the ordered per-GPU summaries
(:attr:`fastgshare.ledger.GpuLedger.summary_id`, everything but the GPUs' uuids). Entries with
equal signatures give equal verdicts, reasons and scores for a pod, so the decisions remember
their answers per (share, policy, signature), across nodes and across cache rebuilds.
"""

from __future__ import annotations

import logging
import threading
from typing import TypeVar

from fastgshare import keys
from fastgshare.codec import decode_node_inventory
from fastgshare.errors import CodecError
from fastgshare.inventory import NodeInventory
from fastgshare.ledger import NodeState, intern_key
from fastgshare.model import ModelRef
from fastgshare.placement import NodeVerdict, Policy, evaluate_node, score_node
from fastgshare.share import ShareSpec
from scheduler_extender.resharing import ShareChange, judge_change

log = logging.getLogger(__name__)

MEMO_LIMIT = 256  # (share, policy) pairs remembered per entry
K = TypeVar("K")
V = TypeVar("V")
PodOnGpu = tuple[str, str, ShareSpec, ModelRef | None]  # (pod id, gpu uuid, share, model)


def no_inventory_reason() -> str:
    return (f"node has no GPU inventory (annotation {keys.NODE_GPU_INFO_ANNOTATION}): the fastgshare node agent "
            "is not running there or has not published yet")


class NodeEntry:
    """A node's inventory (or why it has none) and the ledgers of its GPUs."""

    def __init__(self, name: str, inventory_text: str | None, state: NodeState | None, problem: str) -> None:
        self.name = name
        self.inventory_text = inventory_text  # as published, to tell a real change from a resend
        self.state = state  # None when the node has no usable inventory
        self.problem = problem  # why ``state`` is None, in words a user can act on
        self._lock = threading.Lock()
        self._verdicts: dict[tuple[ShareSpec, Policy, ModelRef | None], NodeVerdict] = {}
        self._scores: dict[tuple[ShareSpec, Policy, ModelRef | None], int] = {}
        self._empty: dict[tuple[ShareSpec, ModelRef | None], NodeVerdict] = {}
        self.signature: int | None = None  # None without inventory; see :meth:`_seal`

    @classmethod
    def from_inventory(cls, name: str, inventory_text: str | None) -> NodeEntry:
        """An entry with empty ledgers, or with the reason the inventory cannot be used."""
        if inventory_text is None:
            return cls(name, None, None, no_inventory_reason())
        try:
            inventory = decode_node_inventory(inventory_text)
        except CodecError as error:
            log.warning("node=%s unreadable GPU inventory: %s", name, error)
            return cls(name, inventory_text, None, f"node's GPU inventory is unreadable: {error}")
        return cls(name, inventory_text, NodeState(inventory), "")._seal()

    @property
    def inventory(self) -> NodeInventory | None:
        return self.state.inventory if self.state is not None else None

    # --- judging a pod (memoized) --------------------------------------------------------
    def verdict(self, share: ShareSpec, policy: Policy, model: ModelRef | None = None) -> NodeVerdict | None:
        """The GPU ``policy`` picks for ``share`` (of ``model``) now, or why none fits; None without inventory."""
        if self.state is None:
            return None
        key = (share, policy, model)
        with self._lock:
            found = self._verdicts.get(key)
            if found is None:
                found = _remember(self._verdicts, key, evaluate_node(self.state, share, policy, model))
            return found

    def score(self, share: ShareSpec, policy: Policy, model: ModelRef | None = None) -> int:
        """0..10: how much ``policy`` likes this node for ``share`` (of ``model``; 0 if it does not fit)."""
        if self.state is None:
            return 0
        key = (share, policy, model)
        with self._lock:
            found = self._scores.get(key)
            if found is None:
                found = _remember(self._scores, key, score_node(self.state, share, policy, model))
            return found

    def fits_when_empty(self, share: ShareSpec, model: ModelRef | None = None) -> NodeVerdict | None:
        """The verdict for ``share`` (of ``model``) on this node with no pods and no models held (the
        store frees a model no pod needs after its grace period): a refusal here is for good."""
        inventory = self.inventory
        if inventory is None:
            return None
        with self._lock:
            found = self._empty.get((share, model))
            if found is None:
                found = _remember(self._empty, (share, model),
                                  evaluate_node(NodeState(inventory, held_models=False), share, model=model))
            return found

    def judge_change(self, pod_id: str, gpu_uuid: str, current: ShareSpec, wanted: ShareSpec,
                     model: ModelRef | None = None) -> ShareChange:
        """The share the pod on ``gpu_uuid`` (of ``model``, which a change keeps) gets instead of
        ``current`` when it asks for ``wanted`` (:func:`~scheduler_extender.resharing.judge_change`);
        raises :class:`~scheduler_extender.resharing.ShareChangeRefused` if it keeps ``current``."""
        others = self.without_pod(pod_id)
        with others._lock:
            ledger = others.state.ledgers.get(gpu_uuid) if others.state is not None else None
            return judge_change(current, wanted, ledger, model)

    # --- new entries (copy-on-write) -----------------------------------------------------
    def rebuilt(self, pods: list[PodOnGpu]) -> NodeEntry:
        """A fresh entry of the same inventory holding ``(pod id, gpu uuid, share, model)`` as given."""
        entry = NodeEntry.from_inventory(self.name, self.inventory_text)
        for pod_id, gpu_uuid, share, model in pods:
            entry._record(pod_id, gpu_uuid, share, model)
        return entry._seal()

    def with_pod(self, pod_id: str, gpu_uuid: str, share: ShareSpec, model: ModelRef | None = None) -> NodeEntry:
        """A new entry with the pod (of ``model``) recorded on ``gpu_uuid``, even beyond the GPU's budgets
        (pods the API shows are committed whether or not they fit)."""
        entry = self._copy()
        entry._record(pod_id, gpu_uuid, share, model)
        return entry._seal()

    def without_pod(self, pod_id: str) -> NodeEntry:
        """A new entry with the pod's share freed (the same entry if it holds no such pod)."""
        if self.state is None or self.state.find_pod(pod_id) is None:
            return self
        entry = self._copy()
        ledger = entry.state.find_pod(pod_id) if entry.state is not None else None
        if ledger is not None:
            ledger.remove(pod_id)
        return entry._seal()

    def _seal(self) -> NodeEntry:
        """Compute the signature of a private entry about to be published."""
        if self.state is not None:
            with self._lock:
                self.signature = intern_key(("node", *(ledger.summary_id for ledger in self.state.ledgers.values())))
        return self

    def _copy(self) -> NodeEntry:
        with self._lock:
            state = self.state.copy() if self.state is not None else None
        return NodeEntry(self.name, self.inventory_text, state, self.problem)

    def _record(self, pod_id: str, gpu_uuid: str, share: ShareSpec, model: ModelRef | None = None) -> None:
        """Add to a private (not yet published) entry."""
        if self.state is None:
            return
        ledger = self.state.ledgers.get(gpu_uuid)
        if ledger is None:
            log.warning("node=%s pod=%s assigned to GPU %s, which the inventory does not list; not counted",
                        self.name, pod_id, gpu_uuid)
            return
        previous = self.state.find_pod(pod_id)
        if previous is not None:
            previous.remove(pod_id)
        was_overcommitted = ledger.overcommitted
        ledger.add(pod_id, share, model=model, force=True)
        if ledger.overcommitted and not was_overcommitted:
            log.warning("node=%s gpu=%s over-committed by pods the API shows", self.name, gpu_uuid)


def _remember(memo: dict[K, V], key: K, value: V) -> V:
    if len(memo) >= MEMO_LIMIT:
        memo.clear()
    memo[key] = value
    return value
