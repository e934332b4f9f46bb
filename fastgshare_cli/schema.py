"""The Kubernetes schema of a manifest, checked with ``kubernetes-validate`` when it is installed.

``kubernetes-validate`` bundles the API's JSON schemas (about 100 MB), so it is an optional
dependency (``pip install 'fastgshare[check]'``); without it :func:`schema_problems` returns
``None`` and ``fastgshare check`` says the schema was not checked. Objects are checked
strictly (unknown fields are problems) against the newest Kubernetes version it knows. A
FaSTPod's ``spec.podSpec`` is checked as the spec of a Pod, since that is what it becomes.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping
from typing import Any

from fastgshare import keys

INSTALL_HINT = "install kubernetes-validate (pip install 'fastgshare[check]') to check them"


def available() -> bool:
    return importlib.util.find_spec("kubernetes_validate") is not None


def schema_problems(document: Mapping[str, Any]) -> list[str] | None:
    """``["path: problem"]`` (the first the schema finds), ``[]`` if none or no schema for the
    kind, ``None`` if ``kubernetes-validate`` is not installed."""
    if not available():
        return None
    if document.get("kind") == keys.FASTPOD_KIND:
        pod_spec = (document.get("spec") or {}).get("podSpec") if isinstance(document.get("spec"), dict) else None
        if not isinstance(pod_spec, dict):
            return []  # reported by the core's FaSTPod checks
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": pod_spec}
        return [_under("spec.podSpec", problem) for problem in _validate(pod)]
    if not isinstance(document.get("apiVersion"), str):
        return ["apiVersion: is required; allowed: the object's API group and version, e.g. v1 or apps/v1"]
    return _validate(document)


def _validate(document: Mapping[str, Any]) -> list[str]:
    import kubernetes_validate  # noqa: PLC0415  # optional, and slow to import: only when asked

    try:
        kubernetes_validate.validate(dict(document), kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as error:
        return [f"{_path(error.path) or '(object)'}: {error.message}"]
    except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError):
        return []  # a kind it has no schema for (another custom resource): nothing to say
    return []


def _path(steps: Iterable[object]) -> str:
    text = ""
    for step in steps:
        text += f"[{step}]" if isinstance(step, int) else f".{step}"
    return text.lstrip(".")


def _under(prefix: str, problem: str) -> str:
    """A Pod's ``spec...`` problem as the FaSTPod's ``spec.podSpec...``."""
    return prefix + problem.removeprefix("spec") if problem.startswith(("spec.", "spec:", "spec[")) else problem
