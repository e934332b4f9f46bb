"""Start and stop a throw-away Kubernetes v1.20 control plane for the cluster test tier.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler (and, opt-in, containerd plus a
kubelet) run as child processes of the test session. Everything listens on 127.0.0.1 only, on
ports picked at run time, with its data, certificates and log file in a directory the caller
owns. Every process is registered in a :class:`ProcessSet`, which stops them by PID in reverse
start order; :func:`install_emergency_cleanup` makes that happen on interpreter exit and SIGTERM
too, and each child is started so that the kernel SIGTERMs it should the test process die first.

The binaries come from ``tests/cluster/build-control-plane.sh``.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client
import yaml

BUILD_SCRIPT = "tests/cluster/build-control-plane.sh"
K8S_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet")
LOOPBACK = "127.0.0.1"
STOP_GRACE_S = 10.0


class ClusterUnavailable(Exception):
    """The binaries the tier needs are not installed; the message says how to get them."""


class ProcessFailed(Exception):
    """A control-plane process exited or never became healthy; the message carries its log tail."""


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


def free_ports(count: int) -> list[int]:
    """``count`` distinct TCP ports on 127.0.0.1 that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind((LOOPBACK, 0))
        return [sock.getsockname()[1] for sock in sockets]


def _die_with_parent(args: list[str]) -> list[str]:
    """Prefix ``args`` so the kernel SIGTERMs the process if the test process dies first.

    ``setpriv`` (util-linux) sets the parent-death signal and execs, keeping the PID; a
    ``preexec_fn`` would do the same but is unsafe in a process with threads.
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", "--", *args] if setpriv else args


class ManagedProcess:
    """One child process with its own log file, stopped by PID."""

    def __init__(self, name: str, args: list[str], log_path: Path):
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log:
            self.popen = subprocess.Popen(
                _die_with_parent(args),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches only pytest, which stops us in order
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the process's log."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError as error:
            return f"(log {self.log_path} unreadable: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def check_running(self) -> None:
        """Raise :class:`ProcessFailed` with the log tail if the process has exited."""
        code = self.popen.poll()
        if code is not None:
            raise ProcessFailed(
                f"{self.name} (pid {self.pid}) exited with code {code}; log {self.log_path}, last lines:\n"
                f"{self.log_tail()}"
            )

    def stop(self) -> None:
        """SIGTERM, wait up to :data:`STOP_GRACE_S`, then SIGKILL; a no-op once it has exited."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.popen.terminate()
        try:
            self.popen.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
            self.popen.wait()


class ProcessSet:
    """The processes one fixture started, stopped in reverse start order."""

    def __init__(self) -> None:
        self._processes: list[ManagedProcess] = []
        _LIVE_SETS.append(self)

    def start(self, name: str, args: list[str], log_path: Path) -> ManagedProcess:
        process = ManagedProcess(name, args, log_path)
        self._processes.append(process)
        return process

    def stop_all(self) -> None:
        """Stop every process; safe to call more than once and from any cleanup path."""
        while self._processes:
            self._processes.pop().stop()
        if self in _LIVE_SETS:
            _LIVE_SETS.remove(self)


_LIVE_SETS: list[ProcessSet] = []


def _stop_everything() -> None:
    for process_set in reversed(list(_LIVE_SETS)):
        process_set.stop_all()


def _on_sigterm(_signum: int, _frame: object) -> None:
    # Unwind like Ctrl-C: pytest stops the session and runs the finalizers, then atexit runs.
    raise KeyboardInterrupt


