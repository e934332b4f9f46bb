"""The OpenFaaS provider contract as FaSTFunc objects: pure mapping, no I/O.

- :func:`to_fastfunc`: an OpenFaaS ``FunctionDeployment`` (``faas-provider/types/function_deployment.go``)
  to a FaSTFunc object dict, or :class:`InvalidDeployment` listing every problem (field, value, what is
  allowed);
- :func:`function_status` / :func:`fastpod_status`: a FaSTFunc, or a FaSTPod written as a function (the
  original's user flow), to an OpenFaaS ``FunctionStatus`` (``types/function_status.go``);
- :func:`scale_patch` and :func:`parse_scale_request`, :func:`parse_delete_request`: the other bodies;
- :func:`parse_body`: the JSON of any of them, hostile input included (nesting deeper than
  :data:`MAX_DEPTH`, not UTF-8, ``NaN``/``Infinity``: a problem at ``body``; a number too large for its
  field: kept as :class:`HugeNumber`, which every field refuses by name).

Mapping (``FunctionDeployment`` → FaSTFunc): ``service`` → ``metadata.name``; ``namespace``;
``image`` → the one container ``fn`` of ``spec.podSpec`` (port 8080, the of-watchdog contract);
``envProcess`` → env ``fprocess``; ``envVars`` → env; ``labels``/``annotations`` → the object's own
(returned as they were sent), ``com.openfaas.scale.min/max`` → ``spec.scaling.minReplicas/maxReplicas``;
the share annotations ``fastgshare/gpu_quota_request|gpu_quota_limit|gpu_sm_partition|gpu_mem`` →
``spec.scaling.policy: fixed``, ``spec.fixed {quotaRequest, quotaLimit, smPartition, replicas}`` and
``spec.memory``: ``gpu_mem`` is required (so is ``spec.memory`` in the CRD), the request defaults to the
whole GPU's time, the limit to the request, SM to 100 %; replicas = the scale minimum, else the count
already set (an update), else 1. (The autoscaler issue adds a profile annotation and policy rpr.)
The annotation ``com.openfaas.fastgshare.model`` (:data:`MODEL_ANNOTATION`), JSON ``{"name", "bytes",
"source": {"path"}}``, → ``spec.model`` (model sharing, checked by :func:`fastgshare.model.parse_model_spec`;
``gpu_mem`` is then each pod's own memory).
``limits``/``requests`` memory and cpu → container resources; ``limits["nvidia.com/gpu"]`` is refused (the
GPU share comes from the annotations); ``constraints`` ``k=v`` → ``nodeSelector``;
``readOnlyRootFilesystem`` → the container's securityContext; non-empty ``secrets`` are refused.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

import attrs

from fastgshare import keys
from fastgshare.errors import FieldProblem, InvalidShareSpec
from fastgshare.model import InvalidModelSpec, ModelSpec, parse_model_spec
from fastgshare.share import DEFAULT_SM_PERCENT, format_fraction, parse_share

CONTAINER_NAME = "fn"
FPROCESS_ENV = "fprocess"
NVIDIA_GPU = "nvidia.com/gpu"
POLICY_FIXED = "fixed"
MAX_NAME_CHARS = 63
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_KNOWN_FIELDS = frozenset({"service", "image", "namespace", "envProcess", "envVars", "constraints", "secrets",
                           "labels", "annotations", "limits", "requests", "readOnlyRootFilesystem"})
_RESOURCES = ("memory", "cpu")
_REPLICAS = re.compile(r"[0-9]{1,6}")
# A Kubernetes quantity (k8s.io/apimachinery resource.Quantity), with a short exponent.
_QUANTITY = re.compile(r"\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][-+]?[0-9]{1,2})?")
MAX_QUANTITY_CHARS = 32
MAX_DEPTH = 32  # a FunctionDeployment nests 3 deep
MAX_INT_DIGITS = 18
# A FunctionDeployment's model (model sharing): its annotation, JSON of the FaSTFunc's spec.model.
MODEL_ANNOTATION = "com.openfaas.fastgshare.model"
MODEL_EXAMPLE = '{"name": "resnet50", "bytes": "100Mi", "source": {"path": "resnet50/weights.bin"}}'


class HugeNumber:
    """A JSON number beyond what any field takes (more than :data:`MAX_INT_DIGITS` digits, or not finite as
    a float): kept as this, not int or float, so the field it is in refuses it by name."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text if len(self.text) <= 20 else f"{self.text[:17]}... ({len(self.text)} characters)"


