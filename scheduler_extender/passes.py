"""Which nodes each pod passed the filter for: what ``/bind`` may bind it to.

``/bind`` writes an assignment and creates a Binding with the extender's own rights, so it must
carry out only placements the scheduler made through this extender: the pod passed the
scheduler's own filters (node selector, affinity, taints, ...) and then ours for that node.
Filter records the nodes it passed per pod uid; bind refuses any other node, and a pod this
extender never filtered (or filtered before it restarted, or too long ago). A refused bind
sends the pod back to the scheduler's queue, which filters it again: nothing is lost.

Entries expire after ``ttl_s`` and at most ``max_pods`` are kept (the oldest go first), so a
flood of filter calls cannot grow the memory without bound.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable

DEFAULT_TTL_S = 600.0
DEFAULT_MAX_PODS = 100_000
LISTED_NODES = 10  # node names a refusal lists


class FilterPasses:
    """Per pod uid, the nodes its latest filter passed; safe to use from any thread."""

    def __init__(self, *, ttl_s: float = DEFAULT_TTL_S, max_pods: int = DEFAULT_MAX_PODS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._max_pods = max_pods
        self._clock = clock
        self._lock = threading.Lock()
        self._passed: OrderedDict[str, tuple[float, Collection[str]]] = OrderedDict()  # uid -> (expiry, nodes)

    def record(self, uid: str, nodes: Iterable[str]) -> None:
        """The filter of pod ``uid`` passed ``nodes`` (replacing what an earlier filter passed).

        A tuple is kept as it is (filter passes thousands of names per pod, and bind looks one up
        once), anything else as a frozenset.
        """
        kept: Collection[str] = nodes if isinstance(nodes, tuple) else frozenset(nodes)
        now = self._clock()
        with self._lock:
            self._passed.pop(uid, None)
            self._passed[uid] = (now + self._ttl_s, kept)
            while len(self._passed) > self._max_pods:
                self._passed.popitem(last=False)
            while self._passed:
                oldest_uid, (expiry, _) = next(iter(self._passed.items()))
                if expiry > now:
                    break
                del self._passed[oldest_uid]

    def refusal(self, uid: str, node: str) -> str | None:
        """None if pod ``uid`` passed the filter for ``node``, else why it may not be bound there."""
        with self._lock:
            expiry, nodes = self._passed.get(uid, (0.0, ()))
        if expiry <= self._clock():
            return ("this extender has no filter result for it: never filtered here, filtered before the extender "
                    f"restarted, or over {self._ttl_s:g} s ago")
        if node in nodes:
            return None
        names = sorted(set(nodes))
        listed = ", ".join(names[:LISTED_NODES]) + (f" and {len(names) - LISTED_NODES} more"
                                                   if len(names) > LISTED_NODES else "")
        return f"it passed for: {listed or 'no node'}"

    def forget(self, uid: str) -> None:
        """The pod is bound: its filter result is spent."""
        with self._lock:
            self._passed.pop(uid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._passed)
