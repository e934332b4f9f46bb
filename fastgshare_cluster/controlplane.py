"""A Kubernetes v1.20 control plane on loopback: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler as child processes, each with its data and log file in a directory the
caller owns, on ports picked at run time.

The binaries come from ``tests/cluster/build-control-plane.sh`` (Debian's kubernetes source
package); etcd is Debian's. Used by ``fastgshare cluster`` and by the cluster test tier.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from fastgshare_cluster.processes import LOOPBACK, ManagedProcess, ProcessSet, free_ports, http_ok, wait_until
from fastgshare_kube.client import ApiClient, token_api_client

BUILD_SCRIPT = "tests/cluster/build-control-plane.sh"
K8S_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
SERVICE_RANGE = "10.96.0.0/24"
KUBERNETES_SERVICE_IP = "10.96.0.1"  # the first of SERVICE_RANGE: the API server's own Service
# The controllers that pods made by workloads need: service account tokens, DaemonSets and
# Deployments, and the endpoints of Services (webhooks are reached through them).
WORKLOAD_CONTROLLERS = ("garbagecollector", "namespace", "serviceaccount", "serviceaccount-token", "daemonset",
                        "deployment", "replicaset", "endpoint", "clusterrole-aggregation", "resourcequota")
# With our components as host processes: tokens for their ServiceAccounts (and a second team's),
# the aggregated roles (`edit`, `view`, `admin` gain our CRDs' rules as on a user's cluster), and
# the usage of ResourceQuotas (the function namespace's vGPU quota; without it, pods in a namespace
# with a quota are refused until the quota's usage is known).
HOST_PROCESS_CONTROLLERS = ("garbagecollector", "namespace", "serviceaccount-token", "clusterrole-aggregation",
                            "resourcequota")


class ClusterUnavailable(Exception):
    """The binaries the tier needs are not installed; the message says how to get them."""


def k8s_cache_dir() -> Path:
    """Where build-control-plane.sh puts the binaries (``$FASTGSHARE_K8S_CACHE``)."""
    default = Path.home() / ".cache" / "fastgshare" / "k8s-1.20.2"
    return Path(os.environ.get("FASTGSHARE_K8S_CACHE") or default)


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the executables the tier runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kubelet: Path


def find_binaries() -> Binaries:
    """Locate etcd on PATH and the Kubernetes binaries in the cache, or say what is missing."""
    bin_dir = k8s_cache_dir() / "bin"
    missing = [name for name in K8S_BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if missing:
        raise ClusterUnavailable(f"{', '.join(missing)} not found in {bin_dir}; run {BUILD_SCRIPT}")
    etcd = shutil.which("etcd")
    if etcd is None:
        raise ClusterUnavailable(f"etcd not found on PATH; run {BUILD_SCRIPT} (installs etcd-server)")
    return Binaries(
        etcd=Path(etcd),
        kube_apiserver=bin_dir / "kube-apiserver",
        kube_controller_manager=bin_dir / "kube-controller-manager",
        kube_scheduler=bin_dir / "kube-scheduler",
        kubelet=bin_dir / "kubelet",
    )


@dataclass(frozen=True)
class ControlPlane:
    """A running etcd + kube-apiserver and how to reach it; logs and data live in ``workdir``."""

    host: str
    token: str
    kubeconfig: Path
    ca_cert: Path
    service_account_key: Path
    etcd_url: str
    workdir: Path

    def api_client(self) -> ApiClient:
        """A new client authenticated as a ``system:masters`` user, verifying the server's cert."""
        return token_api_client(self.host, str(self.ca_cert), self.token)

    def compact_etcd(self) -> int:
        """Drop etcd's history before now (the API server does this every 5 minutes).

        Afterwards a watch from an older resourceVersion of a resource the API server does
        not keep in its watch cache (``events``) ends with 410 Gone. Returns the revision.
        """
        header = _etcd_call(self.etcd_url, "range", {"key": base64.b64encode(b"/").decode(), "limit": 1})
        revision = int(header["header"]["revision"])
        _etcd_call(self.etcd_url, "compaction", {"revision": revision, "physical": True})
        return revision


