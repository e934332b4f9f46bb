"""The function controller: caches, one work loop, and ``reconcile(key)``.

Four caches, each fed by a :class:`~fastgshare_kube.reflector.Reflector`: every FaSTFunc, and
the FaSTPods, Services and pods carrying the function label (the FaSTPod controller copies a
child's labels to its pods). A change to any of them enqueues the FaSTFunc it belongs to (a pod:
the one its function label names). One worker takes keys and reconciles, level-triggered and idempotent:

1. gone, or being deleted: nothing (the garbage collector removes the FaSTPods and the Service
   through their owner references);
2. invalid (:func:`~.spec.parse_function`): no writes to the children, the ``InvalidSpec``
   condition and one Warning event per new message;
3. valid: the actions of :func:`~.plan.plan` (deletes first), a Warning event when a policy runs
   without its profile, Normal events for what was created, deleted and updated;
4. the status (:func:`~.plan.compute_status`, with the pods the children control for the
   ``Unschedulable`` condition) through the status subresource, if it changed, and one Warning
   event when ``Unschedulable`` turns True.

**Autoscaling** (policy ``rpr`` or ``hpa`` with ``spec.profile``): reconcile reads the profile
ConfigMap (a GET, kept :data:`PROFILE_REFRESH_S`; one it cannot use is the ``ProfileMissing``
fallback to the fixed configuration, with one Warning event per message) into the configurations
the policy may run (:mod:`.autoscale`), and keeps per function the scaler's state. Once every
``intervalSeconds`` (by the injected monotonic ``clock``) it reads the function's rates from the
:class:`RateSource` and steps the scaler (:func:`~.autoscale.tick`; no rate: the plan is kept,
``MetricsUnavailable`` says why); the scaler's pods per configuration are the configurations
:func:`~.plan.plan` converges the child FaSTPods to, and a change is one Normal ``Scaled`` event.
Pods a scale-up adds are first fitted to the cluster's free GPU space (``free_space``: every node's
inventory and every bound pod's assignment and model, read only then; :mod:`fastgshare.scaling_fit`;
a function's model is charged once per GPU, as the extender charges it): a
configuration that fits nowhere gives way to the next most efficient ones that do. A vertical step
(the scaler raises the time quota of one configuration's pods) is taken only when every such pod
has room on its GPU; the child is then patched in place (``plan(raised=...)``), else pods are added.
A re-plan runs make-before-break: the old children keep their pods until the new ones report ready.
**Parked pods** (``spec.scaling.parked``): when the scaler runs no pod, the plan parks a child in place
(:func:`~.autoscale.parked_config`: time quota 0/0, through ``plan(raised=...)``); a child the gateway
marked woken is taken as running (the scaler restarts from what runs, one ``Woken`` event); each pod
woken without its request (no room on its GPU) adds one pod of its configuration (``_stand_in``).
A third thread scrapes the rate source every ``tick_s`` and enqueues each function whose interval
is due, so all decisions and writes stay in the one worker.

Child names are fixed by the configuration, so a create the cache has not seen yet answers 409
and is simply waited for: no expectations are needed. A failure is retried after a delay that
doubles per key from 1 s (up to :data:`MAX_RETRY_S`); a success resets it: the layer's rate-limited
:class:`~fastgshare_kube.workqueue.WorkQueue`, as the FaSTPod controller's. Functions are few and their
reconciles cheap, so one worker serves them all and no key is ever reconciled twice at once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

from fastfunc_controller import names
from fastfunc_controller.autoscale import (
    ProfileUnusable,
    Raise,
    State,
    Usable,
    capacity_rps,
    cost,
    desired_configs,
    hold,
    interval_s,
    parked_config,
    pods_of,
    raise_of,
    rounded,
    start,
    summary,
    tick,
    usable_configs,
    windows,
    with_more_pods,
    woken,
    woken_without_request,
)
from fastfunc_controller.metrics_source import NO_GATEWAY
from fastfunc_controller.plan import (
    Action,
    AutoscaleStatus,
    CreateFaSTPod,
    CreateService,
    DeleteFaSTPod,
    PatchFaSTPod,
    PatchService,
    PodSummary,
    Problem,
    compute_status,
    controlled_by,
    plan,
    pod_summary,
)
from fastfunc_controller.rates import Rates, function_name
from fastfunc_controller.spec import FunctionSpec, InvalidFunction, model_ref, parse_function, running_config_label
from fastgshare import keys
from fastgshare.autoscaling import ScalerState
from fastgshare.scaling_fit import FreeSpace, can_raise_in_place, fit_additions
from fastgshare_kube.errors import INVALID, ApiError
from fastgshare_kube.events import NORMAL, WARNING, EventRecorder, rfc3339
from fastgshare_kube.reflector import ListWatch, Reflector
from fastgshare_kube.runner import Workers
from fastgshare_kube.store import Store, object_key, whole
from fastgshare_kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

RESULT_SYNCED, RESULT_INVALID, RESULT_GONE = "synced", "invalid", "gone"
MAX_RETRY_S = 60.0
PROFILE_REFRESH_S = 30.0  # a profile ConfigMap is read again after this long
_RBAC = "this account may not list and watch {what}: apply deploy/function-controller/rbac.yaml and run as its account"
FASTFUNC_HINTS = {404: f"the FaSTFunc CRD {keys.FASTFUNC_CRD_NAME} is not installed; install it with kubectl apply -f "
                       "deploy/crd/fastfuncs.yaml", 403: _RBAC.format(what="FaSTFuncs")}
FASTPOD_HINTS = {404: f"the FaSTPod CRD {keys.FASTPOD_CRD_NAME} is not installed; install it with kubectl apply -f "
                      "deploy/crd/fastpods.yaml", 403: _RBAC.format(what="FaSTPods")}
SERVICE_HINTS = {403: _RBAC.format(what="Services")}
POD_HINTS = {403: _RBAC.format(what="pods")}


class KubePort(Protocol):
    """The writes the controller makes (:class:`~fastfunc_controller.kube.KubeClient`); failures are ApiError."""

    def create_fastpod(self, namespace: str, body: Mapping[str, Any]) -> None: ...

    def patch_fastpod(self, namespace: str, name: str, operations: Any) -> None: ...

    def delete_fastpod(self, namespace: str, name: str, uid: str) -> None: ...

    def create_service(self, namespace: str, body: Mapping[str, Any]) -> None: ...

    def patch_service(self, namespace: str, name: str, body: Mapping[str, Any]) -> None: ...

    def patch_fastfunc_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None: ...

    def get_configmap(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, or None when there is none."""


