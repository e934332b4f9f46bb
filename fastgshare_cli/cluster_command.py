"""``fastgshare cluster up | down | status | shares | restart``: the user's side of :mod:`fastgshare_cluster`."""

from __future__ import annotations

import argparse
import contextlib
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fastgshare import keys
from fastgshare.codec import PodAssignment, decode_assignment
from fastgshare.errors import CodecError, InvalidInventory
from fastgshare.inventory import GPU_SPEC_HELP, parse_gpu_spec
from fastgshare.quantity import format_bytes
from fastgshare.share import format_fraction
from fastgshare_cli.pod_shares import measure_shares, use_by_pod
from fastgshare_cluster import cluster, image_build, images, machines
from fastgshare_cluster.cluster import ClusterError, Options
from fastgshare_cluster.image_build import ImageBuildError
from fastgshare_cluster.images import ImageError
from fastgshare_kube import rest


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "cluster", help="a whole fastgshare cluster on this machine (Linux, root)",
        description="Run Kubernetes (v1.20 control plane, containerd, a real kubelet), the fastgshare "
                    "scheduler extender, controller and node agent with simulated GPUs on this machine, "
                    "the way kind does for Kubernetes.")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start the cluster and print its kubeconfig")
    up.add_argument("--gpus", action="append", metavar="SPEC",
                    help=f"the simulated GPUs, {GPU_SPEC_HELP}: once for every node, or once per node in order "
                         f"(the last for the nodes after it) (default: {cluster.DEFAULT_GPUS})")
    up.add_argument("--nodes", type=int, default=1, metavar="N",
                    help=f"nodes, 1 to {machines.MAX_NODES}: the first is this host, the others machines of their "
                         "own in Linux namespaces, each with its kubelet, containerd, pod subnet and node agent "
                         "(default: %(default)s)")
    up.add_argument("--slots-per-gpu", type=int, default=16, help="pods one GPU may hold (default: %(default)s)")
    up.add_argument("--hook-build", type=Path, default=cluster.Options.hook_build,
                    help="where make -C vgpu_hook put the hook and memcheck (default: %(default)s; built if missing)")
    up.add_argument("--simgpu-build", type=Path, default=cluster.Options.simgpu_build,
                    help="where make -C simgpu put the simulated GPU's driver, NVML and workloads "
                         "(default: %(default)s; built if missing)")
    up.add_argument("--gateway-listen", default=cluster.DEFAULT_GATEWAY_LISTEN, metavar="HOST:PORT",
                    help="where the function gateway listens (default: %(default)s)")
    up.add_argument("--no-install", action="store_true", help="do not apt-get install missing packages")
    up.add_argument("--from-manifests", action="store_true",
                    help="run our components as pods, installed with deploy/install.sh from the image built from "
                         "the Dockerfile (offline, with buildah), instead of as processes on the host; the node "
                         "gets the simulated-GPUs label deploy/ documents")
    down = actions.add_parser("down", help="stop everything up started and leave the host as it was")
    down.add_argument("--keep-logs", action="store_true", help="keep <state-dir>/logs")
    actions.add_parser("status", help="list the components, their state and log file")
    restart = actions.add_parser(
        "restart", help="restart one component as a rollout (SIGTERM, then start again) or, with --kill, a crash would",
        description="Stop one component of the running cluster and start it again with the same command line, "
                    "environment and log file: as a rolling update would (SIGTERM, up to 10 s to exit), or "
                    "with --kill as a crash or an OOM kill would (SIGKILL). Pods keep running.")
    restart.add_argument("component", choices=list(cluster.RESTARTABLE), metavar="COMPONENT",
                         help=f"one of: {', '.join(cluster.RESTARTABLE)}")
    restart.add_argument("--kill", action="store_true", help="SIGKILL instead of SIGTERM")
    restart.add_argument("--node", metavar="NAME", help="the node of a containerd, kubelet or node-agent "
                         "(default: the first)")
    power_off = actions.add_parser(
        "power-off", help="kill one node at once as a machine dies (kubelet, containerd, node agent, pods)",
        description="Kill everything that runs on one node of a cluster of several (not the first: it is this "
                    "host) at once, as a machine that loses power: Kubernetes marks it NotReady, then evicts its "
                    "pods. power-on starts it again.")
    power_on = actions.add_parser("power-on", help="start a node's containerd, kubelet and node agent again")
    for sub in (power_off, power_on):
        sub.add_argument("node", metavar="NODE", help="the node's name (fastgshare cluster status lists them)")
    shares = actions.add_parser(
        "shares", help="each GPU pod's configured share next to the GPU time it gets, measured by the simulated GPU")
    shares.add_argument("--seconds", type=float, default=5.0, help="how long to measure (default: %(default)s)")
    build = actions.add_parser(
        "build-image", help="build the project's image from its Dockerfile offline (mmdebstrap + buildah), "
                            "and import it into the running cluster",
        description="Build the Dockerfile unchanged with buildah, on a Debian base made locally with mmdebstrap "
                    "(no container registry needed; the Python and Debian package registries are reached as "
                    "this machine is configured), print its size, write it as an OCI archive and, if a cluster "
                    "is up, import it into the cluster's containerd.")
    build.add_argument("--source", type=Path, default=Path.cwd(), help="the checkout with the Dockerfile "
                       "(default: the current directory)")
    build.add_argument("--tag", default=image_build.IMAGE, help="the image's name (default: %(default)s)")
    build.add_argument("--output", type=Path, help="where to write the OCI archive (default: in the state dir)")
    for sub in (up, down, actions.choices["status"], shares, build, restart, power_off, power_on):
        sub.add_argument("--state-dir", type=Path, default=cluster.DEFAULT_STATE_DIR,
                         help="where the cluster keeps its state and logs (default: %(default)s)")


