"""The pure decisions: a FaSTFunc and what it owns now → the writes that converge them, and its status.

:func:`plan` compares the desired children of a valid :class:`~.spec.FunctionSpec` (one FaSTPod
per configuration, :func:`desired_fastpod`; the Service, :func:`desired_service`) with the child
FaSTPods and the Service the caches hold, and returns the actions:

- a child FaSTPod of a configuration the function no longer runs (another quota or SM: another
  name) is deleted (with its uid as a precondition) and the new one created; the FaSTPod
  controller's pods go with the old one (garbage collector) and come with the new one;
- a child of a configuration it still runs is patched where it differs: ``spec.replicas`` (a
  replica change), the limit and memory annotations, the model annotation (``fastgshare/model``,
  added, changed or removed with ``spec.model``: the FaSTPod controller then rolls the pods, the
  annotations being part of their revision), the podSpec, the labels (one JSON patch whose first
  operation tests the child's uid, so a replaced object is never patched);
- the Service ``<fn>`` is created, or merge-patched back to its selector and port.

An invalid FaSTFunc plans nothing: what runs keeps running until the spec is fixed.
:func:`compute_status` gives the whole ``status`` (counts from the children's own status,
per-config rows, conditions ``Ready``, ``InvalidSpec``, ``ProfileMissing``, ``Unschedulable``
from the children's pods, each reduced by :func:`pod_summary` to what :func:`unschedulable` needs,
and ``MetricsUnavailable``), with the autoscaler's figures (:class:`AutoscaleStatus`: ``rps``,
``plannedRps``, ``capacityRps`` of the ready pods, each row's ``sloRps``, ``lastScaleTime``) for an
autoscaled function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from fastfunc_controller import names
from fastfunc_controller.spec import (
    PARKED_PREFIX,
    Config,
    FunctionSpec,
    InvalidFunction,
    fastpod_name,
    running_config_label,
)
from fastgshare import keys
from fastgshare.share import format_fraction

JSON_PATCH = "application/json-patch+json"


@attrs.frozen
class CreateFaSTPod:
    body: Mapping[str, Any]


@attrs.frozen
class DeleteFaSTPod:
    name: str
    uid: str


@attrs.frozen
class PatchFaSTPod:
    name: str
    operations: tuple[Mapping[str, Any], ...]  # a JSON patch (RFC 6902), the first one a uid test
    what: str  # for events and logs: "replicas 2 -> 3, podSpec"


@attrs.frozen
class CreateService:
    body: Mapping[str, Any]


@attrs.frozen
class PatchService:
    name: str
    patch: Mapping[str, Any]  # a JSON merge patch


Action = CreateFaSTPod | DeleteFaSTPod | PatchFaSTPod | CreateService | PatchService


def owner_reference(spec: FunctionSpec) -> dict[str, Any]:
    return {"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND, "name": spec.name,
            "uid": spec.uid, "controller": True, "blockOwnerDeletion": True}


def controlled_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether ``obj``'s controller owner reference is the FaSTFunc with ``uid``."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("controller") and ref.get("uid") == uid and ref.get("kind") == keys.FASTFUNC_KIND
               for ref in refs)


def function_labels(spec: FunctionSpec) -> dict[str, str]:
    return {keys.FUNCTION_LABEL: spec.name, keys.OPENFAAS_FUNCTION_LABEL: spec.name}


def desired_fastpod(spec: FunctionSpec, config: Config) -> dict[str, Any]:
    """The child FaSTPod of ``config``; the FaSTPod controller copies its labels and annotations to
    its pods, so the pods carry the function and config labels the Service and the gateway select."""
    labels = {**spec.labels, **function_labels(spec), keys.FUNCTION_CONFIG_LABEL: config.name_label}
    return {
        "apiVersion": keys.FASTPOD_API_VERSION,
        "kind": keys.FASTPOD_KIND,
        "metadata": {
            "name": fastpod_name(spec.name, config.wake or config.share),
            "namespace": spec.namespace,
            "labels": labels,
            "annotations": {**spec.annotations, **config.annotations()},
            "ownerReferences": [owner_reference(spec)],
        },
        "spec": {
            "replicas": config.replicas,
            # Both labels: the FaSTPod's /scale selector never counts another config's pods.
            "selector": {"matchLabels": {keys.FUNCTION_LABEL: spec.name,
                                         keys.FUNCTION_CONFIG_LABEL: config.name_label}},
            "podSpec": dict(spec.pod_spec),
        },
    }


def desired_service(spec: FunctionSpec) -> dict[str, Any]:
    """The ClusterIP Service ``<fn>`` in front of every ready pod of the function, on the function port."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": function_labels(spec),
                     "ownerReferences": [owner_reference(spec)]},
        "spec": {"type": "ClusterIP", "selector": {keys.FUNCTION_LABEL: spec.name}, "ports": _ports()},
    }


