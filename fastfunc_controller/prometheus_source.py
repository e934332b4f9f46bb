"""The function controller's adapter to Prometheus ("Prometheus mode", ``--prometheus-url``): the
request rates the reference autoscalers read, through Prometheus's HTTP API (``/api/v1/query``).

:class:`PrometheusRates` is the same rate source as :class:`~.metrics_source.GatewayMetrics`
(``scrape()`` every tick, ``read(function_name, long_s, short_s)``), asking Prometheus, per function,
for the reference's PromQL, on the arrivals counter rather than the completions one
(:mod:`.rates` says why), summed over the gateway replicas::

    sum(rate(gateway_function_invocation_started_total{function_name="<fn>.<ns>"}[10s]))

over the long window and the same over the short (panic) window, and the requests queued for it
(asynchronous invocations the queue workers have not finished), the largest of the worker replicas'
gauges (each reports the stream's same count)::

    max(fastgshare_queue_pending{function_name="<fn>.<ns>"})

added to both rates as ``pending / long window`` (:func:`~.rates.with_pending`; no series: no queued
requests, as when no queue worker runs or Prometheus does not scrape them). ``rate()`` needs two samples in
its window, so a window shorter than twice Prometheus's scrape interval of the gateways
(``--prometheus-scrape-interval-seconds``, default 1) would answer nothing: each window is clamped
to at least twice that interval (:func:`window_s`). The reference's ``[2s]`` panic window therefore
needs the gateways scraped every second or faster; scraped every 5 s, the panic window is 10 s.

What it answers, as direct mode does:

- Prometheus unreachable, or a query it refuses: no rate, one line naming the URL and the error
  (``MetricsUnavailable``, the current plan is kept); ``scrape()`` asks every tick whether
  Prometheus holds any gateway counter (``count(gateway_function_invocation_started_total)``), and while
  that fails ``read()`` does not query (the worker is not held by a Prometheus that does not answer);
- Prometheus up but without a single gateway counter series (it does not scrape the gateways, or
  every gateway is down and its series went stale, or no gateway has counted a request yet): no
  rate, one line saying so;
- gateway counters present but none of this function (it never had a request, or none for longer
  than Prometheus keeps a stale series): rate 0, as direct mode gives a function no gateway lists.

The query building and the response parsing are pure functions (:func:`rate_query`,
:func:`parse_vector`); :func:`query` is the only I/O.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from fastfunc_controller.rates import ARRIVALS, QUEUE_PENDING, Rates, with_pending

log = logging.getLogger(__name__)

QUERY_TIMEOUT_S = 2.0
STALE_S = 10.0  # as direct mode: a presence check older than this (or 3 short windows) gives no rate
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
DEFAULT_SCRAPE_INTERVAL_S = 1.0
PRESENCE_QUERY = f"count({ARRIVALS})"


class QueryError(Exception):
    """Prometheus did not answer a query with a result; the message says what it said."""


def check_prometheus_url(url: str) -> str | None:
    """None if ``url`` is a Prometheus base URL, else one line naming the flag, value and what is allowed."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        return f"--prometheus-url {url!r} is not a Prometheus URL; allowed: http[s]://HOST[:PORT][/PREFIX] (the " \
               "server's base URL, /api/v1/query is appended; e.g. http://prometheus.monitoring.svc:9090)"
    return None


def query_url(base_url: str) -> str:
    """``base_url``'s ``/api/v1/query`` (a path prefix such as ``/prometheus`` is kept)."""
    parts = urllib.parse.urlsplit(base_url)
    return urllib.parse.urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/api/v1/query"))


def window_s(window: float, scrape_interval_s: float) -> float:
    """The window Prometheus is asked for: ``window``, but at least two scrape intervals (``rate()``
    answers nothing with fewer than two samples in its window)."""
    return max(window, 2 * scrape_interval_s)


def duration(seconds: float) -> str:
    """A PromQL duration: whole seconds as ``10s``, else milliseconds (``2500ms``)."""
    millis = round(seconds * 1000)
    return f"{millis // 1000}s" if millis % 1000 == 0 else f"{millis}ms"


