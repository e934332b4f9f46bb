"""The FaSTPod controller: event handlers, workers, and ``reconcile(key)``.

Handlers only enqueue keys (a pod's change enqueues its controlling FaSTPod) and settle
expectations. Workers take keys from the queue and call :meth:`Controller.reconcile`, which is
level-triggered and idempotent: it reads the FaSTPod and its pods from the cache (never from
the API), decides with pure functions and converges:

1. gone from the cache: forget it (the garbage collector deletes its pods);
2. invalid: create and delete nothing, set ``InvalidSpec``, emit one Warning event per new message;
3. valid: patch the pods that differ only in their time quota in place (the extender then
   re-checks each on its GPU), then, unless earlier creates or deletes are still unobserved,
   carry out the plan (scale, roll);
4. write the status through the status subresource if it changed, unless creates or deletes of
   the controller's own are still unobserved: the counts it would show are stale already, and the
   reconcile that observes the last of them writes it (one status write a scale-up, not one per
   batch of pods seen). A failure or an invalid spec is written at once.

A failed reconcile is retried with a per-key exponential backoff; a success resets it.

Pods are created in batches of 1, 2, 4, ... at a time (the ReplicaSet controller's slow start):
a FaSTPod whose pods are refused costs one call, one that is accepted gets its pods in parallel.
The Kubernetes client checks a pod body against its models before sending it (so an unknown
field is a clear 422, where the API server would drop it); a pod spec it has accepted once is
not checked again (:class:`AcceptedSpecs`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs

from fastgshare import keys
from fastgshare_kube.reflector import ListWatch, Reflector
from fastgshare_kube.runner import Workers
from fastgshare_kube.store import Store, object_key, whole
from fastgshare_kube.workqueue import WorkQueue
from fastpod_crd_controller import names
from fastpod_crd_controller.builder import PodConfig, make_pod
from fastpod_crd_controller.errors import INVALID, ApiError, InvalidFaSTPod
from fastpod_crd_controller.events import NORMAL, WARNING, rfc3339
from fastpod_crd_controller.expectations import Expectations
from fastpod_crd_controller.plan import Plan, in_place_updates, plan
from fastpod_crd_controller.pods import PodInfo, pod_info
from fastpod_crd_controller.ports import EventPort, KubePort, NoObserver, ReconcileObserver
from fastpod_crd_controller.spec import FaSTPodSpec, parse_fastpod, time_quota_of
from fastpod_crd_controller.status import Outcome, compute_status

log = logging.getLogger(__name__)

REASON_POD_REJECTED = "PodRejected"
RESULT_SYNCED, RESULT_INVALID, RESULT_GONE, RESULT_ERROR = "synced", "invalid", "gone", "error"
_RBAC_HINT = "this account may not list and watch {what}: apply deploy/controller/rbac.yaml and run as its account"
FASTPOD_HINTS = {404: f"the FaSTPod CRD {keys.FASTPOD_CRD_NAME} is not installed; install it with kubectl apply -f "
                      "deploy/crd/fastpods.yaml (deploy/install.sh does)",
                 403: _RBAC_HINT.format(what="FaSTPods")}
POD_HINTS = {403: _RBAC_HINT.format(what="pods")}


@attrs.frozen(kw_only=True)
class Settings:
    workers: int = 2
    resync_s: float = 300.0  # every FaSTPod is reconciled at least this often
    shutdown_grace_s: float = 30.0  # how long stop() waits for reconciles in flight
    create_parallelism: int = 16  # pod creates in flight at once, over all workers


class Controller:
    """Keeps every FaSTPod's pods and status converged; see the module docstring."""

    def __init__(self, kube: KubePort, pod_config: PodConfig, recorder: EventPort, *,
                 settings: Settings | None = None, queue: WorkQueue | None = None,
                 expectations: Expectations | None = None, now: Callable[[], str] | None = None,
                 observer: ReconcileObserver | None = None) -> None:
        self._kube = kube
        self._pod_config = pod_config
        self._accepted_specs = AcceptedSpecs()
        self._recorder = recorder
        self._settings = settings or Settings()
        self._observer = observer or NoObserver()
        self.queue = queue or WorkQueue(observer=self._observer)
        self.expectations = expectations or Expectations()
        self._now = now or (lambda: rfc3339(time.time()))
        self.fastpods = fastpod_store(self.queue.add)
        self.pods = pod_store(self.pod_changed)
        self._workers = Workers(self.queue)
        self._creators = ThreadPoolExecutor(max_workers=self._settings.create_parallelism,
                                            thread_name_prefix="create")

    def fastpod_statuses(self) -> list[dict[str, Any]]:
        """Each cached FaSTPod reduced to ``{"status": ...}`` (a copy), for the metrics."""
        return self.fastpods.each(lambda obj: {"status": copy.deepcopy(obj.get("status") or {})})

    # --- event handlers -----------------------------------------------------------------------
    def pod_changed(self, old: PodInfo | None, new: PodInfo | None) -> None:
        """Tick off expectations and enqueue the owning FaSTPod(s)."""
        if old is None and new is not None and new.owner_key:
            self.expectations.creation_observed(new.owner_key)
        if old is not None and old.owner_key and (new is None or (new.deleting and not old.deleting)):
            self.expectations.deletion_observed(old.owner_key, old.uid)
        for owner in {pod.owner_key for pod in (old, new) if pod is not None and pod.owner_key}:
            self.queue.add(owner)

    # --- reconcile ----------------------------------------------------------------------------
    def reconcile(self, key: str) -> str:
        """Converge one FaSTPod and say how it went (``gone``, ``invalid``, ``synced``); raises
        :class:`ApiError` to be retried with backoff."""
        fastpod = self.fastpods.get(key)
        if fastpod is None:
            self.expectations.forget(key)
            return RESULT_GONE
        pods = self.pods.indexed(str(fastpod["metadata"].get("uid", "")))
        try:
            spec = parse_fastpod(fastpod)
        except InvalidFaSTPod as error:
            self._invalid(fastpod, pods, error)
            return RESULT_INVALID
        if not fastpod["metadata"].get("deletionTimestamp"):
            pods = self._update_in_place(fastpod, spec, pods)
        step = plan(spec.replicas, pods, spec.revision)
        outcome = Outcome(progress=step.reason, progress_message=_describe(step, spec))
        failure: ApiError | None = None
        if not step.empty and not fastpod["metadata"].get("deletionTimestamp") and self.expectations.satisfied(key):
            outcome, failure = self._apply(fastpod, spec, step, outcome)
        if failure is not None or outcome.invalid_reason or self.expectations.satisfied(key):
            self._write_status(fastpod, spec if not outcome.invalid_reason else None, pods, outcome)
        if failure is not None and not outcome.invalid_reason:  # a rejected pod waits for a changed spec
            raise failure
        return RESULT_INVALID if outcome.invalid_reason else RESULT_SYNCED

    def _update_in_place(self, fastpod: dict[str, Any], spec: FaSTPodSpec,
                         pods: list[PodInfo]) -> list[PodInfo]:
        """Patch the new time quota and revision onto the pods that differ only in it; returns the pods
        as the plan should see them (updated). A failure is reported and raised (retried with backoff)."""
        updates = in_place_updates(pods, spec)
        if not updates:
            return pods
        request, limit = time_quota_of(spec)
        updated: set[str] = set()
        for pod in updates:
            body = {"metadata": {"uid": pod.uid, "labels": {keys.REVISION_LABEL: spec.revision},
                                 "annotations": {keys.GPU_QUOTA_REQUEST: request, keys.GPU_QUOTA_LIMIT: limit}}}
            try:
                self._kube.patch_pod(spec.namespace, pod.name, body)
                updated.add(pod.uid)
            except ApiError as error:
                if error.not_found or error.conflict:  # gone or replaced meanwhile: the cache will tell
                    continue
                self._recorder.event(fastpod, WARNING, names.REASON_FAILED_UPDATE,
                                     f"cannot update pod {pod.name} in place: {error.message or error}")
                raise
        if updated:
            shown = ", ".join(sorted(pod.name for pod in updates if pod.uid in updated))
            log.info("fastpod=%s time quota updated in place request=%s limit=%s pods=%s", spec.key, request, limit,
                     shown)
            self._recorder.event(fastpod, NORMAL, names.REASON_UPDATED_IN_PLACE,
                                 f"Changed the time quota of pods {shown} in place to request {request} limit {limit}; "
                                 "the scheduler extender applies it where the pod's GPU has room (see the pods' "
                                 "ShareChanged or ShareChangeRefused events)")
        # None of them is rolled: a pod gone or replaced meanwhile shows up in the cache as such.
        pending = {pod.uid for pod in updates}
        return [attrs.evolve(pod, revision=spec.revision, time_quota=(request, limit)) if pod.uid in pending else pod
                for pod in pods]

    def _invalid(self, fastpod: dict[str, Any], pods: Sequence[PodInfo], error: InvalidFaSTPod) -> None:
        message = str(error)
        if not _condition_says(fastpod, names.CONDITION_INVALID_SPEC, message):
            log.info("fastpod=%s invalid: %s", _key(fastpod), message)
            self._recorder.event(fastpod, WARNING, names.REASON_INVALID_SPEC, message)
        self._write_status(fastpod, None, pods, Outcome(invalid_reason=error.reason, invalid_message=message))

    def _apply(self, fastpod: dict[str, Any], spec: FaSTPodSpec, step: Plan,
               outcome: Outcome) -> tuple[Outcome, ApiError | None]:
        self.expectations.expect(spec.key, creates=step.create, deletes=[pod.uid for pod in step.delete])
        deleted, failure = self._delete(spec, step.delete)
        created: list[str] = []
        creating = failure is None
        if creating:
            created, failure = self._create(spec, step.create)
        else:
            self._unexpect_creates(spec.key, step.create)
        log.info("fastpod=%s %s created=%s deleted=%s", spec.key, step.reason, ",".join(created) or "-",
                 ",".join(deleted) or "-")
        if deleted:
            self._recorder.event(fastpod, NORMAL, names.REASON_DELETED, f"Deleted pods: {', '.join(deleted)}")
        if created:
            self._recorder.event(fastpod, NORMAL, names.REASON_CREATED, f"Created pods: {', '.join(created)}")
        if failure is None:
            return outcome, None
        return self._failed(fastpod, failure, creating=creating), failure

    def _delete(self, spec: FaSTPodSpec, victims: Sequence[PodInfo]) -> tuple[list[str], ApiError | None]:
        deleted: list[str] = []
        for position, pod in enumerate(victims):
            try:
                self._kube.delete_pod(spec.namespace, pod.name, pod.uid)
                deleted.append(pod.name)
            except ApiError as error:
                self.expectations.deletion_observed(spec.key, pod.uid)
                if not error.not_found:
                    for untried in victims[position + 1:]:  # none of these will be observed
                        self.expectations.deletion_observed(spec.key, untried.uid)
                    return deleted, error
        return deleted, None

    def _create(self, spec: FaSTPodSpec, count: int) -> tuple[list[str], ApiError | None]:
        """Create ``count`` pods in slow-start batches (1, 2, 4, ...), each batch in parallel; stop
        after the first batch with a failure. Every pod has the same body: once the client's own
        check has let one through (now or for an earlier pod with the same spec), the others skip it."""
        created: list[str] = []
        body = make_pod(spec, self._pod_config)
        checked = body["spec"] in self._accepted_specs
        batch = 1
        while len(created) < count:
            size = min(batch, count - len(created))
            results = self._create_batch(spec.namespace, body, size, checked=checked)
            created += [result for result in results if isinstance(result, str)]
            if created and not checked:
                self._accepted_specs.add(body["spec"])
                checked = True
            failures = [result for result in results if isinstance(result, ApiError)]
            if failures:
                self._unexpect_creates(spec.key, count - len(created))  # none of these will be observed
                return sorted(created), failures[0]
            batch *= 2
        return sorted(created), None

    def _create_batch(self, namespace: str, body: Mapping[str, Any], size: int, *,
                      checked: bool) -> list[str | ApiError]:
        """Create ``size`` pods at once: a single one in this thread, more through the creators."""
        if size == 1:
            return [self._create_one(namespace, body, checked)]
        return list(self._creators.map(lambda _: self._create_one(namespace, body, checked), range(size)))

    def _create_one(self, namespace: str, body: Mapping[str, Any], checked: bool) -> str | ApiError:
        try:
            return str(self._kube.create_pod(namespace, body, checked=checked)["metadata"]["name"])
        except ApiError as error:
            return error

    def _unexpect_creates(self, key: str, count: int) -> None:
        for _ in range(count):
            self.expectations.creation_observed(key)

    def _failed(self, fastpod: dict[str, Any], error: ApiError, *, creating: bool) -> Outcome:
        verb = "create" if creating else "delete"
        message = f"cannot {verb} pods: {error.message or error}"
        if creating and error.status == INVALID:
            message = f"the pod built from this FaSTPod is invalid: {rejection_text(error)}"
            if not _condition_says(fastpod, names.CONDITION_INVALID_SPEC, message):
                log.info("fastpod=%s pod rejected: %s", _key(fastpod), message)
                self._recorder.event(fastpod, WARNING, names.REASON_INVALID_SPEC, message)
            return Outcome(invalid_reason=REASON_POD_REJECTED, invalid_message=message)
        reason = names.REASON_FAILED_CREATE if creating else names.REASON_FAILED_DELETE
        self._recorder.event(fastpod, WARNING, reason, message)
        return Outcome(failure_reason=reason, failure_message=message)

    def _write_status(self, fastpod: Mapping[str, Any], spec: FaSTPodSpec | None, pods: Sequence[PodInfo],
                      outcome: Outcome) -> None:
        status = compute_status(fastpod, spec, pods, outcome, self._now())
        old = fastpod.get("status") or {}
        if status == old:
            return
        metadata = fastpod["metadata"]
        patch = {**{key: None for key in old if key not in status}, **status}  # a merge patch: None deletes
        try:
            self._kube.patch_fastpod_status(metadata["namespace"], metadata["name"], patch)
        except ApiError as error:
            if not error.not_found:  # deleted meanwhile: nothing to report on
                raise

    # --- running ------------------------------------------------------------------------------
    def start(self, fastpod_source: ListWatch, pod_source: ListWatch) -> None:
        """Fill the caches, then start the workers and the periodic resync; TimeoutError names a cache
        that did not fill (:class:`~fastgshare_kube.runner.Workers`)."""
        self._workers.start([Reflector("fastpods", fastpod_source, self.fastpods, hints=FASTPOD_HINTS),
                             Reflector("pods", pod_source, self.pods, hints=POD_HINTS)],
                            [*((f"worker-{n}", self._work) for n in range(self._settings.workers)),
                             ("resync", self._workers.every(self._settings.resync_s, self._resync))])
        log.info("caches synced fastpods=%d pods=%d workers=%d", len(self.fastpods), len(self.pods),
                 self._settings.workers)

    def stop(self) -> None:
        """Stop taking keys, let reconciles in flight finish, stop the watches."""
        self._workers.stop(self._settings.shutdown_grace_s)
        self._creators.shutdown(wait=True)

    @property
    def healthy(self) -> bool:
        return self._workers.alive

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            started = time.monotonic()
            try:
                result = self.reconcile(key)
                self.queue.forget(key)
                self._observer.reconciled(result, time.monotonic() - started)
            except Exception as error:  # any failure is retried; the worker must live on
                self._observer.reconciled(RESULT_ERROR, time.monotonic() - started)
                delay = self.queue.add_rate_limited(key)
                log.warning("fastpod=%s reconcile failed, retrying in %.2fs: %s", key, delay, error,
                            exc_info=not isinstance(error, ApiError))
            finally:
                self.queue.done(key)

    def _resync(self) -> None:
        for key in self.fastpods.list_keys():
            self.queue.add(key)