def _ports() -> list[dict[str, Any]]:
    return [{"name": "http", "protocol": "TCP", "port": keys.FUNCTION_PORT, "targetPort": keys.FUNCTION_PORT}]


def plan(spec: FunctionSpec, children: Sequence[Mapping[str, Any]],
         service: Mapping[str, Any] | None, *, raised: Mapping[str, str] | None = None) -> list[Action]:
    """The writes that make the children and the Service what ``spec`` asks (deletes first).

    Each configuration is served by the child that runs it (its share annotations; the one named
    for it first), else by the child named for it (annotations edited by hand are put back), else
    by the child ``raised`` names for it (the autoscaler's vertical step: that child's time quota is
    patched in place, its pods keep running), else by a new child named for it (``-2``, ``-3``, ...
    when a raised child holds the name). Children that serve nothing are deleted."""
    current = {str(child["metadata"]["name"]): child for child in children}
    serving: dict[str, str] = {}  # config label -> child name
    taken: set[str] = set()

    def claim(label: str, name: str | None) -> None:
        if name is not None and name in current and name not in taken and label not in serving:
            serving[label] = name
            taken.add(name)

    running = {name: running_config_label(child) for name, child in current.items()}
    for config in spec.configs:
        canonical = fastpod_name(spec.name, config.wake or config.share)
        same = sorted(name for name, label in running.items() if label == config.label)
        claim(config.label, canonical if canonical in same else next(iter(same), None))
    for config in spec.configs:
        canonical = fastpod_name(spec.name, config.wake or config.share)
        if running.get(canonical) not in {c.label for c in spec.configs}:
            claim(config.label, canonical)
    for config in spec.configs:
        source = (raised or {}).get(config.label)
        if source is not None and running.get(source) not in {c.label for c in spec.configs}:
            claim(config.label, source)
    actions: list[Action] = [DeleteFaSTPod(name, str(child["metadata"].get("uid", "")))
                             for name, child in sorted(current.items()) if name not in taken]
    for config in spec.configs:
        body = desired_fastpod(spec, config)
        name = serving.get(config.label)
        if name is None:
            body = _named(body, _free_name(body["metadata"]["name"], current), spec.name)
            actions.append(CreateFaSTPod(body))
            continue
        child = current[name]
        if name != body["metadata"]["name"]:
            body = _named(body, name, spec.name, selector=(child.get("spec") or {}).get("selector"))
        if patch := fastpod_patch(child, body):
            actions.append(patch)
    if service is None:
        actions.append(CreateService(desired_service(spec)))
    elif controlled_by(service, spec.uid) and (patch_body := service_patch(service, desired_service(spec))):
        actions.append(PatchService(spec.name, patch_body))
    return actions


def _free_name(name: str, current: Mapping[str, Any]) -> str:
    """``name``, or ``name-2``, ``name-3``, ... when a child (raised in place) holds it."""
    serial, found = 1, name
    while found in current:
        serial += 1
        found = f"{name}-{serial}"
    return found


def _named(body: dict[str, Any], name: str, function: str, *, selector: Any = None) -> dict[str, Any]:
    """``body`` as the child ``name``: its ``config`` label (the pods' selector) is the name's suffix,
    or the selector it already has."""
    label = name.removeprefix(f"{function}-")
    renamed = {**body, "metadata": {**body["metadata"], "name": name,
                                    "labels": {**body["metadata"]["labels"], keys.FUNCTION_CONFIG_LABEL: label}},
               "spec": {**body["spec"]}}
    if selector is not None:
        renamed["spec"]["selector"] = selector
        labels = (selector.get("matchLabels") or {}) if isinstance(selector, Mapping) else {}
        if keys.FUNCTION_CONFIG_LABEL in labels:
            renamed["metadata"]["labels"][keys.FUNCTION_CONFIG_LABEL] = labels[keys.FUNCTION_CONFIG_LABEL]
    else:
        renamed["spec"]["selector"] = {"matchLabels": {**body["spec"]["selector"]["matchLabels"],
                                                       keys.FUNCTION_CONFIG_LABEL: label}}
    return renamed