def label_value(value: str) -> str:
    """``value`` as a PromQL double-quoted string."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def rate_query(function_name: str, window: float) -> str:
    """The reference's PromQL on the arrivals counter, summed over the gateways: ``function_name``'s
    (``<fn>.<ns>``) req/s over the last ``window`` seconds."""
    return f"sum(rate({ARRIVALS}{{function_name={label_value(function_name)}}}[{duration(window)}]))"


def pending_query(function_name: str) -> str:
    """``function_name``'s (``<fn>.<ns>``) queued requests: the largest of the queue workers' gauges."""
    return f"max({QUEUE_PENDING}{{function_name={label_value(function_name)}}})"


def parse_vector(body: Mapping[str, Any]) -> float | None:
    """The one value of an instant query's answer (``/api/v1/query``'s JSON), None when the vector is
    empty (no series); :class:`QueryError` for an error answer or anything else."""
    if body.get("status") != "success":
        raise QueryError(f"{body.get('errorType') or 'error'}: {body.get('error') or body.get('status')!r}")
    data = body.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise QueryError("the answer is not an instant vector")
    result = data["result"]
    if not result:
        return None
    if len(result) != 1:
        raise QueryError(f"{len(result)} series where the sum gives one")
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise QueryError(f"no number in {result[0]!r}") from None
    if not math.isfinite(value):
        raise QueryError(f"the value is {value}")
    return value


def query(url: str, expr: str, timeout_s: float = QUERY_TIMEOUT_S) -> Mapping[str, Any]:
    """GET ``url`` (``.../api/v1/query``) with ``query=expr``: the JSON answer, also of an error (a
    400 or 422 carries Prometheus's reason). OSError or ValueError when there is none."""
    target = f"{url}?{urllib.parse.urlencode({'query': expr})}"
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as response:
            raw = response.read(MAX_RESPONSE_BYTES)
    except urllib.error.HTTPError as error:
        raw = error.read(MAX_RESPONSE_BYTES)
        try:
            body = json.loads(raw)
        except ValueError:
            raise OSError(f"HTTP {error.code} {error.reason}") from None
        if not isinstance(body, Mapping):
            raise OSError(f"HTTP {error.code} {error.reason}") from None
        return body
    body = json.loads(raw)
    if not isinstance(body, Mapping):
        raise ValueError("the answer is not a JSON object")
    return body


class PrometheusRates:
    """Request rates per function from Prometheus (see the module docstring)."""

    def __init__(self, url: str, *, scrape_interval_s: float = DEFAULT_SCRAPE_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic,
                 get: Callable[[str, str], Mapping[str, Any]] = query) -> None:
        self._url = url
        self._query_url = query_url(url)
        self._scrape_interval_s = scrape_interval_s
        self._clock = clock
        self._get = get
        self._lock = threading.Lock()
        self._checked_s: float | None = None  # when the last presence check answered or failed
        self._problem: str | None = None  # why there is no rate, from the last presence check

    @property
    def url(self) -> str:
        return self._url

    def _ask(self, expr: str) -> float | None:
        """One instant query's value; :class:`QueryError` (naming the URL) when there is none."""
        try:
            return parse_vector(self._get(self._query_url, expr))
        except (OSError, ValueError, QueryError) as error:  # URLError and HTTPError are OSErrors
            reason = getattr(error, "reason", None) or error
            raise QueryError(f"cannot query Prometheus at {self._url} ({expr}): {reason}; the current plan is "
                             "kept") from None

    def scrape(self) -> None:
        """One round: does Prometheus answer, and does it hold any gateway counter?"""
        try:
            count = self._ask(PRESENCE_QUERY)
            problem = None if count else (
                f"Prometheus at {self._url} holds no {ARRIVALS} series: it does not scrape the gateways, "
                "every gateway is down, or none has counted a request yet; the current plan is kept")
        except QueryError as error:
            problem = str(error)
        with self._lock:
            if problem is not None and problem != self._problem:
                log.warning("%s", problem)
            elif problem is None and self._problem is not None:
                log.info("Prometheus at %s answers with the gateways' counters again", self._url)
            self._checked_s, self._problem = self._clock(), problem

    def read(self, function_name: str, long_s: float, short_s: float) -> Rates | str:
        """``function_name``'s (``<fn>.<ns>``) rates, or one line saying why there are none."""
        with self._lock:
            checked, problem = self._checked_s, self._problem
        if checked is None:
            return f"Prometheus at {self._url} has not been asked yet; the current plan is kept"
        if problem is not None:
            return problem
        age = self._clock() - checked
        if age > max(3 * short_s, STALE_S):
            return f"Prometheus at {self._url} was last asked {age:.0f} s ago; the current plan is kept"
        try:
            long = self._ask(rate_query(function_name, window_s(long_s, self._scrape_interval_s)))
            short = self._ask(rate_query(function_name, window_s(short_s, self._scrape_interval_s)))
            pending = self._ask(pending_query(function_name))
        except QueryError as error:
            return str(error)
        return with_pending(Rates(long=long or 0.0, short=short or 0.0), pending or 0.0, long_s)
