"""The objects ``kubectl apply -k deploy/`` creates, read from deploy/kustomization.yaml.

Resolves the kustomization's ``resources`` and its one ``configMapGenerator`` the way kustomize
does for this simple case, so tests need no kubectl.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


def kustomization() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    return data


def resource_files() -> list[Path]:
    return [DEPLOY / name for name in kustomization()["resources"]]


def objects() -> list[dict[str, Any]]:
    """Every object of the kustomization, generated ConfigMaps included, in apply order."""
    found = [doc for path in resource_files() for doc in yaml.safe_load_all(path.read_text()) if doc]
    for generator in kustomization().get("configMapGenerator", []):
        data = {Path(name).name: (DEPLOY / name).read_text() for name in generator["files"]}
        labels = generator.get("options", {}).get("labels", {})
        found.append({"apiVersion": "v1", "kind": "ConfigMap",
                      "metadata": {"name": generator["name"], "namespace": generator["namespace"], "labels": labels},
                      "data": data})
    return found


def pod_specs(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod spec of a workload object (none for other kinds)."""
    if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
        return [obj["spec"]["template"]["spec"]]
    return []
