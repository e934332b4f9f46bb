"""The admission webhook on the one-machine cluster, registered as deploy/ registers it.

On a user's cluster the extender serves the admission webhooks on the scheduler pod's port 8443
behind the Service ``fastgshare-webhook``. Here the extender is a host process: it serves them
on loopback with a certificate made for ``127.0.0.1``, and the shipped
``ValidatingWebhookConfiguration`` and ``MutatingWebhookConfiguration`` (deploy/scheduler/webhook.yaml:
their rules, failure policies, timeouts and selectors unchanged) are registered with each webhook's
``clientConfig`` pointed at that URL and the webhook's own path (``/validate``, ``/mutate``).
"""

from __future__ import annotations

import base64
import copy
import subprocess
from pathlib import Path
from typing import Any

import yaml

from fastgshare_kube import rest
from fastgshare_kube.client import ApiClient
from fastgshare_kube.errors import ApiError

REPO = Path(__file__).resolve().parents[1]
WEBHOOK_FILE = REPO / "deploy" / "scheduler" / "webhook.yaml"


def serving_certificate(directory: Path, host: str) -> tuple[Path, Path]:
    """A self-signed certificate and key for ``https://host`` (an IP address), one year."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    cert, key = directory / "tls.crt", directory / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "365",
                    "-keyout", str(key), "-out", str(cert), "-subj", f"/CN={host}",
                    "-addext", f"subjectAltName=IP:{host}"], check=True, capture_output=True)
    key.chmod(0o600)
    return cert, key


KINDS = ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")


def shipped_configuration(url: str, ca: bytes,
                          kind: str = "ValidatingWebhookConfiguration") -> dict[str, Any]:
    """deploy/scheduler/webhook.yaml's configuration of ``kind`` with every webhook calling ``url``
    at the path it is shipped with."""
    shipped = next(doc for doc in yaml.safe_load_all(WEBHOOK_FILE.read_text())
                   if doc and doc.get("kind") == kind)
    config: dict[str, Any] = copy.deepcopy(shipped)
    for hook in config["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {"url": f"{url}{path}", "caBundle": base64.b64encode(ca).decode()}
    return config


def register(api: ApiClient, url: str, ca: bytes) -> tuple[str, ...]:
    """Create (or replace) the shipped configurations pointing at ``url``; returns their names."""
    registrations = rest.admissionregistration_v1(api)
    calls = {"ValidatingWebhookConfiguration": (
                 registrations.create_validating_webhook_configuration,
                 registrations.read_validating_webhook_configuration,
                 registrations.replace_validating_webhook_configuration),
             "MutatingWebhookConfiguration": (
                 registrations.create_mutating_webhook_configuration,
                 registrations.read_mutating_webhook_configuration,
                 registrations.replace_mutating_webhook_configuration)}
    names = []
    for kind in KINDS:
        config = shipped_configuration(url, ca, kind)
        create, read, replace = calls[kind]
        name = str(config["metadata"]["name"])
        try:
            rest.call(create, rest.raw(config))
        except ApiError as error:
            if not error.conflict:
                raise
            current = rest.call(read, name)
            config["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            rest.call(replace, name, rest.raw(config))
        names.append(name)
    return tuple(names)