class RateSource(Protocol):
    """Request rates per function (:class:`~fastfunc_controller.metrics_source.GatewayMetrics`)."""

    def scrape(self) -> None: ...

    def read(self, function_name: str, long_s: float, short_s: float) -> Rates | str:
        """The rates, or one line saying why there are none."""


class NoRates:
    """The rate source without a gateway: autoscaled functions keep their plan, and say so."""

    def scrape(self) -> None:
        pass

    def read(self, function_name: str, long_s: float, short_s: float) -> Rates | str:
        return NO_GATEWAY


@attrs.define
class _Scaler:
    """One autoscaled function's scaler: what it may run, its state, and what it last saw."""

    usable: Usable
    state: State
    next_tick_s: float
    rps: float | None = None
    planned_rps: float | None = None
    last_scale_time: str = ""
    metrics_problem: str = ""
    raises: dict[str, str] = attrs.field(factory=dict)  # vertical steps under way: target config -> child
    stood_in_for: set[str] = attrs.field(factory=set)  # pods woken without their request, one pod added each


@attrs.frozen
class _ProfileRead:
    name: str
    at_s: float
    configmap: dict[str, Any] | None


Sources = ListWatch | Mapping[str, ListWatch]  # cluster-wide, or one per namespace


class Controller:
    """Keeps every FaSTFunc's FaSTPods, Service and status converged; see the module docstring."""

    def __init__(self, kube: KubePort, recorder: EventRecorder, *, resync_s: float = 300.0,
                 now: Callable[[], str] | None = None, metrics: RateSource | None = None,
                 clock: Callable[[], float] = time.monotonic, tick_s: float = 1.0,
                 free_space: Callable[[], FreeSpace] | None = None) -> None:
        self._kube = kube
        self._free_space = free_space
        self._recorder = recorder
        self._resync_s = resync_s
        self._now = now or (lambda: rfc3339(time.time()))
        self._metrics: RateSource = metrics or NoRates()
        self._clock = clock
        self._tick_s = tick_s
        self._scalers: dict[str, _Scaler] = {}
        self._profiles: dict[str, _ProfileRead] = {}
        self._due: dict[str, float] = {}  # autoscaled functions: when to reconcile next (clock)
        self._due_lock = threading.Lock()
        self.queue = WorkQueue(base_delay_s=1.0, max_delay_s=MAX_RETRY_S)
        self.fastfuncs = Store(lambda old, new: self.queue.add(object_key(new or old or {})), convert=whole)
        self.fastpods = Store(self._child_changed, convert=whole)
        self.services = Store(self._child_changed, convert=whole)
        self.pods = Store(self._pod_changed, convert=whole)
        self._workers = Workers(self.queue)

    def _child_changed(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for obj in (old, new):
            if obj is None:
                continue
            metadata = obj.get("metadata") or {}
            for ref in metadata.get("ownerReferences") or []:
                if ref.get("controller") and ref.get("kind") == keys.FASTFUNC_KIND:
                    self.queue.add(f"{metadata.get('namespace', '')}/{ref.get('name', '')}")

    def _pod_changed(self, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        for obj in (old, new):
            metadata = (obj or {}).get("metadata") or {}
            if function := (metadata.get("labels") or {}).get(keys.FUNCTION_LABEL):
                self.queue.add(f"{metadata.get('namespace', '')}/{function}")

    def _pods_of(self, namespace: str, children: list[dict[str, Any]]) -> list[PodSummary]:
        """The pods the ``children`` FaSTPods control, summarised for the Unschedulable condition."""
        uids = {str(child["metadata"].get("uid", "")) for child in children} - {""}

        def controlled(pod: Mapping[str, Any]) -> bool:
            return any(ref.get("controller") and ref.get("kind") == keys.FASTPOD_KIND and ref.get("uid") in uids
                       for ref in (pod.get("metadata") or {}).get("ownerReferences") or [])

        return [pod_summary(pod) for pod in self.pods.select(controlled, namespace=namespace)]

    # --- reconcile ----------------------------------------------------------------------------
    def reconcile(self, key: str) -> str:
        """Converge one FaSTFunc; raises :class:`ApiError` to be retried."""
        fastfunc = self.fastfuncs.get(key)
        if fastfunc is None or fastfunc["metadata"].get("deletionTimestamp"):
            self._forget(key)
            return RESULT_GONE
        metadata = fastfunc["metadata"]
        namespace, uid = str(metadata.get("namespace", "")), str(metadata.get("uid", ""))
        children = self.fastpods.select(lambda obj: controlled_by(obj, uid), namespace=namespace)
        pods = self._pods_of(namespace, children)
        try:
            spec = parse_function(fastfunc)
        except InvalidFunction as error:
            self._forget(key)
            if not _condition_says(fastfunc, names.CONDITION_INVALID_SPEC, "True", str(error)):
                log.info("fastfunc=%s invalid: %s", key, error)
                self._recorder.event(fastfunc, WARNING, names.REASON_INVALID_SPEC, str(error))
            self._write_status(fastfunc, compute_status(fastfunc, error, children, self._now(), pods=pods))
            return RESULT_INVALID
        autoscale = None
        if spec.policy != names.POLICY_FIXED and spec.profile:
            spec, autoscale = self._autoscale(fastfunc, spec, children)
        else:
            self._forget(key)
        if spec.fallback and not _condition_says(fastfunc, names.CONDITION_PROFILE_MISSING, "True", spec.fallback):
            log.info("fastfunc=%s %s", key, spec.fallback)
            self._recorder.event(fastfunc, WARNING, spec.profile_problem or names.REASON_PROFILE_MISSING,
                                 spec.fallback)
        service = self.services.get(key)
        problem = None
        if service is not None and not controlled_by(service, uid):
            problem = _service_conflict(spec)
        failure: ApiError | None = None
        try:
            problem = self._apply(fastfunc, spec, plan(spec, children, service, raised=self._raises(key, spec,
                                                                                                 children))) or problem
        except ApiError as error:
            failure = error
            problem = Problem(reason=names.REASON_FAILED, message=f"cannot update the function's objects: {error}")
        self._write_status(fastfunc, compute_status(fastfunc, spec, children, self._now(), problem, pods=pods,
                                                    autoscale=autoscale))
        if failure is not None:
            raise failure
        return RESULT_SYNCED

    # --- autoscaling ----------------------------------------------------------------------------
    def _forget(self, key: str) -> None:
        self._scalers.pop(key, None)
        self._profiles.pop(key, None)
        with self._due_lock:
            self._due.pop(key, None)

    def _autoscale(self, fastfunc: Mapping[str, Any], spec: FunctionSpec,
                   children: list[dict[str, Any]]) -> tuple[FunctionSpec, AutoscaleStatus | None]:
        """``spec`` with the configurations the scaler wants (its interval due: stepped first), and
        the autoscaler's status; or, when the profile cannot be used, ``spec`` with its fallback."""
        now_s = self._clock()
        try:
            usable = usable_configs(spec, self._profile(spec, now_s))
        except ProfileUnusable as error:
            self._scalers.pop(spec.key, None)
            self._set_due(spec.key, now_s + PROFILE_REFRESH_S)
            return attrs.evolve(spec, fallback=f"{error}: {spec.fixed_fallback}", profile_problem=error.reason), None
        scaler = self._scalers.get(spec.key)
        if scaler is None or scaler.usable != usable:
            scaler = _Scaler(usable=usable, state=start(usable, children, now_s), next_tick_s=now_s)
            self._scalers[spec.key] = scaler
        if spec.scaling.parked and not any(pods_of(usable, scaler.state).values()) and woken(usable, children):
            # The gateway woke the parked pods for a request: they serve now, within the scale-down delay.
            scaler.state = start(usable, children, now_s)
            scaler.last_scale_time = self._now()
            woke = summary(desired_configs(usable, pods_of(usable, scaler.state), spec.memory))
            log.info("fastfunc=%s parked pods woken by the gateway: %s", spec.key, woke)
            self._recorder.event(fastfunc, NORMAL, names.REASON_WOKEN,
                                 f"The gateway woke the parked pods for a request: {woke} runs")
        if spec.scaling.parked:
            self._stand_in(fastfunc, spec, scaler, children, now_s)
        if now_s >= scaler.next_tick_s:
            self._tick(fastfunc, spec, scaler, now_s, children)
        self._set_due(spec.key, min(scaler.next_tick_s, now_s + PROFILE_REFRESH_S))
        pods = pods_of(usable, scaler.state)
        status = AutoscaleStatus(rps=scaler.rps, planned_rps=scaler.planned_rps,
                                 slo_rps={c.label: rounded(c.option.capacity_rps) for c in usable.choices},
                                 last_scale_time=scaler.last_scale_time, metrics_problem=scaler.metrics_problem)
        configs = desired_configs(usable, pods, spec.memory)
        if not configs and spec.scaling.parked:
            parked, source = parked_config(usable, children, spec.scaling.parked, spec.memory)
            configs = (parked,)
            if source is not None:
                scaler.raises[parked.label] = source  # parked in place: its pods keep running
        return attrs.evolve(spec, configs=configs), status

    def _stand_in(self, fastfunc: Mapping[str, Any], spec: FunctionSpec, scaler: _Scaler,
                  children: list[dict[str, Any]], now_s: float) -> None:
        """One more pod of a configuration for each of its pods woken on its memory alone (no room for its
        request on its GPU): the extender places it where there is room; the surplus goes with the next
        scale-down."""
        uids = {str(child["metadata"].get("uid", "")) for child in children}
        pods = self.pods.select(lambda pod: any(ref.get("uid") in uids and ref.get("controller")
                                                for ref in (pod.get("metadata") or {}).get("ownerReferences") or []),
                                namespace=spec.namespace)
        short = woken_without_request(scaler.usable, children, pods)
        scaler.stood_in_for &= set().union(*short.values())  # given their request since, or gone
        for key, found in short.items():
            new = found - scaler.stood_in_for
            if not new:
                continue
            scaler.stood_in_for |= new
            before = pods_of(scaler.usable, scaler.state)
            scaler.state = with_more_pods(scaler.state, key, len(new), now_s)
            scaler.last_scale_time = self._now()
            message = (f"{len(new)} woken pods run without their time quota request (no room on their GPU): "
                       f"{summary(desired_configs(scaler.usable, before, spec.memory))} -> "
                       f"{summary(desired_configs(scaler.usable, pods_of(scaler.usable, scaler.state), spec.memory))},"
                       " the new pods where there is room")
            log.info("fastfunc=%s %s", spec.key, message)
            self._recorder.event(fastfunc, NORMAL, names.REASON_SCALED, message[0].upper() + message[1:])

    def _tick(self, fastfunc: Mapping[str, Any], spec: FunctionSpec, scaler: _Scaler, now_s: float,
              children: list[dict[str, Any]]) -> None:
        """One interval of the function's policy: read the rates, step (or hold), say what changed."""
        before = pods_of(scaler.usable, scaler.state)
        long_s, short_s = windows(spec)
        rates = self._metrics.read(function_name(spec.namespace, spec.name), long_s, short_s)
        if isinstance(rates, Rates):
            result = tick(spec, scaler.usable, scaler.state, rates, now_s, children=children)
            raised = raise_of(scaler.usable, scaler.state, result.state)
            if raised is not None and not self._may_raise(spec, raised, children):
                result = tick(spec, scaler.usable, scaler.state, rates, now_s, children=children, vertical=False)
            elif raised is not None:
                scaler.raises[raised.target.label] = next(
                    str(child["metadata"]["name"]) for child in children
                    if running_config_label(child) == raised.source.label)
            scaler.state, scaler.metrics_problem = self._fit(spec, scaler, result.state), ""
            scaler.rps, scaler.planned_rps = rounded(rates.long), rounded(result.planned_rps)
        else:
            if rates != scaler.metrics_problem:
                log.warning("fastfunc=%s reads no request rate: %s", spec.key, rates)
            scaler.state, scaler.metrics_problem = hold(spec, scaler.usable, scaler.state), rates
        scaler.next_tick_s = now_s + interval_s(spec)
        after = pods_of(scaler.usable, scaler.state)
        if after == before:
            return
        scaler.last_scale_time = self._now()
        old, new = (summary(desired_configs(scaler.usable, pods, spec.memory)) for pods in (before, after))
        seen = (f"{scaler.rps:g} req/s observed, planned for {scaler.planned_rps:g} req/s"
                if isinstance(rates, Rates) else "no request rate (minReplicas)")
        if isinstance(scaler.state, ScalerState) and scaler.state.last_rebalance_s == now_s:
            saving = 1 - cost(scaler.usable, scaler.state.pods) / max(cost(scaler.usable, scaler.state.keep), 1e-9)
            seen += f"; re-plan for {saving:.0%} less GPU, the old pods run until the new ones are ready"
        message = (f"policy {spec.policy}: {seen}: {old} -> {new} (capacity "
                   f"{capacity_rps(scaler.usable, before):.1f} -> {capacity_rps(scaler.usable, after):.1f} req/s)")
        log.info("fastfunc=%s scaled: %s", spec.key, message)
        self._recorder.event(fastfunc, NORMAL, names.REASON_SCALED, message[0].upper() + message[1:])

    def _fit(self, spec: FunctionSpec, scaler: _Scaler, new: State) -> State:
        """``new`` with the pods a scale-up adds made to fit the cluster's free GPU space (a
        configuration that fits nowhere is replaced by the next most efficient ones that do); a
        re-plan whose new pods do not all fit as planned is not made (what runs stays); as it is
        when there is no reader of the free space or the cluster cannot be read."""
        old = scaler.state
        if (self._free_space is None or not isinstance(new, ScalerState) or not isinstance(old, ScalerState)
                or raise_of(scaler.usable, old, new) is not None):
            return new
        additions = {key: n - old.pods.get(key, 0) for key, n in new.pods.items() if n > old.pods.get(key, 0)}
        if not additions:
            return new
        try:
            space = self._free_space()
        except ApiError as error:
            log.warning("fastfunc=%s cannot read the cluster's free GPU space, adding pods unchecked: %s",
                        spec.key, error)
            return new
        by_key = scaler.usable.by_key()
        fitted = fit_additions(additions, scaler.usable.options, space, lambda option: by_key[option.point.key].share,
                               model_ref(spec))
        if new.keep and not old.keep and (fitted.unplaced or fitted.additions != additions):
            log.info("fastfunc=%s no re-plan: its new pods %s do not fit the free GPU space", spec.key, additions)
            return attrs.evolve(old, last_rebalance_s=new.last_rebalance_s)  # try again after the interval
        if fitted.additions == additions:
            return new
        pods = dict(old.pods)
        for key, n in fitted.additions.items():
            pods[key] = pods.get(key, 0) + n
        log.info("fastfunc=%s new pods fitted to the free GPU space: %s -> %s (%d fit nowhere)", spec.key,
                 additions, dict(fitted.additions), fitted.unplaced)
        return attrs.evolve(new, pods=pods)

    def _raises(self, key: str, spec: FunctionSpec, children: list[dict[str, Any]]) -> dict[str, str]:
        """The vertical steps still to write: target configuration -> the child to raise in place
        (one is done once a child runs the target, or moot once the target is not wanted)."""
        scaler = self._scalers.get(key)
        if scaler is None:
            return {}
        runs = {running_config_label(child) for child in children}
        wanted = {config.label for config in spec.configs}
        for label in [label for label in scaler.raises if label in runs or label not in wanted]:
            del scaler.raises[label]
        return dict(scaler.raises)

    def _may_raise(self, spec: FunctionSpec, raised: Raise, children: list[dict[str, Any]]) -> bool:
        """Whether every pod of the configuration a vertical step raises is running and may have the
        larger time quota on its GPU (else the step adds pods instead). Without a reader of the free
        space the extender alone judges the live change."""
        sources = [child for child in children if running_config_label(child) == raised.source.label]
        if len(sources) != 1:
            return False
        child = sources[0]
        uid = str(child["metadata"].get("uid", ""))
        pods = [f"{spec.namespace}/{pod['metadata']['name']}" for pod in self.pods.select(
            lambda pod: any(ref.get("uid") == uid and ref.get("controller")
                            for ref in (pod.get("metadata") or {}).get("ownerReferences") or []),
            namespace=spec.namespace)]
        if not pods:
            return False
        if self._free_space is None:
            return True
        try:
            space = self._free_space()
        except ApiError as error:
            log.warning("fastfunc=%s cannot read the cluster's free GPU space, adding pods instead of raising "
                        "the quota of %s: %s", spec.key, child["metadata"]["name"], error)
            return False
        return can_raise_in_place(pods, raised.target.share, space, model_ref(spec))

    def _profile(self, spec: FunctionSpec, now_s: float) -> dict[str, Any] | None:
        """The profile ConfigMap (None: not found), read again after PROFILE_REFRESH_S; a failed read
        keeps the one read before, else raises ApiError (retried)."""
        read = self._profiles.get(spec.key)
        if read is not None and read.name == spec.profile and now_s - read.at_s < PROFILE_REFRESH_S:
            return read.configmap
        try:
            configmap = self._kube.get_configmap(spec.namespace, spec.profile)
        except ApiError as error:
            if read is None or read.name != spec.profile:
                raise
            log.warning("fastfunc=%s cannot read the profile ConfigMap %s, using the one read before: %s",
                        spec.key, spec.profile, error)
            return read.configmap
        self._profiles[spec.key] = _ProfileRead(name=spec.profile, at_s=now_s, configmap=configmap)
        return configmap

    def _set_due(self, key: str, at_s: float) -> None:
        with self._due_lock:
            self._due[key] = at_s

    def due(self) -> list[str]:
        """The autoscaled functions whose interval (or profile re-read) is due."""
        now_s = self._clock()
        with self._due_lock:
            return [key for key, at_s in self._due.items() if at_s <= now_s]

    def _apply(self, fastfunc: dict[str, Any], spec: FunctionSpec, actions: list[Action]) -> Problem | None:
        """Carry out ``actions``; returns a problem that retrying cannot fix, raises ApiError otherwise."""
        problem = None
        for action in actions:
            try:
                done = self._do(spec.namespace, action)
            except ApiError as error:
                if error.not_found and isinstance(action, DeleteFaSTPod | PatchFaSTPod | PatchService):
                    continue  # gone meanwhile: the cache will say so
                if error.conflict and isinstance(action, CreateService):
                    problem = _service_conflict(spec)
                    self._recorder.event(fastfunc, WARNING, names.REASON_SERVICE_CONFLICT, problem.message)
                    continue
                if error.conflict or (error.status == INVALID and isinstance(action, PatchFaSTPod)):
                    # created or replaced meanwhile (a name is one configuration): retry once the cache has it
                    self.queue.add_after(spec.key, 1.0)
                    continue
                if error.status == INVALID:
                    message = f"the API server refused {_what(action)}: {error.message or error}"
                    self._recorder.event(fastfunc, WARNING, names.REASON_FAILED, message)
                    problem = Problem(reason=names.REASON_FAILED, message=message)
                    continue
                self._recorder.event(fastfunc, WARNING, names.REASON_FAILED, f"cannot {_what(action)}: {error}")
                raise
            log.info("fastfunc=%s %s", spec.key, done)
            reason = names.REASON_DELETED if isinstance(action, DeleteFaSTPod) else (
                names.REASON_UPDATED if isinstance(action, PatchFaSTPod | PatchService) else names.REASON_CREATED)
            self._recorder.event(fastfunc, NORMAL, reason, done[0].upper() + done[1:])
        return problem

    def _do(self, namespace: str, action: Action) -> str:
        if isinstance(action, CreateFaSTPod):
            self._kube.create_fastpod(namespace, action.body)
            return f"created FaSTPod {action.body['metadata']['name']}"
        if isinstance(action, DeleteFaSTPod):
            self._kube.delete_fastpod(namespace, action.name, action.uid)
            return f"deleted FaSTPod {action.name} (a configuration the function no longer runs)"
        if isinstance(action, PatchFaSTPod):
            self._kube.patch_fastpod(namespace, action.name, action.operations)
            return f"updated FaSTPod {action.name}: {action.what}"
        if isinstance(action, CreateService):
            self._kube.create_service(namespace, action.body)
            return f"created Service {action.body['metadata']['name']}"
        self._kube.patch_service(namespace, action.name, action.patch)
        return f"updated Service {action.name}: selector and port"

    def _write_status(self, fastfunc: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        """Patch what changed of the status; one Warning event when Unschedulable turns True."""
        old = fastfunc.get("status") or {}
        patch = {key: value for key, value in status.items() if old.get(key) != value}
        patch.update({key: None for key in old if key not in status})  # a merge patch removes with null
        if not patch:
            return
        metadata = fastfunc["metadata"]
        try:
            self._kube.patch_fastfunc_status(metadata["namespace"], metadata["name"], patch)
        except ApiError as error:
            if not error.not_found:
                raise
            return
        stuck = next((c for c in status.get("conditions") or [] if c["type"] == names.CONDITION_UNSCHEDULABLE
                      and c["status"] == "True"), None)
        if stuck is not None and not _condition_says(fastfunc, names.CONDITION_UNSCHEDULABLE, "True"):
            log.info("fastfunc=%s/%s unschedulable: %s", metadata["namespace"], metadata["name"], stuck["message"])
            self._recorder.event(fastfunc, WARNING, names.REASON_PODS_UNSCHEDULABLE, stuck["message"])

    # --- running ------------------------------------------------------------------------------
    def start(self, fastfuncs: Sources, fastpods: Sources, services: Sources, pods: Sources) -> None:
        """Fill the caches, then start the worker and the periodic resync; TimeoutError names a cache
        that did not fill (its reflector's log says why). Each kind's source is cluster-wide, or one
        per namespace (a mapping): then each namespace has its own reflector, whose relists replace
        that namespace's part of the cache."""
        self._workers.start([*self._reflectors_of("fastfuncs", fastfuncs, self.fastfuncs, FASTFUNC_HINTS),
                             *self._reflectors_of("fastpods", fastpods, self.fastpods, FASTPOD_HINTS),
                             *self._reflectors_of("services", services, self.services, SERVICE_HINTS),
                             *self._reflectors_of("pods", pods, self.pods, POD_HINTS)],
                            [("worker", self._work), ("resync", self._workers.every(self._resync_s, self._resync)),
                             ("autoscaler", self._workers.every(self._tick_s, self._scrape_and_enqueue_due))])
        log.info("caches synced fastfuncs=%d", len(self.fastfuncs))

    @staticmethod
    def _reflectors_of(name: str, source: Sources, store: Store[dict[str, Any]],
                       hints: Mapping[int, str]) -> list[Reflector]:
        if isinstance(source, Mapping):
            return [Reflector(f"{name}-{namespace}", each, store.scoped(namespace), hints=hints)
                    for namespace, each in source.items()]
        return [Reflector(name, source, store, hints=hints)]

    def stop(self, grace_s: float = 30.0) -> None:
        self._workers.stop(grace_s)

    @property
    def healthy(self) -> bool:
        return self._workers.alive

    def _work(self) -> None:
        while (key := self.queue.get()) is not None:
            try:
                self.reconcile(key)
                self.queue.forget(key)
            except Exception as error:  # any failure is retried; the worker must live on
                delay = self.queue.add_rate_limited(key)
                log.warning("fastfunc=%s reconcile failed, retrying in %.1fs: %s", key, delay, error,
                            exc_info=not isinstance(error, ApiError))
            finally:
                self.queue.done(key)

    def _scrape_and_enqueue_due(self) -> None:
        """Scrape the rates (every tick_s) and enqueue the autoscaled functions that are due."""
        try:
            self._metrics.scrape()
        except Exception:  # the loop must live on; the source logs what it can say
            log.exception("reading the request rates failed")
        for key in self.due():
            self.queue.add(key)

    def _resync(self) -> None:
        for key in self.fastfuncs.list_keys():
            self.queue.add(key)


def _service_conflict(spec: FunctionSpec) -> Problem:
    return Problem(reason=names.REASON_SERVICE_CONFLICT,
                   message=f"a Service {spec.name} exists in {spec.namespace} that this FaSTFunc does not own; "
                           "delete that Service or give the function another name")


def _what(action: Action) -> str:
    if isinstance(action, CreateFaSTPod | CreateService):
        return f"create {action.body['kind']} {action.body['metadata']['name']}"
    if isinstance(action, DeleteFaSTPod):
        return f"delete FaSTPod {action.name}"
    return f"update {'FaSTPod' if isinstance(action, PatchFaSTPod) else 'Service'} {action.name}"


def _condition_says(fastfunc: Mapping[str, Any], kind: str, status: str, message: str | None = None) -> bool:
    """Whether the cached status has condition ``kind`` with ``status`` (and ``message``, if given)."""
    return any(c.get("type") == kind and c.get("status") == status and (message is None or c.get("message") == message)
               for c in (fastfunc.get("status") or {}).get("conditions") or [])
