"""Time-token arbitration for one GPU: who may launch kernels now, and for how long.

A client (one pod's processes on one GPU) asks for a token; the arbiter grants tokens so
that over a sliding window ``W`` every client gets at least its *request* while it wants the
GPU, and never more than its *limit*, also when it is alone. The rules (DESIGN §5, after
FaST-GShare's token scheduler, with its starvation and overshoot holes closed):

- a client's usage is the time its grants overlap ``[now - W, now]``; when it asks again
  it reports the time it really used since its last grant started, and the grant is set to
  that: idle time is credited back, a kernel that ran past the token's end is charged;
- a client is eligible while ``limit*W - usage`` is at least half a minimum token; its token
  is never shorter than ``min_token`` (or the whole limit if that is smaller), so the window's
  usage swings within half a minimum token around the limit and averages to it; a limit of
  1 never throttles;
- and while its *credit* is not negative: credit is earned at the limit's rate (a limit of 0.25
  earns 0.25 ns a ns), at most one window's limit of it (a new client starts with that), and
  every grant's real use is spent from it. A parked client (limit 0) is never eligible; its credit
  stands still until it is woken, and the time since it last earned is then earned at the new
  limit (still at most a window's limit). The window alone cannot hold a client whose kernels
  run past its tokens to the limit: each token is admitted up to half a minimum token under the
  limit and then takes a whole kernel, and an overrun older than the window is forgotten (10 ms
  kernels at a limit of 0.25 got 113 % of it, a 20 ms kernel at 0.1 180 %); the credit pays
  every overrun back;
- eligible clients below their request go first, most starved first (largest unmet
  fraction of the request), then the others by least usage; ties by arrival;
- several clients hold tokens at once only while their SM partitions sum to <= 100 % and
  the GPU runs MPS; without MPS one client at a time;
- if a client below its request cannot be granted because the SMs are taken, nobody behind
  it gets a new token: the GPU drains to it within one token length, so bursting clients
  cannot starve it;
- a token lasts ``max(request*W, min_token)`` but no longer than the client's remaining limit
  budget in the window (and at least ``min_token``, see above).

Pure: time is an argument (nanoseconds from any monotonic origin); the caller owns clocks,
sockets and timers. Deterministic for equal inputs.

Cost: a decision looks only at the clients that wait and those that hold a token (both kept as
they change), never at every registered client, so a renewal with nobody else waiting is O(1)
plus the holders; usage is a running sum.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable

import attrs

from fastgshare import keys
from fastgshare.errors import FastGShareError

DEFAULT_WINDOW_NS = 100_000_000  # 100 ms
DEFAULT_MIN_TOKEN_NS = 2_000_000  # 2 ms: a token is never so short that a round trip dominates

ClientId = Hashable


class ArbitrationError(FastGShareError):
    """An operation on a client the arbiter does not know, or one it already knows."""


@attrs.frozen
class TimeShare:
    """The part of a pod's share the arbiter enforces."""

    request_permille: int
    limit_permille: int
    sm_percent: int


@attrs.frozen
class Grant:
    client: ClientId
    token_ns: int


@attrs.frozen
class Decision:
    """Tokens to hand out now, and when to run the scheduler again if nothing else happens."""

    grants: tuple[Grant, ...]
    wake_at_ns: int | None


@attrs.define
class _Client:
    share: TimeShare
    arrival: int  # order of registration, the last tie-breaker
    # Grants (start, end), oldest first. They never overlap: a client holds one token at a time.
    history: deque[tuple[int, int]] = attrs.field(factory=deque)
    history_ns: int = 0  # the summed length of ``history``, so usage is O(1)
    waiting_since: int | None = None  # set while the client waits for a token
    holding_until: int | None = None  # end of the current token, while it runs
    # The long-run budget (the module docstring's credit rule), in ns × TIME_UNITS so that earning
    # limit_permille per ns is exact: earned up to ``credit_at``, spent by every grant's real use.
    credit: int = 0
    credit_at: int | None = None  # None until the client first asks: it starts with a full window's limit

    def add_grant(self, start: int, end: int) -> None:
        self.history.append((start, end))
        self.history_ns += end - start
        self.credit -= (end - start) * keys.TIME_UNITS

    def set_last_grant_end(self, end: int) -> None:
        start, old_end = self.history[-1]
        self.history[-1] = (start, end)
        self.history_ns -= old_end - end
        self.credit += (old_end - end) * keys.TIME_UNITS

    def earn(self, now_ns: int, window_ns: int) -> int:
        """Bring the credit up to ``now_ns`` (at most a window's limit) and return it. A parked client
        (limit 0) runs nothing, so it earns nothing and loses nothing: its credit, and the time since
        it was last brought up, wait for the share it is woken to (else the time it was idle before it
        was parked would be lost, and a debt could never be paid back)."""
        if self.share.limit_permille == 0:
            return self.credit
        cap = self.share.limit_permille * window_ns
        if self.credit_at is None:
            self.credit = cap
        elif now_ns > self.credit_at:
            self.credit = min(cap, self.credit + (now_ns - self.credit_at) * self.share.limit_permille)
        if self.credit_at is None or now_ns > self.credit_at:
            self.credit_at = now_ns
        return self.credit

    def forget_before(self, time_ns: int) -> None:
        """Drop grants that ended at or before ``time_ns``."""
        while self.history and self.history[0][1] <= time_ns:
            start, end = self.history.popleft()
            self.history_ns -= end - start

    def usage(self, now_ns: int, window_ns: int) -> int:
        """Overlap of the grants with ``[now - window, now]``, from the running sum."""
        history = self.history
        cutoff = now_ns - window_ns
        if not history:
            return 0
        if history[0][1] <= cutoff:
            self.forget_before(cutoff)
            if not history:
                return 0
        usage = self.history_ns
        first_start, first_end = history[0]
        if first_start < cutoff:
            usage -= (first_end if first_end < cutoff else cutoff) - first_start
        last_start, last_end = history[-1]
        if last_end > now_ns:
            usage -= last_end - (last_start if last_start > now_ns else now_ns)
        return usage if usage > 0 else 0


