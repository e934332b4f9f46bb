"""Request rates from the gateways' invocation counters, differentiated here (pure: no I/O, no clock).

Each gateway exports ``gateway_function_invocation_started_total{function_name="<fn>.<ns>"}``, a
counter per process of the requests that *arrived* (counted before they wait, are served or are
refused): the demand. The completed ones (``gateway_function_invocation_total``) would understate
it under overload (completions cannot exceed the capacity) and show nothing for a function at zero
pods whose requests the gateway holds while it waits for a first pod, so it could never wake.
:class:`RateTracker` is given, every scrape round, each gateway's counts (or None where a gateway
did not answer) and the round's time, and keeps per function the cumulative increase over all
gateways:

- a count below the gateway's previous one is a reset (the gateway restarted): its increase is the
  new count (it counted from 0);
- a function a gateway no longer lists counts as 0 there (a restarted gateway that has not served
  it yet); one it lists for the first time has counted from 0;
- a gateway seen for the first time gives its counts as the baseline, not as an increase;
- a gateway that did not answer keeps its previous counts: what it served meanwhile shows in the
  round it answers again.

:meth:`RateTracker.rate` is the increase over the last ``window_s`` (the round at or before the
window's start, else the oldest kept) divided by the time between those rounds: requests per second.

Asynchronous invocations wait in NATS JetStream until a queue worker calls the function through a
gateway; the workers export ``fastgshare_queue_pending{function_name="<fn>.<ns>"}``, the requests
stored and not yet acknowledged (waiting or running). They are demand the arrivals counter has not
seen yet (a queued request reaches a gateway only when a worker calls it), so :func:`with_pending`
adds them as a rate: ``pending / drain_s``, the rate that serves the backlog within ``drain_s`` (the
controller's long window), to the long and the short window alike. A function with requests queued
and no arrivals therefore gets a rate above 0, which plans at least one pod (scale from zero); a
backlog raises the rate further, a drained queue adds nothing. Every worker replica reports the
stream's same count, so the replicas' values are combined with ``max`` (:func:`pending_of`), never
summed. A request being called counts twice for as long as its call runs (pending, and an arrival at
the gateway): at an async rate ``r`` and call latency ``t`` that adds ``r * t / drain_s``, small
beside ``r`` unless calls last as long as the window.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping

import attrs

ARRIVALS = "gateway_function_invocation_started_total"
QUEUE_PENDING = "fastgshare_queue_pending"  # the queue workers' gauge (fastgshare_queue.metrics.PENDING)


@attrs.frozen(kw_only=True)
class Rates:
    """A function's request rate over a long (stable) and a short (panic) window, in req/s."""

    long: float
    short: float


def function_name(namespace: str, name: str) -> str:
    """The gateway's ``function_name`` label value: ``<fn>.<ns>``."""
    return f"{name}.{namespace}"


class RateTracker:
    """Cumulative increases per function over scrape rounds; see the module docstring."""

    def __init__(self, history_s: float = 120.0) -> None:
        self._history_s = history_s
        self._last: dict[str, dict[str, float]] = {}  # gateway -> function -> count at its last answer
        self._totals: dict[str, float] = {}  # function -> increase summed over gateways since the start
        self._rounds: collections.deque[tuple[float, dict[str, float]]] = collections.deque()

    def observe(self, now_s: float, counts: Mapping[str, Mapping[str, float] | None]) -> None:
        """One scrape round at ``now_s``: per gateway its counts by function (None: no answer). A
        round in which no gateway answered is not recorded."""
        answered = False
        for gateway, current in counts.items():
            if current is None:
                continue
            answered = True
            previous = self._last.get(gateway)
            if previous is not None:
                for function in previous.keys() | current.keys():
                    before, after = previous.get(function, 0.0), current.get(function, 0.0)
                    increase = after if after < before else after - before
                    if increase:
                        self._totals[function] = self._totals.get(function, 0.0) + increase
            self._last[gateway] = dict(current)
        if not answered:
            return
        if self._rounds and now_s <= self._rounds[-1][0]:
            self._rounds.pop()  # the same instant twice: keep the later totals
        self._rounds.append((now_s, dict(self._totals)))
        while len(self._rounds) > 2 and self._rounds[1][0] <= now_s - self._history_s:
            self._rounds.popleft()

    @property
    def last_round_s(self) -> float | None:
        return self._rounds[-1][0] if self._rounds else None

    def rate(self, function: str, window_s: float) -> float | None:
        """Requests per second of ``function`` over the last ``window_s`` before the latest round;
        None until two rounds exist."""
        if len(self._rounds) < 2:
            return None
        end_s, end = self._rounds[-1]
        start_s, start = self._rounds[0]
        for at_s, totals in reversed(self._rounds):
            if at_s <= end_s - window_s:
                start_s, start = at_s, totals
                break
        return (end.get(function, 0.0) - start.get(function, 0.0)) / (end_s - start_s)

    def rates(self, function: str, long_s: float, short_s: float) -> Rates | None:
        long, short = self.rate(function, long_s), self.rate(function, short_s)
        return None if long is None or short is None else Rates(long=long, short=short)


def pending_of(replicas: Iterable[Mapping[str, float]], function: str) -> float:
    """``function``'s pending requests as the queue worker replicas report them: the largest count
    (each reports the stream's same number), 0 where none lists it."""
    return max((counts.get(function, 0.0) for counts in replicas), default=0.0)


def with_pending(rates: Rates, pending: float, drain_s: float) -> Rates:
    """``rates`` with ``pending`` queued requests added as ``pending / drain_s`` req/s to both windows
    (see the module docstring); a negative or non-finite count adds nothing."""
    if not (math.isfinite(pending) and pending > 0) or not drain_s > 0:
        return rates
    queued = pending / drain_s
    return Rates(long=rates.long + queued, short=rates.short + queued)
