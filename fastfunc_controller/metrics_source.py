"""The function controller's adapter to the gateways' metrics ("direct mode"): with
:mod:`.prometheus_source` (Prometheus mode, the same rate source interface), the only modules of the
controller that speak HTTP.

:class:`GatewayMetrics` scrapes each gateway's ``/metrics`` (``--gateway-url``, repeatable) when
:meth:`~GatewayMetrics.scrape` is called, sums ``gateway_function_invocation_started_total`` over the
status codes per ``function_name`` (prometheus_client's text parser), and hands the round to a
:class:`~.rates.RateTracker`, which differentiates the counters (resets included) and sums the
gateways. :meth:`~GatewayMetrics.read` answers a function's rate over a long and a short window, or
one line saying why it cannot (no gateway given, none answers, stale, no two rounds yet).

:class:`QueueWorkers` scrapes each queue worker's ``/metrics`` (``--queue-worker-url``, repeatable,
each replica behind a headless Service read on its own as the gateways are) for
``fastgshare_queue_pending``; :class:`QueuedDemand` wraps a rate source (this one or Prometheus
mode's) and adds the pending requests to its rates (:func:`~.rates.with_pending`). A worker that
does not answer counts no pending requests (it calls nothing either, so nothing would drain them
sooner); the rates of the gateways are given as they are, never held back by a worker.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from prometheus_client.parser import text_string_to_metric_families

from fastfunc_controller.rates import ARRIVALS, QUEUE_PENDING, Rates, RateTracker, pending_of, with_pending

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_S = 2.0
STALE_S = 10.0  # rates from rounds older than this (or 3 short windows) are not given
MAX_METRICS_BYTES = 16 * 1024 * 1024
NO_GATEWAY = ("no gateway to read request rates from: start the function controller with --gateway-url URL "
              "(each gateway replica) or --prometheus-url URL; the current plan is kept")


def metrics_url(url: str) -> str:
    """``url``'s ``/metrics``: a gateway's base URL gets the path, a URL with a path is kept."""
    parts = urllib.parse.urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


def check_gateway_url(url: str) -> str | None:
    """None if ``url`` can be scraped, else one line naming it and what is allowed."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"--gateway-url {url!r} is not a URL; allowed: http[s]://HOST[:PORT][/path] (a gateway, e.g. " \
               "http://127.0.0.1:8080)"
    return None


def check_queue_worker_url(url: str) -> str | None:
    """None if ``url`` can be scraped, else one line naming it and what is allowed."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"--queue-worker-url {url!r} is not a URL; allowed: http[s]://HOST[:PORT][/path] (a queue " \
               "worker's /metrics, e.g. http://127.0.0.1:8081)"
    return None


def pending_counts(text: str) -> dict[str, float]:
    """``fastgshare_queue_pending`` (requests queued, waiting or running) per ``function_name``."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == QUEUE_PENDING and "function_name" in sample.labels:
                counts[sample.labels["function_name"]] = float(sample.value)
    return counts


def invocation_counts(text: str) -> dict[str, float]:
    """``gateway_function_invocation_started_total`` (requests arrived) per ``function_name``."""
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ARRIVALS and "function_name" in sample.labels:
                name = sample.labels["function_name"]
                counts[name] = counts.get(name, 0.0) + float(sample.value)
    return counts


