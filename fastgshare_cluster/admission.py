"""The admission webhook on the one-machine cluster, registered as deploy/ registers it.

On a user's cluster the extender serves the validating webhook on the scheduler pod's port 8443
behind the Service ``fastgshare-webhook``. Here the extender is a host process: it serves the
webhook on loopback with a certificate made for ``127.0.0.1``, and the shipped
``ValidatingWebhookConfiguration`` (deploy/scheduler/webhook.yaml: its rules, failure policy,
timeouts and selectors unchanged) is registered with its ``clientConfig`` pointed at that URL.
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


def shipped_configuration(url: str, ca: bytes) -> dict[str, Any]:
    """deploy/scheduler/webhook.yaml's configuration with every webhook calling ``url``."""
    shipped = next(doc for doc in yaml.safe_load_all(WEBHOOK_FILE.read_text())
                   if doc and doc.get("kind") == "ValidatingWebhookConfiguration")
    config: dict[str, Any] = copy.deepcopy(shipped)
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": f"{url}/validate", "caBundle": base64.b64encode(ca).decode()}
    return config


def register(api: ApiClient, url: str, ca: bytes) -> str:
    """Create (or replace) the shipped configuration pointing at ``url``; returns its name."""
    config = shipped_configuration(url, ca)
    registrations = rest.admissionregistration_v1(api)
    name = str(config["metadata"]["name"])
    try:
        rest.call(registrations.create_validating_webhook_configuration, rest.raw(config))
    except ApiError as error:
        if not error.conflict:
            raise
        current = rest.call(registrations.read_validating_webhook_configuration, name)
        config["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        rest.call(registrations.replace_validating_webhook_configuration, name, rest.raw(config))
    return name