def cluster_main(args: argparse.Namespace, console: Console, errors: Console) -> int:
    actions: dict[str, Callable[[], int]] = {
        "up": lambda: _up(args, console, errors),
        "down": lambda: 1 if cluster.down(args.state_dir, say=console.print, keep_logs=args.keep_logs) else 0,
        "shares": lambda: _shares(args.state_dir, args.seconds, console),
        "build-image": lambda: _build_image(args, console),
        "status": lambda: _status(args.state_dir, console),
        "restart": lambda: _restart(args, console),
        "power-off": lambda: _power(cluster.power_off, args, console),
        "power-on": lambda: _power(cluster.power_on, args, console),
    }
    try:
        return actions[args.action]()
    except (ClusterError, ImageBuildError, ImageError) as error:
        errors.print(f"fastgshare cluster {args.action}: {error}", markup=False, highlight=False)
        return 1
    except KeyboardInterrupt:
        errors.print(f"fastgshare cluster {args.action}: interrupted")
        return 130


def _up(args: argparse.Namespace, console: Console, errors: Console) -> int:
    specs = args.gpus or [cluster.DEFAULT_GPUS]
    for text in specs:
        try:
            parse_gpu_spec(text)
        except InvalidInventory as error:
            errors.print(f"--gpus {text!r}: {error}", markup=False, highlight=False)
            return 2
    if len(specs) > max(args.nodes, 1):
        errors.print(f"--gpus given {len(specs)} times for {args.nodes} node(s): once for every node, or once per node",
                     markup=False, highlight=False)
        return 2
    if args.slots_per_gpu < 1:
        errors.print(f"--slots-per-gpu must be >= 1, got {args.slots_per_gpu}")
        return 2
    if not 1 <= args.nodes <= machines.MAX_NODES:
        errors.print(f"--nodes must be 1 to {machines.MAX_NODES}, got {args.nodes}")
        return 2
    if args.from_manifests and (args.slots_per_gpu != 16 or any("=" in text for text in specs)):
        errors.print(f"--from-manifests: the node agent runs as deploy/ ships it (--slots-per-gpu 16, got "
                     f"{args.slots_per_gpu}) and the node label holds no model name (--gpus {', '.join(specs)})",
                     markup=False, highlight=False)
        return 2
    per_node = tuple(specs) if len(specs) > 1 else ()
    running = cluster.up(Options(state_dir=args.state_dir, gpus=specs[0], node_gpus=per_node,
                                 slots_per_gpu=args.slots_per_gpu,
                                 hook_build=args.hook_build, simgpu_build=args.simgpu_build,
                                 install_packages=not args.no_install,
                                 gateway_listen=args.gateway_listen, from_manifests=args.from_manifests,
                                 nodes=args.nodes,
                                 say=lambda text: console.print(text, markup=False, highlight=False)))
    options = Options(gpus=specs[0], node_gpus=per_node)
    for index, name in enumerate(running.node_names, start=1):
        spec = options.gpus_of(index)
        console.print(f"cluster up: node {name} with {parse_gpu_spec(spec).count} simulated GPU(s) ({spec}), "
                      f"{args.slots_per_gpu} pods per GPU", markup=False)
    console.print(f"kubeconfig: {running.kubeconfig}", markup=False, highlight=False)
    if running.gateway_url:
        console.print(f"function gateway: {running.gateway_url} (fastgshare fn --gateway {running.gateway_url} ...)",
                      markup=False, highlight=False)
        if running.nats_url:
            console.print(f"asynchronous invocations: POST {running.gateway_url}/async-function/<name>; NATS JetStream "
                          f"{running.nats_url}, queue worker {running.queue_worker_url} (/metrics)",
                          markup=False, highlight=False)
    else:
        console.print("components: pods in namespace fastgshare-system, installed with deploy/install.sh",
                      markup=False, highlight=False)
    console.print(f"export KUBECONFIG={running.kubeconfig}", markup=False, highlight=False)
    return 0


