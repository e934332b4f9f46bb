"""The node of a local cluster: containerd (CRI) on a private socket and root, a CNI bridge, and
a real kubelet v1.20 that runs pods; and the host state they change, recorded before and put
back after.

Facts this follows (docs/cluster.md has the why): containerd must clamp ``oom_score_adj``
(these machines lack CAP_SYS_RESOURCE), keeps pod network namespaces under its state
directory, and uses our static pause image; pods get ``10.x.y.z/24`` on a bridge that carries
the node's own address and has no gateway, NAT or iptables rule; the kubelet runs with cgroups
per QoS class (the arbiter finds a process's pod from ``/kubepods/.../pod<uid>/``), serves on
the node's address so ``kubectl logs/exec`` and the API server's node proxy reach it, and runs
without its iptables chains. A v1.20 kubelet rewrites three sysctls and hard-codes
``/var/lib/kubelet/device-plugins``; containerd uses ``/run/containerd`` whatever it is told.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from fastgshare_cluster.controlplane import KUBERNETES_SERVICE_IP, SERVICE_RANGE, Binaries, ControlPlane
from fastgshare_cluster.pki import KubeletPki
from fastgshare_cluster.processes import LOOPBACK, ManagedProcess, ProcessSet, free_ports, http_ok, wait_until

NODE_NAME = "fastgshare-node"
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # hard-coded in kubelet v1.20
KUBELET_SOCKET = DEVICE_PLUGIN_DIR / "kubelet.sock"
CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
CGROUP_ROOT = Path("/sys/fs/cgroup")
KUBEPODS = "kubepods"
SYSCTLS = ("vm.overcommit_memory", "vm.panic_on_oom", "kernel.panic", "kernel.panic_on_oops",
           "kernel.keys.root_maxkeys", "kernel.keys.root_maxbytes",
           "net.ipv4.ip_forward")  # a cluster of several nodes forwards between them
HOST_PATHS = ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/run/containerd", "/opt/containerd",
              # what deploy/ mounts from the node (hostPath DirectoryOrCreate): the node agent's state,
              # the MPS pipe and log directories
              "/var/lib/fastgshare", "/tmp/nvidia-mps", "/var/log/nvidia-mps")
KUBELET_ROOT_DIR = Path("/var/lib/kubelet")  # where deploy/ expects it (the PodResources socket)
SERVICE_CHAIN = "FASTGSHARE-SERVICES"


@dataclass(frozen=True)
class NodeNetwork:
    """The pods' bridge and subnet; the node's own address is the subnet's first, on the bridge."""

    bridge: str
    subnet: str

    @property
    def node_ip(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    @property
    def prefix_length(self) -> int:
        return ipaddress.ip_network(self.subnet).prefixlen


def create_bridge(network: NodeNetwork, enter: Sequence[str] = ()) -> None:
    """The pods' bridge with the node's address on it, before the kubelet needs that address: the
    API server reaches the kubelet and the node agent there (it refuses to proxy to loopback), and
    the host and its pods reach each other on it. No gateway or NAT; only the nodes of a cluster
    of several forward to each other (:mod:`fastgshare_cluster.machines`). ``enter``: the prefix
    that runs a command in the node's network namespace (none: the host's)."""
    if not enter and Path(f"/sys/class/net/{network.bridge}").exists():
        raise RuntimeError(f"a network interface named {network.bridge} already exists")
    for command in ([*enter, "ip", "link", "add", "name", network.bridge, "type", "bridge"],
                    [*enter, "ip", "addr", "add", f"{network.node_ip}/{network.prefix_length}", "dev", network.bridge],
                    [*enter, "ip", "link", "set", network.bridge, "up"]):
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


def socket_answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


# --- host state -------------------------------------------------------------------------------

def _sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def _cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy (v1 controllers and the v2 unified one)."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        if fields[separator + 1] in ("cgroup", "cgroup2"):
            found.append(Path(fields[4]))
    return found


def record_host_state() -> dict[str, object]:
    """What the node may change on the host: sysctl values, paths and cgroups that do not exist yet."""
    sysctls = {}
    for name in SYSCTLS:
        with contextlib.suppress(OSError):
            sysctls[name] = _sysctl_path(name).read_text().strip()
    kubepods = [hierarchy / KUBEPODS for hierarchy in _cgroup_hierarchies()]
    return {"sysctls": sysctls, "absent_paths": [p for p in HOST_PATHS if not os.path.lexists(p)],
            "kubepods": [str(top) for top in kubepods],
            "present_cgroups": [str(cgroup) for top in kubepods for cgroup in _cgroups_below(top)]}


def mount_points_below(paths: Iterable[Path]) -> list[str]:
    prefixes = [str(path.resolve()) for path in paths]
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4].encode().decode("unicode_escape")
        if any(mount_point == p or mount_point.startswith(p + "/") for p in prefixes):
            found.append(mount_point)
    return found


