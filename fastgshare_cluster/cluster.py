"""``fastgshare cluster up | down | status``: the whole system on one machine.

``up`` starts, from the cached binaries, etcd, kube-apiserver, kube-controller-manager,
kube-scheduler (a ``default-scheduler`` profile and the ``fastgshare-scheduler`` profile with our
extender), our extender and FaSTPod controller, the function controller and the function gateway (on
``127.0.0.1:8080`` by default), asynchronous invocations (Debian's ``nats-server -js`` on loopback
with its store under the state directory, and one ``fastgshare-queue-worker``; without
``nats-server`` they are off, said in one line, and ``/async-function/*`` answers 501), containerd
with a CNI bridge, a real kubelet, and our node agent with simulated GPUs; it installs the FaSTPod
and FaSTFunc CRDs, creates the function namespace ``fast-gshare-fn`` and imports the pause, tenant
and fake-fn images. Our components run as their own ServiceAccounts with the shipped RBAC, the
admission webhook is registered, and the Secrets ``basic-auth`` and ``fastgshare-assignment-key``
exist (:mod:`fastgshare_cluster.identities`, :mod:`fastgshare_cluster.admission`). Every process
logs to ``<state-dir>/logs`` and is recorded with its PID and start time in
``<state-dir>/cluster.json``, together with the host state found before ``up``, so that ``down``
(another process, later) stops exactly those and puts the host back.

``up`` with ``Options.from_manifests`` (``--from-manifests``) runs none of our components as host
processes: the cluster's default kube-scheduler and the workload controllers run instead, and
:mod:`fastgshare_cluster.manifests` installs our components as pods with ``deploy/install.sh``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fastgshare import keys
from fastgshare.inventory import parse_gpu_spec
from fastgshare_cluster import admission, identities, images, machines, manifests, node
from fastgshare_cluster.controlplane import (
    HOST_PROCESS_CONTROLLERS,
    WORKLOAD_CONTROLLERS,
    Binaries,
    ClusterUnavailable,
    ControlPlane,
    find_binaries,
    scheduler_config,
    start_control_plane,
    start_controller_manager,
    wait_for_apiserver,
)
from fastgshare_cluster.image_build import ImageBuildError
from fastgshare_cluster.pki import KubeletPki, apiserver_kubelet_flags, make_kubelet_pki
from fastgshare_cluster.processes import (
    LOOPBACK,
    ManagedProcess,
    ProcessFailed,
    ProcessSet,
    free_ports,
    http_ok,
    is_running,
    stop_recorded,
    wait_until,
)
from fastgshare_kube import rest
from fastgshare_kube.client import ApiClient, load_api_client
from fastgshare_kube.errors import ApiError

REPO = Path(__file__).resolve().parents[1]
DEFAULT_STATE_DIR = Path("/var/lib/fastgshare-cluster")
DEFAULT_GPUS = "2x16GiB:80sm"
DEFAULT_SUBNET = "10.244.250.0/24"
DEFAULT_BRIDGE = "fgs0"
STATE_FILE = "cluster.json"
VGPU_RESOURCE = "fastgshare.caps.in.tum/vgpu"
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
# Debian packages the node needs, by the command that shows each is there.
PACKAGES = {"containerd": "containerd", "runc": "runc", "ctr": "containerd", "gcc": "gcc", "openssl": "openssl",
            "busybox": "busybox-static", "ip": "iproute2", "etcd": "etcd-server"}
CNI_PACKAGE = "containernetworking-plugins"
# Asynchronous invocations' store: optional. Installed with the others when missing (unless --no-install);
# without it async is off and the gateway answers 501 on /async-function/*.
NATS_COMMAND = NATS_PACKAGE = "nats-server"
# The order ``down`` stops components in: clients of the API first, the node, then the control plane.
STOP_ORDER = ("fastgshare-queue-worker", "fastgshare-gateway", "nats-server", "fastgshare-function-controller",
              "node-agent", "fastgshare-controller", "kube-scheduler", "fastgshare-extender", "kubelet", "containerd",
              "node-namespaces", "kube-controller-manager", "kube-apiserver", "etcd")
# A component of the second and later nodes is named ``<component>@<node>``.
NODE_SEPARATOR = "@"
# With more than one node, Kubernetes notices a lost node (the node lifecycle controller) and moves
# its pods, faster than a production cluster's defaults (40 s grace, 300 s tolerations), so that
# the tests and a demo see it within a minute: the kubelets renew their lease every 2 s.
NODE_LEASE_SECONDS = 8
NODE_MONITOR_GRACE = "12s"
NODE_LOSS_TOLERATION_SECONDS = 10
NODE_LIFECYCLE_FLAGS = ("--node-monitor-period=2s", f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
                        "--pod-eviction-timeout=10s")
NODE_LIFECYCLE_CONTROLLERS = ("nodelifecycle", "podgc")
DEFAULT_GATEWAY_LISTEN = f"127.0.0.1:{keys.DEFAULT_GATEWAY_PORT}"
INSTALL_READY_S = 120  # --from-manifests: how long install.sh waits for each component to be Ready


class ClusterError(Exception):
    """``up``, ``down`` or ``status`` cannot go on; the message names the component and its log."""


Say = Callable[[str], None]


@dataclass
class Options:
    state_dir: Path = DEFAULT_STATE_DIR
    gpus: str = DEFAULT_GPUS
    slots_per_gpu: int = 16
    hook_build: Path = REPO / "vgpu_hook" / "build"
    simgpu_build: Path = REPO / "simgpu" / "build"
    subnet: str = DEFAULT_SUBNET
    bridge: str = DEFAULT_BRIDGE
    install_packages: bool = True
    gateway_listen: str = DEFAULT_GATEWAY_LISTEN  # the function gateway (OpenFaaS API and /function/...)
    die_with_parent: bool = False  # the test tier: components die with the test process
    nodes: int = 1  # the first on the host, the others in namespaces of their own (machines.py)
    # The simulated GPUs of nodes 1, 2, ... in order (the last one for the nodes after it); empty:
    # ``gpus`` for every node.
    node_gpus: tuple[str, ...] = ()
    # Our components as pods, installed from deploy/ with deploy/install.sh (manifests.py), instead
    # of host processes.
    from_manifests: bool = False
    say: Say = field(default=print)

    def gpus_of(self, index: int) -> str:
        """The simulated GPUs of node ``index`` (1-based)."""
        if not self.node_gpus:
            return self.gpus
        return self.node_gpus[min(index, len(self.node_gpus)) - 1]


@dataclass(frozen=True)
class Cluster:
    """A running local cluster, as ``up`` leaves it (or :func:`load` finds it)."""

    state_dir: Path
    kubeconfig: Path
    node_name: str
    containerd_socket: Path
    node_agent_state_dir: Path
    extender_url: str
    controller_url: str  # /healthz and /metrics
    gateway_url: str = ""  # the function gateway: /function/<name>, /system/*, /metrics
    nats_url: str = ""  # NATS with JetStream, asynchronous invocations' store ("": async is off)
    queue_worker_url: str = ""  # the queue worker's /healthz and /metrics
    # Every node, the first (``node_name``) first, with its node agent's state directory.
    node_agent_state_dirs: tuple[tuple[str, Path], ...] = ()

    @property
    def node_names(self) -> list[str]:
        return [name for name, _ in self.node_agent_state_dirs] or [self.node_name]

    def api_client(self) -> ApiClient:
        return load_api_client(str(self.kubeconfig))

    def fake_gpu_dir(self, gpu_uuid: str, node_name: str | None = None) -> Path:
        """Where the simulated GPU keeps its state: ``fake_gpu.state`` and ``fake_gpu.lock``, the two
        files the node agent mounts into pods one by one (the directory itself is never mounted)."""
        state_dir = dict(self.node_agent_state_dirs).get(node_name or self.node_name, self.node_agent_state_dir)
        return state_dir / "fake-gpus" / gpu_uuid


def _state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def _read_state(state_dir: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(_state_path(state_dir).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise ClusterError(f"cannot read {_state_path(state_dir)}: {error}") from None
    return data


def _write_state(state_dir: Path, state: dict[str, Any]) -> None:
    path = _state_path(state_dir)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(state, indent=2))
    os.replace(temporary, path)


def _running(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in state.get("components", []) if is_running(c["pid"], c.get("start_time"))]


def _cluster_of(state_dir: Path, state: dict[str, Any]) -> Cluster:
    agents = tuple((entry["name"], Path(entry["node_agent_state_dir"])) for entry in state.get("nodes", [])
                   if "node_agent_state_dir" in entry)
    return Cluster(state_dir=state_dir, kubeconfig=Path(state["kubeconfig"]), node_name=state["node_name"],
                   containerd_socket=Path(state["containerd_socket"]),
                   node_agent_state_dir=Path(state["node_agent_state_dir"]), extender_url=state["extender_url"],
                   controller_url=state.get("controller_url", ""), gateway_url=state.get("gateway_url", ""),
                   nats_url=state.get("nats_url", ""), queue_worker_url=state.get("queue_worker_url", ""),
                   node_agent_state_dirs=agents)


def load(state_dir: Path = DEFAULT_STATE_DIR) -> Cluster:
    """The cluster ``up`` started in ``state_dir``."""
    state = _read_state(state_dir)
    if state is None or "kubeconfig" not in state:
        raise ClusterError(f"no cluster in {state_dir}; start one with: fastgshare cluster up")
    return _cluster_of(state_dir, state)


# --- prerequisites ------------------------------------------------------------------------------

def _check_host() -> None:
    if sys.platform != "linux":
        raise ClusterError("fastgshare cluster runs on Linux only (it starts a kubelet and containerd)")
    if os.geteuid() != 0:
        raise ClusterError("fastgshare cluster needs root: the kubelet mounts volumes and creates cgroups "
                           "(run it with sudo)")


def _missing_packages() -> list[str]:
    missing = {package for command, package in PACKAGES.items() if shutil.which(command) is None}
    if not (node.CNI_BIN_DIR / "bridge").exists():
        missing.add(CNI_PACKAGE)
    if not Path("/usr/lib/x86_64-linux-gnu/libc.a").exists() and shutil.which("gcc"):
        missing.add("libc6-dev")
    return sorted(missing)


def ensure_packages(install: bool, say: Say) -> None:
    """Install the Debian packages the node needs, saying so; or say which are missing."""
    missing = _missing_packages()
    if not missing:
        return
    if not install or shutil.which("apt-get") is None:
        raise ClusterError(f"missing Debian packages: {' '.join(missing)} (apt-get install {' '.join(missing)})")
    say(f"installing Debian packages: {' '.join(missing)}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    result = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
                            check=False, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise ClusterError(f"apt-get install {' '.join(missing)} failed:\n{result.stderr.strip()[-2000:]}")


NATS_MISSING = (f"{NATS_COMMAND} is not installed (apt-get install {NATS_PACKAGE}): asynchronous invocations are off "
                "and /async-function/* answers 501")


def ensure_nats(install: bool, say: Say) -> str | None:
    """The ``nats-server`` command, installed with apt-get if missing and ``install``; None (and one
    line said) when it is not there: asynchronous invocations are then off, the rest runs."""
    found = shutil.which(NATS_COMMAND)
    if found is None and install and shutil.which("apt-get") is not None:
        say(f"installing Debian package: {NATS_PACKAGE}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        result = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", NATS_PACKAGE],
                                check=False, capture_output=True, text=True, env=env)
        found = shutil.which(NATS_COMMAND) if result.returncode == 0 else None
    if found is None:
        say(NATS_MISSING)
    return found


def nats_command(nats_server: str, store_dir: Path, port: int, monitor_port: int) -> list[str]:
    """``nats-server`` with JetStream, its store in ``store_dir``, clients on loopback ``port`` and its
    monitoring (``/healthz``) on loopback ``monitor_port``."""
    return [nats_server, "-js", "-sd", str(store_dir), "-a", LOOPBACK, "-p", str(port), "-m", str(monitor_port)]


def ensure_hook_build(hook_build: Path, simgpu_build: Path, say: Say) -> None:
    """The hook and memcheck (``hook_build``), the simulated GPU and its workloads (``simgpu_build``), built if
    missing (``make -C vgpu_hook`` builds both)."""
    needed = [hook_build / name for name in ("libfastgshare-hook.so", "memcheck")]
    needed += [simgpu_build / name for name in ("libcuda.so.1", "libnvidia-ml.so.1", "tenant", "fake-fn")]
    if all(path.exists() for path in needed):
        return
    makefile_dir = hook_build.parent
    if not (makefile_dir / "Makefile").exists():
        raise ClusterError(f"the CUDA hook is not built in {hook_build} and there is no Makefile to build it; "
                           "pass --hook-build DIR (the output of make -C vgpu_hook) and --simgpu-build DIR "
                           "(of make -C simgpu)")
    say(f"building the CUDA hook and the simulated GPU driver (make -C {makefile_dir})")
    result = subprocess.run(["make", "-C", str(makefile_dir), f"PYTHON={sys.executable}"],
                            check=False, capture_output=True, text=True)
    if result.returncode != 0:
        raise ClusterError(f"make -C {makefile_dir} failed:\n{result.stdout[-1500:]}{result.stderr[-1500:]}")


def _command(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        raise ClusterError(f"{name} is not installed (pip install -e . in this virtualenv)")
    return path


# --- up -----------------------------------------------------------------------------------------

def _scheduler_document(extender_url: str) -> dict[str, Any]:
    """Our shipped v1beta1 configuration with the extender here, plus a default profile."""
    document: dict[str, Any] = yaml.safe_load((REPO / "deploy/scheduler/kube-scheduler-config.v1beta1.yaml")
                                              .read_text())
    document["extenders"][0]["urlPrefix"] = extender_url
    document["profiles"].insert(0, {"schedulerName": "default-scheduler"})
    return document


CRDS = ("fastpods.yaml", "fastfuncs.yaml")


def _install_crds(api: ApiClient) -> None:
    for name in CRDS:
        crd = yaml.safe_load((REPO / "deploy/crd" / name).read_text())
        try:
            rest.call(rest.apiextensions_v1(api).create_custom_resource_definition, rest.raw(crd))
        except ApiError as error:
            if not error.conflict:  # already there
                raise ClusterError(f"cannot install the {crd['spec']['names']['kind']} CRD: {error}") from None


def _create_namespace(core: Any, name: str) -> None:
    try:
        rest.call(core.create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    except ApiError as error:
        if not error.conflict:
            raise ClusterError(f"cannot create namespace {name}: {error}") from None


def _read_node(core: Any, name: str) -> dict[str, Any]:
    try:
        return rest.call(core.read_node, name)
    except ApiError:
        return {}


def _node_ready(core: Any, name: str) -> bool:
    conditions = (_read_node(core, name).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _untaint(core: Any, name: str) -> bool:
    """Remove the not-ready taint the API server put on the new node (no node lifecycle
    controller runs here to do it). True once it is gone."""
    taints = (_read_node(core, name).get("spec") or {}).get("taints") or []
    kept = [t for t in taints if t.get("key") != NOT_READY_TAINT]
    if len(kept) != len(taints):
        rest.call(core.patch_node, name, {"spec": {"taints": kept or None}})
    return True


def _vgpus(core: Any, name: str) -> int:
    allocatable = (_read_node(core, name).get("status") or {}).get("allocatable") or {}
    try:
        return int(allocatable.get(VGPU_RESOURCE, "0"))
    except ValueError:
        return 0


@dataclass(frozen=True)
class _Queue:
    """The asynchronous invocations' processes one ``up`` started."""

    nats: ManagedProcess
    nats_monitor_url: str  # nats-server's /healthz
    nats_url: str
    worker: ManagedProcess
    worker_url: str  # /healthz (200 once bound to the stream) and /metrics

    def wait(self) -> None:
        wait_until(lambda: http_ok(f"{self.nats_monitor_url}/healthz"), what=f"nats-server /healthz on "
                   f"{self.nats_monitor_url}", timeout_s=60, watched=self.nats)
        wait_until(lambda: http_ok(f"{self.worker_url}/healthz"), what=f"fastgshare-queue-worker /healthz on "
                   f"{self.worker_url}", timeout_s=60, watched=self.worker)


