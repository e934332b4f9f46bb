"""The shipped MutatingWebhookConfiguration (issue 36 item 6): it reaches the extender's /mutate on
pod creates, with the same service, failure policy, timeout and namespaces as the validating one."""

from __future__ import annotations

from typing import Any

from fastgshare import keys
from tests.deploy_manifests import objects


def _one(kind: str) -> dict[str, Any]:
    (found,) = [obj for obj in objects() if obj["kind"] == kind]
    return found


def test_the_mutating_webhook_sees_pod_creates_and_fails_open_like_the_validating_one() -> None:
    (hook,) = _one("MutatingWebhookConfiguration")["webhooks"]
    validating = {h["name"]: h for h in _one("ValidatingWebhookConfiguration")["webhooks"]}
    pods = validating["pods.validate.fastgshare.caps.in.tum"]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]  # not pods/status, not updates
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["clientConfig"]["service"] == {**pods["clientConfig"]["service"], "path": "/mutate"}
    assert hook["clientConfig"]["service"]["name"] == "fastgshare-webhook"
    assert hook["clientConfig"]["caBundle"] == ""  # install.sh fills it in (test_install_script)
    for key in ("failurePolicy", "timeoutSeconds", "sideEffects", "admissionReviewVersions", "matchPolicy",
                "namespaceSelector"):
        assert hook[key] == pods[key], key
    assert hook["failurePolicy"] == "Ignore"
    assert hook["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]
    assert "objectSelector" not in hook  # a pod's resources cannot be selected on: every create reaches it
    assert hook["clientConfig"]["service"]["namespace"] == keys.SYSTEM_NAMESPACE