def fastpod_store(on_change: Callable[[str], None]) -> Store[dict[str, Any]]:
    """The FaSTPods, whole (the builder needs the podSpec), by ``namespace/name``; ``on_change``
    hears the key of every change."""
    return Store(lambda old, new: on_change(object_key(new if new is not None else old or {})), convert=whole)


def pod_store(on_change: Callable[[PodInfo | None, PodInfo | None], None]) -> Store[PodInfo]:
    """The pods, each as the few fields reconcile reads (:class:`PodInfo`), by uid, indexed by the
    uid of their controlling FaSTPod (:meth:`Store.indexed`)."""
    return Store(on_change, convert=pod_info, key=lambda obj: str((obj.get("metadata") or {}).get("uid", "")),
                 frozen=True, index=lambda info: (info.owner_uid,) if info.owner_uid else ())


def _key(fastpod: Mapping[str, Any]) -> str:
    metadata = fastpod.get("metadata") or {}
    return f"{metadata.get('namespace')}/{metadata.get('name')}"


def rejection_text(error: ApiError) -> str:
    """Why a pod was refused, each field named where the user wrote it: the pod's ``spec.X`` is
    the FaSTPod's ``spec.podSpec.X``; its ``metadata.X`` comes from the FaSTPod's own metadata."""
    if not error.causes:
        return error.message or str(error)
    return "; ".join(f"{_fastpod_field(field)}: {problem}" for field, problem in error.causes)