def _build_image(args: argparse.Namespace, console: Console) -> int:
    if not (args.source / "Dockerfile").is_file():
        raise ImageBuildError(f"--source {args.source}: no Dockerfile there; pass the project's checkout")
    say = lambda text: console.print(text, markup=False, highlight=False)  # noqa: E731
    builder = image_build.ImageBuilder(args.source.resolve(), args.state_dir / "image-build", tag=args.tag, say=say)
    built = builder.build()
    archive = builder.export(args.output or args.state_dir / "image-build" / "fastgshare-image.tar")
    say(f"built {built.tag}: {built.size_bytes / 2**20:.0f} MiB unpacked, in {built.build_seconds:.0f} s"
        + (f" (+ {built.base_seconds:.0f} s for the base image)" if built.base_seconds else "")
        + f"; OCI archive {archive} ({archive.stat().st_size / 2**20:.0f} MiB)")
    try:
        running = cluster.load(args.state_dir)
    except ClusterError:
        return 0
    images.import_images(shutil.which("ctr") or "ctr", running.containerd_socket, [archive])
    say(f"imported into the cluster's containerd ({running.containerd_socket})")
    return 0


def _restart(args: argparse.Namespace, console: Console) -> int:
    cluster.restart(args.state_dir, args.component, kill=args.kill, node_name=args.node,
                    say=lambda text: console.print(text, markup=False, highlight=False))
    return 0


def _power(action: Callable[..., None], args: argparse.Namespace, console: Console) -> int:
    action(args.state_dir, args.node, say=lambda text: console.print(text, markup=False, highlight=False))
    return 0


def _status(state_dir: Path, console: Console) -> int:
    components = cluster.status(state_dir)
    table = Table(title=f"fastgshare cluster in {state_dir}")
    for column in ("component", "state", "pid", "log"):
        table.add_column(column, overflow="fold")
    for component in components:
        table.add_row(component.name, "running" if component.running else "[red]exited[/red]", str(component.pid),
                      component.log)
    console.print(table)
    return 0 if all(c.running for c in components) else 1


def _assigned_pods(pods: list[dict[str, Any]]) -> list[tuple[str, str, PodAssignment]]:
    """(uid, namespace/name, assignment) of the running pods that carry an assignment."""
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(keys.POD_ASSIGNMENT_ANNOTATION)
        if not meta.get("uid") or text is None or (pod.get("status") or {}).get("phase") != "Running":
            continue
        with contextlib.suppress(CodecError):
            found.append((str(meta["uid"]), f"{meta.get('namespace')}/{meta.get('name')}", decode_assignment(text)))
    return sorted(found, key=lambda entry: (entry[2].gpu_uuid, entry[1]))


def _shares(state_dir: Path, seconds: float, console: Console) -> int:
    running = cluster.load(state_dir)
    with running.api_client() as api:
        pods = rest.call(rest.core_v1(api).list_pod_for_all_namespaces)["items"]
    gpus = [(gpu_dir, "/" if name == running.node_name else f"/{name}")
            for name in running.node_names
            for gpu_dir in sorted(running.fake_gpu_dir("", name).glob("*"))]
    achieved = measure_shares([gpu for gpu, _ in gpus], seconds, [root for _, root in gpus])
    memory = {uid: use.memory_bytes for gpu, root in gpus for uid, use in use_by_pod(gpu, root).items()}
    table = Table(title=f"GPU time over {seconds:g} s, measured by the simulated GPUs")
    for column in ("pod", "gpu", "request", "limit", "SM %", "memory used / limit", "achieved"):
        table.add_column(column, overflow="fold")
    for uid, name, assignment in _assigned_pods(pods):
        share = assignment.share
        table.add_row(name, assignment.gpu_uuid, format_fraction(share.request_permille),
                      format_fraction(share.limit_permille), str(share.sm_percent),
                      f"{format_bytes(memory.get(uid, 0))} / {format_bytes(share.memory_bytes)}",
                      f"{achieved[uid]:.3f}" if uid in achieved else "-")
    console.print(table)
    return 0