class GpuArbiter:
    """The token scheduler of one GPU."""

    def __init__(self, *, window_ns: int = DEFAULT_WINDOW_NS, min_token_ns: int = DEFAULT_MIN_TOKEN_NS,
                 mps_enabled: bool = True) -> None:
        if window_ns <= 0 or not 0 < min_token_ns <= window_ns:
            raise ArbitrationError(f"need window_ns > 0 and 0 < min_token_ns <= window_ns, "
                                   f"got {window_ns} and {min_token_ns}")
        self.window_ns = window_ns
        self.min_token_ns = min_token_ns
        self.mps_enabled = mps_enabled
        self._clients: dict[ClientId, _Client] = {}
        self._arrivals = 0
        # The clients with ``waiting_since`` set, and those with ``holding_until`` set: a decision
        # looks at these only.
        self._waiting: dict[ClientId, _Client] = {}
        self._holders: dict[ClientId, _Client] = {}

    # --- membership --------------------------------------------------------------------
    def add_client(self, client: ClientId, share: TimeShare) -> None:
        if client in self._clients:
            raise ArbitrationError(f"client {client!r} is already registered")
        self._arrivals += 1
        self._clients[client] = _Client(share, self._arrivals)

    def update_share(self, client: ClientId, share: TimeShare) -> None:
        """Change a running client's share; it applies from the next scheduling decision."""
        self._client(client).share = share

    def remove_client(self, client: ClientId) -> None:
        """Forget a client at once: its token and its SMs are free for others."""
        self._clients.pop(client, None)
        self._waiting.pop(client, None)
        self._holders.pop(client, None)

    @property
    def clients(self) -> tuple[ClientId, ...]:
        return tuple(self._clients)

    def share(self, client: ClientId) -> TimeShare:
        return self._client(client).share

    # --- the protocol --------------------------------------------------------------------
    def request(self, client: ClientId, now_ns: int, used_ns: int) -> None:
        """The client asks for a token, having used ``used_ns`` of its previous one."""
        self.release(client, now_ns, used_ns)
        state = self._client(client)
        if state.waiting_since is None:
            state.waiting_since = now_ns
            self._waiting[client] = state

    def release(self, client: ClientId, now_ns: int, used_ns: int) -> None:
        """The client is done with its current token and used ``used_ns`` of GPU time from its
        start (its SMs free up). Less than the token is credited back; more (a launch that ran
        past the token's end) is charged, never past ``now``."""
        state = self._client(client)
        if state.history:
            start, _ = state.history[-1]
            state.earn(now_ns, self.window_ns)
            state.set_last_grant_end(max(start, min(start + max(used_ns, 0), now_ns)))
        if state.holding_until is not None:
            state.holding_until = None
            del self._holders[client]

    def is_waiting(self, client: ClientId) -> bool:
        return self._client(client).waiting_since is not None

    @property
    def anyone_waiting(self) -> bool:
        """Whether any client waits for a token: without one, no decision can grant anything."""
        return bool(self._waiting)

    def holding_until(self, client: ClientId) -> int | None:
        """When the client's current token ends, if it holds one."""
        return self._client(client).holding_until

    def usage_ns(self, client: ClientId, now_ns: int) -> int:
        """Time the client's grants overlap the window ending at ``now_ns``."""
        return self._client(client).usage(now_ns, self.window_ns)

    def schedule(self, now_ns: int) -> Decision:
        """Grant what the rules allow at ``now_ns``; say when to look again."""
        holders = self._release_expired(now_ns) if self._holders else []
        sm_taken = 0
        wake_candidates: list[int | None] = []
        for holder in holders:
            sm_taken += holder.share.sm_percent
            wake_candidates.append(holder.holding_until)
        grants: list[Grant] = []
        if self._waiting:
            anyone_holding = bool(holders)
            for client, state, usage in self._eligible_in_order(now_ns, wake_candidates):
                share = state.share
                fits = (sm_taken + share.sm_percent <= keys.SM_UNITS) if self.mps_enabled else not anyone_holding
                if not fits:
                    if usage < self._request_ns(share):
                        break  # a starved client waits for the GPU to drain; nobody jumps ahead of it
                    continue
                token = self._token_ns(share, usage)
                end = now_ns + token
                state.earn(now_ns, self.window_ns)
                state.add_grant(now_ns, end)
                state.waiting_since = None
                del self._waiting[client]
                state.holding_until = end
                self._holders[client] = state
                sm_taken += share.sm_percent
                anyone_holding = True
                grants.append(Grant(client, token))
                wake_candidates.append(end)
        future = [t for t in wake_candidates if t is not None and t > now_ns]
        return Decision(tuple(grants), min(future) if future else None)

    # --- internals -------------------------------------------------------------------
    def _client(self, client: ClientId) -> _Client:
        try:
            return self._clients[client]
        except KeyError:
            raise ArbitrationError(f"client {client!r} is not registered") from None

    def _release_expired(self, now_ns: int) -> list[_Client]:
        """End the tokens that are over; the holders left. (A client's old grants are dropped
        when its usage is next read: clients that neither wait nor hold gain no grants.)"""
        if not self._holders:
            return []
        holders = []
        expired = []
        for client, state in self._holders.items():
            until = state.holding_until
            if until is not None and until <= now_ns:
                state.holding_until = None
                expired.append(client)
            else:
                holders.append(state)
        for client in expired:
            del self._holders[client]
        return holders

    def _request_ns(self, share: TimeShare) -> int:
        return share.request_permille * self.window_ns // keys.TIME_UNITS

    def _limit_ns(self, share: TimeShare) -> int:
        return share.limit_permille * self.window_ns // keys.TIME_UNITS

    def _eligible_in_order(self, now_ns: int,
                           wake_candidates: list[int | None]) -> list[tuple[ClientId, _Client, int]]:
        """Waiting clients with limit budget left, in priority order. Adds to ``wake_candidates``
        the time each over-limit waiting client becomes eligible again."""
        ranked = []
        window, min_token = self.window_ns, self.min_token_ns
        for client, state in self._waiting.items():
            usage = state.usage(now_ns, window)
            share = state.share
            if share.limit_permille < keys.TIME_UNITS:
                limit = share.limit_permille * window // keys.TIME_UNITS
                need = (min_token if min_token < limit else limit) // 2
                if limit - usage < (need if need > 1 else 1):
                    wake_candidates.append(_when_usage_at_most(state.history, limit - need, now_ns, window))
                    continue
                credit = state.earn(now_ns, window)
                if credit < 0:  # a kernel ran past its token: paid back before the next one
                    wake_candidates.append(now_ns - credit // share.limit_permille)  # rounded up
                    continue
            request = share.request_permille * window // keys.TIME_UNITS
            since = state.waiting_since or 0  # set for every client in ``_waiting``
            if usage < request:
                starvation = (request - usage) / request
                key: tuple[int, float, int] = (0, -starvation, since)
            else:
                key = (1, usage, since)
            ranked.append((key, state.arrival, client, state, usage))
        if len(ranked) == 1:
            _, _, client, state, usage = ranked[0]
            return [(client, state, usage)]
        ranked.sort(key=lambda item: (item[0], item[1]))
        return [(client, state, usage) for _, _, client, state, usage in ranked]

    def _token_ns(self, share: TimeShare, usage: int) -> int:
        base = max(self._request_ns(share), self.min_token_ns)
        if share.limit_permille >= keys.TIME_UNITS:
            return base  # an uncapped client
        limit = self._limit_ns(share)
        return max(min(base, limit - usage), min(self.min_token_ns, limit))


def _usage(history: deque[tuple[int, int]], now_ns: int, window_ns: int) -> int:
    start = now_ns - window_ns
    return sum(max(0, min(end, now_ns) - max(begin, start)) for begin, end in history)


def _when_usage_at_most(history: deque[tuple[int, int]], target: int, now_ns: int, window_ns: int) -> int:
    """The earliest time >= now at which the window's usage has fallen to ``target``.

    With no new grants, usage(t) is piecewise linear and non-increasing for t >= now (grants
    slide out of the window's left edge); walk its breakpoints.
    """
    if _usage(history, now_ns, window_ns) <= target:
        return now_ns
    points = sorted({p + window_ns for grant in history for p in grant if p + window_ns > now_ns})
    previous = now_ns
    for point in points:
        if _usage(history, point, window_ns) <= target:
            # usage falls linearly between breakpoints: solve for the crossing
            high, low = _usage(history, previous, window_ns), _usage(history, point, window_ns)
            if high == low:
                return point
            return previous - (-(high - target) * (point - previous) // (high - low))  # rounded up
        previous = point
    return points[-1] if points else now_ns
