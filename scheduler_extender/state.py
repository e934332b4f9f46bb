"""The extender's picture of the cluster: nodes and their GPU ledgers, pod placements, binds in flight.

Two sides feed it. The kube adapter reports what the API server says (lists and watch events
of nodes and pods, as records); binds reserve a GPU before they write anything and report
how they ended. The rules that make a restart lose nothing and double-book nothing:

- A pod counts on its GPU while the API shows its assignment annotation and the pod has not
  finished (Succeeded or Failed) or gone, bound or not: an assigned pod that is not bound yet
  is a bind in flight, perhaps of an extender that has since restarted.
- Only assignments signed with our key for that pod's uid and node count
  (:mod:`fastgshare.assignment_signature`): a forged or unsigned one counts for nothing (one log
  line per pod). One that replaces a trusted assignment of a pod we hold is ignored: the pod keeps
  the share we placed until its trusted assignment comes back or the pod goes.
- A bind of ours counts from its reservation until it ends. Events that do not show its
  assignment until then are older than its write and change nothing. After it bound the pod,
  the placement stays until the API has shown the assignment (``seen``) or the pod is gone;
  a relist that started after the bind ended is the truth.
- A live share change (:mod:`scheduler_extender.resharing`) of a bound pod is judged and
  taken on the ledger in one step (:meth:`ClusterState.begin_share_change`), before it is
  written; until the API shows the new share, events showing the old one change nothing. The
  new assignment is stamped later than the one it replaces (a later ``assigned_at_ms``, which
  the signature covers), and an assignment older than the one a placement holds is ignored: an
  older signed assignment written back (a replay, with the webhook down) is never followed past
  the fit check of the GPU as it is now. The node agent refuses it too.
- A pod's model (its ``fastgshare/model`` annotation, :attr:`Placement.model`) is recorded with its
  share and charged once per GPU with the other pods of that model; a share change keeps it.
- The pods that are not bound yet are kept as the watch last showed them
  (:meth:`ClusterState.pending_pod`), so a bind need not read its pod from the API server.
- With ``bind_wait_s`` > 0, binds to one node take turns in arrival order within a window of
  ``bind_window``: a bind writes while fewer than that many pods of the node are being written or
  wait for the node agent (bound, not marked allocated, assigned less than ``bind_wait_s`` ago);
  else it waits until one is marked or its wait runs out, then proceeds anyway. A window of 1 is
  one pod at a time. The node agent's Allocate tells pods apart by kubelet's record and the
  order they arrived on the node, so the window is not needed for exactness: it keeps a node
  whose agent or kubelet is down from taking pods faster than one window per ``bind_wait_s``
  (kubelet refuses them at admission while the agent is away). With 0 binds take no turns.

One condition variable guards everything here, and waiting binds sleep on it. Node entries
are replaced, never modified, so readers may use them after the lock is released.
"""

from __future__ import annotations

import enum
import gc
import logging
import math
import threading
import time
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterable, Sequence

import attrs

from fastgshare.assignment_signature import AssignmentTrust
from fastgshare.model import ModelRef
from fastgshare.placement import Policy
from fastgshare.share import ShareSpec
from scheduler_extender.nodes import NodeEntry, PodOnGpu
from scheduler_extender.placements import (
    Placement,
    ReadAssignment,
    placement_from_api,
    placement_of,
    read_assignment,
    same_assignment,
)
from scheduler_extender.records import NodeRecord, PodRecord
from scheduler_extender.resharing import ShareChangeRefused

log = logging.getLogger(__name__)

COLLECT_AFTER_RELIST_NODES = 1000  # see ClusterState.replace_pods
CHANGE_LOG = 4096  # single-node changes remembered (see ClusterState.changed_entries)
DISTRUSTED_REMEMBERED = 4096  # pods whose untrusted assignment was logged (once per pod)


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@attrs.frozen(kw_only=True)
class Reservation:
    """The GPU a bind reserved for a pod."""

    uid: str
    pod_key: str
    node: str
    gpu_uuid: str
    gpu_index: int
    share: ShareSpec
    model: ModelRef | None = None