def unmount_below(*paths: Path) -> None:
    """Unmount everything at or below ``paths``, deepest first."""
    for mount_point in sorted(set(mount_points_below(paths)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", mount_point], check=False, capture_output=True)


def _cgroups_below(top: Path) -> list[Path]:
    """``top`` and every cgroup below it, deepest first; cgroups vanishing meanwhile are skipped."""
    found = [Path(directory) for directory, _subdirs, _files in os.walk(top)]  # os.walk ignores errors
    return sorted(found, key=lambda path: len(path.parts), reverse=True)


def _kill_cgroup_tree(top: Path) -> None:
    for cgroup in _cgroups_below(top):
        with contextlib.suppress(OSError):
            for pid in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)


def _remove_cgroups(top: Path, keep: set[str]) -> list[str]:
    """rmdir the cgroups at and below ``top`` not in ``keep``, deepest first; a cgroup whose
    processes are still exiting gets a moment. Returns those that stayed."""
    deadline = time.monotonic() + 5
    while True:
        ours = [cgroup for cgroup in _cgroups_below(top) if str(cgroup) not in keep]
        for cgroup in ours:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
        left = [str(cgroup) for cgroup in ours if cgroup.exists()]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def cgroup_hierarchies() -> list[Path]:
    """Every mounted cgroup hierarchy: where a node of its own gets its cgroup."""
    return _cgroup_hierarchies()


def kill_pods(cgroup_root: str = "/") -> None:
    """SIGKILL every process in the pod cgroups of the kubelet with ``--cgroup-root`` (containers
    and pause processes)."""
    for hierarchy in _cgroup_hierarchies():
        _kill_cgroup_tree(hierarchy / cgroup_root.lstrip("/") / KUBEPODS)


def kill_cgroup(name: str) -> None:
    """SIGKILL every process in the cgroup ``/<name>`` and below, in every hierarchy (a node of
    its own: its pods and its node agent), as a machine's death would."""
    for hierarchy in _cgroup_hierarchies():
        _kill_cgroup_tree(hierarchy / name)


def remove_cgroup(name: str) -> list[str]:
    """rmdir ``/<name>`` and everything below it in every hierarchy; returns what stayed."""
    left = []
    for hierarchy in _cgroup_hierarchies():
        if (hierarchy / name).exists():
            left += _remove_cgroups(hierarchy / name, keep=set())
    return left


# What `up` starts (a Python entry point runs as `python .../bin/NAME`), and containerd's shims.
LEFTOVER_PROGRAMS = frozenset({
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "containerd",
    "fastgshare-extender", "fastgshare-controller", "fastgshare-node-agent"})
# Python modules run with ``-m`` that outlive their parent by design: the node agent's model-store
# workers (a session of their own, so that the agent's restart leaves the weights in place).
LEFTOVER_MODULES = frozenset({"device_plugin.models.worker"})
SHIM_PREFIX = "containerd-shim"


def _is_leftover(argv: list[bytes]) -> bool:
    names = [os.path.basename(arg.decode(errors="replace")) for arg in argv[:2]]
    if not names:
        return False
    if names[0].startswith("python") and len(names) > 1:
        if names[1] == "-m" and len(argv) > 2:
            return argv[2].decode(errors="replace") in LEFTOVER_MODULES
        return names[1] in LEFTOVER_PROGRAMS
    return names[0] in LEFTOVER_PROGRAMS or names[0].startswith(SHIM_PREFIX)


def _ancestors() -> set[int]:
    """This process and its parents up to init: never killed, whatever their command line says."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rpartition(")")[2].split()[1])
    return found


def kill_leftovers(state_dir: Path) -> None:
    """SIGKILL the containerd shims (they outlive containerd and name its socket) and the components
    ``up`` started but could not record, if their command line names ``state_dir``; nothing else (a
    user's ``tail -f`` of a log there, the shell that runs ``down``)."""
    needle = str(state_dir.resolve()).encode()
    spared = _ancestors()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline and _is_leftover(cmdline.split(b"\0")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(entry.name), signal.SIGKILL)


def restore_host_state(saved: dict[str, object], network: NodeNetwork | None) -> list[str]:
    """Put back what :func:`record_host_state` saw; returns what could not be undone."""
    problems = []
    for name, value in dict(saved.get("sysctls", {})).items():  # type: ignore[call-overload]
        try:
            path = _sysctl_path(name)
            if path.read_text().strip() != value:
                path.write_text(str(value))
        except OSError as error:
            problems.append(f"sysctl {name}={value}: {error}")
    keep = set(saved.get("present_cgroups", []))  # type: ignore[call-overload]
    for top in saved.get("kubepods", []):  # type: ignore[attr-defined]
        problems += [f"cgroup {cgroup} still has processes" for cgroup in _remove_cgroups(Path(top), keep)]
    if network is not None and Path(f"/sys/class/net/{network.bridge}").exists():
        subprocess.run(["ip", "link", "delete", network.bridge], check=False, capture_output=True)
    for path in saved.get("absent_paths", []):  # type: ignore[attr-defined]
        unmount_below(Path(path))
        subprocess.run(["rm", "-rf", "--one-file-system", path], check=False, capture_output=True)
        if os.path.lexists(path):
            problems.append(f"could not remove {path}")
    return problems


# --- containerd -------------------------------------------------------------------------------

def write_cni_config(conf_dir: Path, ipam_dir: Path, network: NodeNetwork, other_subnets: Sequence[str] = ()
                     ) -> None:
    """A bridge without gateway, masquerade or iptables rule: pods reach each other, the node's
    address, the Service range through the node (where :func:`route_kubernetes_service`
    may answer for the API server's Service), the pods of ``other_subnets`` (the other nodes')
    through the node, and nothing else."""
    conf_dir.mkdir(parents=True, exist_ok=True)
    (conf_dir / "10-fastgshare.conflist").write_text(json.dumps({
        "cniVersion": "0.4.0", "name": "fastgshare-local",
        "plugins": [
            {"type": "bridge", "bridge": network.bridge, "isGateway": False, "ipMasq": False, "hairpinMode": False,
             "ipam": {"type": "host-local", "dataDir": str(ipam_dir),
                      "ranges": [[{"subnet": network.subnet, "gateway": network.node_ip}]],
                      "routes": [{"dst": SERVICE_RANGE}, *({"dst": subnet} for subnet in other_subnets)]}},
            {"type": "loopback"},
        ],
    }, indent=2))


def containerd_config(workdir: Path, pause_image: str) -> str:
    return f"""\
version = 2
root = "{workdir / 'root'}"
state = "{workdir / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{workdir / 'containerd.sock'}"
[ttrpc]
  address = "{workdir / 'containerd.sock.ttrpc'}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{workdir / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  stream_server_address = "{LOOPBACK}"
  stream_server_port = "0"
  enable_selinux = false
  disable_apparmor = true
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{workdir / 'net.d'}"
    max_conf_num = 1
"""


def start_containerd(containerd: str, workdir: Path, processes: ProcessSet, *, pause_image: str,
                     network: NodeNetwork, log_path: Path, other_subnets: Sequence[str] = (),
                     enter: Sequence[str] = (), name: str = "containerd") -> tuple[ManagedProcess, Path]:
    """containerd with the CRI plugin set up for the kubelet; returns it and its socket. ``enter``:
    the prefix that runs it in its node's namespaces."""
    workdir.mkdir(parents=True, exist_ok=True)
    write_cni_config(workdir / "net.d", workdir / "cni-ipam", network, other_subnets)
    config = workdir / "config.toml"
    config.write_text(containerd_config(workdir, pause_image))
    sock = workdir / "containerd.sock"
    process = processes.start(name, [*enter, containerd, f"--config={config}"], log_path)
    wait_until(lambda: socket_answers(sock), what="containerd socket", timeout_s=60, watched=process)
    return process, sock


# --- the API server's Service -------------------------------------------------------------------

def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", "5", "-t", "nat", *args], capture_output=True, text=True, check=False)


def route_kubernetes_service(api_address: str, api_port: int) -> None:
    """What kube-proxy does for the ``kubernetes`` Service, and only that: pods' connections to
    ``KUBERNETES_SERVICE_IP:443`` (their in-cluster configuration) go to the API server. One
    chain of ours in the nat table, jumped to from PREROUTING; :func:`remove_service_route`
    takes both away."""
    remove_service_route()
    for args in (("-N", SERVICE_CHAIN),
                 ("-A", SERVICE_CHAIN, "-d", f"{KUBERNETES_SERVICE_IP}/32", "-p", "tcp", "--dport", "443",
                  "-j", "DNAT", "--to-destination", f"{api_address}:{api_port}"),
                 ("-I", "PREROUTING", "-j", SERVICE_CHAIN)):
        result = _iptables(*args)
        if result.returncode != 0:
            remove_service_route()
            raise RuntimeError(f"iptables -t nat {' '.join(args)}: {result.stderr.strip()}")


def remove_service_route() -> None:
    """Remove :func:`route_kubernetes_service`'s rule and chain, if there."""
    while _iptables("-D", "PREROUTING", "-j", SERVICE_CHAIN).returncode == 0:
        pass
    _iptables("-F", SERVICE_CHAIN)
    _iptables("-X", SERVICE_CHAIN)


def service_route_present() -> bool:
    return _iptables("-S", SERVICE_CHAIN).returncode == 0


# --- kubelet ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Kubelet:
    process: ManagedProcess
    root_dir: Path
    healthz: str


def start_kubelet(binaries: Binaries, plane: ControlPlane, pki: KubeletPki, *, containerd_socket: Path,
                  network: NodeNetwork, workdir: Path, processes: ProcessSet, log_path: Path,
                  wait: bool = True, root_dir: Path | None = None, node_name: str = NODE_NAME,
                  cgroup_root: str = "/", enter: Sequence[str] = (), name: str = "kubelet",
                  healthz_address: str = LOOPBACK, config: Mapping[str, object] | None = None) -> Kubelet:
    """The kubelet registering ``node_name``, its state in ``root_dir`` (default: private, in
    ``workdir``), its pods' cgroups below ``cgroup_root``; ``enter``: the prefix that runs it in its
    node's namespaces, where it serves ``/healthz`` on ``healthz_address``; ``config``: fields of a
    ``KubeletConfiguration`` that have no flag (the flags set everything else). With ``wait``,
    returns once ``/healthz`` answers."""
    root_dir = root_dir or workdir / "root"
    root_dir.mkdir(parents=True, exist_ok=True)
    config_flags = []
    if config:
        workdir.mkdir(parents=True, exist_ok=True)
        config_file = workdir / "kubelet-config.json"
        config_file.write_text(json.dumps({"apiVersion": "kubelet.config.k8s.io/v1beta1",
                                           "kind": "KubeletConfiguration", **config}))
        config_flags.append(f"--config={config_file}")
    port, healthz_port = free_ports(2)
    process = processes.start(name, [
        *enter, str(binaries.kubelet), f"--cgroup-root={cgroup_root}", f"--kubeconfig={plane.kubeconfig}",
        f"--root-dir={root_dir}",
        "--container-runtime=remote", f"--container-runtime-endpoint=unix://{containerd_socket}",
        f"--volume-plugin-dir={workdir / 'volume-plugins'}", f"--cert-dir={workdir / 'pki'}",
        "--fail-swap-on=false", "--cgroup-driver=cgroupfs", "--eviction-hard=",
        "--image-gc-high-threshold=100", "--image-gc-low-threshold=99",  # local images cannot be pulled again
        "--make-iptables-util-chains=false", "--resolv-conf=",
        "--node-status-update-frequency=2s", "--sync-frequency=5s",
        f"--hostname-override={node_name}", f"--node-ip={network.node_ip}",
        f"--address={network.node_ip}", f"--port={port}", "--read-only-port=0",
        f"--healthz-bind-address={healthz_address}", f"--healthz-port={healthz_port}",
        # As kubeadm sets a kubelet up: client certificates of the cluster's CA and bearer tokens (checked
        # with the API server's TokenReview) authenticate; the API server authorises each request
        # (SubjectAccessReview on nodes/proxy, nodes/log, ...): who may read logs or exec is RBAC's say.
        f"--client-ca-file={pki.ca_cert}", "--anonymous-auth=false", "--authentication-token-webhook=true",
        "--authorization-mode=Webhook", *config_flags,
    ], log_path)
    healthz = f"http://{healthz_address}:{healthz_port}/healthz"
    if wait:
        wait_until(lambda: http_ok(healthz), what="kubelet /healthz", timeout_s=120, watched=process)
    return Kubelet(process=process, root_dir=root_dir, healthz=healthz)
