"""Function logs: ``GET /system/logs``, the OpenFaaS provider API's log endpoint, over the logs of the
function's pods that the API server serves.

The query (faas-provider's ``logs.Request``): ``name`` (required; ``fn`` or ``fn.ns``), ``namespace``,
``instance`` (one pod), ``since`` (RFC 3339), ``tail`` (lines per pod, 0 or less: all), ``follow``
(a Go bool). The answer: 200 with one JSON object a line (``application/x-ndjson``, chunked), each
faas-provider's ``logs.Message``: ``name, namespace, instance`` (the pod), ``timestamp`` (RFC 3339, as
the kubelet wrote it), ``text`` (the line, without its newline).

Pure, no I/O: :func:`parse_query` (a :class:`LogQuery`, or :class:`LogQueryError`: status and one line
naming the parameter, the value and what is allowed), :func:`split_line` (the kubelet's
``<timestamp> <text>`` line) and :func:`message_line` (one NDJSON line).

The I/O, free of HTTP and of the Kubernetes layer: :class:`PodLogs`, the port that lists a function's pods
and opens one pod's log as a blocking line stream (the real one is
:class:`fastgshare_gateway.kube.KubePodLogs`; its failures are :class:`PodLogsError`), and
:class:`LogServer`, which turns a query into a :class:`Refusal` or a :class:`LogAnswer` whose chunks the
HTTP edge (:mod:`fastgshare_gateway.http`) writes. Each pod's stream is read in a thread of its own (never
the default executor: a followed stream would hold it for minutes), its lines handed to the event loop
through a bounded queue.
Without ``follow`` the lines of every pod are collected, sorted by time and sent. With ``follow`` they
are sent as they come and the pods are listed again every :attr:`LogLimits.pod_poll_s` to read new
ones. Every answer ends at :attr:`LogLimits.max_lines`, at its time cap (``request_timeout_s``, or
``follow_timeout_s`` when following) or when the client goes away; then every pod stream is closed.
At most :attr:`LogLimits.max_requests` answers at once (429 past it).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import logging
import math
import re
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Protocol

import attrs

from fastgshare_gateway.openfaas import is_dns_label

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/x-ndjson"
ZERO_TIME = "0001-01-01T00:00:00Z"  # Go's zero time.Time, what faas-provider sends for a line without one
GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})  # Go's strconv.ParseBool
GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False", ""})
RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})")
_FRACTION = re.compile(r"(\.\d{6})\d+")  # datetime keeps microseconds
WAITING = 400  # the API server's answer for a container that has not started: read it later


@attrs.frozen
class LogLimits:
    """What one log answer may take: lines (all pods together), seconds, pods; and answers at once."""

    max_lines: int = 10_000
    request_timeout_s: float = 30.0
    follow_timeout_s: float = 600.0
    max_pods: int = 20
    max_requests: int = 32
    pod_poll_s: float = 5.0
    queue_lines: int = 1000
    client_check_s: float = 0.5  # how often a quiet follow looks whether its client is still there


@attrs.frozen
class LogQuery:
    name: str
    namespace: str | None  # None: the gateway's default
    instance: str | None
    since: datetime.datetime | None
    tail: int | None  # lines per pod; None: all (up to the line cap)
    follow: bool


class LogQueryError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@attrs.frozen
class Instance:
    """A pod to read, and its container (None: the pod's only one)."""

    pod: str
    container: str | None = None


class PodLogsError(Exception):
    """A failed call of the :class:`PodLogs` port: the API server's ``status`` (0: no answer) and message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class LogStream(Protocol):
    def __iter__(self) -> Iterator[str]:
        """The log's lines without their newline; blocks; raises PodLogsError when the read fails."""
        ...

    def close(self) -> None:
        """From another thread: ends the iteration (it may raise or stop)."""
        ...


class PodLogs(Protocol):
    """Blocking calls (run in threads); failures are :class:`PodLogsError`."""

    def function_pods(self, namespace: str, name: str) -> list[Instance]: ...

    def open(self, namespace: str, instance: Instance, *, follow: bool, tail: int | None,
             since_seconds: int | None, timeout_s: float) -> LogStream: ...


# --- pure ----------------------------------------------------------------------------------------
def parse_query(query: Mapping[str, str], *, max_lines: int = LogLimits().max_lines) -> LogQuery:
    """The request a ``/system/logs`` query string asks for; :class:`LogQueryError` (400) naming the first
    bad parameter. A repeated parameter: its last value, as faas-provider reads it."""
    raw_name = query.get("name", "")
    if not raw_name:
        raise LogQueryError(400, "name: missing; give the function's name, e.g. /system/logs?name=hello")
    name, dot, dotted = raw_name.partition(".")
    if not is_dns_label(name) or (dot and not is_dns_label(dotted)):
        raise LogQueryError(400, f"name {raw_name!r}: expected a function name (a DNS label: at most 63 lowercase "
                                 "letters, digits and '-'), optionally followed by .NAMESPACE")
    namespace = query.get("namespace") or None
    if namespace is not None and not is_dns_label(namespace):
        raise LogQueryError(400, f"namespace {namespace!r}: expected a namespace name (a DNS label)")
    if dot and namespace is not None and namespace != dotted:
        raise LogQueryError(400, f"name {raw_name!r} and namespace {namespace!r}: they name two namespaces; give "
                                 "one of them")
    instance = query.get("instance") or None
    if instance is not None and (len(instance) > 253 or not re.fullmatch(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?", instance)):
        raise LogQueryError(400, f"instance {instance!r}: expected a pod name (lowercase letters, digits, '-', '.')")
    return LogQuery(name=name, namespace=namespace or (dotted if dot else None), instance=instance,
                    since=parse_since(query.get("since", "")), tail=parse_tail(query.get("tail", ""), max_lines),
                    follow=parse_follow(query.get("follow", "")))


def parse_tail(text: str, max_lines: int) -> int | None:
    if text == "":
        return None
    try:
        tail = int(text)
    except ValueError:
        raise LogQueryError(400, f"tail {text!r}: expected a whole number of lines per pod (0 or less: all, at "
                                 f"most {max_lines} lines in all)") from None
    return min(tail, max_lines) if tail > 0 else None


def parse_since(text: str) -> datetime.datetime | None:
    if text == "":
        return None
    if not RFC3339.fullmatch(text):
        raise LogQueryError(400, f"since {text!r}: expected an RFC 3339 time, e.g. 2026-01-02T03:04:05Z")
    try:
        return parse_time(text)
    except ValueError:
        raise LogQueryError(400, f"since {text!r}: not a valid time (RFC 3339, e.g. 2026-01-02T03:04:05Z)") from None


def parse_follow(text: str) -> bool:
    if text in GO_TRUE:
        return True
    if text in GO_FALSE:
        return False
    raise LogQueryError(400, f"follow {text!r}: expected true or false (or 1, 0, t, f)")


def parse_time(text: str) -> datetime.datetime:
    """An RFC 3339 time (nanoseconds cut to microseconds); ValueError when it is none."""
    value = datetime.datetime.fromisoformat(_FRACTION.sub(r"\1", text))
    if value.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return value


def since_seconds(since: datetime.datetime | None, now: datetime.datetime) -> int | None:
    """The API server's ``sinceSeconds`` covering ``since`` (whole seconds, at least 1); lines before
    ``since`` that it lets through are dropped by their timestamp (:func:`after`)."""
    if since is None:
        return None
    return max(1, math.ceil((now - since).total_seconds()))


def split_line(line: str) -> tuple[str, str]:
    """A line read with ``timestamps=true`` (``<RFC 3339> <text>``) as (timestamp, text); a line without a
    timestamp gets Go's zero time and keeps all its text."""
    stamp, space, text = line.partition(" ")
    if RFC3339.fullmatch(stamp):
        return stamp, text if space else ""
    return ZERO_TIME, line


def after(timestamp: str, since: datetime.datetime | None) -> bool:
    if since is None:
        return True
    try:
        return parse_time(timestamp) >= since
    except ValueError:
        return True


@attrs.frozen
class Message:
    """faas-provider's ``logs.Message``."""

    name: str
    namespace: str
    instance: str
    timestamp: str
    text: str

    def line(self) -> bytes:
        return json.dumps({"name": self.name, "namespace": self.namespace, "instance": self.instance,
                           "timestamp": self.timestamp, "text": self.text}, ensure_ascii=False).encode() + b"\n"

    def sort_key(self) -> tuple[datetime.datetime, str]:
        try:
            return parse_time(self.timestamp), self.instance
        except ValueError:
            return datetime.datetime.min.replace(tzinfo=datetime.UTC), self.instance


def message_line(name: str, namespace: str, instance: str, line: str) -> Message:
    timestamp, text = split_line(line)
    return Message(name, namespace, instance, timestamp, text)


# --- the I/O -------------------------------------------------------------------------------------
_END = object()


@attrs.frozen
class Refusal:
    """No log answer: the HTTP status and one line saying why."""

    status: int
    message: str


class _Reader:
    """One pod's stream read in its own thread; every line, then ``_END``, put on the queue."""

    def __init__(self, instance: Instance, stream: LogStream, queue: asyncio.Queue[object],
                 loop: asyncio.AbstractEventLoop) -> None:
        self.instance, self.stream, self._queue, self._loop = instance, stream, queue, loop
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"logs-{instance.pod}", daemon=True)
        self._thread.start()

    def _put(self, item: object) -> bool:
        try:
            future = asyncio.run_coroutine_threadsafe(self._queue.put(item), self._loop)
        except RuntimeError:  # the loop is closed
            return False
        while not self._closed.is_set():
            try:
                future.result(timeout=0.5)
                return True
            except TimeoutError:
                continue
            except Exception:  # the loop went away
                return False
        future.cancel()
        return False

    def _run(self) -> None:
        try:
            for line in self.stream:
                if self._closed.is_set() or not self._put((self.instance, line)):
                    return
        except PodLogsError as error:
            if not self._closed.is_set():
                log.warning("log stream of pod %s ended: %s", self.instance.pod, error)
        finally:
            with contextlib.suppress(Exception):
                self.stream.close()
            if not self._closed.is_set():
                self._put(_END)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(Exception):
            self.stream.close()


class LogServer:
    """Starts log answers; ``pod_logs`` None: no Kubernetes (503). Counts the answers in progress."""

    def __init__(self, pod_logs: PodLogs | None, limits: LogLimits | None = None) -> None:
        self.pod_logs = pod_logs
        self.limits = limits or LogLimits()
        self.active = 0

    async def open(self, query: Mapping[str, str], namespace_of: Callable[[str | None], str],
                   exists: Callable[[str, str], bool]) -> Refusal | LogAnswer:
        """The answer to a query, its pod streams open, or why there is none. ``namespace_of``: the namespace
        to read (the gateway's default for None; it raises the edge's error for one not served);
        ``exists(namespace, name)``: whether the function is there. The caller closes the answer."""
        if self.pod_logs is None:
            return Refusal(503, "this gateway runs without Kubernetes: no function logs")
        try:
            parsed = parse_query(query, max_lines=self.limits.max_lines)
        except LogQueryError as error:
            return Refusal(error.status, error.message)
        namespace = namespace_of(parsed.namespace)
        if not exists(namespace, parsed.name):
            return Refusal(404, f"name {parsed.name!r}: no function of that name in namespace {namespace!r}")
        if self.active >= self.limits.max_requests:
            return Refusal(429, f"{self.active} log requests are in progress, the most this gateway serves at "
                                "once; retry later")
        answer = LogAnswer(self, parsed, namespace)
        refusal = await answer.start()
        if refusal is not None:
            answer.close()
            return refusal
        return answer


class LogAnswer:
    """One log request, from the first pod list to the last line; :meth:`close` ends every pod stream."""

    def __init__(self, server: LogServer, query: LogQuery, namespace: str) -> None:
        assert server.pod_logs is not None
        self.pod_logs, self.limits, self.query, self.namespace = server.pod_logs, server.limits, query, namespace
        self.follow = query.follow
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[object] = asyncio.Queue(self.limits.queue_lines)
        self.readers: dict[str, _Reader] = {}
        self.running = 0  # readers that have not put _END yet
        self._server: LogServer | None = server
        server.active += 1

    async def start(self) -> Refusal | None:
        try:
            instances = await self._instances()
            if self.query.instance is not None and not instances:
                pods = await asyncio.to_thread(self.pod_logs.function_pods, self.namespace, self.query.name)
                return Refusal(404, f"instance {self.query.instance!r}: no pod of that name serves function "
                                    f"{self.query.name!r} in namespace {self.namespace!r} (its pods: "
                                    f"{', '.join(i.pod for i in pods) or 'none'})")
            failures = await self._start(instances)
        except PodLogsError as error:
            return _api_failed(error, self.namespace)
        refused = [failure for failure in failures if failure.status != WAITING]  # a pod starting has no log yet
        if refused and len(refused) == len(instances) and not self.follow:
            return _api_failed(refused[0], self.namespace)
        return None

    async def _instances(self) -> list[Instance]:
        pods = await asyncio.to_thread(self.pod_logs.function_pods, self.namespace, self.query.name)
        if self.query.instance is not None:
            pods = [i for i in pods if i.pod == self.query.instance]
        return pods[:self.limits.max_pods]

    async def _start(self, instances: list[Instance]) -> list[PodLogsError]:
        """Open each new pod's log and start its reader; the failures (a pod still starting: read it on the
        next poll) in order."""
        fresh = [i for i in instances if i.pod not in self.readers][:self.limits.max_pods - len(self.readers)]
        timeout_s = self.limits.follow_timeout_s if self.follow else self.limits.request_timeout_s
        since = since_seconds(self.query.since, datetime.datetime.now(datetime.UTC))
        opened = await asyncio.gather(*(asyncio.to_thread(
            self.pod_logs.open, self.namespace, instance, follow=self.follow, tail=self.query.tail,
            since_seconds=since, timeout_s=timeout_s + 5) for instance in fresh), return_exceptions=True)
        failures = []
        for instance, result in zip(fresh, opened, strict=True):
            if isinstance(result, PodLogsError):
                if result.status != WAITING:
                    log.warning("cannot read the log of pod %s/%s: %s", self.namespace, instance.pod, result)
                failures.append(result)
            elif isinstance(result, BaseException):
                raise result
            else:
                self.readers[instance.pod] = _Reader(instance, result, self.queue, self.loop)
                self.running += 1
        return failures

    def _message(self, item: object) -> Message | None:
        if item is _END:
            self.running -= 1
            return None
        assert isinstance(item, tuple)
        instance, line = item
        message = message_line(self.query.name, self.namespace, instance.pod, line)
        return message if after(message.timestamp, self.query.since) else None

    async def chunks(self, client_there: Callable[[], bool]) -> AsyncIterator[bytes]:
        """The answer's body: without ``follow`` one chunk, every pod's lines sorted by time; with it, each
        message as it comes, until a cap or ``client_there()`` is False."""
        if not self.follow:
            yield await self._collect()
            return
        deadline = self.loop.time() + self.limits.follow_timeout_s
        next_poll = self.loop.time() + self.limits.pod_poll_s
        sent = 0
        while sent < self.limits.max_lines and self.loop.time() < deadline and client_there():
            if self.loop.time() >= next_poll:
                next_poll = self.loop.time() + self.limits.pod_poll_s
                with contextlib.suppress(PodLogsError):
                    await self._start(await self._instances())
            wait = min(self.limits.client_check_s, max(0.0, deadline - self.loop.time()))
            try:
                item = await asyncio.wait_for(self.queue.get(), timeout=wait)
            except TimeoutError:
                continue
            if (message := self._message(item)) is not None:
                yield message.line()
                sent += 1

    async def _collect(self) -> bytes:
        messages: list[Message] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.limits.request_timeout_s):
                while self.running and len(messages) < self.limits.max_lines:
                    if (message := self._message(await self.queue.get())) is not None:
                        messages.append(message)
        messages.sort(key=Message.sort_key)
        return b"".join(m.line() for m in messages)

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()
        if self._server is not None:
            self._server.active -= 1
            self._server = None


def _api_failed(error: PodLogsError, namespace: str) -> Refusal:
    if error.status == 403:
        return Refusal(502, f"the gateway may not read pod logs in namespace {namespace!r} (RBAC: its Role needs "
                            f"pods/log get; deploy/gateway/rbac.yaml): {error.message}")
    return Refusal(502, f"the Kubernetes API refused or did not answer the log request: {error}")