def addresses(host: str) -> list[str]:
    """Every address ``host`` names: one per replica for a headless Service, else one."""
    found = {str(info[4][0]) for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    return sorted(found)


def replica_urls(url: str, resolve: Callable[[str], list[str]]) -> list[str]:
    """``url`` once per address of its host, so each gateway replica behind a headless Service is
    read on its own (their counters are separate; through a load-balanced name they would mix).
    A host that is already an address, or that does not resolve now, is kept as it is."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    try:
        ipaddress.ip_address(host)
        return [url]
    except ValueError:
        pass
    try:
        found = resolve(host)
    except OSError:
        return [url]
    port = f":{parts.port}" if parts.port else ""
    return [urllib.parse.urlunsplit(parts._replace(netloc=f"[{ip}]{port}" if ":" in ip else f"{ip}{port}"))
            for ip in found] or [url]


def fetch(url: str, timeout_s: float = SCRAPE_TIMEOUT_S) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return str(response.read(MAX_METRICS_BYTES).decode("utf-8", errors="replace"))


_Parsed = TypeVar("_Parsed")


class _Replicas:
    """The ``/metrics`` of every replica behind some URLs, each name resolved every round."""

    def __init__(self, urls: Sequence[str], *, clock: Callable[[], float], get: Callable[[str], str],
                 resolve: Callable[[str], list[str]]) -> None:
        self._urls = {url: metrics_url(url) for url in urls}
        self._clock = clock
        self._get = get
        self._resolve = resolve
        self._lock = threading.Lock()
        self._failures: dict[str, str] = {}

    @property
    def urls(self) -> list[str]:
        return list(self._urls)

    def _targets(self) -> list[str]:
        """Each replica's ``/metrics`` this round."""
        return sorted({target for url in self._urls.values() for target in replica_urls(url, self._resolve)})

    def _read_all(self, parse: Callable[[str], _Parsed]) -> tuple[list[str], dict[str, _Parsed], dict[str, str]]:
        """One round: the targets, what each that answered gave (``parse`` of its exposition), and a line
        for each that did not."""
        targets = self._targets()
        answers: dict[str, _Parsed] = {}
        failures: dict[str, str] = {}
        for target in targets:
            try:
                answers[target] = parse(self._get(target))
            except (OSError, ValueError, urllib.error.URLError) as error:  # HTTPError is an OSError
                failures[target] = f"{target}: {getattr(error, 'reason', None) or error}"
        return targets, answers, failures


class GatewayMetrics(_Replicas):
    """Request rates per function from the gateways' counters (see the module docstring)."""

    def __init__(self, urls: Sequence[str], *, clock: Callable[[], float] = time.monotonic,
                 get: Callable[[str], str] = fetch, resolve: Callable[[str], list[str]] = addresses) -> None:
        super().__init__(urls, clock=clock, get=get, resolve=resolve)
        self._tracker = RateTracker()
        self._targets_read = 0  # replicas the last round tried

    def scrape(self) -> None:
        """One round: every gateway's counters, now."""
        if not self._urls:
            return
        targets, answers, failures = self._read_all(invocation_counts)
        counts: dict[str, Mapping[str, float] | None] = {target: answers.get(target) for target in targets}
        now = self._clock()
        with self._lock:
            for target in failures.keys() - self._failures.keys():
                log.warning("cannot read the gateway's metrics at %s", failures[target])
            for target in self._failures.keys() - failures.keys():
                log.info("the gateway's metrics at %s answer again", target)
            self._failures, self._targets_read = failures, len(targets)
            self._tracker.observe(now, counts)

    def read(self, function_name: str, long_s: float, short_s: float) -> Rates | str:
        """``function_name``'s (``<fn>.<ns>``) rates, or one line saying why there are none."""
        with self._lock:
            if not self._urls:
                return NO_GATEWAY
            if self._failures and len(self._failures) == self._targets_read:
                return "no gateway answers: " + "; ".join(self._failures.values()) + "; the current plan is kept"
            last = self._tracker.last_round_s
            if last is not None and self._clock() - last > max(3 * short_s, STALE_S):
                return f"the gateways' counters were last read {self._clock() - last:.0f} s ago; the current plan " \
                       "is kept"
            rates = self._tracker.rates(function_name, long_s, short_s)
            if rates is None:
                return "the gateways' counters have not been read twice yet; the current plan is kept"
            return rates


class QueueWorkers(_Replicas):
    """The queued requests per function from the queue workers' gauges (see the module docstring)."""

    def __init__(self, urls: Sequence[str], *, clock: Callable[[], float] = time.monotonic,
                 get: Callable[[str], str] = fetch, resolve: Callable[[str], list[str]] = addresses) -> None:
        super().__init__(urls, clock=clock, get=get, resolve=resolve)
        self._counts: dict[str, dict[str, float]] = {}  # replica -> function -> pending, from its last answer
        self._read_s: dict[str, float] = {}  # replica -> when it last answered

    def scrape(self) -> None:
        """One round: every worker replica's gauge, now."""
        targets, answers, failures = self._read_all(pending_counts)
        now = self._clock()
        with self._lock:
            for target in failures.keys() - self._failures.keys():
                log.warning("cannot read the queue worker's metrics at %s; its queued requests count as 0 until "
                            "it answers", failures[target])
            for target in self._failures.keys() - failures.keys():
                log.info("the queue worker's metrics at %s answer again", target)
            self._failures = failures
            for target in self._counts.keys() - set(targets):  # a replica gone from the Service
                del self._counts[target]
                del self._read_s[target]
            for target, counts in answers.items():
                self._counts[target], self._read_s[target] = counts, now

    def pending(self, function_name: str) -> float:
        """``function_name``'s (``<fn>.<ns>``) queued requests: the largest count of the replicas read
        within :data:`STALE_S` (each reports the stream's same count), else 0."""
        with self._lock:
            now = self._clock()
            fresh = [counts for target, counts in self._counts.items() if now - self._read_s[target] <= STALE_S]
            return pending_of(fresh, function_name)


class Source(Protocol):
    """A rate source (the controller's ``RateSource``): :class:`GatewayMetrics`, Prometheus mode's."""

    def scrape(self) -> None: ...

    def read(self, function_name: str, long_s: float, short_s: float) -> Rates | str: ...


class QueuedDemand:
    """``rates``'s rates plus the requests queued for each function as ``workers`` read them
    (:func:`~.rates.with_pending`, drained within the long window)."""

    def __init__(self, rates: Source, workers: QueueWorkers) -> None:
        self._rates = rates
        self._workers = workers

    def scrape(self) -> None:
        self._rates.scrape()
        self._workers.scrape()

    def read(self, function_name: str, long_s: float, short_s: float) -> Rates | str:
        rates = self._rates.read(function_name, long_s, short_s)
        if not isinstance(rates, Rates):
            return rates
        return with_pending(rates, self._workers.pending(function_name), long_s)
