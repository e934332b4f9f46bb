"""Carrying out live share changes: a bound pod whose share annotations no longer match its assignment.

The pod watch hands every pod event to :meth:`ShareChanges.notice`, which only looks (cheap, in
the watch's thread) and queues the pods whose annotations ask for another share than their
assignment holds. One worker thread then, per pod:

1. judges and takes the change on the cache's ledger in one step
   (:meth:`~scheduler_extender.state.ClusterState.begin_share_change`, rules in
   :mod:`~scheduler_extender.resharing`), so binds that follow see the new share;
2. writes the new assignment (same node, GPU and time; the new share) with its signature, guarded by the pod's
   ``resourceVersion``: on a conflict it re-reads the pod and goes on only if the pod still asks
   for the same change, so a concurrent edit is never lost;
3. records an event on the pod: ``ShareChanged`` (Normal), or ``ShareChangeRefused`` (Warning,
   once per distinct change: the same edit seen again is not reported again) saying why.

A parked pod (request and limit 0) whose wake does not fit is woken without its request: the
assignment gets request 0 and the new limit, and a ``WokenWithoutRequest`` Warning (once per
distinct change, like a refusal) names the pod, the GPU, the request and what is free. Its
annotations still ask for the request, so, like a refused change, it is tried again at the pod's
next event (any update of the pod; the extender does not watch for room freed on the GPU) and
reported again only when its annotations are edited to another change.

The node agent's arbiter follows the assignment (its pod cache) and applies the new time share to
the running pod's processes from its next decision.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from fastgshare import keys
from fastgshare.assignment_signature import AssignmentTrust
from fastgshare.codec import PodAssignment, encode_assignment
from fastgshare.share import ShareSpec, format_fraction
from scheduler_extender.placements import pod_assignment
from scheduler_extender.ports import ApiConflict, ApiFailure, KubePort, PodNotFound
from scheduler_extender.records import PodRecord
from scheduler_extender.resharing import ShareChangeRefused, change_key, wanted_share
from scheduler_extender.state import ClusterState, ShareChangeStart

log = logging.getLogger(__name__)

REASON_CHANGED = "ShareChanged"
REASON_REFUSED = "ShareChangeRefused"
REASON_WOKEN_WITHOUT_REQUEST = "WokenWithoutRequest"
NORMAL, WARNING = "Normal", "Warning"
CONFLICT_RETRIES = 5
RETRY_DELAY_S = 1.0  # after an API failure, try the pod again this much later
REMEMBERED = 4096  # pods whose last refused change is remembered


class PodEvents(Protocol):
    """Events on pods (:class:`fastgshare_kube.events.EventRecorder` reporting on ``v1`` Pods)."""

    def event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None: ...


def pod_object(pod: PodRecord) -> dict[str, Any]:
    """What an event names about the pod."""
    return {"metadata": {"namespace": pod.namespace, "name": pod.name, "uid": pod.uid,
                         "resourceVersion": pod.resource_version}}


def asks_for_change(pod: PodRecord, trust: AssignmentTrust) -> bool:
    """Whether a bound, assigned, running pod's share annotations differ from its (trusted) assignment's share."""
    if not pod.node_name or pod.finished or pod.deleting or pod.assignment_text is None:
        return False
    assignment = pod_assignment(pod, trust)
    if assignment is None:
        return False
    try:
        return wanted_share(pod.annotations) != assignment.share
    except ShareChangeRefused:
        return True  # an invalid edit: refused with the parser's words


class ShareChanges:
    """Queues and carries out live share changes; see the module docstring."""

    def __init__(self, state: ClusterState, kube: KubePort, events: PodEvents) -> None:
        self._state = state
        self._kube = kube
        self._events = events
        self._lock = threading.Condition()
        self._queue: OrderedDict[str, PodRecord] = OrderedDict()  # by uid: the latest record wins
        self._refused: OrderedDict[str, tuple[str | None, ...]] = OrderedDict()  # uid -> last refused change
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._timers: set[threading.Timer] = set()

    # --- from the watch ----------------------------------------------------------------------
    def notice(self, pod: PodRecord) -> None:
        """A pod was added or changed: queue it if it asks for another share."""
        if not asks_for_change(pod, self._state.trust):
            with self._lock:
                self._refused.pop(pod.uid, None)  # back to its share: a new edit is a new change
            return
        with self._lock:
            self._queue[pod.uid] = pod
            self._queue.move_to_end(pod.uid)
            self._lock.notify_all()

    def forget(self, pod: PodRecord) -> None:
        """The pod is gone."""
        with self._lock:
            self._queue.pop(pod.uid, None)
            self._refused.pop(pod.uid, None)

    # --- the worker --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._work, name="share-changes", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
            timers, self._timers = set(self._timers), set()
        for timer in timers:
            timer.cancel()
        if self._thread is not None:
            self._thread.join(10)

    def run_pending(self) -> None:
        """Carry out every queued change now, in this thread (tests; the worker does the same)."""
        while (pod := self._take(block=False)) is not None:
            self.process(pod)

    def _work(self) -> None:
        while (pod := self._take(block=True)) is not None:
            try:
                self.process(pod)
            except Exception:  # the worker must live on; the pod's next event retries
                log.exception("share change of pod=%s failed", pod.key)

    def _take(self, *, block: bool) -> PodRecord | None:
        with self._lock:
            while not self._queue:
                if self._stopping or not block:
                    return None
                self._lock.wait()
            return None if self._stopping else self._queue.popitem(last=False)[1]

    # --- one pod -----------------------------------------------------------------------------
    def process(self, pod: PodRecord) -> None:
        """Judge, take, write and report the share change ``pod`` asks for."""
        try:
            wanted = wanted_share(pod.annotations)
            start = self._state.begin_share_change(pod.uid, wanted)
        except ShareChangeRefused as refusal:
            self._refuse(pod, str(refusal))
            return
        if start is None:
            return
        written = False
        try:
            written = self._write(pod, start)
        finally:
            self._state.end_share_change(start, written)
        if not written:
            return
        if start.short_of is not None:
            self._woken_without_request(pod, start, start.short_of)
            return
        message = (f"time share changed from {_time(start.old)} to {_time(start.new)} of GPU {start.gpu_index} "
                   f"({start.gpu_uuid}); the node's arbiter applies it to the running processes")
        log.info("share change pod=%s %s", pod.key, message)
        self._events.event(pod_object(pod), NORMAL, REASON_CHANGED, message)

    def _woken_without_request(self, pod: PodRecord, start: ShareChangeStart, short_of: str) -> None:
        """A parked pod woken with request 0 and its new limit: reported once per distinct change,
        which stays asked for (its annotations are as written) and is retried like a refused one."""
        if not self._remember_refused(pod):
            return
        message = (f"pod {pod.key} woken without its request: {short_of}; "
                   f"it runs with {_time(start.new)} (the GPU's idle time up to its limit, no guarantee) until "
                   f"{_time(start.wanted)} fits: tried again at the pod's next update or edit")
        log.info("share change pod=%s partial wake: %s", pod.key, message)
        self._events.event(pod_object(pod), WARNING, REASON_WOKEN_WITHOUT_REQUEST, message)

    def _write(self, pod: PodRecord, start: ShareChangeStart) -> bool:
        assignment = PodAssignment(node_name=start.node, gpu_uuid=start.gpu_uuid, gpu_index=start.gpu_index,
                                   share=start.new, assigned_at_ms=start.assigned_at_ms)
        # The assignment and its signature in one patch: the node agent never sees one without the other.
        annotations = {keys.POD_ASSIGNMENT_ANNOTATION: encode_assignment(assignment),
                       keys.POD_ASSIGNMENT_SIGNATURE_ANNOTATION: self._state.trust.sign(start.uid, assignment)}
        for _ in range(CONFLICT_RETRIES):
            try:
                self._kube.patch_pod_annotations(pod, annotations)
                return True
            except ApiConflict:
                current = self._still_asking(pod, start)
                if current is None:
                    return False
                pod = current
            except PodNotFound:
                return False
            except ApiFailure as error:
                log.warning("share change pod=%s: writing the assignment failed, retrying in %.0fs: %s", pod.key,
                            RETRY_DELAY_S, error)
                self._retry_later(pod)
                return False
        log.warning("share change pod=%s: the pod kept changing; gave up after %d conflicts, its next change "
                    "retries", pod.key, CONFLICT_RETRIES)
        return False

    def _still_asking(self, pod: PodRecord, start: ShareChangeStart) -> PodRecord | None:
        """The pod re-read after a conflict, if it still asks for this change from the same
        assignment; otherwise None (and a pod asking for something else is queued again)."""
        try:
            current = self._kube.read_pod(pod.namespace, pod.name)
        except ApiFailure as error:
            log.warning("share change pod=%s: re-reading failed, retrying in %.0fs: %s", pod.key, RETRY_DELAY_S,
                        error)
            self._retry_later(pod)
            return None
        if current is None or current.uid != pod.uid:
            return None
        assignment = pod_assignment(current, self._state.trust)
        try:
            same = (wanted_share(current.annotations) == start.wanted and assignment is not None
                    and assignment.share == start.old and assignment.gpu_uuid == start.gpu_uuid)
        except ShareChangeRefused:
            same = False
        if not same:
            self.notice(current)
            return None
        return current

    def _retry_later(self, pod: PodRecord) -> None:
        with self._lock:
            if self._stopping:
                return
            timer = threading.Timer(RETRY_DELAY_S, self._retry, [pod])
            timer.daemon = True
            self._timers.add(timer)
        timer.start()

    def _retry(self, pod: PodRecord) -> None:
        with self._lock:
            self._timers = {timer for timer in self._timers if timer.is_alive()}
        try:
            current = self._kube.read_pod(pod.namespace, pod.name)
        except ApiFailure:
            current = pod  # try with what we have; a conflict re-reads
        if current is not None and current.uid == pod.uid:
            self.notice(current)

    def _refuse(self, pod: PodRecord, message: str) -> None:
        if not self._remember_refused(pod):
            return  # this change was reported already
        log.info("share change pod=%s refused: %s", pod.key, message)
        self._events.event(pod_object(pod), WARNING, REASON_REFUSED, message)

    def _remember_refused(self, pod: PodRecord) -> bool:
        """Remember the change ``pod`` asks for as not (fully) given; False if it was already."""
        change = change_key(pod.annotations)
        with self._lock:
            if self._refused.get(pod.uid) == change:
                return False
            self._refused[pod.uid] = change
            self._refused.move_to_end(pod.uid)
            while len(self._refused) > REMEMBERED:
                self._refused.popitem(last=False)
        return True


def _time(share: ShareSpec) -> str:
    return f"request {format_fraction(share.request_permille)} limit {format_fraction(share.limit_permille)}"