class _Startup:
    """One ``up``: the processes it started and the state file it keeps current."""

    def __init__(self, options: Options, nats_server: str | None = None) -> None:
        self.options = options
        self.nats_server = nats_server  # None: asynchronous invocations are off
        self.dir = options.state_dir
        self.logs = self.dir / "logs"
        self.processes = ProcessSet(die_with_parent=options.die_with_parent)
        self.state: dict[str, Any] = {}
        self.started = time.monotonic()
        self.plans = machines.plan_nodes(options.nodes, options.subnet, node.NODE_NAME)

    def step(self, text: str) -> None:
        self.options.say(f"==> {text} [{time.monotonic() - self.started:5.1f}s]")

    def start(self, name: str, args: list[str]) -> ManagedProcess:
        process = self.processes.start(name, args, self.logs / f"{name}.log")
        self.record(process)
        return process

    def record(self, process: ManagedProcess, args: Sequence[str] | None = None) -> None:
        """Record a started process; ``args`` (a node's component): its whole command line, kept
        to start it again after :func:`power_off`."""
        entry = {"name": process.name, "pid": process.pid, "start_time": process.start_time,
                 "log": str(process.log_path)}
        if args is not None:
            entry["args"] = list(args)
        self.state.setdefault("components", []).append(entry)
        _write_state(self.dir, self.state)

    # --- the second and later nodes (machines.py) ---

    def node_entry(self, plan: machines.NodePlan) -> dict[str, Any]:
        entry: dict[str, Any] = self.state["nodes"][plan.index - 1]
        return entry

    def start_on_node(self, plan: machines.NodePlan, component: str, args: list[str]) -> ManagedProcess:
        """Start ``args`` on a namespaced node as ``<component>@<node>``."""
        name = f"{component}{NODE_SEPARATOR}{plan.name}"
        process = self.processes.start(name, [*self.node_entry(plan)["enter"], *args], self.logs / f"{name}.log")
        self.record(process, process.args)
        return process

    def start_other_machines(self) -> list[Path]:
        """Nodes 2..N up to their containerd, and forwarding between the nodes; returns the
        containerd sockets."""
        if not self.several:
            return []
        self.state["forwarding"] = True
        _write_state(self.dir, self.state)
        machines.allow_forwarding(self.plans)
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1")
        subnets = [plan.subnet for plan in self.plans]
        sockets = [self.start_machine(plan, node.NodeNetwork(bridge=self.options.bridge, subnet=plan.subnet),
                                      [subnet for subnet in subnets if subnet != plan.subnet])
                   for plan in self.plans[1:]]
        self.step(f"nodes {', '.join(plan.name for plan in self.plans[1:])}: namespaces, links and routes, "
                  "containerd")
        return sockets

    def start_machine(self, plan: machines.NodePlan, network: node.NodeNetwork, other_subnets: list[str]
                      ) -> Path:
        """A namespaced node up to its containerd (machines.py); returns containerd's socket."""
        entry = self.node_entry(plan)
        node_dir = self.dir / f"n{plan.index}"  # short: containerd's sockets live below it (104 bytes at most)
        entry["node_dir"] = str(node_dir)
        hierarchies = node.cgroup_hierarchies()
        entry["cgroup"] = True
        _write_state(self.dir, self.state)
        machines.create_cgroups(plan, hierarchies)
        machines.prepare_host_paths(node_dir)
        holder = self.start(f"node-namespaces{NODE_SEPARATOR}{plan.name}",
                            machines.holder_command(plan, node_dir, hierarchies))
        wait_until((node_dir / "ready").exists, what=f"node {plan.name}'s namespaces", timeout_s=30,
                   watched=holder)
        machines.release_holder(holder.pid, hierarchies)
        machines.connect(plan, holder.pid, self.plans[0].node_ip)
        entry["enter"] = machines.enter_command(plan, holder.pid, hierarchies)
        _write_state(self.dir, self.state)
        node.create_bridge(network, enter=machines.network_command(holder.pid))
        name = f"containerd{NODE_SEPARATOR}{plan.name}"
        containerd, socket_path = node.start_containerd(
            shutil.which("containerd") or "containerd", node_dir / "ctrd", self.processes,
            pause_image=images.PAUSE_IMAGE, network=network, log_path=self.logs / f"{name}.log",
            other_subnets=other_subnets, enter=entry["enter"], name=name)
        self.record(containerd, containerd.args)
        entry["containerd_socket"] = str(socket_path)
        _write_state(self.dir, self.state)
        return socket_path

    @property
    def several(self) -> bool:
        return len(self.plans) > 1

    def run(self, binaries: Binaries) -> Cluster:
        options = self.options
        network = node.NodeNetwork(bridge=options.bridge, subnet=options.subnet)
        self.state.update({"version": 1, "host": node.record_host_state(),
                           "network": {"bridge": network.bridge, "subnet": network.subnet},
                           "nodes": [{"name": plan.name, "index": plan.index, "subnet": plan.subnet,
                                      "gpus": options.gpus_of(plan.index)} for plan in self.plans]})
        _write_state(self.dir, self.state)

        built: dict[str, list[Path] | BaseException] = {}

        def build_images() -> None:
            try:
                archives = [images.build_pause(self.dir / "images"),
                            images.build_tenant(self.dir / "images", options.hook_build, options.simgpu_build),
                            images.build_fake_fn(self.dir / "images", options.hook_build, options.simgpu_build)]
                if options.from_manifests:
                    ours = manifests.build_images(self.dir / "images", binaries.kube_scheduler, options.say)
                    self.state["image"] = {"tag": ours.image.tag, "size_bytes": ours.image.size_bytes,
                                           "build_seconds": ours.image.build_seconds,
                                           "base_seconds": ours.image.base_seconds}
                    archives += ours.archives
                built["archives"] = archives
            except BaseException as error:  # re-raised in the main thread
                built["archives"] = error

        builder = threading.Thread(target=build_images, name="images")
        builder.start()
        pki = make_kubelet_pki(self.dir / "pki")
        # The API server listens on the first node's address where pods or other nodes reach it.
        on_node_address = options.from_manifests or self.several
        if on_node_address:
            node.create_bridge(network)
        tolerations = [f"--default-not-ready-toleration-seconds={NODE_LOSS_TOLERATION_SECONDS}",
                       f"--default-unreachable-toleration-seconds={NODE_LOSS_TOLERATION_SECONDS}"]
        plane = start_control_plane(binaries, self.dir / "control-plane", self.processes,
                                    extra_apiserver_flags=[*apiserver_kubelet_flags(pki),
                                                           *(tolerations if self.several else [])],
                                    wait=False, log_dir=self.logs,
                                    address=network.node_ip if on_node_address else LOOPBACK,
                                    serve_pods=options.from_manifests)
        for name in ("etcd", "kube-apiserver"):
            process = self.processes.get(name)
            assert process is not None
            self.record(process)
        shutil.copy(plane.kubeconfig, self.dir / "kubeconfig")
        kubeconfig = self.dir / "kubeconfig"
        self.step("etcd healthy, kube-apiserver starting")

        if not on_node_address:
            node.create_bridge(network)
        subnets = [plan.subnet for plan in self.plans]
        containerd, containerd_socket = node.start_containerd(
            shutil.which("containerd") or "containerd", self.dir / "containerd", self.processes,
            pause_image=images.PAUSE_IMAGE, network=network, log_path=self.logs / "containerd.log",
            other_subnets=subnets[1:])
        self.record(containerd)
        sockets = [containerd_socket, *self.start_other_machines()]
        builder.join()
        archives = built["archives"]
        if isinstance(archives, BaseException):
            raise archives
        for socket_path in sockets:
            images.import_images(shutil.which("ctr") or "ctr", socket_path, archives)
        self.step("containerd up, images imported" + (f" on {len(sockets)} nodes" if self.several else ""))

        wait_for_apiserver(plane, self.processes.get("kube-apiserver"))
        self.step("kube-apiserver ready")
        if options.from_manifests:
            self.state["service_route"] = True
            _write_state(self.dir, self.state)
            node.route_kubernetes_service(network.node_ip, int(plane.host.rsplit(":", 1)[1]))
            return self._install_from_manifests(binaries, plane, pki, kubeconfig, containerd_socket, network=network)
        return self._start_node_and_services(binaries, plane, pki, kubeconfig, containerd_socket, network=network)

    def _start_node(self, binaries: Binaries, plane: ControlPlane, pki: KubeletPki, containerd_socket: Path,
                    network: node.NodeNetwork) -> node.Kubelet:
        """The kubelet and kube-controller-manager (with the workload controllers for
        --from-manifests, where the kubelet keeps its state where deploy/ expects it)."""
        from_manifests = self.options.from_manifests
        lease = {"nodeLeaseDurationSeconds": NODE_LEASE_SECONDS} if self.several else None
        kubelet = node.start_kubelet(binaries, plane, pki, containerd_socket=containerd_socket, network=network,
                                     workdir=self.dir / "kubelet", processes=self.processes,
                                     log_path=self.logs / "kubelet.log", wait=False,
                                     root_dir=node.KUBELET_ROOT_DIR if from_manifests else None, config=lease)
        self.record(kubelet.process)
        for plan in self.plans[1:]:
            entry = self.node_entry(plan)
            name = f"kubelet{NODE_SEPARATOR}{plan.name}"
            other = node.start_kubelet(
                binaries, plane, pki, containerd_socket=Path(entry["containerd_socket"]),
                network=node.NodeNetwork(bridge=self.options.bridge, subnet=plan.subnet),
                workdir=Path(entry["node_dir"]) / "kubelet", processes=self.processes,
                log_path=self.logs / f"{name}.log", wait=False, root_dir=node.KUBELET_ROOT_DIR, node_name=plan.name,
                enter=entry["enter"], name=name, healthz_address=plan.node_ip, config=lease)
            self.record(other.process, other.process.args)
        controllers = WORKLOAD_CONTROLLERS if from_manifests else HOST_PROCESS_CONTROLLERS
        self.record(start_controller_manager(
            binaries, plane, self.dir / "controller-manager", self.processes, wait=False, log_dir=self.logs,
            controllers=[*controllers, *(NODE_LIFECYCLE_CONTROLLERS if self.several else ())],
            extra_flags=NODE_LIFECYCLE_FLAGS if self.several else ()))
        return kubelet

    def wait_for_nodes(self, core: Any, kubelet: node.Kubelet) -> None:
        """Every node Ready, without the not-ready taint the API server gave it."""
        for plan in self.plans:
            watched = kubelet.process if plan.index == 1 else self.processes.get(
                f"kubelet{NODE_SEPARATOR}{plan.name}")
            wait_until(lambda name=plan.name: _node_ready(core, name), what=f"node {plan.name} Ready",  # type: ignore[misc]
                       timeout_s=90, watched=watched)
            _untaint(core, plan.name)
        self.step(f"node{'s' if self.several else ''} {', '.join(plan.name for plan in self.plans)} Ready")

    def wait_for_vgpus(self, core: Any, watched: ManagedProcess | None = None, via: str = "") -> None:
        for plan in self.plans:
            wanted = parse_gpu_spec(self.options.gpus_of(plan.index)).count * self.options.slots_per_gpu
            wait_until(lambda name=plan.name, wanted=wanted: _vgpus(core, name) >= wanted,  # type: ignore[misc]
                       what=f"{VGPU_RESOURCE} on node {plan.name}{via}", timeout_s=60,
                       watched=watched if plan.index == 1 else self.processes.get(
                           f"node-agent{NODE_SEPARATOR}{plan.name}"))

    def _start_default_scheduler(self, binaries: Binaries, kubeconfig: Path) -> None:
        """The cluster's own kube-scheduler (the default profile only), which places our components'
        pods as any cluster's does; ours runs as a pod beside it."""
        secure_port, health_port = free_ports(2)
        config = self.dir / "kube-scheduler.yaml"
        config.write_text(yaml.safe_dump(scheduler_config({"profiles": [{"schedulerName": "default-scheduler"}]},
                                                          kubeconfig, health_port)))
        scheduler = self.start("kube-scheduler", [
            str(binaries.kube_scheduler), f"--config={config}", f"--bind-address={LOOPBACK}",
            f"--secure-port={secure_port}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", f"--cert-dir={self.dir / 'kube-scheduler-certs'}"])
        wait_until(lambda: http_ok(f"http://{LOOPBACK}:{health_port}/healthz"), what="kube-scheduler /healthz",
                   timeout_s=60, watched=scheduler)

    def _identities(self, api: ApiClient, plane: ControlPlane, kubeconfig: Path) -> dict[str, Path]:
        """The CRDs, namespaces and shipped RBAC; a kubeconfig per component (its own ServiceAccount),
        the gateway's credentials and the assignment key as files. Keys: the component names of
        :data:`identities.COMPONENT_ACCOUNTS`, ``gateway-auth`` (a directory), ``assignment-key``."""
        core = rest.core_v1(api)
        _install_crds(api)
        _create_namespace(core, keys.DEFAULT_FUNCTION_NAMESPACE)
        identities.apply_shipped_rbac(kubeconfig)
        accounts = self.dir / "accounts"
        accounts.mkdir(mode=0o700, exist_ok=True)
        found = {component: identities.service_account_kubeconfig(
                     core, plane, keys.SYSTEM_NAMESPACE, account, accounts / f"{component}.kubeconfig")
                 for component, account in identities.COMPONENT_ACCOUNTS.items()}
        found["gateway-auth"] = identities.ensure_secret_files(
            core, keys.BASIC_AUTH_SECRET, identities.gateway_credentials(), self.dir / "gateway-auth")
        key_dir = identities.ensure_secret_files(core, keys.ASSIGNMENT_KEY_SECRET, identities.assignment_key(),
                                                 self.dir / "assignment-key")
        found["assignment-key"] = key_dir / keys.ASSIGNMENT_KEY_SECRET_KEY
        self.step(f"CRDs, namespaces and the shipped RBAC applied; each component has its ServiceAccount in "
                  f"{keys.SYSTEM_NAMESPACE}; Secrets {keys.BASIC_AUTH_SECRET} and {keys.ASSIGNMENT_KEY_SECRET}")
        return found

    def _install_from_manifests(self, binaries: Binaries, plane: ControlPlane, pki: KubeletPki, kubeconfig: Path,
                                containerd_socket: Path, *, network: node.NodeNetwork) -> Cluster:
        options = self.options
        kubelet = self._start_node(binaries, plane, pki, containerd_socket, network)
        self._start_default_scheduler(binaries, kubeconfig)
        with plane.api_client() as api:
            core = rest.core_v1(api)
            self.wait_for_nodes(core, kubelet)
            for plan in self.plans:
                manifests.label_node(kubeconfig, plan.name, options.gpus_of(plan.index))
            # The MPS DaemonSet skips simulated nodes: stand in for its daemon where deploy/ mounts it.
            _start_simulated_mps(Path(keys.DEFAULT_MPS_PIPE_DIRECTORY))
            for plan in self.plans[1:]:
                _start_simulated_mps(machines.node_path(Path(self.node_entry(plan)["node_dir"]),
                                                        keys.DEFAULT_MPS_PIPE_DIRECTORY))
            install_seconds = manifests.run_script("install.sh", kubeconfig, say=options.say,
                                                   log_path=self.logs / "install.log",
                                                   env={"FASTGSHARE_WAIT_TIMEOUT": f"{INSTALL_READY_S}s"})
            self.step("deploy/install.sh: every component Ready")
            self.state["nodes"][0]["node_agent_state_dir"] = manifests.NODE_AGENT_STATE_DIR
            for plan in self.plans[1:]:  # the DaemonSet's hostPath, the node's own in its mount namespace
                entry = self.node_entry(plan)
                entry["node_agent_state_dir"] = str(machines.node_path(Path(entry["node_dir"]),
                                                                       manifests.NODE_AGENT_STATE_DIR))
            self.wait_for_vgpus(core, via=" (from the node agent's DaemonSet)")
        self.state.update({"kubeconfig": str(kubeconfig), "node_name": node.NODE_NAME, "from_manifests": True,
                           "containerd_socket": str(containerd_socket),
                           "node_agent_state_dir": manifests.NODE_AGENT_STATE_DIR, "extender_url": "",
                           "gpus": options.gpus, "install_seconds": round(install_seconds, 1),
                           "up_seconds": round(time.monotonic() - self.started, 1)})
        _write_state(self.dir, self.state)
        self.processes.release()
        return _cluster_of(self.dir, self.state)

    def _start_node_and_services(self, binaries: Binaries, plane: ControlPlane, pki: KubeletPki, kubeconfig: Path,
                                 containerd_socket: Path, *, network: node.NodeNetwork) -> Cluster:
        options = self.options
        kubelet = self._start_node(binaries, plane, pki, containerd_socket, network)
        with plane.api_client() as api:
            identities = self._identities(api, plane, kubeconfig)
        extender_port, scheduler_port, scheduler_health, controller_health, agent_metrics, function_health, \
            webhook_port = free_ports(7)
        extender_url = f"http://{LOOPBACK}:{extender_port}"
        webhook_cert, webhook_key = admission.serving_certificate(self.dir / "webhook-tls", LOOPBACK)
        extender = self.start("fastgshare-extender", [
            _command("fastgshare-extender"), "--kubeconfig", str(identities["fastgshare-extender"]), "--listen",
            f"{LOOPBACK}:{extender_port}", "--assignment-key-file", str(identities["assignment-key"]),
            "--webhook-listen", f"{LOOPBACK}:{webhook_port}", "--webhook-cert", str(webhook_cert),
            "--webhook-key", str(webhook_key)])
        scheduler_file = self.dir / "kube-scheduler.yaml"
        scheduler_file.write_text(yaml.safe_dump(scheduler_config(_scheduler_document(extender_url), kubeconfig,
                                                                  scheduler_health)))
        scheduler = self.start("kube-scheduler", [
            str(binaries.kube_scheduler), f"--config={scheduler_file}", f"--bind-address={LOOPBACK}",
            f"--secure-port={scheduler_port}", f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}", f"--cert-dir={self.dir / 'kube-scheduler-certs'}"])
        controller = self.start("fastgshare-controller", [
            _command("fastgshare-controller"), "--kubeconfig", str(identities["fastgshare-controller"]),
            "--no-leader-elect",
            "--health-address", f"{LOOPBACK}:{controller_health}"])
        agent_state = self.dir / "node-agent"
        _start_simulated_mps(self.dir / "nvidia-mps")
        agent = self.start("node-agent", [
            _command("fastgshare-node-agent"), "--node-name", node.NODE_NAME,
            "--kubeconfig", str(identities["fastgshare-node-agent"]),
            "--assignment-key-file", str(identities["assignment-key"]),
            "--state-dir", str(agent_state), "--fake-gpus", options.gpus_of(1),
            "--pod-resources-socket", str(kubelet.root_dir / "pod-resources" / "kubelet.sock"),
            "--slots-per-gpu", str(options.slots_per_gpu), "--mps-pipe-dir", str(self.dir / "nvidia-mps"),
            "--hook-library", str(options.hook_build / "libfastgshare-hook.so"),
            "--fake-driver-dir", str(options.simgpu_build),
            "--metrics-listen", f"{network.node_ip}:{agent_metrics}"])
        self.state["nodes"][0]["node_agent_state_dir"] = str(agent_state)
        for plan in self.plans[1:]:
            self.start_node_agent(plan, identities)
        with plane.api_client() as api:
            core = rest.core_v1(api)
            gateway_url = f"http://{options.gateway_listen}"
            queue = self.start_queue(gateway_url, identities["gateway-auth"])
            functions = self.start("fastgshare-function-controller", [
                _command("fastgshare-function-controller"),
                "--kubeconfig", str(identities["fastgshare-function-controller"]), "--no-leader-elect",
                "--health-address", f"{LOOPBACK}:{function_health}", "--gateway-url", gateway_url,
                *(["--queue-worker-url", queue.worker_url] if queue else [])])
            gateway = self.start("fastgshare-gateway", [
                _command("fastgshare-gateway"), "--kubeconfig", str(identities["fastgshare-gateway"]),
                "--listen", options.gateway_listen, "--basic-auth-dir", str(identities["gateway-auth"]),
                *(["--nats-url", queue.nats_url] if queue else [])])
            self.step("components started, each as its own ServiceAccount")
            wait_until(lambda: http_ok(f"{extender_url}/readyz"), what="fastgshare-extender /readyz",
                       timeout_s=60, watched=extender)
            admission.register(api, f"https://{LOOPBACK}:{webhook_port}", webhook_cert.read_bytes())
            self.step(f"admission webhooks registered (https://{LOOPBACK}:{webhook_port}/validate, /mutate)")
            wait_until(lambda: http_ok(f"http://{LOOPBACK}:{scheduler_health}/healthz"),
                       what="kube-scheduler /healthz", timeout_s=60, watched=scheduler)
            wait_until(lambda: http_ok(f"http://{LOOPBACK}:{controller_health}/healthz"),
                       what="fastgshare-controller /healthz", timeout_s=60, watched=controller)
            wait_until(lambda: http_ok(f"http://{LOOPBACK}:{function_health}/healthz"),
                       what="fastgshare-function-controller /healthz", timeout_s=60, watched=functions)
            wait_until(lambda: http_ok(f"{gateway_url}/healthz"), what=f"fastgshare-gateway /healthz on {gateway_url}",
                       timeout_s=60, watched=gateway)
            if queue:
                queue.wait()
                self.step(f"asynchronous invocations: NATS JetStream on {queue.nats_url}, queue worker "
                          f"{queue.worker_url}")
            self.wait_for_nodes(core, kubelet)
            self.wait_for_vgpus(core, agent)
        self.state.update({"kubeconfig": str(kubeconfig), "node_name": node.NODE_NAME,
                           "containerd_socket": str(containerd_socket), "node_agent_state_dir": str(agent_state),
                           "extender_url": extender_url, "gpus": options.gpus,
                           "controller_url": f"http://{LOOPBACK}:{controller_health}", "gateway_url": gateway_url,
                           "nats_url": queue.nats_url if queue else "",
                           "queue_worker_url": queue.worker_url if queue else "",
                           "up_seconds": round(time.monotonic() - self.started, 1)})
        _write_state(self.dir, self.state)
        self.processes.release()
        return _cluster_of(self.dir, self.state)


    def start_queue(self, gateway_url: str, gateway_auth: Path) -> _Queue | None:
        """NATS with JetStream (its store in ``<state-dir>/nats``) and one queue worker that calls
        the functions through ``gateway_url`` with the gateway's credentials; None without
        ``nats-server`` (asynchronous invocations off)."""
        if self.nats_server is None:
            return None
        nats_port, monitor_port, worker_port = free_ports(3)
        nats = self.start("nats-server", nats_command(self.nats_server, self.dir / "nats", nats_port, monitor_port))
        nats_url = f"nats://{LOOPBACK}:{nats_port}"
        worker = self.start("fastgshare-queue-worker", [
            _command("fastgshare-queue-worker"), "--nats-url", nats_url, "--gateway-url", gateway_url,
            "--basic-auth-dir", str(gateway_auth), "--listen", f"{LOOPBACK}:{worker_port}"])
        return _Queue(nats, f"http://{LOOPBACK}:{monitor_port}", nats_url, worker, f"http://{LOOPBACK}:{worker_port}")

    def start_node_agent(self, plan: machines.NodePlan, identities: dict[str, Path]) -> None:
        """The node agent of a namespaced node, as the first node's but with the node's own paths:
        the kubelet's at /var/lib/kubelet and the MPS pipe at /tmp/nvidia-mps in its namespace."""
        options, entry = self.options, self.node_entry(plan)
        node_dir = Path(entry["node_dir"])
        agent_state = node_dir / "node-agent"
        _start_simulated_mps(machines.node_path(node_dir, keys.DEFAULT_MPS_PIPE_DIRECTORY))
        (metrics_port,) = free_ports(1)
        self.start_on_node(plan, "node-agent", [
            _command("fastgshare-node-agent"), "--node-name", plan.name,
            "--kubeconfig", str(identities["fastgshare-node-agent"]),
            "--assignment-key-file", str(identities["assignment-key"]),
            "--state-dir", str(agent_state), "--fake-gpus", options.gpus_of(plan.index),
            "--pod-resources-socket", str(node.KUBELET_ROOT_DIR / "pod-resources" / "kubelet.sock"),
            "--slots-per-gpu", str(options.slots_per_gpu), "--mps-pipe-dir", keys.DEFAULT_MPS_PIPE_DIRECTORY,
            "--hook-library", str(options.hook_build / "libfastgshare-hook.so"),
            "--fake-driver-dir", str(options.simgpu_build),
            "--metrics-listen", f"{plan.node_ip}:{metrics_port}"])
        entry["node_agent_state_dir"] = str(agent_state)
        _write_state(self.dir, self.state)


def _start_simulated_mps(pipe_dir: Path) -> None:
    """The simulated GPUs' MPS control daemon, as simgpu/mps.py stands in for it: its ``control``
    FIFO, which the node agent looks for (GPUs have MPS, SM partitions apply, while it is there).
    Made here, not imported: the local cluster does not import the simulated GPU's Python side."""
    pipe_dir.mkdir(parents=True, exist_ok=True)
    control = pipe_dir / keys.MPS_CONTROL_PIPE
    if not control.exists():
        os.mkfifo(control, 0o666)


def up(options: Options) -> Cluster:
    """Start a cluster in ``options.state_dir``; raises :class:`ClusterError` saying what failed."""
    _check_host()
    try:
        machines.plan_nodes(options.nodes, options.subnet, node.NODE_NAME)
    except ValueError as error:  # the nodes' count or subnets
        raise ClusterError(str(error)) from None
    state = _read_state(options.state_dir)
    if state is not None:
        if _running(state):
            raise ClusterError(f"a cluster is already running (state in {options.state_dir}); "
                               "stop it with: fastgshare cluster down")
        options.say(f"cleaning up a cluster that did not stop cleanly in {options.state_dir}")
        down(options.state_dir, say=options.say)
    if node.socket_answers(node.KUBELET_SOCKET):
        raise ClusterError(f"another kubelet serves {node.KUBELET_SOCKET}; only one kubelet can run on a machine")
    ensure_packages(options.install_packages, options.say)
    nats_server = None if options.from_manifests else ensure_nats(options.install_packages, options.say)
    try:
        binaries = find_binaries()
    except ClusterUnavailable as error:
        raise ClusterError(f"the Kubernetes binaries are missing: {error} (or: make control-plane)") from None
    ensure_hook_build(options.hook_build, options.simgpu_build, options.say)
    options.state_dir.mkdir(parents=True, exist_ok=True)
    startup = _Startup(options, nats_server=nats_server)
    try:
        return startup.run(binaries)
    except BaseException as error:
        startup.processes.release()
        logs = startup.logs
        down(options.state_dir, say=lambda _text: None, keep_logs=True)
        if isinstance(error, (ProcessFailed, OSError, RuntimeError, images.ImageError, manifests.InstallError,
                              ImageBuildError, subprocess.CalledProcessError)):
            raise ClusterError(f"cluster up failed: {error}\n(logs kept in {logs})") from None
        raise


# --- down and status ----------------------------------------------------------------------------

def _stop_rank(name: str) -> int:
    base = name.partition(NODE_SEPARATOR)[0]
    return STOP_ORDER.index(base) if base in STOP_ORDER else -1


def _other_nodes(state: dict[str, Any]) -> list[machines.NodePlan]:
    """The namespaced nodes ``up`` started (or began to)."""
    return [machines.NodePlan(entry["index"], entry["name"], entry["subnet"])
            for entry in state.get("nodes", [])[1:] if entry.get("cgroup")]


def down(state_dir: Path = DEFAULT_STATE_DIR, say: Say = print, keep_logs: bool = False) -> list[str]:
    """Stop what ``up`` started in ``state_dir`` and put the host back; returns what could not be
    undone (an empty list on success)."""
    state = _read_state(state_dir)
    if state is None:
        say(f"no cluster in {state_dir}")
        return []
    started = time.monotonic()
    components = sorted(state.get("components", []), key=lambda c: _stop_rank(c["name"]))
    for component in components:
        base, _, node_name = component["name"].partition(NODE_SEPARATOR)
        if base == "containerd":
            if node_name:
                node.kill_cgroup(node_name)
            else:
                node.kill_pods()
        stop_recorded(component["pid"], component.get("start_time"))
    node.kill_pods()
    for plan in _other_nodes(state):
        node.kill_cgroup(plan.name)
    node.kill_leftovers(state_dir)
    node.unmount_below(state_dir)
    if state.get("service_route"):
        node.remove_service_route()
    problems = _take_down_other_nodes(state)
    network = state.get("network")
    problems += node.restore_host_state(state.get("host", {}), node.NodeNetwork(**network) if network else None)
    if keep_logs:
        for entry in state_dir.iterdir():
            if entry.name != "logs":
                _remove(entry)
        with contextlib.suppress(OSError):
            _state_path(state_dir).unlink()
    else:
        _remove(state_dir)
    say(f"cluster down in {time.monotonic() - started:.1f}s" + (f"; left behind: {'; '.join(problems)}"
                                                                 if problems else ""))
    return problems


def _take_down_other_nodes(state: dict[str, Any]) -> list[str]:
    """The forwarding rules, links and cgroups of the namespaced nodes (their processes are dead);
    returns what could not be undone."""
    if state.get("forwarding"):
        machines.remove_forwarding()
    problems = []
    for plan in _other_nodes(state):
        machines.disconnect(plan)
        problems += [f"cgroup {cgroup} still has processes" for cgroup in node.remove_cgroup(plan.name)]
    return problems


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False, capture_output=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


# --- restart ------------------------------------------------------------------------------------

RESTARTABLE = {"node-agent": "node-agent", "extender": "fastgshare-extender", "controller": "fastgshare-controller",
               "kubelet": "kubelet", "containerd": "containerd", "gateway": "fastgshare-gateway",
               "function-controller": "fastgshare-function-controller", "nats": "nats-server",
               "queue-worker": "fastgshare-queue-worker"}


def _process_image(pid: int) -> tuple[list[str], dict[str, str]]:
    """The command line and environment a running process was started with."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError as error:
        raise ClusterError(f"cannot read how pid {pid} was started: {error}") from None
    env = dict(entry.decode().split("=", 1) for entry in environ if b"=" in entry)
    return [arg.decode() for arg in argv if arg], env


NODE_COMPONENTS = ("containerd", "kubelet", "node-agent")  # in the order a node starts them


def _read_running_state(state_dir: Path) -> dict[str, Any]:
    state = _read_state(state_dir)
    if state is None or "kubeconfig" not in state:
        raise ClusterError(f"no cluster in {state_dir}; start one with: fastgshare cluster up")
    return state


def _component_name(state: dict[str, Any], name: str, node_name: str | None) -> str:
    """``name`` as the state records it on ``node_name`` (``<name>@<node>`` from the second node on)."""
    if node_name is None or node_name == state["node_name"]:
        return name
    names = [entry["name"] for entry in state.get("nodes", [])]
    if node_name not in names:
        raise ClusterError(f"--node {node_name}: no such node; the cluster's nodes: {', '.join(names)}")
    if name not in NODE_COMPONENTS:
        raise ClusterError(f"{name} runs once for the cluster, not on each node; leave out --node")
    return f"{name}{NODE_SEPARATOR}{node_name}"


def _latest(state: dict[str, Any], name: str) -> dict[str, Any] | None:
    entries = [c for c in state.get("components", []) if c["name"] == name]
    return entries[-1] if entries else None


def restart(state_dir: Path, component: str, *, kill: bool = False, say: Say = print,
            die_with_parent: bool = False, extra_args: Sequence[str] = (), node_name: str | None = None
            ) -> ComponentStatus:
    """Restart one component of the running cluster as a rollout (SIGTERM, wait, start again) or,
    with ``kill``, as a crash (SIGKILL) would; the same command line, environment and log file.
    Returns the new process's status. ``die_with_parent`` (tests): the new process gets SIGTERM
    when the calling process dies. ``extra_args`` are appended to the command line (for flags
    that take one value, the last one counts: a later restart can set it back). ``node_name``: the
    node whose containerd, kubelet or node agent it is (default: the first)."""
    name = RESTARTABLE.get(component)
    if name is None:
        raise ClusterError(f"cannot restart {component!r}; one of: {', '.join(RESTARTABLE)}")
    state = _read_running_state(state_dir)
    name = _component_name(state, name, node_name)
    entry = _latest(state, name)
    if entry is None or not is_running(entry["pid"], entry.get("start_time")):
        raise ClusterError(f"{name} is not running (see fastgshare cluster status)")
    args, env = _process_image(entry["pid"])
    args = entry.get("args", args)  # a node's component: with the prefix that enters the node
    started = time.monotonic()
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(entry["pid"], signal.SIGKILL)
        wait_until(lambda: not is_running(entry["pid"], entry.get("start_time")), what=f"{name} to exit",
                   timeout_s=30)
    else:
        stop_recorded(entry["pid"], entry.get("start_time"))
    stopped = time.monotonic()
    process = ManagedProcess(name, [*args, *extra_args], Path(entry["log"]), die_with_parent=die_with_parent,
                             env=env)
    entry.update({"pid": process.pid, "start_time": process.start_time})
    _write_state(state_dir, state)
    time.sleep(0.5)
    if not is_running(process.pid, process.start_time):
        raise ClusterError(f"{name} exited right after the restart; see {entry['log']}")
    say(f"{name} {'killed' if kill else 'stopped'} in {stopped - started:.1f}s and started again (pid {process.pid})")
    return ComponentStatus(name, True, process.pid, entry["log"])


def power_off(state_dir: Path, node_name: str, *, say: Say = print) -> None:
    """Kill one node at once, as a machine dies: its kubelet, containerd, node agent and pods
    (everything in the node's cgroup). Its network stays; :func:`power_on` starts it again.
    Only the second and later nodes: the first is the host."""
    state = _read_running_state(state_dir)
    plan = next((p for p in _other_nodes(state) if p.name == node_name), None)
    if plan is None:
        raise ClusterError(f"cannot power off {node_name!r}: only the nodes in namespaces of their own can be, "
                           f"of {', '.join(entry['name'] for entry in state.get('nodes', []))}")
    started = time.monotonic()
    node.kill_cgroup(plan.name)
    for component in NODE_COMPONENTS:
        entry = _latest(state, f"{component}{NODE_SEPARATOR}{plan.name}")
        if entry is not None:
            wait_until(lambda e=entry: not is_running(e["pid"], e.get("start_time")),  # type: ignore[misc]
                       what=f"{component} on {plan.name} to die", timeout_s=30)
    say(f"node {plan.name} powered off in {time.monotonic() - started:.1f}s (kubelet, containerd, node agent and "
        "pods killed)")


def power_on(state_dir: Path, node_name: str, *, say: Say = print, die_with_parent: bool = False) -> None:
    """Start a node's containerd, kubelet and node agent again after :func:`power_off`, with the
    command lines ``up`` gave them; the kubelet registers the node again as after a reboot."""
    state = _read_running_state(state_dir)
    entries = {entry["name"]: entry for entry in state.get("nodes", [])}
    if node_name not in entries or "containerd_socket" not in entries[node_name]:
        raise ClusterError(f"cannot power on {node_name!r}: not a node in a namespace of its own")
    for component in NODE_COMPONENTS:
        name = f"{component}{NODE_SEPARATOR}{node_name}"
        entry = _latest(state, name)
        if entry is None:
            continue
        if is_running(entry["pid"], entry.get("start_time")):
            raise ClusterError(f"{name} is running: node {node_name} is on")
        process = ManagedProcess(name, entry["args"], Path(entry["log"]), die_with_parent=die_with_parent)
        entry.update({"pid": process.pid, "start_time": process.start_time})
        _write_state(state_dir, state)
        if component == "containerd":
            socket_path = Path(entries[node_name]["containerd_socket"])
            wait_until(functools.partial(node.socket_answers, socket_path), what=f"containerd on {node_name}",
                       timeout_s=60, watched=process)
    say(f"node {node_name} powered on (containerd, kubelet, node agent started)")


@dataclass(frozen=True)
class ComponentStatus:
    name: str
    running: bool
    pid: int
    log: str


def status(state_dir: Path = DEFAULT_STATE_DIR) -> list[ComponentStatus]:
    """Every component ``up`` started, whether it runs, and its log file."""
    state = _read_state(state_dir)
    if state is None:
        raise ClusterError(f"no cluster in {state_dir}; start one with: fastgshare cluster up")
    return [ComponentStatus(c["name"], is_running(c["pid"], c.get("start_time")), c["pid"], c["log"])
            for c in state.get("components", [])]
