"""deploy/install.sh without a cluster: its shell functions, and the script against a fake kubectl.

Issue 15, defect 4: the shipped scheduler configuration (``kubescheduler.config.k8s.io/v1``) is
refused by kube-scheduler 1.20-1.24, and install then waited 3 minutes and said nothing. The
script must pick the configuration the server's version reads, refuse at once what it cannot
serve, and on a timeout show the failing pods' status, logs and recent events.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy_manifests import objects

REPO = Path(__file__).resolve().parents[3]
INSTALL = REPO / "deploy" / "install.sh"
FAKE_KUBECTL = Path(__file__).with_name("fake_kubectl.sh")


def function(name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Call one function of install.sh (sourced, so nothing else runs)."""
    return subprocess.run(["bash", "-c", f'source "{INSTALL}" && {name} "$@"', "install.sh", *args],
                          capture_output=True, text=True, timeout=30, check=False)


@pytest.mark.parametrize(("version", "config"), [
    ("1.20.2", "kube-scheduler-config.v1beta1.yaml"),
    ("1.21.14", "kube-scheduler-config.v1beta1.yaml"),
    ("1.22.0", "kube-scheduler-config.v1beta2.yaml"),
    ("1.23.17", "kube-scheduler-config.v1beta2.yaml"),
    ("1.24.17", "kube-scheduler-config.v1beta2.yaml"),
    ("1.25.0", "kube-scheduler-config.yaml"),
    ("1.28.15", "kube-scheduler-config.yaml"),
    ("1.30.6", "kube-scheduler-config.yaml"),
    ("1.33.1", "kube-scheduler-config.yaml"),
    ("2.0.0", "kube-scheduler-config.yaml"),
])
def test_the_scheduler_config_matches_the_server_version(version: str, config: str) -> None:
    result = function("scheduler_config_for", version)
    assert (result.returncode, result.stdout.strip()) == (0, config), result.stderr
    assert (REPO / "deploy" / "scheduler" / config).is_file()


@pytest.mark.parametrize(("version", "message"), [
    ("1.19.16", "Kubernetes 1.19.16 is too old: fastgshare needs 1.20 or newer"),
    ("one.two", "not a Kubernetes version: 'one.two'"),
])
def test_a_version_it_cannot_serve_is_refused_saying_why(version: str, message: str) -> None:
    result = function("scheduler_config_for", version)
    assert result.returncode != 0
    assert result.stderr.strip() == f"install.sh: {message}"


@pytest.mark.parametrize(("body", "version"), [
    ('{"major": "1", "minor": "20", "gitVersion": "v1.20.2", "gitCommit": "x"}', "1.20.2"),
    ('{\n  "major": "1",\n  "minor": "27+",\n  "gitVersion": "v1.27.4-eks-2d98532"\n}', "1.27.4"),
    ('{"gitVersion": "v1.29.1+k3s2"}', "1.29.1"),
])
def test_the_server_version_is_read_from_its_version_document(body: str, version: str) -> None:
    result = function("version_from_json", body)
    assert (result.returncode, result.stdout.strip()) == (0, version), result.stderr


