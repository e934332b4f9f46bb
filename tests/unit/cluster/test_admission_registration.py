"""The one-machine cluster registers the shipped webhook configurations, only re-pointed."""

from __future__ import annotations

import base64

import pytest
import yaml

from fastgshare_cluster import admission


@pytest.mark.parametrize(("kind", "path"), [("ValidatingWebhookConfiguration", "/validate"),
                                            ("MutatingWebhookConfiguration", "/mutate")])
def test_every_webhook_calls_the_local_url_with_the_rest_as_shipped(kind: str, path: str) -> None:
    shipped = next(doc for doc in yaml.safe_load_all(admission.WEBHOOK_FILE.read_text())
                   if doc and doc["kind"] == kind)
    config = admission.shipped_configuration("https://127.0.0.1:4443", b"PEM", kind)
    assert config["kind"] == kind
    assert len(config["webhooks"]) == len(shipped["webhooks"]) >= 1
    for local, original in zip(config["webhooks"], shipped["webhooks"], strict=True):
        assert local["clientConfig"] == {"url": f"https://127.0.0.1:4443{path}",
                                         "caBundle": base64.b64encode(b"PEM").decode()}
        assert {k: v for k, v in local.items() if k != "clientConfig"} == \
            {k: v for k, v in original.items() if k != "clientConfig"}
    assert shipped["webhooks"][0]["clientConfig"]["service"]["name"] == "fastgshare-webhook"  # not modified


def test_both_configurations_are_registered() -> None:
    assert set(admission.KINDS) == {doc["kind"] for doc in yaml.safe_load_all(admission.WEBHOOK_FILE.read_text())
                                    if doc and "webhooks" in doc}