def _etcd_call(etcd_url: str, method: str, body: Mapping[str, object]) -> dict[str, Any]:
    """One call of etcd's v3 JSON gateway (``POST /v3/kv/<method>``)."""
    request = urllib.request.Request(f"{etcd_url}/v3/kv/{method}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, Any] = json.load(response)
        return answer


def start_control_plane(binaries: Binaries, workdir: Path, processes: ProcessSet,
                        extra_apiserver_flags: Sequence[str] = (), *, wait: bool = True,
                        log_dir: Path | None = None, address: str = LOOPBACK, serve_pods: bool = False
                        ) -> ControlPlane:
    """Start etcd and kube-apiserver in ``workdir``; with ``wait``, return once ``/readyz`` answers
    (else call :func:`wait_for_apiserver`). Logs go to ``log_dir`` (default ``workdir``).

    The API server listens on ``address``. With ``serve_pods`` it serves pods as a cluster's does:
    service account tokens are admitted, the ``kubernetes`` Service's endpoints are kept (the
    address and port; something must route :data:`KUBERNETES_SERVICE_IP` there, as kube-proxy
    does), and it reaches webhooks through their Service's endpoints, not its cluster IP (no
    kube-proxy on the host)."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_dir = log_dir or workdir
    client_port, peer_port, api_port = free_ports(3)
    client_url, peer_url = f"http://{LOOPBACK}:{client_port}", f"http://{LOOPBACK}:{peer_port}"
    etcd = processes.start("etcd", [
        str(binaries.etcd), "--name=test", f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=test={peer_url}", "--listen-metrics-urls=",
    ], log_dir / "etcd.log")
    wait_until(lambda: http_ok(f"{client_url}/health"), what="etcd /health", timeout_s=60, watched=etcd)

    token = secrets.token_hex(16)
    tokens = workdir / "tokens.csv"
    tokens.write_text(f"{token},admin,admin-uid,system:masters\n")
    tokens.chmod(0o600)
    sa_key = workdir / "sa.key"
    subprocess.run(["openssl", "genrsa", "-out", str(sa_key), "2048"], check=True, capture_output=True)
    cert_dir = workdir / "apiserver-certs"
    apiserver = processes.start("kube-apiserver", [
        str(binaries.kube_apiserver), f"--etcd-servers={client_url}",
        f"--bind-address={address}", f"--advertise-address={address}", f"--secure-port={api_port}",
        f"--cert-dir={cert_dir}", f"--token-auth-file={tokens}", "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
        f"--service-cluster-ip-range={SERVICE_RANGE}",
        *(["--enable-aggregator-routing=true"] if serve_pods else
          ["--disable-admission-plugins=ServiceAccount", "--endpoint-reconciler-type=none"]),
        *extra_apiserver_flags,
    ], log_dir / "kube-apiserver.log")
    host = f"https://{address}:{api_port}"
    ca_cert = cert_dir / "apiserver.crt"  # the self-signed serving cert followed by its CA
    kubeconfig = workdir / "kubeconfig"
    write_kubeconfig(kubeconfig, host=host, token=token, ca_cert=ca_cert)
    plane = ControlPlane(host=host, token=token, kubeconfig=kubeconfig, ca_cert=ca_cert,
                         service_account_key=sa_key, etcd_url=client_url, workdir=workdir)
    if wait:
        wait_for_apiserver(plane, apiserver)
    return plane


def wait_for_apiserver(plane: ControlPlane, apiserver: ManagedProcess | None = None) -> None:
    """Return once the API server's ``/readyz`` answers."""
    wait_until(lambda: http_ok(f"{plane.host}/readyz", plane.token), what="kube-apiserver /readyz",
               timeout_s=120, watched=apiserver)


def write_kubeconfig(path: Path, *, host: str, token: str, ca_cert: Path) -> None:
    """A kubeconfig with one context: bearer-token user, server cert checked against ``ca_cert``."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": host, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": "admin", "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "admin"}}],
        "current-context": "test",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)


def _authenticated_https_flags(plane: ControlPlane, workdir: Path, secure_port: int) -> list[str]:
    """Serving and delegated-auth flags kube-controller-manager and kube-scheduler share."""
    return [
        f"--authentication-kubeconfig={plane.kubeconfig}",
        f"--authorization-kubeconfig={plane.kubeconfig}",
        f"--bind-address={LOOPBACK}",
        f"--secure-port={secure_port}",
        f"--cert-dir={workdir / 'certs'}",
    ]


def start_controller_manager(binaries: Binaries, plane: ControlPlane, workdir: Path,
                             processes: ProcessSet, *, wait: bool = True, log_dir: Path | None = None,
                             controllers: Sequence[str] = ("garbagecollector", "namespace"),
                             extra_flags: Sequence[str] = ()) -> ManagedProcess:
    """kube-controller-manager with only ``controllers`` (by default the garbage collector and
    the namespace controller; the node lifecycle controller only where every node has a kubelet:
    it marks kubelet-less test nodes Unknown and evicts their pods). Service account token
    secrets carry the API server's CA. With ``wait``, returns once ``/healthz`` answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    process = processes.start("kube-controller-manager", [
        str(binaries.kube_controller_manager), *_authenticated_https_flags(plane, workdir, port),
        f"--kubeconfig={plane.kubeconfig}",
        "--port=0",  # no insecure HTTP port (v1.20 would otherwise bind 0.0.0.0:10252)
        "--leader-elect=false",
        f"--controllers={','.join(controllers)}",
        "--use-service-account-credentials=false",
        f"--service-account-private-key-file={plane.service_account_key}",
        f"--root-ca-file={plane.ca_cert}",
        *extra_flags,
    ], (log_dir or workdir) / "kube-controller-manager.log")
    if not wait:
        return process
    wait_until(lambda: http_ok(f"https://{LOOPBACK}:{port}/healthz"),
               what="kube-controller-manager /healthz", timeout_s=90, watched=process)
    return process


