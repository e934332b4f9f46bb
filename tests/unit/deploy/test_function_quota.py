"""The function namespace's vGPU quota and the gateway's credentials in the shipped manifests: the
ResourceQuota caps ``requests.fastgshare.caps.in.tum/vgpu`` in fast-gshare-fn and is installed by
default (kustomization); the gateway mounts Secret ``basic-auth`` read-only and is started with
``--basic-auth-dir`` on that mount, not ``--no-auth``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from fastgshare import keys

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_the_function_namespace_has_a_vgpu_quota_installed_by_default() -> None:
    [quota] = list(yaml.safe_load_all((DEPLOY / "function-quota.yaml").read_text()))
    assert quota["kind"] == "ResourceQuota"
    assert quota["metadata"]["namespace"] == keys.DEFAULT_FUNCTION_NAMESPACE
    hard = quota["spec"]["hard"]
    assert int(hard[f"requests.{keys.VGPU_RESOURCE}"]) > 0
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert "function-quota.yaml" in kustomization["resources"]


def _gateway() -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all((DEPLOY / "gateway" / "deployment.yaml").read_text()) if d]
    [deployment] = [d for d in documents if d["kind"] == "Deployment"]
    return deployment


def test_the_gateway_reads_its_credentials_from_the_basic_auth_secret() -> None:
    spec = _gateway()["spec"]["template"]["spec"]
    [volume] = [v for v in spec["volumes"] if v.get("secret", {}).get("secretName") == keys.BASIC_AUTH_SECRET]
    [container] = spec["containers"]
    [mount] = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert f"--basic-auth-dir={mount['mountPath']}" in container["args"]
    assert "--no-auth" not in container["args"]
    assert any(arg.startswith("--max-replicas=") for arg in container["args"])