class ReservationRefused(Exception):
    """The node cannot take the pod now; the message says why."""


class BindOutcome(enum.Enum):
    BOUND = "bound"
    RELEASED = "released"  # nothing of the bind is left in the API
    ASSIGNED = "assigned"  # the assignment stayed on the pod, which is not bound


@attrs.frozen(kw_only=True)
class ShareChangeStart:
    """A share change the cache has taken on the pod's GPU, to be written as its new assignment."""

    uid: str
    node: str
    gpu_uuid: str
    gpu_index: int
    assigned_at_ms: int  # the new assignment's time: later than the one it replaces
    old: ShareSpec
    new: ShareSpec  # what the pod gets: the share asked for, or a parked pod woken without its request
    old_assigned_at_ms: int = 0
    asked: ShareSpec | None = None  # the share the pod's annotations ask for, when it is not ``new``
    short_of: str | None = None  # why ``new`` is not what was asked (``ShareChange.short_of``)

    @property
    def wanted(self) -> ShareSpec:
        """The share the pod's annotations ask for."""
        return self.asked if self.asked is not None else self.new


@attrs.frozen
class Snapshot:
    """A consistent copy of the cache for the inspection view."""

    synced: bool
    nodes: dict[str, NodeEntry]
    placements: list[Placement]
    waiting: dict[str, list[str]]  # node -> pod keys whose binds wait for their turn


