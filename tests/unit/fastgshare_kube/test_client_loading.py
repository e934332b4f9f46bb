"""Loading a client from a kubeconfig: the credentials refresh hook is called at most once a second."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kubernetes.config import kube_config

from fastgshare_kube.client import load_api_client, throttled_refresh


def kubeconfig(path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "secret-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def test_a_loaded_clients_credentials_still_go_out_with_a_throttled_refresh_hook(tmp_path: Path) -> None:
    configuration = load_api_client(str(kubeconfig(tmp_path / "config"))).configuration
    assert configuration.refresh_api_key_hook is not None
    for _ in range(3):  # the first call refreshes, the next ones within the second skip it
        assert configuration.auth_settings()["BearerToken"]["value"] == "Bearer secret-token"


def test_the_throttle_survives_the_loaders_hook_reinstalling_itself(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The kubeconfig loader's hook sets every setting again, its own hook included: a throttle that
    # wrapped only the first hook would be gone after its first call.
    configuration = load_api_client(str(kubeconfig(tmp_path / "config"))).configuration
    settings: list[object] = []
    original = kube_config.KubeConfigLoader._set_config

    def counted(loader: kube_config.KubeConfigLoader, client_configuration: object) -> None:
        settings.append(client_configuration)
        original(loader, client_configuration)

    monkeypatch.setattr(kube_config.KubeConfigLoader, "_set_config", counted)
    for _ in range(50):
        assert configuration.auth_settings()["BearerToken"]["value"] == "Bearer secret-token"
    assert len(settings) == 1


def test_the_hook_runs_at_most_once_per_interval() -> None:
    calls: list[object] = []
    now = [100.0]
    refresh = throttled_refresh(calls.append, interval_s=1.0, clock=lambda: now[0])
    refresh("config")
    refresh("config")
    now[0] = 100.9
    refresh("config")
    assert calls == ["config"]
    now[0] = 101.0
    refresh("config")
    assert calls == ["config", "config"]