def fastpod_patch(child: Mapping[str, Any], body: Mapping[str, Any]) -> PatchFaSTPod | None:
    """A JSON patch that gives ``child`` what the controller owns of ``body``, or None if it has it."""
    metadata, child_spec = child.get("metadata") or {}, child.get("spec") or {}
    operations: list[dict[str, Any]] = []
    what: list[str] = []
    for field in ("labels", "annotations"):
        have = metadata.get(field) or {}
        want = body["metadata"][field]
        changed = {key: value for key, value in want.items() if have.get(key) != value}
        if not changed:
            continue
        what.append(", ".join(f"{key}={value}" for key, value in sorted(changed.items())))
        if not metadata.get(field):
            operations.append({"op": "add", "path": f"/metadata/{field}", "value": dict(want)})
            continue
        operations += [{"op": "add", "path": f"/metadata/{field}/{_pointer(key)}", "value": value}
                       for key, value in sorted(changed.items())]
    stale = sorted(key for key in (metadata.get("annotations") or {})
                   if key in (keys.GPU_CONTAINERS_ANNOTATION, keys.SCHEDULING_POLICY_ANNOTATION,
                              keys.FASTPOD_WOKEN_ANNOTATION, keys.MODEL_ANNOTATION)
                   and key not in body["metadata"]["annotations"])
    operations += [{"op": "remove", "path": f"/metadata/annotations/{_pointer(key)}"} for key in stale]
    what += [f"-{key}" for key in stale]
    for field in ("replicas", "selector", "podSpec"):
        if child_spec.get(field) != body["spec"][field]:
            operations.append({"op": "add", "path": f"/spec/{field}", "value": body["spec"][field]})
            what.append(f"replicas {child_spec.get('replicas')} -> {body['spec']['replicas']}"
                        if field == "replicas" else field)
    if not operations:
        return None
    guard = {"op": "test", "path": "/metadata/uid", "value": metadata.get("uid", "")}
    return PatchFaSTPod(str(metadata.get("name", "")), (guard, *operations), "; ".join(what))


