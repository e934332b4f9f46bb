"""The second and later nodes of a local cluster (``fastgshare cluster up --nodes N``), each a
machine of its own on this host, the way kind makes nodes of containers:

* a network namespace with the node's own pods' bridge and subnet;
* a mount namespace in which ``/var/lib/kubelet`` (its device plugins and pod-resources sockets),
  ``/run/containerd``, the pods' logs and what the node agent keeps on its node are the node's
  own (:data:`NODE_PATHS`; kubelet v1.20 and containerd hard-code some of them), and
  ``/sys/fs/cgroup`` shows the node's cgroup as the root;
* a cgroup of its own (``/<node name>`` in every hierarchy) and a cgroup namespace rooted there:
  the node's kubelet, containerd and node agent run in it, so the kubelet makes ``/kubepods`` as
  on any machine, and the agent reads its tenants' ``/proc/<pid>/cgroup`` as ``/kubepods/...``.

The first node is the host itself, as a single-node cluster has it. The nodes reach each other
and the host through a veth pair per node (a /30 of :data:`LINK_NETWORK`): each node's default
route leads to the host, and the host routes each node's pod subnet to it, with forwarding on.
So a pod on one node reaches a pod on another by its IP, and the API server (on the first
node's address) is reached from every node.

A node's namespaces live while its holder process does (``sleep infinity``, recorded in the
cluster's state, outside the node's cgroup); the node's processes enter them with ``nsenter``
after moving into the node's cgroup. So killing the node's cgroup kills the machine (kubelet,
containerd, node agent, pods) and keeps its network, as a powered-off machine keeps its cable;
:func:`enter_command` starts its processes again. ``down`` kills them all; the namespaces, their
mounts, the veth pair and its routes go with the last process; this module removes the
forwarding rules, and :func:`fastgshare_cluster.node.remove_cgroup` the cgroups.

Tested on cgroup v1 (this project's machines: v1 controllers and a v2 ``unified`` hierarchy).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LINK_NETWORK = "169.254.250.0/24"  # link-local: never routed beyond this host
FORWARD_CHAIN = "FASTGSHARE-NODES"
MAX_NODES = 6
CONTAINERD_RUN_DIR = "/run/containerd"
# The host paths each node has of its own (a directory of the node's, bound over them in its
# mount namespace): the kubelet's root (device plugins, pod-resources, volumes), and what the
# node agent's DaemonSet mounts from its node (deploy/node-agent).
NODE_PATHS = ("/var/lib/kubelet", "/var/log/pods", "/var/log/containers", "/var/lib/fastgshare",
              "/tmp/nvidia-mps", "/var/log/nvidia-mps")
CGROUP_DIR = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class NodePlan:
    """Where one node of the cluster lives: its name, pod subnet, and (from the second node on)
    its link to the host and its cgroup."""

    index: int  # 1-based; node 1 is the host itself
    name: str
    subnet: str

    @property
    def node_ip(self) -> str:
        return str(next(ipaddress.ip_network(self.subnet).hosts()))

    @property
    def host_link(self) -> str:
        """The host's end of the node's veth pair (the node's end is ``eth0`` in its namespace)."""
        return f"fgsv{self.index}"

    @property
    def link_host_ip(self) -> str:
        return str(ipaddress.ip_network(LINK_NETWORK)[4 * self.index + 1])

    @property
    def link_node_ip(self) -> str:
        return str(ipaddress.ip_network(LINK_NETWORK)[4 * self.index + 2])


def plan_nodes(count: int, first_subnet: str, first_name: str) -> list[NodePlan]:
    """``count`` nodes: the first named ``first_name`` on ``first_subnet``, node ``n`` named
    ``<first_name>-<n>`` on the subnet of the same size ``n - 1`` subnets further on."""
    if not 1 <= count <= MAX_NODES:
        raise ValueError(f"--nodes {count}: a local cluster has 1 to {MAX_NODES} nodes")
    first = ipaddress.ip_network(first_subnet)
    plans = []
    for index in range(1, count + 1):
        address = int(first.network_address) + (index - 1) * first.num_addresses
        try:
            subnet = ipaddress.ip_network(f"{ipaddress.ip_address(address)}/{first.prefixlen}")
        except ValueError:
            raise ValueError(f"--subnet {first_subnet}: no room after it for {count} node subnets") from None
        if subnet.overlaps(ipaddress.ip_network(LINK_NETWORK)):
            raise ValueError(f"--subnet {first_subnet}: node {index}'s subnet {subnet} overlaps the nodes' "
                             f"links {LINK_NETWORK}")
        plans.append(NodePlan(index, first_name if index == 1 else f"{first_name}-{index}", str(subnet)))
    return plans


# --- commands ---------------------------------------------------------------------------------

def _cgroup_mounts() -> list[tuple[str, str, str]]:
    """``(mount point, file system type, options)`` of each cgroup hierarchy mounted here."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        separator = fields.index("-")
        fs_type, options = fields[separator + 1], fields[separator + 3]
        if fs_type in ("cgroup", "cgroup2"):
            kept = [option for option in options.split(",") if option not in ("rw", "ro")]
            found.append((fields[4], fs_type, ",".join(kept)))
    return found


def _remount_cgroups_script(cgroup_dir: Path = CGROUP_DIR) -> str:
    """Shell lines that mount every cgroup hierarchy again on a fresh tmpfs over ``cgroup_dir``:
    mounted in a new cgroup namespace, each shows the namespace's root. Symbolic links there
    (``cpu -> cpu,cpuacct``) are made again."""
    lines = [f"mount -t tmpfs -o mode=755 cgroup-root {cgroup_dir}"]
    for mount_point, fs_type, options in _cgroup_mounts():
        if mount_point != str(cgroup_dir) and not mount_point.startswith(f"{cgroup_dir}/"):
            continue
        lines.append(f"mkdir -p {shlex.quote(mount_point)}")
        flags = f"-o {shlex.quote(options)} " if options else ""
        lines.append(f"mount -t {fs_type} {flags}{fs_type} {shlex.quote(mount_point)}")
    if cgroup_dir.is_dir():
        for entry in sorted(cgroup_dir.iterdir()):
            if entry.is_symlink():
                lines.append(f"ln -s {shlex.quote(os.readlink(entry))} {shlex.quote(str(entry))}")
    return "; ".join(lines)


def _join_cgroup_script(plan: NodePlan, hierarchies: Sequence[Path]) -> str:
    procs = " ".join(shlex.quote(str(top / plan.name / "cgroup.procs")) for top in hierarchies)
    return f'for f in {procs}; do echo $$ > "$f" || exit 1; done'


def holder_command(plan: NodePlan, node_dir: Path, hierarchies: Sequence[Path]) -> list[str]:
    """The process that makes and keeps the node's namespaces: started in the node's cgroup (the
    root of its cgroup namespace), it mounts the cgroup hierarchies as the node sees them, the
    node's own device-plugin and containerd run directories, brings up loopback, turns forwarding
    on, writes ``<node_dir>/ready`` and sleeps. Start it after :func:`create_cgroups` and
    :func:`prepare_host_paths`; then :func:`release_holder`."""
    binds = "; ".join(f"mount --bind {shlex.quote(str(node_path(node_dir, path)))} {path}" for path in NODE_PATHS)
    inside = (f"set -e; {_remount_cgroups_script()}; {binds}; "
              f"mount -t tmpfs tmpfs {CONTAINERD_RUN_DIR}; ip link set lo up; "
              f"echo 1 > /proc/sys/net/ipv4/ip_forward; : > {shlex.quote(str(node_dir / 'ready'))}; "
              "exec sleep infinity")
    outside = (f"{_join_cgroup_script(plan, hierarchies)}; exec unshare --mount --net --cgroup --propagation private "
               f"-- sh -c {shlex.quote(inside)}")
    return ["sh", "-c", outside]


def release_holder(holder_pid: int, hierarchies: Sequence[Path]) -> None:
    """Move the holder out of the node's cgroup (to the root of each hierarchy) once its
    namespaces exist, so that killing the node's cgroup leaves them for the node's return."""
    for top in hierarchies:
        (top / "cgroup.procs").write_text(str(holder_pid))


def enter_command(plan: NodePlan, holder_pid: int, hierarchies: Sequence[Path]) -> list[str]:
    """The prefix that runs a command on the node: moved into the node's cgroup, then in its
    mount, network and cgroup namespaces."""
    script = (f'{_join_cgroup_script(plan, hierarchies)}; '
              f'exec nsenter --target={holder_pid} --mount --net --cgroup -- "$@"')
    return ["sh", "-c", script, "sh"]


def network_command(holder_pid: int) -> list[str]:
    """The prefix that runs a command (``ip``) in the node's network namespace only."""
    return ["nsenter", f"--target={holder_pid}", "--net", "--"]


def node_path(node_dir: Path, path: str) -> Path:
    """Where the host keeps the node's own ``path`` (one of :data:`NODE_PATHS`)."""
    return node_dir / "paths" / path.lstrip("/")


def prepare_host_paths(node_dir: Path) -> None:
    """What the holder's mounts need: the mount points on the host and the node's own directories."""
    for path in (*NODE_PATHS, CONTAINERD_RUN_DIR):
        Path(path).mkdir(parents=True, exist_ok=True)
    for path in NODE_PATHS:
        node_path(node_dir, path).mkdir(parents=True, exist_ok=True)
    (node_path(node_dir, "/var/lib/kubelet") / "device-plugins").mkdir(exist_ok=True)


def _run(command: Sequence[str]) -> None:
    result = subprocess.run(list(command), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


def create_cgroups(plan: NodePlan, hierarchies: Sequence[Path]) -> None:
    """The node's cgroup in every hierarchy: the root of everything that runs on the node. A v1
    cpuset cgroup takes no process before it has CPUs and memory nodes: it gets its parent's."""
    for top in hierarchies:
        cgroup = top / plan.name
        cgroup.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (top / name).exists() and not (cgroup / name).read_text().strip():
                (cgroup / name).write_text((top / name).read_text())


def connect(plan: NodePlan, holder_pid: int, host_address: str) -> None:
    """The veth pair between the host and the node, the node's default route to the host, and the
    host's route to the node's pods, from ``host_address`` (the first node's: the pods route it
    through their node, as they route the other nodes' pods; they have no default route)."""
    if Path(f"/sys/class/net/{plan.host_link}").exists():
        raise RuntimeError(f"a network interface named {plan.host_link} already exists")
    inside = network_command(holder_pid)
    _run(["ip", "link", "add", plan.host_link, "type", "veth", "peer", "name", "eth0", "netns", str(holder_pid)])
    _run(["ip", "addr", "add", f"{plan.link_host_ip}/30", "dev", plan.host_link])
    _run(["ip", "link", "set", plan.host_link, "up"])
    _run([*inside, "ip", "addr", "add", f"{plan.link_node_ip}/30", "dev", "eth0"])
    _run([*inside, "ip", "link", "set", "eth0", "up"])
    _run([*inside, "ip", "route", "add", "default", "via", plan.link_host_ip])
    _run(["ip", "route", "add", plan.subnet, "via", plan.link_node_ip, "dev", plan.host_link, "src", host_address])


def _iptables(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["iptables", "-w", "5", *args], capture_output=True, text=True, check=False)


def allow_forwarding(plans: Sequence[NodePlan]) -> None:
    """Accept what the host forwards between the nodes' pod subnets and links (a host whose
    FORWARD policy is DROP, as Docker leaves it, would drop it): one chain of ours, jumped to
    from FORWARD; :func:`remove_forwarding` takes both away."""
    remove_forwarding()
    networks = [plan.subnet for plan in plans] + [LINK_NETWORK]
    commands: list[tuple[str, ...]] = [("-N", FORWARD_CHAIN)]
    commands += [("-A", FORWARD_CHAIN, "-s", source, "-d", destination, "-j", "ACCEPT")
                 for source in networks for destination in networks]
    commands.append(("-I", "FORWARD", "-j", FORWARD_CHAIN))
    for args in commands:
        result = _iptables(*args)
        if result.returncode != 0:
            remove_forwarding()
            raise RuntimeError(f"iptables {' '.join(args)}: {result.stderr.strip()}")


def remove_forwarding() -> None:
    while _iptables("-D", "FORWARD", "-j", FORWARD_CHAIN).returncode == 0:
        pass
    _iptables("-F", FORWARD_CHAIN)
    _iptables("-X", FORWARD_CHAIN)


def forwarding_present() -> bool:
    return _iptables("-S", FORWARD_CHAIN).returncode == 0


def disconnect(plan: NodePlan) -> None:
    """Delete the host's end of the node's veth pair (and with it the route to the node's pods);
    the pair goes anyway with the node's network namespace."""
    if Path(f"/sys/class/net/{plan.host_link}").exists():
        with contextlib.suppress(RuntimeError):
            _run(["ip", "link", "delete", plan.host_link])