def install_emergency_cleanup() -> None:
    """Stop all children at interpreter exit, and treat SIGTERM like Ctrl-C."""
    atexit.register(_stop_everything)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def wait_until(condition: Callable[[], bool], *, what: str, timeout_s: float,
               watched: ManagedProcess | None = None, interval_s: float = 0.25) -> None:
    """Poll ``condition`` until it holds, else raise :class:`TimeoutError`.

    With ``watched``, raise :class:`ProcessFailed` (with the log tail) as soon as it exits.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if watched is not None:
            watched.check_running()
        if condition():
            return
        if time.monotonic() > deadline:
            tail = f"; last lines of {watched.log_path}:\n{watched.log_tail()}" if watched else ""
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}{tail}")
        time.sleep(interval_s)


# Health probes only; the API clients verify the server's certificate.
_UNVERIFIED_TLS = ssl.create_default_context()
_UNVERIFIED_TLS.check_hostname = False
_UNVERIFIED_TLS.verify_mode = ssl.CERT_NONE


def http_ok(url: str, token: str | None = None) -> bool:
    """True if a GET of ``url`` answers 200 (TLS not verified: used for health endpoints)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=5, context=_UNVERIFIED_TLS) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


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

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new client authenticated as a ``system:masters`` user, verifying the server's cert."""
        config = kubernetes.client.Configuration()
        config.host = self.host
        config.ssl_ca_cert = str(self.ca_cert)
        config.api_key = {"authorization": self.token}
        config.api_key_prefix = {"authorization": "Bearer"}
        return kubernetes.client.ApiClient(config)

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


def start_control_plane(binaries: Binaries, workdir: Path, processes: ProcessSet) -> ControlPlane:
    """Start etcd and kube-apiserver in ``workdir`` and return once ``/readyz`` answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    client_port, peer_port, api_port = free_ports(3)
    client_url, peer_url = f"http://{LOOPBACK}:{client_port}", f"http://{LOOPBACK}:{peer_port}"
    etcd = processes.start("etcd", [
        str(binaries.etcd), "--name=test", f"--data-dir={workdir / 'etcd'}",
        f"--listen-client-urls={client_url}", f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=test={peer_url}", "--listen-metrics-urls=",
    ], workdir / "etcd.log")
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
        f"--bind-address={LOOPBACK}", f"--advertise-address={LOOPBACK}", f"--secure-port={api_port}",
        f"--cert-dir={cert_dir}", f"--token-auth-file={tokens}", "--authorization-mode=RBAC",
        "--service-account-issuer=https://kubernetes.default.svc",
        f"--service-account-key-file={sa_key}", f"--service-account-signing-key-file={sa_key}",
        "--service-cluster-ip-range=10.96.0.0/24", "--disable-admission-plugins=ServiceAccount",
        "--endpoint-reconciler-type=none",
    ], workdir / "kube-apiserver.log")
    host = f"https://{LOOPBACK}:{api_port}"
    wait_until(lambda: http_ok(f"{host}/readyz", token), what="kube-apiserver /readyz",
               timeout_s=120, watched=apiserver)

    ca_cert = cert_dir / "apiserver.crt"  # the self-signed serving cert followed by its CA
    kubeconfig = workdir / "kubeconfig"
    write_kubeconfig(kubeconfig, host=host, token=token, ca_cert=ca_cert)
    return ControlPlane(host=host, token=token, kubeconfig=kubeconfig, ca_cert=ca_cert,
                        service_account_key=sa_key, etcd_url=client_url, workdir=workdir)


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
                             processes: ProcessSet) -> ManagedProcess:
    """kube-controller-manager with only the garbage collector and the namespace controller."""
    workdir.mkdir(parents=True, exist_ok=True)
    (port,) = free_ports(1)
    process = processes.start("kube-controller-manager", [
        str(binaries.kube_controller_manager), *_authenticated_https_flags(plane, workdir, port),
        f"--kubeconfig={plane.kubeconfig}",
        "--port=0",  # no insecure HTTP port (v1.20 would otherwise bind 0.0.0.0:10252)
        "--leader-elect=false",
        "--controllers=garbagecollector,namespace",
        "--use-service-account-credentials=false",
        f"--service-account-private-key-file={plane.service_account_key}",
    ], workdir / "kube-controller-manager.log")
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