def service_patch(service: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch that puts back the selector and the port of ``body``, or None if they hold."""
    spec = service.get("spec") or {}
    want_selector, want_ports = body["spec"]["selector"], body["spec"]["ports"]
    patch: dict[str, Any] = {}
    if (spec.get("selector") or {}) != want_selector:
        patch["selector"] = {**dict.fromkeys(spec.get("selector") or {}), **want_selector}
    fields = ("name", "protocol", "port", "targetPort")
    if [{f: port.get(f) for f in fields} for port in spec.get("ports") or []] != want_ports:
        patch["ports"] = want_ports
    return {"spec": patch} if patch else None


def _pointer(key: str) -> str:
    """A map key as a JSON pointer step (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


# --- status -------------------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class AutoscaleStatus:
    """What the autoscaler reports of an autoscaled function (policy rpr or hpa with a usable profile)."""

    rps: float | None  # the observed rate (long window); None before the first one
    planned_rps: float | None  # what the plan was sized for
    slo_rps: Mapping[str, float]  # one pod's SLO capacity, by config label
    last_scale_time: str  # RFC 3339, "" before the first change
    metrics_problem: str  # why no rate was read ("" when one was)


@attrs.frozen(kw_only=True)
class Problem:
    """An API failure or a conflict reconcile met, for the Ready condition."""

    reason: str
    message: str


def compute_status(fastfunc: Mapping[str, Any], outcome: FunctionSpec | InvalidFunction,
                   children: Sequence[Mapping[str, Any]], now: str,
                   problem: Problem | None = None, *, pods: Sequence[PodSummary] = (),
                   autoscale: AutoscaleStatus | None = None) -> dict[str, Any]:
    """The whole status ``fastfunc`` should have, from its own children's status and their ``pods``."""
    metadata, old = fastfunc.get("metadata") or {}, fastfunc.get("status") or {}
    rows = sorted((_config_row(child) for child in children), key=lambda row: row["fastPod"])
    if autoscale is not None:
        for row in rows:
            if row["config"] in autoscale.slo_rps:
                row["sloRps"] = autoscale.slo_rps[row["config"]]
    spec = outcome if isinstance(outcome, FunctionSpec) else None
    parked_rows = [row for row in rows if str(row["config"]).startswith(f"{PARKED_PREFIX}-")]
    parked = sum(row["replicas"] for row in parked_rows)  # spec.replicas: the pods kept parked
    replicas = sum(row.pop("_replicas") for row in rows if row not in parked_rows)
    for row in parked_rows:
        row.pop("_replicas", None)
    ready_all = sum(row["readyReplicas"] for row in rows)
    ready = ready_all - sum(row["readyReplicas"] for row in parked_rows)
    status: dict[str, Any] = {
        "observedGeneration": metadata.get("generation", 0),
        "policy": spec.policy if spec else str(((fastfunc.get("spec") or {}).get("scaling") or {})
                                                   .get("policy", names.POLICY_FIXED)),
        "replicas": replicas,
        "readyReplicas": ready,
        "parkedReplicas": parked,
        "configs": rows,
        "configSummary": ", ".join(f"{row['config']}x{row['replicas']}" for row in rows) or "-",
    }
    if parked_rows and spec is not None and (wake := next((c for c in spec.configs if c.wake), None)):
        status["parked"] = _parked_status(parked_rows[0], wake, parked)
    if autoscale is not None:
        if autoscale.rps is not None:
            status["rps"] = autoscale.rps
        if autoscale.planned_rps is not None:
            status["plannedRps"] = autoscale.planned_rps
        status["capacityRps"] = round(sum(row["readyReplicas"] * row.get("sloRps", 0.0) for row in rows), 2)
        if autoscale.last_scale_time:
            status["lastScaleTime"] = autoscale.last_scale_time
    conditions = [_ready(spec, outcome, rows, ready_all, problem), _invalid(outcome), _profile(fastfunc, spec),
                  unschedulable(pods), _metrics(spec, autoscale)]
    status["conditions"] = _with_times(conditions, old.get("conditions") or [], now)
    return status


def _parked_status(row: Mapping[str, Any], config: Config, pods: int) -> dict[str, Any]:
    """What the gateway needs to wake the parked pods (the child and the time quota it wakes to) and
    what they cost: their GPU memory, held while they are parked."""
    assert config.wake is not None
    return {"fastPod": row["fastPod"], "replicas": pods,
            "wakeQuotaRequest": format_fraction(config.wake.request_permille),
            "wakeQuotaLimit": format_fraction(config.wake.limit_permille),
            "smPartition": config.wake.sm_percent, "memoryBytes": pods * config.share.memory_bytes}


def _metrics(spec: FunctionSpec | None, autoscale: AutoscaleStatus | None) -> dict[str, Any]:
    if autoscale is None:
        why = ("policy fixed reads no request rate" if spec is None or spec.policy == names.POLICY_FIXED
               else "no autoscaling without a usable profile (see ProfileMissing)")
        return _condition(names.CONDITION_METRICS_UNAVAILABLE, False, names.REASON_NOT_NEEDED, why)
    if autoscale.metrics_problem:
        return _condition(names.CONDITION_METRICS_UNAVAILABLE, True, names.REASON_NO_RATES, autoscale.metrics_problem)
    return _condition(names.CONDITION_METRICS_UNAVAILABLE, False, names.REASON_RATES_READ, "")


def _config_row(child: Mapping[str, Any]) -> dict[str, Any]:
    metadata, spec, status = child.get("metadata") or {}, child.get("spec") or {}, child.get("status") or {}
    annotations, labels = metadata.get("annotations") or {}, metadata.get("labels") or {}
    return {
        "fastPod": str(metadata.get("name", "")),
        "config": running_config_label(child) or str(labels.get(keys.FUNCTION_CONFIG_LABEL, "")),
        "quotaRequest": str(annotations.get(keys.GPU_QUOTA_REQUEST, "")),
        "quotaLimit": str(annotations.get(keys.GPU_QUOTA_LIMIT, "")),
        "smPartition": _as_int(annotations.get(keys.GPU_SM_PARTITION)),
        "replicas": _as_int(spec.get("replicas")),
        "readyReplicas": _as_int(status.get("readyReplicas")),
        "_replicas": _as_int(status.get("replicas")),
    }


def _as_int(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _condition(kind: str, true: bool, reason: str, message: str) -> dict[str, Any]:
    condition = {"type": kind, "status": "True" if true else "False", "reason": reason}
    # No empty message: the API server refused a status write with "" messages (as null).
    return {**condition, "message": message} if message else condition


def _ready(spec: FunctionSpec | None, outcome: FunctionSpec | InvalidFunction, rows: Sequence[Mapping[str, Any]],
           ready: int, problem: Problem | None) -> dict[str, Any]:
    if spec is None:
        return _condition(names.CONDITION_READY, False, names.REASON_INVALID_SPEC,
                          f"the spec is invalid (see InvalidSpec); what ran before keeps running: {outcome}")
    if problem is not None:
        return _condition(names.CONDITION_READY, False, problem.reason, problem.message)
    want = {fastpod_name(spec.name, config.wake or config.share): config.replicas for config in spec.configs}
    have = {row["fastPod"]: row["replicas"] for row in rows}
    desired = sum(want.values())
    shares = ", ".join(f"{config.label} ({describe(config)})" for config in spec.configs)
    if have != want:
        return _condition(names.CONDITION_READY, False, names.REASON_REPLICAS_UNAVAILABLE,
                          f"updating the FaSTPods to {shares}")
    message = f"{ready} of {desired} replicas ready ({shares})"
    return _condition(names.CONDITION_READY, ready >= desired,
                      names.REASON_ALL_READY if ready >= desired else names.REASON_REPLICAS_UNAVAILABLE, message)


def describe(config: Config) -> str:
    return (f"quota {format_fraction(config.share.request_permille)}..{format_fraction(config.share.limit_permille)}, "
            f"SM {config.share.sm_percent} %, {config.replicas} replicas")


def _invalid(outcome: FunctionSpec | InvalidFunction) -> dict[str, Any]:
    if isinstance(outcome, InvalidFunction):
        return _condition(names.CONDITION_INVALID_SPEC, True, outcome.reason, str(outcome))
    return _condition(names.CONDITION_INVALID_SPEC, False, names.REASON_VALID, "")


def _profile(fastfunc: Mapping[str, Any], spec: FunctionSpec | None) -> dict[str, Any]:
    raw = fastfunc.get("spec") or {}
    policy = spec.policy if spec else str((raw.get("scaling") or {}).get("policy", names.POLICY_FIXED))
    profile = spec.profile if spec else str(((raw.get("profile") or {}).get("configMapRef") or {}).get("name") or "")
    fallback = spec.fallback if spec else ""
    if policy == names.POLICY_FIXED:
        return _condition(names.CONDITION_PROFILE_MISSING, False, names.REASON_NOT_NEEDED,
                          "policy fixed runs spec.fixed and needs no profile")
    if not profile:
        return _condition(names.CONDITION_PROFILE_MISSING, True, names.REASON_PROFILE_MISSING,
                          fallback or f"policy {policy} needs a profile (spec.profile.configMapRef)")
    if fallback:  # the profile cannot be used: the controller says why
        reason = spec.profile_problem if spec and spec.profile_problem else names.REASON_PROFILE_INVALID
        return _condition(names.CONDITION_PROFILE_MISSING, True, reason, fallback)
    return _condition(names.CONDITION_PROFILE_MISSING, False, names.REASON_PROFILE_GIVEN, "")


@attrs.frozen(kw_only=True)
class PodSummary:
    """What the Unschedulable condition needs of one pod of the function."""

    name: str
    unschedulable: bool  # Pending, and the scheduler said PodScheduled False / Unschedulable
    message: str = ""  # the scheduler's reason (the PodScheduled condition's message)


def pod_summary(pod: Mapping[str, Any]) -> PodSummary:
    """``pod`` (a dict as the API gives it) reduced to what :func:`unschedulable` needs."""
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    scheduled: Mapping[str, Any] = next((c for c in status.get("conditions") or []
                                         if c.get("type") == "PodScheduled"), {})
    stuck = (status.get("phase", "Pending") == "Pending" and scheduled.get("status") == "False"
             and scheduled.get("reason") == "Unschedulable" and not metadata.get("deletionTimestamp"))
    return PodSummary(name=str(metadata.get("name", "")), unschedulable=stuck,
                      message=str(scheduled.get("message") or "") if stuck else "")


def unschedulable(pods: Sequence[PodSummary]) -> dict[str, Any]:
    """The ``Unschedulable`` condition: True while any of ``pods`` cannot be scheduled, its message
    the count and the scheduler's reason for one of them (the first by name, so it does not flap)."""
    stuck = sorted((pod for pod in pods if pod.unschedulable), key=lambda pod: pod.name)
    if not stuck:
        return _condition(names.CONDITION_UNSCHEDULABLE, False, names.REASON_PODS_SCHEDULABLE, "")
    first = stuck[0]
    count = f"{len(stuck)} of {len(pods)} pods" if len(pods) > 1 else "1 pod"
    why = f": {first.message}" if first.message else ""
    return _condition(names.CONDITION_UNSCHEDULABLE, True, names.REASON_PODS_UNSCHEDULABLE,
                      f"{count} of the function cannot be scheduled; pod {first.name}{why}")


def _with_times(conditions: list[dict[str, Any]], old: Sequence[Mapping[str, Any]], now: str) -> list[dict[str, Any]]:
    """``lastTransitionTime`` moves only when a condition's status flips."""
    before = {c.get("type"): c for c in old}
    for condition in conditions:
        previous = before.get(condition["type"])
        same = previous is not None and previous.get("status") == condition["status"]
        condition["lastTransitionTime"] = previous.get("lastTransitionTime", now) if same and previous else now
    return conditions