def scheduler_config(config: str | Mapping[str, Any], kubeconfig: Path, health_port: int) -> dict[str, Any]:
    """A ``KubeSchedulerConfiguration`` (YAML text or dict) made safe for the tier.

    It gets our kubeconfig, leader election off, and its plain-HTTP health and metrics
    endpoint on 127.0.0.1:``health_port`` (v1beta1 otherwise binds 0.0.0.0:10251, and with
    ``--config`` the ``--port`` flag is ignored).
    """
    document = yaml.safe_load(config) if isinstance(config, str) else dict(config)
    document.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1beta1")
    document.setdefault("kind", "KubeSchedulerConfiguration")
    document["clientConnection"] = {**document.get("clientConnection", {}), "kubeconfig": str(kubeconfig)}
    document["leaderElection"] = {"leaderElect": False}
    document["healthzBindAddress"] = document["metricsBindAddress"] = f"{LOOPBACK}:{health_port}"
    return document


def start_scheduler(binaries: Binaries, plane: ControlPlane, config: str | Mapping[str, Any],
                    workdir: Path, processes: ProcessSet) -> ManagedProcess:
    """kube-scheduler with the given configuration; returns once ``/healthz`` answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    secure_port, health_port = free_ports(2)
    config_path = workdir / "scheduler-config.yaml"
    config_path.write_text(yaml.safe_dump(scheduler_config(config, plane.kubeconfig, health_port)))
    process = processes.start("kube-scheduler", [
        str(binaries.kube_scheduler), f"--config={config_path}",
        *_authenticated_https_flags(plane, workdir, secure_port),
    ], workdir / "kube-scheduler.log")
    wait_until(lambda: http_ok(f"http://{LOOPBACK}:{health_port}/healthz"),
               what="kube-scheduler /healthz", timeout_s=90, watched=process)
    return process
