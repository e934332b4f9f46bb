"""List, then watch, one kind of object into a store, forever; relist when the watch expires.

The classic client-go reflector: list to get every object and a resourceVersion, hand the list
to the store (which diffs it), then watch from that version and apply each event. A watch
that ends normally (its timeout) is resumed from the last version seen; one that the API
server ends with 410 Gone (the version left its history) is followed by a relist; any other
failure waits and relists, the wait doubling from ``retry_delay_s`` up to ``max_retry_delay_s``
while failures follow each other. ``hints`` add what to do to the log line of an HTTP status
(for example a 404 listing FaSTPods: the CRD is not installed). The API calls sit behind :class:`ListWatch`, so
this loop is tested with fakes; the real one is :class:`fastgshare_kube.rest.RawListWatch`.

This is the one list/watch loop of the project: the controller's FaSTPod and pod caches, the
extender's node and pod caches and the node agent's pods of its node all run it, each with its own
:class:`Sink` that turns the API's dicts into that service's records. BOOKMARK events (which the
watch asks for) only move the version on; ERROR events become :class:`ApiError`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from fastgshare_kube.errors import ApiError

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 300
MAX_RETRY_DELAY_S = 30.0


class ListWatch(Protocol):
    """The two calls a reflector makes, for one resource."""

    def list(self) -> tuple[list[dict[str, Any]], str]:
        """Every object, and the list's resourceVersion."""
        ...

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        """Watch events (``{"type": ..., "object": ...}``) after ``resource_version``."""
        ...

    def close(self) -> None:
        """Abort a watch in progress (from another thread)."""
        ...


class Sink(Protocol):
    """Where a reflector puts what it sees: a whole list, then each change."""

    def replace(self, objects: list[dict[str, Any]]) -> None: ...

    def upsert(self, obj: Mapping[str, Any]) -> None: ...

    def delete(self, obj: Mapping[str, Any]) -> None: ...


class Reflector:
    """Keeps ``sink`` equal to the API's view of one resource, in a daemon thread."""

    def __init__(self, name: str, list_watch: ListWatch, sink: Sink, *, retry_delay_s: float = 1.0,
                 max_retry_delay_s: float = MAX_RETRY_DELAY_S, watch_timeout_s: int = WATCH_TIMEOUT_S,
                 hints: Mapping[int, str] | None = None) -> None:
        self.name = name
        self._list_watch = list_watch
        self._sink = sink
        self._retry_delay_s = retry_delay_s
        self._max_retry_delay_s = max_retry_delay_s
        self._next_delay_s = retry_delay_s
        self._hints = dict(hints or {})
        self._watch_timeout_s = watch_timeout_s
        self._synced = threading.Event()
        self._stop = threading.Event()
        self.relists = 0
        self._thread = threading.Thread(target=self.run, name=f"reflector-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._list_watch.close()
        self._thread.join(timeout=5)

    def wait_synced(self, timeout_s: float | None = None) -> bool:
        """True once the first list has reached the store."""
        return self._synced.wait(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                resource_version = self._relist()
                while not self._stop.is_set():
                    resource_version = self._watch(resource_version)
            except ApiError as error:
                if error.gone:
                    log.info("watch expired (410 Gone), relisting resource=%s", self.name)
                    continue
                self._failed(error)
            except Exception as error:  # a dropped connection must not end the cache
                self._failed(error)

    def _failed(self, error: Exception) -> None:
        delay = self._next_delay_s
        self._next_delay_s = min(delay * 2, self._max_retry_delay_s)
        if not self._stop.is_set():
            hint = self._hints.get(error.status) if isinstance(error, ApiError) else None
            log.warning("list/watch failed resource=%s error=%s%s; retrying in %gs", self.name, error,
                        f": {hint}" if hint else "", round(delay, 3))
        self._stop.wait(delay)

    def _relist(self) -> str:
        objects, resource_version = self._list_watch.list()
        self._sink.replace(objects)
        self._next_delay_s = self._retry_delay_s
        self.relists += 1
        self._synced.set()
        log.debug("listed resource=%s count=%d resourceVersion=%s", self.name, len(objects), resource_version)
        return resource_version

    def _watch(self, resource_version: str) -> str:
        for event in self._list_watch.watch(resource_version, self._watch_timeout_s):
            if self._stop.is_set():
                break
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise ApiError(int(obj.get("code", 500)), str(obj.get("reason", "")), str(obj.get("message", "")))
            resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
            if kind == "DELETED":
                self._sink.delete(obj)
            elif kind in ("ADDED", "MODIFIED"):
                self._sink.upsert(obj)
            # BOOKMARK: only its resourceVersion counts, read above
        return resource_version
