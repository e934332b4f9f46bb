"""The install's security posture (issue 15, defect 10), read from the shipped manifests.

The extender's verbs bind pods with the extender's rights, so they listen on the scheduler pod's
loopback only; what the pod network may reach is the status port and the TLS webhook. The
webhook's configuration covers FaSTPods, pods and nodes, and fails open (Ignore) for the reason
docs/security.md gives.
"""

from __future__ import annotations

from typing import Any

import yaml

from fastgshare import keys
from tests.deploy_manifests import DEPLOY, objects


def _one(kind: str, name: str) -> dict[str, Any]:
    [found] = [o for o in objects() if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _extender() -> tuple[dict[str, Any], dict[str, Any]]:
    pod = _one("Deployment", "fastgshare-scheduler")["spec"]["template"]["spec"]
    [extender] = [c for c in pod["containers"] if c["name"] == "extender"]
    return pod, extender


def _flag(command: list[str], name: str) -> str:
    [value] = [arg.split("=", 1)[1] for arg in command if arg.startswith(f"{name}=")]
    return value


def test_the_extenders_verbs_listen_on_the_pods_loopback_and_the_scheduler_calls_them_there() -> None:
    pod, extender = _extender()
    assert _flag(extender["command"], "--listen") == "127.0.0.1:8888"
    assert {c["name"] for c in pod["containers"]} == {"kube-scheduler", "extender"}  # one pod: one network namespace
    assert not pod.get("hostNetwork")
    for name in ("kube-scheduler-config.yaml", "kube-scheduler-config.v1beta2.yaml",
                 "kube-scheduler-config.v1beta1.yaml"):
        config = yaml.safe_load((DEPLOY / "scheduler" / name).read_text())
        assert config["extenders"][0]["urlPrefix"] == "http://127.0.0.1:8888", name


def test_probes_and_prometheus_use_the_status_port_and_the_webhook_its_tls_port() -> None:
    _, extender = _extender()
    ports = {p["name"]: p["containerPort"] for p in extender["ports"]}
    assert ports == {"http": 8889, "webhook": 8443}
    assert _flag(extender["command"], "--metrics-listen") == "0.0.0.0:8889"
    assert _flag(extender["command"], "--webhook-listen") == "0.0.0.0:8443"
    assert extender["livenessProbe"]["httpGet"]["port"] == "http"
    assert extender["readinessProbe"]["httpGet"]["path"] == "/readyz"
    policy = _one("NetworkPolicy", "fastgshare-scheduler")
    allowed = sorted(p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"])
    assert allowed == [8443, 8889]


def test_the_webhook_covers_fastpods_fastfuncs_and_pods_fails_open_and_reaches_the_extender() -> None:
    config = _one("ValidatingWebhookConfiguration", "fastgshare-validate")
    hooks = {hook["name"]: hook for hook in config["webhooks"]}
    fastpods, pods = hooks["fastpods.validate.fastgshare.caps.in.tum"], hooks["pods.validate.fastgshare.caps.in.tum"]
    assert fastpods["rules"][0]["resources"] == [keys.FASTPOD_PLURAL]
    assert fastpods["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    assert pods["rules"][0]["resources"] == ["pods"]  # not pods/status: the kubelets' writes stay off it
    assert pods["rules"][0]["operations"] == ["CREATE", "UPDATE"]
    # forged system annotations are judged in fastgshare-system too
    assert pods["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system"]
    fastfuncs = hooks["fastfuncs.validate.fastgshare.caps.in.tum"]  # a malformed spec.model (model sharing)
    assert fastfuncs["rules"] == [{"apiGroups": [keys.FASTFUNC_GROUP], "apiVersions": ["v1"],
                                   "operations": ["CREATE", "UPDATE"], "resources": [keys.FASTFUNC_PLURAL],
                                   "scope": "Namespaced"}]  # not fastfuncs/status: the controller's writes
    nodes = hooks["nodes.validate.fastgshare.caps.in.tum"]
    assert nodes["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                               "resources": ["nodes"], "scope": "Cluster"}]
    for hook in hooks.values():
        assert hook["failurePolicy"] == "Ignore"
        assert hook["timeoutSeconds"] <= 3  # issue 37: a stalled webhook delays no write long
        assert hook["sideEffects"] == "None"
        assert hook["clientConfig"]["service"] == {"namespace": keys.SYSTEM_NAMESPACE, "name": "fastgshare-webhook",
                                                   "path": "/validate", "port": 443}
    service = _one("Service", "fastgshare-webhook")
    assert service["spec"]["ports"][0]["targetPort"] == "webhook"
    pod, extender = _extender()
    [volume] = [v for v in pod["volumes"] if v["name"] == "webhook-tls"]
    assert volume["secret"]["secretName"] == "fastgshare-webhook-tls"
    assert _flag(extender["command"], "--webhook-cert").startswith("/etc/fastgshare/webhook/")