def install(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], str, str]:
    """Run install.sh with the fake kubectl; returns the result, the kubectl calls, what was applied."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "kubectl").symlink_to(FAKE_KUBECTL)
    log = tmp_path / "kubectl.log"
    result = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log),
                                 "FASTGSHARE_WAIT_TIMEOUT": "1s", **env})
    applied = Path(f"{log}.applied")
    return result, log.read_text() if log.exists() else "", applied.read_text() if applied.exists() else ""


def test_install_on_1_20_runs_the_v1beta1_config_on_a_scheduler_of_that_version(tmp_path: Path) -> None:
    result, _, applied = install(tmp_path, FAKE_VERSION="v1.20.2")
    assert result.returncode == 0, result.stderr
    assert "- --config=/etc/fastgshare/kube-scheduler-config.v1beta1.yaml" in applied
    assert "image: registry.k8s.io/kube-scheduler:v1.20.2" in applied
    assert "Kubernetes 1.20.2: kube-scheduler registry.k8s.io/kube-scheduler:v1.20.2 with " \
           "scheduler/kube-scheduler-config.v1beta1.yaml" in result.stdout


def test_the_scheduler_image_can_be_chosen(tmp_path: Path) -> None:
    result, _, applied = install(tmp_path, FAKE_VERSION="v1.31.0",
                                 FASTGSHARE_SCHEDULER_IMAGE="mirror.example/kube-scheduler:v1.31.0")
    assert result.returncode == 0, result.stderr
    assert "- --config=/etc/fastgshare/kube-scheduler-config.yaml" in applied
    assert "image: mirror.example/kube-scheduler:v1.31.0" in applied


def test_a_too_old_cluster_is_refused_before_anything_is_applied(tmp_path: Path) -> None:
    result, calls, _ = install(tmp_path, FAKE_VERSION="v1.19.16")
    assert result.returncode != 0
    assert "fastgshare needs 1.20 or newer" in result.stderr
    assert "apply" not in calls


def test_an_unreachable_cluster_is_one_clear_line(tmp_path: Path) -> None:
    result, calls, _ = install(tmp_path, FAKE_UNREACHABLE="1")
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        "install.sh: cannot reach the cluster (kubectl get --raw /version: The connection to the server "
        "localhost:8080 was refused - did you specify the right host or port?); check kubectl's context: "
        "kubectl config current-context"]
    assert "apply" not in calls


def test_a_timeout_shows_the_failing_pods_their_logs_and_the_events(tmp_path: Path) -> None:
    result, _, _ = install(tmp_path, FAKE_VERSION="v1.30.6", FAKE_STUCK="deployment/fastgshare-scheduler")
    assert result.returncode != 0
    err = result.stderr
    assert "install.sh: deployment/fastgshare-scheduler is not ready after 1s" in err
    assert "fastgshare-scheduler-7d9c8b6f5-abcde   1/2     CrashLoopBackOff" in err
    assert 'no kind "KubeSchedulerConfiguration" is registered' in err
    assert "Back-off restarting failed container" in err
    assert "fastgshare-controller-5c7f9d-xyz12" not in err.split("logs of")[-1]  # ready pods: no logs


def test_render_rewrites_the_shipped_deployment_and_the_configmap_has_every_form() -> None:
    """The two lines render() rewrites are in deploy/scheduler/deployment.yaml as shipped."""
    shipped = (REPO / "deploy" / "scheduler" / "deployment.yaml").read_text()
    result = subprocess.run(["bash", "-c", f'source "{INSTALL}" && render "$@"', "install.sh",
                             "kube-scheduler-config.v1beta1.yaml", "k8s.example/kube-scheduler:v1.20.2"],
                            input=shipped, capture_output=True, text=True, timeout=30, check=True)
    assert "--config=/etc/fastgshare/kube-scheduler-config.v1beta1.yaml" in result.stdout
    assert "image: k8s.example/kube-scheduler:v1.20.2" in result.stdout
    assert result.stdout.count("\n") == shipped.count("\n")
    [config_map] = [o for o in objects() if o["kind"] == "ConfigMap"]
    assert sorted(config_map["data"]) == ["kube-scheduler-config.v1beta1.yaml", "kube-scheduler-config.v1beta2.yaml",
                                          "kube-scheduler-config.yaml"]


# --- the admission webhook's certificate (issue 15: created by install, renewed near expiry) ------
def make_cert(directory: Path) -> dict[str, str]:
    """``make_webhook_cert`` into ``directory``; the three files' contents."""
    result = function("make_webhook_cert", str(directory))
    assert result.returncode == 0, result.stderr
    return {name: (directory / name).read_text() for name in ("ca.crt", "tls.crt", "tls.key")}


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_the_webhook_certificate_is_signed_by_its_ca_for_the_service_name(tmp_path: Path) -> None:
    make_cert(tmp_path)
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(tmp_path / "ca.crt"), str(tmp_path / "tls.crt")],
                              capture_output=True, text=True, check=False)
    assert verified.returncode == 0, verified.stderr
    text = subprocess.run(["openssl", "x509", "-noout", "-text", "-in", str(tmp_path / "tls.crt")],
                          capture_output=True, text=True, check=True).stdout
    assert "DNS:fastgshare-webhook.fastgshare-system.svc" in text
    assert function("webhook_cert_valid", b64((tmp_path / "tls.crt").read_text())).returncode == 0


def test_a_certificate_near_expiry_is_not_valid(tmp_path: Path) -> None:
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "10", "-subj", "/CN=x",
                    "-keyout", str(tmp_path / "k"), "-out", str(tmp_path / "c")], check=True, capture_output=True)
    assert function("webhook_cert_valid", b64((tmp_path / "c").read_text())).returncode != 0
    assert function("webhook_cert_valid", "").returncode != 0


def ca_bundle(tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "kubectl").exists():
        (bin_dir / "kubectl").symlink_to(FAKE_KUBECTL)
    log = tmp_path / "kubectl.log"
    result = subprocess.run(["bash", "-c", f'source "{INSTALL}" && webhook_ca_bundle "$@"', "install.sh", *args],
                            capture_output=True, text=True, timeout=60, check=False,
                            env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log),
                                 **env})
    return result, log.read_text() if log.exists() else ""


