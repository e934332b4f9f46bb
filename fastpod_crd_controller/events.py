"""Events on FaSTPods, as ``kubectl describe fastpod`` shows them: the shared recorder
(:mod:`fastgshare_kube.events`) set to report on FaSTPods as the controller, and
:class:`BackgroundEvents`, which writes them from a thread of its own so that a reconcile never
waits on an event write (client-go's recorder hands its events to a broadcaster the same way)."""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Mapping
from typing import Any

from fastgshare import keys
from fastgshare_kube import events
from fastgshare_kube.events import NORMAL, WARNING, EventSink, rfc3339  # noqa: F401 - re-exported
from fastpod_crd_controller import names

log = logging.getLogger(__name__)

QUEUED_EVENTS = 1000  # events waiting to be written; beyond that new ones are dropped (and logged)
_STOP = None


class EventRecorder(events.EventRecorder):
    """Writes events about FaSTPods, from the controller."""

    def __init__(self, kube: EventSink, *, instance: str, **options: Any) -> None:
        super().__init__(kube, component=names.COMPONENT, instance=instance, api_version=keys.FASTPOD_API_VERSION,
                         kind=keys.FASTPOD_KIND, **options)


_Event = tuple[Mapping[str, Any], str, str, str]


class BackgroundEvents:
    """Queues events and writes them through ``recorder`` in one thread, in the order they came.

    :meth:`event` returns at once; a full queue drops the event with a warning (an event is
    advice, the status is the record). :meth:`stop` writes what is queued, then ends the thread.
    """

    def __init__(self, recorder: events.EventRecorder, *, capacity: int = QUEUED_EVENTS) -> None:
        self._recorder = recorder
        self._queue: queue.Queue[_Event | None] = queue.Queue(maxsize=capacity)
        self._thread = threading.Thread(target=self._write, name="events", daemon=True)
        self._thread.start()

    def event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """Queue a ``kind`` event on ``obj``; its metadata is copied, so later changes do not show."""
        snapshot = {"metadata": dict(obj.get("metadata") or {})}
        try:
            self._queue.put_nowait((snapshot, kind, reason, message))
        except queue.Full:
            log.warning("event dropped, %d waiting to be written: object=%s/%s reason=%s", self._queue.maxsize,
                        snapshot["metadata"].get("namespace"), snapshot["metadata"].get("name"), reason)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Write the queued events (for at most ``timeout_s``) and end the thread."""
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout_s)
        self._thread.join(timeout_s)

    def _write(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            try:
                self._recorder.event(*item)
            except Exception:  # the recorder logs API failures; anything else must not end the thread
                log.exception("cannot write event reason=%s", item[2])