class ClusterState:
    """Nodes, placements and bind turns; every method is safe to call from any thread."""

    def __init__(self, *, bind_wait_s: float, trust: AssignmentTrust, bind_window: int = 1,
                 now_ms: Callable[[], int] = wall_clock_ms) -> None:
        self.trust = trust  # signs what our binds and share changes write, and vets what the API shows
        self._distrusted: OrderedDict[str, None] = OrderedDict()  # uids whose untrusted assignment was logged
        self._older_logged: OrderedDict[tuple[str, int], None] = OrderedDict()  # (uid, time) of older ones logged
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # the cache changed (every method holds its lock)
        self._turn_waiters: dict[str, threading.Condition] = {}  # uid -> what its wait_turn waits on
        self._nodes: dict[str, NodeEntry] = {}
        self._placements: dict[str, Placement] = {}  # by pod uid
        self._on_node: defaultdict[str, set[str]] = defaultdict(set)  # node -> uids placed there
        self._pending: dict[str, PodRecord] = {}  # "namespace/name" -> the pod, while not bound and not finished
        self._queues: defaultdict[str, deque[str]] = defaultdict(deque)  # node -> uids waiting to write
        self._writing: defaultdict[str, set[str]] = defaultdict(set)  # node -> uids writing now
        self._nodes_synced = False
        self._pods_synced = False
        self._seq = 0
        self._generation = 0  # +1 whenever a node entry changes (see :meth:`generation_for`)
        # (generation, node) of every single-node change since generation ``_log_floor``
        self._changes: deque[tuple[int, str]] = deque(maxlen=CHANGE_LOG)
        self._log_floor = 0
        self._bind_wait_ms = int(bind_wait_s * 1000)
        self._takes_turns = bind_wait_s > 0
        self._bind_window = bind_window
        self._now_ms = now_ms

    def now_ms(self) -> int:
        """Wall-clock ms on the cache's clock (what assignments are stamped with)."""
        return self._now_ms()

    # --- sync ------------------------------------------------------------------------------
    @property
    def synced(self) -> bool:
        """Both nodes and pods have been listed at least once."""
        with self._changed:
            return self._nodes_synced and self._pods_synced

    def wait_synced(self, timeout_s: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self._nodes_synced and self._pods_synced, timeout=timeout_s)

    def sizes(self) -> tuple[int, int]:
        """(nodes, placements) held now."""
        with self._changed:
            return len(self._nodes), len(self._placements)

    # --- nodes (from the API) --------------------------------------------------------------
    def replace_nodes(self, records: Iterable[NodeRecord]) -> None:
        """A fresh list of all nodes."""
        with self._changed:
            self._nodes = {record.name: self._node_entry(record) for record in records}
            self._changed_all()
            self._nodes_synced = True
            self._notify()

    def upsert_node(self, record: NodeRecord) -> None:
        """A node was added or changed (most changes, e.g. heartbeats, leave the inventory alone)."""
        with self._changed:
            entry = self._node_entry(record)
            if entry is not self._nodes.get(record.name):
                self._nodes[record.name] = entry
                self._changed_node(record.name)
                self._notify()

    def delete_node(self, name: str) -> None:
        with self._changed:
            if self._nodes.pop(name, None) is not None:
                self._changed_node(name)
            self._notify()

    def _notify(self) -> None:
        """Something changed: wake whoever waits for the cache, and in each node's queue of binds the
        first (only it can get its turn: :meth:`_gate`). Waking every bind waiting for its turn, as a
        single condition did, made each change wake all of them; with binpack most wait on one node,
        and that cost the extender ~15 % of its CPU in ``bench.scheduling_throughput``."""
        self._changed.notify_all()
        for queue in self._queues.values():
            if queue and (turn := self._turn_waiters.get(queue[0])) is not None:
                turn.notify()

    def _changed_node(self, name: str) -> None:
        self._generation += 1
        self._changes.append((self._generation, name))

    def _changed_all(self) -> None:
        self._generation += 1
        self._changes.clear()
        self._log_floor = self._generation

    def _node_entry(self, record: NodeRecord) -> NodeEntry:
        current = self._nodes.get(record.name)
        if current is not None and current.inventory_text == record.inventory_text:
            return current
        return NodeEntry.from_inventory(record.name, record.inventory_text).rebuilt(self._pods_on(record.name))

    def _pods_on(self, node: str) -> list[PodOnGpu]:
        placed = sorted((self._placements[uid] for uid in self._on_node.get(node, ())),
                        key=lambda p: (p.assigned_at_ms, p.uid))
        return [(p.uid, p.gpu_uuid, p.share, p.model) for p in placed]

    # --- pods (from the API) ---------------------------------------------------------------
    def begin_relist(self) -> int:
        """Call before listing pods; pass the answer to :meth:`replace_pods`."""
        with self._changed:
            return self._seq

    def replace_pods(self, records: Iterable[PodRecord], started_seq: int) -> None:
        """A fresh list of all pods; keeps binds the list cannot know about yet."""
        with self._changed:
            fresh: dict[str, Placement] = {}
            self._pending = {}
            for record in records:
                if _pending(record):
                    self._pending[record.key] = record
                read = self._read(record)
                placement = placement_from_api(record, read.assignment)
                if placement is not None:
                    fresh[record.uid] = placement
                elif read.problem is not None and not record.finished and record.uid in self._placements:
                    fresh[record.uid] = self._placements[record.uid]  # a forgery over one we hold: keep ours
            for uid, old in self._placements.items():
                listed = fresh.get(uid)
                same = listed is not None and same_assignment(listed, old)
                if old.in_flight:
                    old.seen = old.seen or same
                    fresh[uid] = old
                elif listed is not None and listed.assigned_at_ms < old.assigned_at_ms:
                    fresh[uid] = old  # older than ours: a list from before our share change's write, or a replay
                elif not old.seen and old.done_seq > started_seq and not same:
                    fresh[uid] = old  # bound after the list began: the list may predate our write
            self._placements = fresh
            self._on_node = defaultdict(set)
            for placement in fresh.values():
                self._on_node[placement.node].add(placement.uid)
            self._nodes = {name: entry.rebuilt(self._pods_on(name)) for name, entry in self._nodes.items()}
            self._changed_all()
            self._pods_synced = True
            self._notify()
            large = len(self._nodes) >= COLLECT_AFTER_RELIST_NODES
        if large:
            # A relist of a large cluster makes hundreds of thousands of objects at once; left to
            # itself the collector's next full pass (0.3 s at 5,000 nodes) lands on a random later
            # request. Pay it here, with the relist, so requests do not. What survives (the cache)
            # is then frozen, so later collections no longer walk it: at 5,000 nodes they added
            # ~6 ms to the p99 of filter under a steady stream of binds (bench.extender_latency).
            # Unfreezing first lets this pass free the previous relist's cache, cycles included.
            gc.unfreeze()
            gc.collect()
            gc.freeze()

    def upsert_pod(self, record: PodRecord) -> None:
        """A pod was added or changed."""
        with self._changed:
            if _pending(record):
                self._pending[record.key] = record
            else:
                self._forget_pending(record)
            old = self._placements.get(record.uid)
            if record.finished:
                if old is not None:
                    self._drop(old)
                return
            read = self._read(record)
            if old is None:
                if read.assignment is not None:
                    self._place(placement_of(record, read.assignment))
            else:
                self._update_placed(old, record, read)

    def _update_placed(self, old: Placement, record: PodRecord, read: ReadAssignment) -> None:
        """What the API now shows of a pod we hold a placement for."""
        assignment = read.assignment
        if old.in_flight or not old.seen:
            if assignment is not None and old.matches(assignment):  # our write came back
                self._refresh(old, record)
        elif read.problem is not None:
            pass  # an untrusted assignment over one we hold: the pod keeps what we placed
        elif assignment is None:
            self._unplace(old)  # the assignment was removed
        elif assignment.assigned_at_ms < old.assigned_at_ms:
            self._ignore_older(record, old, assignment.assigned_at_ms)
        elif old.matches(assignment):
            self._refresh(old, record)
            self._follow_share(old, assignment.share)
        else:
            self._unplace(old)
            self._place(placement_of(record, assignment))

    def _ignore_older(self, record: PodRecord, placement: Placement, older_ms: int) -> None:
        """An assignment older than the placement's (a replay, or an event from before our own
        write): the pod keeps what we placed; logged once per pod and time."""
        seen = (record.uid, older_ms)
        if seen not in self._older_logged:
            self._older_logged[seen] = None
            while len(self._older_logged) > DISTRUSTED_REMEMBERED:
                self._older_logged.popitem(last=False)
            log.warning("pod=%s uid=%s assignment of %d ms not followed: older than the one held (%d ms), "
                        "the pod keeps %s", record.key, record.uid, older_ms, placement.assigned_at_ms,
                        placement.share.describe())

    def _read(self, record: PodRecord) -> ReadAssignment:
        """The pod's assignment if we can trust it; an untrusted one is logged once per pod."""
        read = read_assignment(record, self.trust)
        if read.problem is not None and record.uid not in self._distrusted:
            self._distrusted[record.uid] = None
            while len(self._distrusted) > DISTRUSTED_REMEMBERED:
                self._distrusted.popitem(last=False)
            log.warning("pod=%s uid=%s assignment not counted: %s", record.key, record.uid, read.problem)
        return read

    def _follow_share(self, placement: Placement, share: ShareSpec) -> None:
        """The API shows ``share`` in the pod's assignment: a live change of ours coming back, one
        older than ours (ignored while ours is pending), or one we did not make (followed)."""
        if share == placement.share:
            placement.share_pending = False
        elif not placement.share_pending:
            self._reshare(placement, share)

    def _reshare(self, placement: Placement, share: ShareSpec) -> None:
        placement.share = share
        entry = self._nodes.get(placement.node)
        if entry is not None:
            self._nodes[placement.node] = entry.with_pod(placement.uid, placement.gpu_uuid, share, placement.model)
            self._changed_node(placement.node)
        self._notify()

    # --- live share changes ------------------------------------------------------------------
    def begin_share_change(self, uid: str, wanted: ShareSpec) -> ShareChangeStart | None:
        """Take ``wanted`` on the bound pod's GPU in place of its share, if it may have it (a parked
        pod whose wake does not fit takes request 0 with ``wanted``'s limit instead:
        :attr:`ShareChangeStart.short_of` says why).

        None if there is nothing to change here (the pod is not placed and bound, a bind or
        another change of it is in progress, or it has that share already); raises
        :class:`ShareChangeRefused` saying why the pod keeps its share. End every start with
        :meth:`end_share_change`.
        """
        with self._changed:
            placement = self._placements.get(uid)
            if (placement is None or placement.in_flight or not placement.bound or not placement.seen
                    or placement.share_pending or placement.share == wanted):
                return None
            entry = self._nodes.get(placement.node)
            if entry is None or entry.state is None:
                raise ShareChangeRefused(f"node {placement.node} has no usable GPU inventory in the extender's "
                                         f"cache; the share stays {placement.share.describe()}")
            change = entry.judge_change(uid, placement.gpu_uuid, placement.share, wanted, placement.model)
            start = ShareChangeStart(uid=uid, node=placement.node, gpu_uuid=placement.gpu_uuid,
                                     gpu_index=placement.gpu_index,
                                     assigned_at_ms=max(self._now_ms(), placement.assigned_at_ms + 1),
                                     old=placement.share, new=change.share, old_assigned_at_ms=placement.assigned_at_ms,
                                     asked=wanted if change.share != wanted else None, short_of=change.short_of)
            self._reshare(placement, change.share)
            placement.assigned_at_ms = start.assigned_at_ms
            placement.share_pending = True
            return start

    def end_share_change(self, start: ShareChangeStart, written: bool) -> None:
        """The change was written (it stays pending until the API shows it) or not (the old share
        comes back, unless the API has shown the new one meanwhile)."""
        with self._changed:
            placement = self._placements.get(start.uid)
            if placement is None or written or not placement.share_pending or placement.share != start.new:
                return
            placement.share_pending = False
            placement.assigned_at_ms = start.old_assigned_at_ms
            self._reshare(placement, start.old)

    def delete_pod(self, record: PodRecord) -> None:
        with self._changed:
            self._forget_pending(record)
            old = self._placements.get(record.uid)
            if old is not None:
                self._drop(old)

    def _forget_pending(self, record: PodRecord) -> None:
        held = self._pending.get(record.key)
        if held is not None and held.uid == record.uid:
            del self._pending[record.key]

    def pending_pod(self, key: str, uid: str) -> PodRecord | None:
        """Pod ``key`` (namespace/name) as the watch last showed it, if that is pod ``uid``, not bound,
        not finished, and no bind of ours is binding or has bound it (the watch may not show that yet);
        else None: ask the API server."""
        with self._changed:
            pod = self._pending.get(key)
            if pod is None or pod.uid != uid:
                return None
            placement = self._placements.get(uid)
            if placement is not None and (placement.in_flight or placement.bound):
                return None
            return pod

    def _refresh(self, placement: Placement, record: PodRecord) -> None:
        placement.seen = True
        placement.bound = placement.bound or bool(record.node_name)
        if record.allocated and not placement.allocated:
            placement.allocated = True
            self._notify()

    def _drop(self, placement: Placement) -> None:
        """The pod is gone: free its share now, or when our bind of it ends."""
        if placement.in_flight:
            placement.gone = True
        else:
            self._unplace(placement)

    def _place(self, placement: Placement) -> None:
        self._placements[placement.uid] = placement
        self._on_node[placement.node].add(placement.uid)
        entry = self._nodes.get(placement.node)
        if entry is not None:
            self._nodes[placement.node] = entry.with_pod(placement.uid, placement.gpu_uuid, placement.share,
                                                         placement.model)
            self._changed_node(placement.node)

    def _unplace(self, placement: Placement) -> None:
        self._placements.pop(placement.uid, None)
        self._on_node[placement.node].discard(placement.uid)
        entry = self._nodes.get(placement.node)
        if entry is not None:
            self._nodes[placement.node] = entry.without_pod(placement.uid)
            self._changed_node(placement.node)
        self._notify()

    # --- reading for filter and prioritize -------------------------------------------------
    def generation_for(self, pod_uid: str) -> tuple[int, str | None]:
        """The cache generation (it changes whenever any node's entry changes) and the node of
        the pod's own stale assignment, which :meth:`entries_for` leaves out (None if none):
        equal answers mean equal entries for every node."""
        with self._changed:
            own = self._placements.get(pod_uid)
            return self._generation, (own.node if own is not None and not own.in_flight and not own.bound else None)

    def changed_entries(self, since: int) -> tuple[int, dict[str, NodeEntry | None]] | None:
        """The generation now and the entries (None: deleted) of the nodes changed after generation
        ``since``; None if the cache cannot tell (a relist since, or more changes than it keeps)."""
        with self._changed:
            changes = self._changes
            if since < self._log_floor or (changes and changes[0][0] > since + 1):
                return None  # every generation after the floor is logged, until the log drops its oldest
            names: set[str] = set()
            for generation, name in reversed(changes):
                if generation <= since:
                    break
                names.add(name)
            nodes = self._nodes
            return self._generation, {name: nodes.get(name) for name in names}

    def entries_for(self, pod_uid: str, names: Sequence[str]) -> list[NodeEntry | None]:
        """The entries of ``names`` (None if unknown), without the pod's own stale assignment."""
        return self.entries_and_generation(pod_uid, names)[0]

    def entries_and_generation(self, pod_uid: str, names: Sequence[str]) -> tuple[list[NodeEntry | None], int]:
        """:meth:`entries_for` and the generation they belong to, read together."""
        with self._changed:
            nodes = self._nodes
            entries = [nodes.get(name) for name in names]
            generation = self._generation
            own = self._placements.get(pod_uid)
            stale_node = own.node if own is not None and not own.in_flight and not own.bound else None
        if stale_node is not None:
            entries = [entry.without_pod(pod_uid) if entry is not None and entry.name == stale_node else entry
                       for entry in entries]
        return entries, generation

    def snapshot(self) -> Snapshot:
        with self._changed:
            return Snapshot(
                synced=self._nodes_synced and self._pods_synced,
                nodes=dict(self._nodes),
                placements=[attrs.evolve(p) for p in self._placements.values()],
                waiting={node: [self._placements[uid].pod_key for uid in queue if uid in self._placements]
                         for node, queue in self._queues.items() if queue},
            )

    # --- binds ------------------------------------------------------------------------------
    def reserve(self, *, uid: str, pod_key: str, node: str, share: ShareSpec, policy: Policy,
                model: ModelRef | None = None) -> Reservation:
        """Choose the GPU of ``node`` that ``policy`` prefers for a pod of ``model`` and hold the share
        (and the model, if not there yet) there.

        The caller must end every reservation with :meth:`finish_bind`.
        """
        with self._changed:
            if not (self._nodes_synced and self._pods_synced):
                raise ReservationRefused("the extender's cache has not synced with the API server yet")
            old = self._placements.get(uid)
            if old is not None and old.in_flight:
                raise ReservationRefused(f"a bind of pod {pod_key} is already in progress")
            if old is not None:
                self._unplace(old)  # the assignment of an earlier attempt that did not bind
            choice = self._choose(node, share, policy, model)
            placement = Placement(uid=uid, pod_key=pod_key, node=node, gpu_uuid=choice.uuid,
                                  gpu_index=choice.index, share=share, assigned_at_ms=self._now_ms(),
                                  in_flight=True, seen=False, model=model)
            self._place(placement)
            if self._takes_turns:
                self._queues[node].append(uid)
            return Reservation(uid=uid, pod_key=pod_key, node=node, gpu_uuid=choice.uuid,
                               gpu_index=choice.index, share=share, model=model)

    def _choose(self, node: str, share: ShareSpec, policy: Policy, model: ModelRef | None) -> GpuPick:
        entry = self._nodes.get(node)
        if entry is None:
            raise ReservationRefused(f"node {node} is not in the extender's cache")
        verdict = entry.verdict(share, policy, model)
        if verdict is None:
            raise ReservationRefused(entry.problem)
        if verdict.choice is None:
            raise ReservationRefused(verdict.reason)
        return GpuPick(verdict.choice.uuid, verdict.choice.index)

    def wait_turn(self, uid: str, node: str, timeout_s: float) -> bool:
        """Block until this bind may write to ``node``; False if it gave up after ``timeout_s``.

        ``uid`` must be in the node's queue (:meth:`reserve` puts it there): a bind is woken when it
        is first in the queue. Either way the bind then counts as writing to the node until
        :meth:`finish_bind`. Without turns (``bind_wait_s`` 0) every bind may write at once.
        """
        if not self._takes_turns:
            return True
        deadline = time.monotonic() + timeout_s
        with self._changed:
            turn = self._turn_waiters[uid] = threading.Condition(self._lock)
            try:
                while (opens_at_ms := self._gate(node, uid)) is not None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    if opens_at_ms != math.inf:
                        remaining = min(remaining, max((opens_at_ms - self._now_ms()) / 1000, 0.001))
                    turn.wait(remaining)
                return True
            finally:
                del self._turn_waiters[uid]
                if uid in self._queues[node]:
                    self._queues[node].remove(uid)
                self._writing[node].add(uid)
                self._notify()

    def _gate(self, node: str, uid: str) -> float | None:
        """None if ``uid`` may write to ``node`` now, else the wall-clock ms when the gate
        opens by itself (``inf``: only when something changes)."""
        queue = self._queues[node]
        writing = len(self._writing[node] - {uid})
        if (queue and queue[0] != uid) or writing >= self._bind_window:
            return math.inf
        now = self._now_ms()
        expiries = []  # when each pod waiting for the node agent stops counting
        for other in self._on_node.get(node, ()):
            placement = self._placements[other]
            if other != uid and placement.bound and not placement.allocated and not placement.in_flight:
                expiry = placement.assigned_at_ms + self._bind_wait_ms
                if expiry > now:
                    expiries.append(expiry)
        busy = writing + len(expiries)
        if busy < self._bind_window:
            return None
        return sorted(expiries)[busy - self._bind_window]  # then one fewer than the window is busy

    def stamp(self, uid: str, assigned_at_ms: int) -> None:
        """Record the assignment time a bind is about to write, so its write is recognised."""
        with self._changed:
            placement = self._placements.get(uid)
            if placement is not None:
                placement.assigned_at_ms = assigned_at_ms

    def finish_bind(self, uid: str, node: str, outcome: BindOutcome) -> None:
        """End a reservation: keep the share if the pod was bound (or stays assigned), else free it."""
        with self._changed:
            self._writing[node].discard(uid)
            if uid in self._queues[node]:
                self._queues[node].remove(uid)
            for turns in (self._writing, self._queues):
                if not turns[node]:
                    del turns[node]
            placement = self._placements.get(uid)
            if placement is not None:
                placement.in_flight = False
                if placement.gone or outcome is BindOutcome.RELEASED:
                    self._unplace(placement)
                elif outcome is BindOutcome.BOUND:
                    self._seq += 1
                    placement.bound, placement.done_seq = True, self._seq
                else:
                    placement.seen = True
            self._notify()


def _pending(record: PodRecord) -> bool:
    """Whether a pod may still be bound: not bound, not finished, not being deleted."""
    return not record.node_name and not record.finished and not record.deleting


@attrs.frozen
class GpuPick:
    uuid: str
    index: int