def _fastpod_field(field: str) -> str:
    if field == "spec" or field.startswith(("spec.", "spec[")):
        return "spec.podSpec" + field.removeprefix("spec")
    if field.startswith("metadata"):
        return f"{field} (of the pod, from the FaSTPod's metadata)"
    return field or "the pod"


def _condition_says(fastpod: Mapping[str, Any], kind: str, message: str) -> bool:
    """Whether the cached status already has condition ``kind`` True with ``message``."""
    conditions = (fastpod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" and c.get("message") == message
               for c in conditions)


def _describe(step: Plan, spec: FaSTPodSpec) -> str:
    if step.waiting:
        pods = "1 pod of an older revision waits" if step.waiting == 1 else \
            f"{step.waiting} pods of an older revision wait"
        return f"{pods} until all {spec.replicas} replicas are ready (one is replaced at a time)"
    if step.empty:
        return ""
    parts = [f"creating {step.create}"] if step.create else []
    if step.delete:
        parts.append(f"deleting {len(step.delete)}")
    return f"{' and '.join(parts)} pods toward {spec.replicas} of revision {spec.revision}"


class AcceptedSpecs:
    """The last ``size`` pod specs the client's check accepted, by digest (thread-safe): the check
    costs about four plain creates' client CPU, and a spec it accepted once passes again (the rest
    of a pod's body is the controller's own, or metadata the API server checked in the FaSTPod)."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._digests: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def _digest(pod_spec: Mapping[str, Any]) -> bytes:
        text = json.dumps(pod_spec, sort_keys=True, separators=(",", ":"))
        return hashlib.blake2b(text.encode(), digest_size=16).digest()

    def __contains__(self, pod_spec: Mapping[str, Any]) -> bool:
        digest = self._digest(pod_spec)
        with self._lock:
            if digest not in self._digests:
                return False
            self._digests.move_to_end(digest)
            return True

    def add(self, pod_spec: Mapping[str, Any]) -> None:
        digest = self._digest(pod_spec)
        with self._lock:
            self._digests[digest] = None
            self._digests.move_to_end(digest)
            while len(self._digests) > self._size:
                self._digests.popitem(last=False)