class InvalidDeployment(ValueError):
    """A request body the provider cannot accept; ``problems`` names each field, value and what is allowed."""

    def __init__(self, problems: list[FieldProblem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(f"{p.field}: {p.message} (got {_show(p.value)})" for p in self.problems))


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _parse_int(text: str) -> int | HugeNumber:
    return HugeNumber(text) if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def _parse_float(text: str) -> float | HugeNumber:
    value = float(text)
    return value if math.isfinite(value) else HugeNumber(text)


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _depth(value: object) -> int:
    """How deep lists and objects nest in ``value`` (iteratively: no recursion to exhaust)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            break
        stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_body(raw: bytes) -> object:
    """A request body's JSON, or :class:`InvalidDeployment` at ``body`` for anything that is not plain JSON
    of a sane shape; never another exception."""
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_no_constant)
    except UnicodeDecodeError as error:
        raise InvalidDeployment([FieldProblem("body", raw[:20], f"not UTF-8 ({error.reason})")]) from None
    except RecursionError:
        raise InvalidDeployment([FieldProblem("body", raw[:20], f"nested deeper than {MAX_DEPTH} levels")]) from None
    except ValueError as error:  # JSONDecodeError included
        raise InvalidDeployment([FieldProblem("body", raw[:20], f"not JSON ({error})")]) from None
    if _depth(value) > MAX_DEPTH:
        raise InvalidDeployment([FieldProblem("body", raw[:20], f"nested deeper than {MAX_DEPTH} levels")])
    return value


def split_function_name(name: str, default_namespace: str) -> tuple[str, str]:
    """``"fn.ns"`` → ``("fn", "ns")``; ``"fn"`` → ``("fn", default_namespace)`` (OpenFaaS's name form)."""
    function, dot, namespace = name.partition(".")
    return function, (namespace if dot and namespace else default_namespace)


def is_dns_label(text: object) -> bool:
    return isinstance(text, str) and len(text) <= MAX_NAME_CHARS and _DNS_LABEL.fullmatch(text) is not None


def _string_map(body: Mapping[str, Any], field: str, problems: list[FieldProblem]) -> dict[str, str]:
    value = body.get(field)
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        problems.append(FieldProblem(field, value, "must be an object of string keys and string values"))
        return {}
    return dict(value)


def _count(labels: Mapping[str, str], key: str, problems: list[FieldProblem]) -> int | None:
    if key not in labels:
        return None
    text = labels[key]
    if not _REPLICAS.fullmatch(text) or not 0 <= int(text) <= 10_000:
        problems.append(FieldProblem(f"labels[{key}]", text, "must be a whole number of replicas, 0..10000"))
        return None
    return int(text)


def _resources(body: Mapping[str, Any], field: str, problems: list[FieldProblem]) -> dict[str, str]:
    value = body.get(field)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(FieldProblem(field, value, 'must be an object such as {"memory": "128Mi", "cpu": "100m"}'))
        return {}
    out: dict[str, str] = {}
    for name, amount in value.items():
        if name == NVIDIA_GPU:
            problems.append(FieldProblem(f"{field}[{name}]", amount, "whole GPUs are not how fastgshare shares "
                                         f"them: give the share as annotations {', '.join(keys.SHARE_ANNOTATIONS)}"))
        elif name not in _RESOURCES:
            problems.append(FieldProblem(f"{field}[{name}]", amount,
                                         f"unknown resource; allowed: {', '.join(_RESOURCES)}"))
        elif (not isinstance(amount, str) or len(amount) > MAX_QUANTITY_CHARS
              or not _QUANTITY.fullmatch(amount)):
            problems.append(FieldProblem(f"{field}[{name}]", amount, 'must be a Kubernetes quantity string, e.g. '
                                                                     '"128Mi" or "100m"'))
        else:
            out[name] = amount
    return out


def _constraints(body: Mapping[str, Any], problems: list[FieldProblem]) -> dict[str, str]:
    value = body.get("constraints")
    if value is None:
        return {}
    if not isinstance(value, list):
        problems.append(FieldProblem("constraints", value, 'must be a list of "key=value" node labels'))
        return {}
    selector: dict[str, str] = {}
    for index, item in enumerate(value):
        text = item.replace("==", "=") if isinstance(item, str) else None
        key, equals, label = (text or "").partition("=")
        if not equals or not key.strip() or not label.strip():
            problems.append(FieldProblem(f"constraints[{index}]", item, 'must be "key=value" (a node label)'))
            continue
        selector[key.strip()] = label.strip()
    return selector


def _share(annotations: Mapping[str, str], problems: list[FieldProblem]) -> dict[str, Any] | None:
    """``{"quotaRequest", "quotaLimit", "smPartition", "memory"}`` from the share annotations: memory is
    required (the FaSTFunc CRD requires ``spec.memory``), the request defaults to the whole GPU's time,
    the limit to the request, SM to 100 %."""
    if keys.GPU_MEM not in annotations:
        problems.append(FieldProblem(f"annotations[{keys.GPU_MEM}]", None,
                                     "required: the GPU memory of each of the function's pods, bytes or a quantity "
                                     'such as "2Gi" (add the time share with ' f"{keys.GPU_QUOTA_REQUEST}, "
                                     f"{keys.GPU_QUOTA_LIMIT} and {keys.GPU_SM_PARTITION})"))
        return None
    filled = dict(annotations)
    filled.setdefault(keys.GPU_QUOTA_REQUEST, "1")
    filled.setdefault(keys.GPU_QUOTA_LIMIT, filled[keys.GPU_QUOTA_REQUEST])
    filled.setdefault(keys.GPU_SM_PARTITION, str(DEFAULT_SM_PERCENT))
    try:
        share = parse_share(filled)
    except InvalidShareSpec as error:
        written = [p for p in error.problems if p.field in annotations]  # not a default derived from a bad one
        problems.extend(FieldProblem(f"annotations[{p.field}]", p.value, p.message)
                        for p in written or error.problems)
        return None
    return {"quotaRequest": format_fraction(share.request_permille),
            "quotaLimit": format_fraction(share.limit_permille),
            "smPartition": share.sm_percent, "memory": annotations[keys.GPU_MEM]}


@attrs.frozen(kw_only=True)
class _Deployment:
    name: str
    namespace: str
    image: str
    env_process: str | None
    env_vars: dict[str, str]
    labels: dict[str, str]
    annotations: dict[str, str]
    limits: dict[str, str]
    requests: dict[str, str]
    node_selector: dict[str, str]
    read_only: bool
    minimum: int | None
    maximum: int | None
    share: dict[str, Any] | None
    model: ModelSpec | None = None


def _model(annotations: Mapping[str, str], problems: list[FieldProblem]) -> ModelSpec | None:
    """``spec.model`` from the :data:`MODEL_ANNOTATION` annotation (None without one)."""
    text = annotations.get(MODEL_ANNOTATION)
    if text is None:
        return None
    field = f"annotations[{MODEL_ANNOTATION}]"
    try:
        document = json.loads(text)
    except ValueError:
        problems.append(FieldProblem(field, text, f"must be JSON of the FaSTFunc's spec.model, e.g. {MODEL_EXAMPLE}"))
        return None
    try:
        return parse_model_spec(document, field)
    except InvalidModelSpec as error:
        problems.extend(error.problems)
        return None


def _names(body: Mapping[str, Any], default_namespace: str, problems: list[FieldProblem]) -> tuple[Any, Any, Any]:
    problems.extend(FieldProblem(str(field), body[field], "unknown field of a FunctionDeployment; allowed: "
                                 + ", ".join(sorted(_KNOWN_FIELDS))) for field in body if field not in _KNOWN_FIELDS)
    name = body.get("service")
    if not is_dns_label(name):
        problems.append(FieldProblem("service", name, "must be a DNS-1123 label: lower-case letters, digits and "
                                     f"'-', starting and ending with a letter or digit, at most {MAX_NAME_CHARS}"))
    namespace = body.get("namespace") or default_namespace
    if not is_dns_label(namespace):
        problems.append(FieldProblem("namespace", namespace, "must be a namespace name (a DNS-1123 label)"))
    image = body.get("image")
    if not isinstance(image, str) or not image.strip():
        problems.append(FieldProblem("image", image, "required: the function's container image"))
    return name, namespace, image


def _parse(body: object, default_namespace: str) -> _Deployment:
    if not isinstance(body, Mapping):
        raise InvalidDeployment([FieldProblem("body", body, "must be a JSON object (an OpenFaaS FunctionDeployment)")])
    problems: list[FieldProblem] = []
    name, namespace, image = _names(body, default_namespace, problems)
    env_process = body.get("envProcess")
    if env_process is not None and not isinstance(env_process, str):
        problems.append(FieldProblem("envProcess", env_process, "must be a string (the watchdog's fprocess)"))
    if secrets := body.get("secrets"):
        problems.append(FieldProblem("secrets", secrets, "secrets are not supported by fastgshare; "
                                     "mount them in the FaSTFunc's podSpec (kubectl edit fstf) or leave the field out"))
    read_only = body.get("readOnlyRootFilesystem", False)
    if not isinstance(read_only, bool):
        problems.append(FieldProblem("readOnlyRootFilesystem", read_only, "must be true or false"))
    labels = _string_map(body, "labels", problems)
    annotations = _string_map(body, "annotations", problems)
    minimum = _count(labels, keys.OPENFAAS_SCALE_MIN_LABEL, problems)
    maximum = _count(labels, keys.OPENFAAS_SCALE_MAX_LABEL, problems)
    if minimum is not None and maximum is not None and minimum > maximum:
        problems.append(FieldProblem(f"labels[{keys.OPENFAAS_SCALE_MIN_LABEL}]", minimum,
                                     f"must be <= {keys.OPENFAAS_SCALE_MAX_LABEL} ({maximum})"))
    deployment = _Deployment(
        name=name, namespace=namespace, image=image, env_process=env_process or None,
        env_vars=_string_map(body, "envVars", problems), labels=labels, annotations=annotations,
        limits=_resources(body, "limits", problems), requests=_resources(body, "requests", problems),
        node_selector=_constraints(body, problems), read_only=read_only is True, minimum=minimum, maximum=maximum,
        share=_share(annotations, problems), model=_model(annotations, problems))
    if problems:
        raise InvalidDeployment(problems)
    return deployment


# faas-netes's default HTTP probe (of-watchdog's health path): a pod is not sent requests before its
# function listens (a model still loading), nor a parked pod woken before it could answer.
READINESS_PROBE = {"httpGet": {"path": "/_/health", "port": keys.FUNCTION_PORT}, "initialDelaySeconds": 2,
                   "periodSeconds": 2, "timeoutSeconds": 1, "failureThreshold": 3}


def _pod_spec(d: _Deployment) -> dict[str, Any]:
    env = ([{"name": FPROCESS_ENV, "value": d.env_process}] if d.env_process else []) + [
        {"name": key, "value": value} for key, value in sorted(d.env_vars.items()) if key != FPROCESS_ENV]
    container: dict[str, Any] = {"name": CONTAINER_NAME, "image": d.image,
                                 "ports": [{"name": "http", "containerPort": keys.FUNCTION_PORT}],
                                 "readinessProbe": dict(READINESS_PROBE)}
    if env:
        container["env"] = env
    resources = {field: amounts for field, amounts in (("limits", d.limits), ("requests", d.requests)) if amounts}
    if resources:
        container["resources"] = resources
    if d.read_only:
        container["securityContext"] = {"readOnlyRootFilesystem": True}
    pod_spec: dict[str, Any] = {"containers": [container]}
    if d.node_selector:
        pod_spec["nodeSelector"] = d.node_selector
    return pod_spec


def to_fastfunc(body: object, default_namespace: str, *, replicas: int | None = None) -> dict[str, Any]:
    """The FaSTFunc object for a ``FunctionDeployment``; ``replicas`` keeps a count already set (an update)
    when the deployment names no scale minimum. Raises :class:`InvalidDeployment` with every problem."""
    d = _parse(body, default_namespace)
    scaling: dict[str, Any] = {}
    if d.minimum is not None:
        scaling["minReplicas"] = d.minimum
    if d.maximum is not None:
        scaling["maxReplicas"] = d.maximum
    spec: dict[str, Any] = {"podSpec": _pod_spec(d)}
    if d.share is not None:  # always, once parsed; kept optional for the autoscaler's policies
        scaling["policy"] = POLICY_FIXED
        count = d.minimum if d.minimum is not None else replicas if replicas is not None else 1
        share = dict(d.share)
        spec["memory"] = share.pop("memory")
        spec["fixed"] = {**share, "replicas": count}
    if scaling:
        spec["scaling"] = scaling
    if d.model is not None:
        spec["model"] = d.model.to_spec()
    metadata: dict[str, Any] = {"name": d.name, "namespace": d.namespace}
    if d.labels:
        metadata["labels"] = d.labels
    if d.annotations:
        metadata["annotations"] = d.annotations
    return {"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND, "metadata": metadata, "spec": spec}


def is_fixed(fastfunc: Mapping[str, Any]) -> bool:
    return ((fastfunc.get("spec") or {}).get("scaling") or {}).get("policy") == POLICY_FIXED


def fixed_replicas(fastfunc: Mapping[str, Any]) -> int | None:
    value = ((fastfunc.get("spec") or {}).get("fixed") or {}).get("replicas")
    return value if isinstance(value, int) else None


def _container(pod_spec: Mapping[str, Any]) -> Mapping[str, Any]:
    containers = [c for c in pod_spec.get("containers") or [] if isinstance(c, Mapping)]
    named = [c for c in containers if c.get("name") == CONTAINER_NAME]
    return (named or containers or [{}])[0]


def _common_status(obj: Mapping[str, Any], pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata") or {}
    container = _container(pod_spec)
    env = {e.get("name"): e.get("value", "") for e in container.get("env") or [] if isinstance(e, Mapping)}
    status: dict[str, Any] = {
        "name": metadata.get("name", ""),
        "image": container.get("image", ""),
        "namespace": metadata.get("namespace", ""),
        "labels": dict(metadata.get("labels") or {}),
        "annotations": dict(metadata.get("annotations") or {}),
        "createdAt": metadata.get("creationTimestamp"),
    }
    if FPROCESS_ENV in env:
        status["envProcess"] = env.pop(FPROCESS_ENV)
    if env:
        status["envVars"] = {str(k): str(v) for k, v in env.items()}
    if node_selector := pod_spec.get("nodeSelector"):
        status["constraints"] = [f"{k}={v}" for k, v in sorted(node_selector.items())]
    resources = container.get("resources") or {}
    for field in ("limits", "requests"):
        if resources.get(field):
            status[field] = dict(resources[field])
    if (container.get("securityContext") or {}).get("readOnlyRootFilesystem"):
        status["readOnlyRootFilesystem"] = True
    return status


def function_status(fastfunc: Mapping[str, Any], invocation_count: float = 0) -> dict[str, Any]:
    """The ``FunctionStatus`` of a FaSTFunc: ``replicas`` the fixed count (else the controller's
    ``status.replicas``), ``availableReplicas`` = ``status.readyReplicas``."""
    spec = fastfunc.get("spec") or {}
    state = fastfunc.get("status") or {}
    desired = fixed_replicas(fastfunc) if is_fixed(fastfunc) else None
    return {**_common_status(fastfunc, spec.get("podSpec") or {}),
            "replicas": desired if desired is not None else int(state.get("replicas") or 0),
            "availableReplicas": int(state.get("readyReplicas") or 0),
            "invocationCount": invocation_count}


def fastpod_status(fastpod: Mapping[str, Any], invocation_count: float = 0) -> dict[str, Any]:
    """The ``FunctionStatus`` of a FaSTPod served as a function (read-only): its ``spec.replicas`` and
    ``status.readyReplicas``, its labels and annotations."""
    spec = fastpod.get("spec") or {}
    state = fastpod.get("status") or {}
    pod_spec = spec.get("podSpec") or ((spec.get("template") or {}).get("spec")) or {}
    return {**_common_status(fastpod, pod_spec), "replicas": int(spec.get("replicas", 1) or 0),
            "availableReplicas": int(state.get("readyReplicas") or 0), "invocationCount": invocation_count}


def is_function_fastpod(fastpod: Mapping[str, Any]) -> bool:
    """A FaSTPod a user wrote as a function (not the child of a FaSTFunc)."""
    metadata = fastpod.get("metadata") or {}
    owned = any((ref or {}).get("kind") == keys.FASTFUNC_KIND for ref in metadata.get("ownerReferences") or [])
    return not owned and keys.FUNCTION_LABEL not in (metadata.get("labels") or {})


def parse_scale_request(body: object, name: str) -> int:
    """The replica count of a ``ScaleServiceRequest`` ``{serviceName, replicas, namespace}``."""
    if not isinstance(body, Mapping):
        raise InvalidDeployment([FieldProblem("body", body, "must be a JSON object (a ScaleServiceRequest)")])
    replicas = body.get("replicas")
    problems = []
    if not isinstance(replicas, int) or isinstance(replicas, bool) or not 0 <= replicas <= 10_000:
        problems.append(FieldProblem("replicas", replicas, "must be a whole number, 0..10000"))
    service = body.get("serviceName")
    if service not in (None, "", name):
        problems.append(FieldProblem("serviceName", service, f"must be the function in the path ({name!r}) or absent"))
    namespace = body.get("namespace")
    if namespace not in (None, "") and not is_dns_label(namespace):
        problems.append(FieldProblem("namespace", namespace, "must be a namespace name (a DNS-1123 label) or absent"))
    if problems:
        raise InvalidDeployment(problems)
    assert isinstance(replicas, int)
    return replicas


def scale_patch(replicas: int) -> dict[str, Any]:
    """The merge patch that sets a fixed FaSTFunc's replica count."""
    return {"spec": {"fixed": {"replicas": replicas}}}


def parse_delete_request(body: object, default_namespace: str) -> tuple[str, str]:
    """``(name, namespace)`` of a ``DeleteFunctionRequest`` ``{functionName, namespace}``."""
    if not isinstance(body, Mapping) or not is_dns_label(body.get("functionName")):
        value = body.get("functionName") if isinstance(body, Mapping) else body
        raise InvalidDeployment([FieldProblem("functionName", value, "required: the function's name")])
    namespace = body.get("namespace") or default_namespace
    if not is_dns_label(namespace):
        raise InvalidDeployment([FieldProblem("namespace", namespace, "must be a namespace name")])
    return str(body["functionName"]), str(namespace)