def test_install_keeps_a_valid_certificate_and_renews_one_near_expiry_or_when_asked(tmp_path: Path) -> None:
    (tmp_path / "current").mkdir()
    current = make_cert(tmp_path / "current")
    secret = {"FAKE_SECRET_CERT": b64(current["tls.crt"]), "FAKE_SECRET_CA": b64(current["ca.crt"])}
    kept, calls = ca_bundle(tmp_path, "0", **secret)
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout.strip() == secret["FAKE_SECRET_CA"]
    assert "create secret" not in calls
    assert "webhook certificate: kept" in kept.stderr

    rotated, calls = ca_bundle(tmp_path, "1", **secret)
    assert rotated.returncode == 0, rotated.stderr
    assert "create secret generic fastgshare-webhook-tls" in calls
    bundle = base64.b64decode(rotated.stdout.strip()).decode()
    assert bundle.count("BEGIN CERTIFICATE") == 2  # the new CA, then the old one
    assert bundle.endswith(current["ca.crt"])

    expiring = tmp_path / "expiring"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "5", "-subj", "/CN=x",
                    "-keyout", str(expiring.with_suffix(".key")), "-out", str(expiring)], check=True,
                   capture_output=True)
    renewed, calls = ca_bundle(tmp_path, "0", FAKE_SECRET_CERT=b64(expiring.read_text()),
                               FAKE_SECRET_CA=secret["FAKE_SECRET_CA"])
    assert renewed.returncode == 0, renewed.stderr
    assert calls.count("create secret generic fastgshare-webhook-tls") == 2
    assert "webhook certificate: new, valid 365 days" in renewed.stderr

    (tmp_path / "fresh").mkdir()
    first, _ = ca_bundle(tmp_path / "fresh", "0")  # no Secret yet
    assert first.returncode == 0, first.stderr
    assert base64.b64decode(first.stdout.strip()).decode().count("BEGIN CERTIFICATE") == 1


def test_render_sets_the_webhooks_ca_bundle() -> None:
    shipped = (REPO / "deploy" / "scheduler" / "webhook.yaml").read_text()
    result = subprocess.run(["bash", "-c", f'source "{INSTALL}" && render "$@"', "install.sh", "c.yaml", "i:1",
                             "Q0E="], input=shipped, capture_output=True, text=True, timeout=30, check=True)
    assert 'caBundle: ""' not in result.stdout
    hooks = {document["kind"]: [hook["clientConfig"]["caBundle"] for hook in document["webhooks"]]
             for document in yaml.safe_load_all(result.stdout) if document and "webhooks" in document}
    assert hooks == {"ValidatingWebhookConfiguration": ["Q0E="] * 4,  # FaSTPods, FaSTFuncs, pods, nodes
                     "MutatingWebhookConfiguration": ["Q0E="]}  # pods: our scheduler set (issue 36)


def test_render_sets_our_image_on_every_component_when_asked_and_leaves_it_otherwise() -> None:
    """FASTGSHARE_IMAGE (an upgrade: install.sh again with the new tag) reaches every container of
    ours, the node agent's DaemonSet included, and nothing else."""
    rendered = subprocess.run(["kubectl", "kustomize", str(REPO / "deploy")], capture_output=True, text=True,
                              timeout=60, check=True).stdout
    shipped_count = rendered.count("image: ghcr.io/fastgshare/fastgshare:0.1.0")
    assert shipped_count == 7  # controller, function controller, gateway, extender, node agent, NATS, queue worker

    def render(*args: str) -> str:
        return subprocess.run(["bash", "-c", f'source "{INSTALL}" && render "$@"', "install.sh", *args],
                              input=rendered, capture_output=True, text=True, timeout=30, check=True).stdout

    upgraded = render("c.yaml", "s:1", "", "registry.example/fastgshare:0.2.0")
    assert upgraded.count("image: registry.example/fastgshare:0.2.0") == shipped_count
    assert "ghcr.io/fastgshare/fastgshare:0.1.0" not in upgraded
    assert "image: s:1" in upgraded  # the scheduler's own image is its own setting
    assert render("c.yaml", "s:1").count("image: ghcr.io/fastgshare/fastgshare:0.1.0") == shipped_count


def test_a_daemonset_rollout_is_done_only_when_its_pods_run_the_current_template(tmp_path: Path) -> None:
    """kubectl rollout status can call a DaemonSet's rollout done before the replaced pod exists
    (seen on 1.20 in the install tier: install.sh returned 30 s before the new node agent ran)."""
    stale, calls, _applied = install(tmp_path / "stale", FAKE_VERSION="v1.20.2", FAKE_DS_STALE="1",
                                     FASTGSHARE_WAIT_TIMEOUT="3s")
    assert stale.returncode == 1
    assert "daemonset/fastgshare-node-agent is not ready after 3s" in stale.stderr
    assert "pod-template-generation=3" in calls
    current, _calls, _applied = install(tmp_path / "current", FAKE_VERSION="v1.20.2", FASTGSHARE_WAIT_TIMEOUT="3s")
    assert current.returncode == 0, current.stderr


def test_an_unknown_argument_is_refused(tmp_path: Path) -> None:
    result = subprocess.run(["bash", str(INSTALL), "--rotate"], capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode != 0
    assert result.stderr.strip() == "install.sh: unknown argument '--rotate'; allowed: --rotate-webhook-cert"
