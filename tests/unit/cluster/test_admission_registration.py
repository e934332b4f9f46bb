"""The one-machine cluster registers the shipped webhook configuration, only re-pointed."""

from __future__ import annotations

import base64

import yaml

from fastgshare_cluster import admission


def test_every_webhook_calls_the_local_url_with_the_rest_as_shipped() -> None:
    shipped = next(doc for doc in yaml.safe_load_all(admission.WEBHOOK_FILE.read_text())
                   if doc and doc["kind"] == "ValidatingWebhookConfiguration")
    config = admission.shipped_configuration("https://127.0.0.1:4443", b"PEM")
    assert len(config["webhooks"]) == len(shipped["webhooks"]) >= 2
    for local, original in zip(config["webhooks"], shipped["webhooks"], strict=True):
        assert local["clientConfig"] == {"url": "https://127.0.0.1:4443/validate",
                                         "caBundle": base64.b64encode(b"PEM").decode()}
        assert {k: v for k, v in local.items() if k != "clientConfig"} == \
            {k: v for k, v in original.items() if k != "clientConfig"}
    assert shipped["webhooks"][0]["clientConfig"]["service"]["name"] == "fastgshare-webhook"  # not modified
