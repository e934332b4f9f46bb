"""What the controller has asked the API server to do and not yet seen in its cache.

After creating three pods, the next reconcile may run before the watch has delivered them;
counting the cache then would create three more. So, as client-go's ReplicaSet controller does,
reconcile records the creates and deletes it is about to make, the pod handlers tick them off
as the watch reports them, and reconcile changes nothing for a FaSTPod until its expectations
are met. Creates are counted (the names are not known before the API answers); deletes are
tracked by pod uid. Expectations older than ``ttl_s`` count as met, so a lost watch event can
delay a FaSTPod but never wedge it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import attrs

DEFAULT_TTL_S = 300.0


@attrs.define
class _Pending:
    creates: int
    deletes: set[str]
    since: float


class Expectations:
    """Outstanding creates and deletes per FaSTPod key; thread-safe."""

    def __init__(self, *, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}

    def expect(self, key: str, creates: int = 0, deletes: Iterable[str] = ()) -> None:
        """Record the creates and the uids of the deletes about to be made for ``key``."""
        with self._lock:
            self._pending[key] = _Pending(creates, set(deletes), self._clock())

    def creation_observed(self, key: str) -> None:
        """A create was seen in the cache, or failed (it will never be seen)."""
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None and pending.creates > 0:
                pending.creates -= 1

    def deletion_observed(self, key: str, uid: str) -> None:
        """A delete was seen (the pod is terminating or gone), or failed."""
        with self._lock:
            pending = self._pending.get(key)
            if pending is not None:
                pending.deletes.discard(uid)

    def satisfied(self, key: str) -> bool:
        """Whether reconcile may act on ``key``'s pods again."""
        with self._lock:
            pending = self._pending.get(key)
            if pending is None:
                return True
            if (pending.creates <= 0 and not pending.deletes) or self._clock() - pending.since > self._ttl_s:
                del self._pending[key]
                return True
            return False

    def forget(self, key: str) -> None:
        with self._lock:
            self._pending.pop(key, None)
