"""``fastgshare-node-agent``: flags, wiring and signal handling (the composition root).

Everything is created here and passed in; no module keeps global state.

The arbiter starts first, before the modules that talk to kubelet and the API server are even
imported (they take seconds to load): after a restart the hooks of running pods reconnect within
a fraction of a second, and the arbiter serves them from its saved ledger until the pod cache is
loaded (see docs/architecture.md, "Restarting the node agent").

The model store (:mod:`device_plugin.models`) starts with the pod cache: its pod-facing socket
``model.sock`` sits next to the arbiter's in the run directory. Stopping the agent stops the store's
sweeping and its socket; the per-GPU workers keep running, by design, so the pods' mappings of the
weights stay valid, and the next agent adopts them (docs/node-agent.md, "Model store").
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from device_plugin.allocation import Allocator, HostPaths, NodePod, SimulatedDriver
from device_plugin.arbiter.probe import arbiter_problem
from device_plugin.arbiter.runner import (
    ArbiterThread,
    add_edge_arguments,
    add_timing_arguments,
    edge_options,
    timing_ns,
)
from device_plugin.arbiter.server import ArbiterServer, GpuSettings
from device_plugin.arbiter.shares import AssignmentShares, DeferredShares
from device_plugin.arbiter.state import STATE_FILE_NAME, StateFile
from device_plugin.devices import DeviceState
from device_plugin.discovery import GpuBackend, SimulatedGpus
from device_plugin.gpu_usage import DEFAULT_THRESHOLD, ProcessGpuTime
from device_plugin.hook_install import (
    HookInstallError,
    SimulatedGpuFilesError,
    ensure_simulated_gpu_files,
    install_hook,
    install_library,
)
from device_plugin.mps import with_mps
from device_plugin.mps_watch import MPS_POLL_S, MpsFollower, daemon_running
from device_plugin.nvml import NvmlGpus, NvmlProcessGpuTime, NvmlUnavailable
from fastgshare import __version__, keys
from fastgshare.assignment_signature import (
    ALLOW_UNSIGNED_FLAG,
    KEY_FILE_FLAG,
    AssignmentKeyError,
    AssignmentTrust,
    trust_from_flags,
)
from fastgshare.context_reserve import (
    CONTEXT_RESERVE_HELP,
    InvalidContextReserve,
    parse_context_reserve,
    with_context_reserve,
)
from fastgshare.context_reserve import describe as describe_reserves
from fastgshare.errors import InvalidInventory
from fastgshare.inventory import GPU_SPEC_HELP, GpuDevice, gpu_spec_from_label, parse_gpu_spec
from fastgshare_kube.process import ListenAddressError, parse_listen, stop_on_signals

if TYPE_CHECKING:  # imported where used: they load kubernetes, grpc and prometheus (seconds)
    from device_plugin.agent import NodeAgent
    from device_plugin.gpu_usage import UsageAudit
    from device_plugin.kube import NodePods
    from device_plugin.metrics import MetricsAccess
    from device_plugin.models.access import ModelAccessServer
    from device_plugin.models.store import ModelStore
    from fastgshare_kube.health import HealthServer

log = logging.getLogger("device_plugin")

DEFAULT_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"
DEFAULT_STATE_DIR = "/var/lib/fastgshare"
DEFAULT_HOOK = "/usr/lib/fastgshare/libfastgshare-hook.so"
DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_MODEL_DIR = "/var/lib/fastgshare/models"  # <state-dir>/models with the shipped DaemonSet's state dir
DEFAULT_MODEL_GRACE_S = 300.0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastgshare-node-agent",
        description=f"The fastgshare node agent: a kubelet device plugin advertising {keys.VGPU_RESOURCE} "
                    "(slots per healthy GPU), GPU discovery and health, the node's GPU inventory annotation, "
                    "and Allocate for pods the fastgshare scheduler extender assigned to this node.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                        help="this node's name (default: $NODE_NAME)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else ~/.kube/config)")
    parser.add_argument("--node-wait-seconds", type=float, default=60.0,
                        help="how long to wait at start for --node-name to be registered in the cluster before "
                             "giving up (default: %(default)s)")
    parser.add_argument("--device-plugin-dir", default=DEFAULT_PLUGIN_DIR, type=Path,
                        help="kubelet's device-plugin directory (default: %(default)s)")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR, type=Path,
                        help="where the hook library copy, the arbiter socket and the arbiter's saved ledger live "
                             "(default: %(default)s)")
    parser.add_argument("--fake-gpus", metavar="SPEC",
                        help=f"simulate GPUs instead of asking NVML: {GPU_SPEC_HELP}")
    parser.add_argument("--slots-per-gpu", type=int, default=keys.DEFAULT_SLOTS_PER_GPU,
                        help="pods one GPU may hold; each is one kubelet device (default: %(default)s)")
    parser.add_argument("--context-reserve", default="auto", metavar="QUANTITY|auto",
                        help="GPU memory each pod's CUDA context is charged next to its gpu_mem, published per GPU "
                             f"in the inventory: {CONTEXT_RESERVE_HELP} (default: %(default)s)")
    parser.add_argument("--hook-library", type=Path, default=Path(DEFAULT_HOOK),
                        help="the CUDA hook to install into --state-dir and mount into containers "
                             "(default: %(default)s)")
    parser.add_argument("--fake-driver-dir", type=Path, default=None,
                        help="with --fake-gpus: directory holding the simulated libcuda.so.1 and libnvidia-ml.so.1 "
                             "that Allocate mounts into containers, with each simulated GPU's state "
                             "(default: fake/ next to --hook-library, if it is there)")
    parser.add_argument("--mps-pipe-dir", default=keys.DEFAULT_MPS_PIPE_DIRECTORY,
                        help="the MPS control daemon's pipe directory: GPUs have MPS while its "
                             f"{keys.MPS_CONTROL_PIPE} pipe is there, looked for every {MPS_POLL_S:g} s for the "
                             "agent's whole life (default: %(default)s)")
    parser.add_argument("--health-recovery-seconds", type=float, default=0.0,
                        help="mark a GPU healthy again after this long without critical XID events; "
                             "0 keeps it unhealthy until the agent restarts (default: %(default)s)")
    parser.add_argument("--pod-resources-socket", type=Path, default=DEFAULT_POD_RESOURCES_SOCKET,
                        help="kubelet's PodResources API socket: kubelet's record of which pods hold a vGPU, so "
                             "Allocate never serves a pod on a guess (default: %(default)s; kubelet --root-dir "
                             "decides where it is; without it the agent relies on its own annotations)")
    parser.add_argument("--allocate-wait-seconds", type=float, default=10.0,
                        help="how long Allocate waits for the pod it serves to appear in the watch cache "
                             "(default: %(default)s)")
    parser.add_argument("--metrics-listen", default=f"0.0.0.0:{keys.DEFAULT_NODE_METRICS_PORT}", metavar="HOST:PORT",
                        help="where to serve /metrics and /healthz (default: %(default)s; port 0 picks a free one); "
                             "the port is published on the node for `fastgshare inspect`")
    parser.add_argument("--metrics-auth", choices=keys.METRICS_AUTH_CHOICES, default=keys.METRICS_AUTH_KUBERNETES,
                        help="who may read /metrics (the node's pods with their shares): 'kubernetes' (default) serves "
                             "it only to a bearer token the API server authenticates and allows get on the "
                             "non-resource URL /metrics (TokenReview, SubjectAccessReview); 'none' serves it to "
                             "anyone who reaches the port (development only)")
    parser.add_argument(KEY_FILE_FLAG, metavar="PATH",
                        help="the key the extender signs assignments with (Secret fastgshare-assignment-key); "
                             f"Allocate serves only assignments it signed for the pod; required unless "
                             f"{ALLOW_UNSIGNED_FLAG}")
    parser.add_argument(ALLOW_UNSIGNED_FLAG, action="store_true",
                        help="run without a key and serve unsigned assignments (development only: anyone who may "
                             "patch a pod can then give it any share)")
    parser.add_argument("--unaccounted-threshold", type=float, default=DEFAULT_THRESHOLD, metavar="SHARE",
                        help="warn (Event GPUTimeUnaccounted) when the GPU reports a pod used more than this share "
                             "of its time beyond what the arbiter charged it, over ~10 s (default: %(default)s)")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="where the node's model files are: a FaSTFunc's spec.model.source.path is relative to "
                             "it; the model store loads each GPU's models from here once (default: <state-dir>/models, "
                             f"so {DEFAULT_MODEL_DIR} with the shipped DaemonSet)")
    parser.add_argument("--model-grace-seconds", type=float, default=DEFAULT_MODEL_GRACE_S,
                        help="free a model this long after the last pod on its GPU that declares it left, so scaling "
                             "down and up again does not reload it (default: %(default)s)")
    add_timing_arguments(parser)
    add_edge_arguments(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def make_backend(args: argparse.Namespace) -> GpuBackend:
    """The GPUs: simulated with --fake-gpus; else NVML's; else, on a node without GPUs that
    carries the simulated-GPUs label, simulated as the label says (``args.fake_gpus`` is set)."""
    if args.fake_gpus:
        return SimulatedGpus(parse_gpu_spec(args.fake_gpus), args.node_name)
    try:
        return NvmlGpus(args.mps_pipe_dir)
    except NvmlUnavailable:
        spec = simulated_gpus_of_node(args)
        if spec is None:
            raise
    log.warning("no NVIDIA GPUs here; simulating %s as node label %s says", spec, keys.SIMULATED_GPUS_LABEL)
    args.fake_gpus = spec
    return SimulatedGpus(parse_gpu_spec(spec), args.node_name)


def mps_allowed(backend: GpuBackend) -> dict[str, bool]:
    """GPU uuid -> whether it may run MPS: every real GPU; a simulated one unless its spec says ``:nomps``."""
    simulated = isinstance(backend, SimulatedGpus)
    return {gpu.uuid: gpu.mps_enabled if simulated else True for gpu in backend.devices()}


def simulated_gpus_of_node(args: argparse.Namespace) -> str | None:
    """The GPU spec of this node's simulated-GPUs label, or None without one."""
    from device_plugin.kube import KubeConfigError, load_api_client, node_label  # noqa: PLC0415 - heavy

    try:
        api = load_api_client(args.kubeconfig)
    except KubeConfigError:
        return None
    value = node_label(api, args.node_name, keys.SIMULATED_GPUS_LABEL)
    if value is None:
        return None
    try:
        return gpu_spec_from_label(value)
    except InvalidInventory as error:
        raise StartupError(f"node label {keys.SIMULATED_GPUS_LABEL}: {error}", 2) from None


def simulated_driver(args: argparse.Namespace, gpus: tuple[GpuDevice, ...]) -> SimulatedDriver | None:
    """With --fake-gpus, install the simulated driver next to the hook and make each GPU's state
    directory; None (with a warning) if the driver is not there."""
    if not args.fake_gpus:
        return None
    source = args.fake_driver_dir or args.hook_library.parent / "fake"
    if args.fake_driver_dir is None and not (source / keys.CUDA_DRIVER_LIBRARY).exists():
        log.warning("no simulated driver in %s: GPU containers must bring their own libcuda "
                    "(pass --fake-driver-dir, the output of make -C simgpu, to mount it)", source)
        return None
    lib_dir = args.state_dir / "lib"
    libcuda = install_library(source / keys.CUDA_DRIVER_LIBRARY, lib_dir, "libcuda-simulated", "simulated driver")
    nvml = install_library(source / keys.NVML_LIBRARY, lib_dir, "libnvidia-ml-simulated", "simulated NVML")
    gpu_dirs = {}
    for gpu in gpus:
        directory = args.state_dir / "fake-gpus" / gpu.uuid
        ensure_simulated_gpu_files(directory)  # containers mount its two files, never the directory
        gpu_dirs[gpu.uuid] = str(directory)
    return SimulatedDriver(libcuda=str(libcuda), libnvidia_ml=str(nvml), gpu_dirs=gpu_dirs,
                           gpu_memory={gpu.uuid: gpu.memory_bytes for gpu in gpus})


class StartupError(Exception):
    """The agent cannot start; the message says why and ``code`` is the exit status."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


@attrs.define
class Components:
    pods: NodePods
    arbiter: ArbiterThread
    agent: NodeAgent
    stopping: threading.Event
    metrics: HealthServer
    mps: MpsFollower
    audit: UsageAudit | None = None
    models: ModelStore | None = None
    model_access: ModelAccessServer | None = None


def metrics_address(args: argparse.Namespace) -> tuple[str, int]:
    """``--metrics-listen`` as (host, port); :class:`StartupError` naming the flag otherwise."""
    try:
        return parse_listen(args.metrics_listen, "--metrics-listen", example="0.0.0.0:9401")
    except ListenAddressError as error:
        raise StartupError(str(error), 2) from None


def start_metrics(args: argparse.Namespace, pods: NodePods, arbiter: ArbiterThread,
                  devices: DeviceState, audit: UsageAudit | None = None, *,
                  access: MetricsAccess | None = None, models: ModelStore | None = None) -> HealthServer:
    from device_plugin.metrics import NodeMetrics, metrics_server  # noqa: PLC0415 - after the arbiter starts

    host, port = metrics_address(args)

    def arbiter_answers() -> bool:
        """The arbiter answers through its socket's path, as the hooks reach it, and its loop answers."""
        problem = arbiter_problem(arbiter.server.socket_path)
        if problem is None:
            try:
                arbiter.usage(timeout_s=1.0)
            except Exception as error:
                problem = f"the arbiter's loop does not answer: {error!r}"
        if problem is not None:
            log.error("unhealthy: %s", problem)
        return problem is None

    try:
        return metrics_server(host, port, NodeMetrics(pods, arbiter.usage, devices.inventory,
                                                      audit.latest if audit is not None else None, models=models),
                              arbiter_answers, access=access)
    except OSError as error:
        raise StartupError(f"cannot serve metrics on --metrics-listen {args.metrics_listen}: "
                           f"{error.strerror or error}") from None


@attrs.define
class EarlyArbiter:
    """The arbiter, started before the rest of the agent, and what it needed."""

    backend: GpuBackend
    run_dir: Path
    shares: DeferredShares
    thread: ArbiterThread
    gpus: tuple[GpuDevice, ...]  # as published: the backend's, with their context reserves and MPS as of now
    mps_allowed: dict[str, bool]


def start_arbiter(args: argparse.Namespace) -> EarlyArbiter:
    """Check the flags, find the GPUs and start serving the hooks (with the saved ledger)."""
    if not args.node_name:
        raise StartupError("--node-name is required (or set $NODE_NAME, e.g. from the downward API)", 2)
    if args.slots_per_gpu < 1:
        raise StartupError(f"--slots-per-gpu must be >= 1, got {args.slots_per_gpu}", 2)
    if args.model_grace_seconds < 0:
        raise StartupError(f"--model-grace-seconds {args.model_grace_seconds}: allowed: 0 or more seconds", 2)
    if not 0.0 < args.unaccounted_threshold <= 1.0:
        raise StartupError(f"--unaccounted-threshold {args.unaccounted_threshold}: expected a share of GPU time "
                           "in (0, 1], e.g. 0.05", 2)
    try:
        reserve = parse_context_reserve(args.context_reserve)
    except InvalidContextReserve as error:
        raise StartupError(str(error), 2) from None
    try:
        backend = make_backend(args)
    except InvalidInventory as error:
        raise StartupError(f"--fake-gpus: {error}", 2) from None
    except NvmlUnavailable as error:
        raise StartupError(f"no GPUs: {error}; on a machine without NVIDIA GPUs pass --fake-gpus SPEC "
                           f"(e.g. 2x80GiB:132sm) or label the node {keys.SIMULATED_GPUS_LABEL}=SPEC "
                           "(e.g. 2x16GiB_80sm)") from None
    try:  # the simulated GPU holds no context memory: auto is 0 there
        gpus = with_context_reserve(backend.devices(), reserve, simulated=bool(args.fake_gpus))
    except InvalidContextReserve as error:
        backend.close()
        raise StartupError(str(error), 2) from None
    allowed = mps_allowed(backend)
    gpus = with_mps(gpus, allowed, daemon_running(Path(args.mps_pipe_dir)))  # followed from here on: MpsFollower
    run_dir = args.state_dir / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    shares = DeferredShares()
    thread = ArbiterThread(
        ArbiterServer(run_dir / keys.ARBITER_SOCKET_NAME,
                      {gpu.uuid: GpuSettings(mps_enabled=gpu.mps_enabled) for gpu in gpus},
                      shares, state=StateFile(args.state_dir / STATE_FILE_NAME), **timing_ns(args),
                      **edge_options(args)))
    try:
        thread.start()
    except OSError as error:
        backend.close()
        raise StartupError(f"cannot start the arbiter: {error}") from None
    return EarlyArbiter(backend, run_dir, shares, thread, gpus, allowed)


def build(args: argparse.Namespace, early: EarlyArbiter, trust: AssignmentTrust) -> Components:
    """Create and wire every other part of the agent (nothing of it runs yet)."""
    from device_plugin.agent import NodeAgent  # noqa: PLC0415 - heavy: after the arbiter started
    from device_plugin.kube import (  # noqa: PLC0415
        REASON_ASSIGNMENT_REFUSED,
        KubeConfigError,
        KubeWriter,
        NodePods,
        kubernetes_metrics_access,
        load_api_client,
        missing_node,
    )
    from device_plugin.pod_resources import PodResourcesClient  # noqa: PLC0415
    from device_plugin.servicer import DevicePluginServicer  # noqa: PLC0415

    backend, run_dir, arbiter = early.backend, early.run_dir, early.thread
    try:
        hook = install_hook(args.hook_library, args.state_dir / "lib")
        driver = simulated_driver(args, backend.devices())
    except (HookInstallError, SimulatedGpuFilesError) as error:
        raise StartupError(str(error)) from None

    stopping = threading.Event()
    try:
        api = load_api_client(args.kubeconfig)
    except KubeConfigError as error:
        raise StartupError(str(error), 2) from None
    if (problem := missing_node(api, args.node_name, args.node_wait_seconds)) is not None:
        raise StartupError(problem, 2)
    pods = NodePods(api, args.node_name, trust=trust,  # reports once it runs, when the writer below exists
                    report=lambda pod, message: writer.warn(pod, REASON_ASSIGNMENT_REFUSED, message))
    early.shares.attach(AssignmentShares(pods))
    devices = DeviceState(args.node_name, early.gpus, args.slots_per_gpu)
    audit = usage_audit(args, backend, driver, arbiter, pods,  # warns once it runs, when the writer exists
                        warn=lambda pod, reason, message: writer.warn(pod, reason, message))  # noqa: PLW0108
    if args.metrics_auth == keys.METRICS_AUTH_NONE:
        log.warning("--metrics-auth none: /metrics (every pod's share) is served to anyone who reaches the port")
    models, model_access = model_store(  # warns once it sweeps, when the writer exists; real GPUs only
        args, run_dir, driver, early.gpus, pods,
        warn=None if args.fake_gpus else lambda pod, reason, message: writer.warn(pod, reason, message))  # noqa: PLW0108
    metrics = start_metrics(args, pods, arbiter, devices, audit,
                            access=kubernetes_metrics_access(api) if args.metrics_auth != keys.METRICS_AUTH_NONE
                            else None, models=models)
    writer = KubeWriter(api, node_annotations={keys.NODE_METRICS_PORT_ANNOTATION: str(metrics.port)},
                        instance=args.node_name)
    allocator = Allocator(args.node_name, HostPaths(hook_library=str(hook), run_dir=str(run_dir),
                                                    mps_pipe_dir=args.mps_pipe_dir, simulated_driver=driver))
    kubelet_record = PodResourcesClient(args.pod_resources_socket, keys.VGPU_RESOURCE)
    mps = MpsFollower(Path(args.mps_pipe_dir), allowed=early.mps_allowed, devices=devices, arbiter=arbiter,
                      events=writer, pods=pods, node_name=args.node_name, stopping=stopping)
    agent = NodeAgent(
        devices=devices, backend=backend, publisher=writer, plugin_dir=args.device_plugin_dir, stopping=stopping,
        health_recovery_s=args.health_recovery_seconds, models=models,
        make_servicer=lambda: DevicePluginServicer(devices, allocator, pods, writer, stopping=stopping,
                                                   allocate_wait_s=args.allocate_wait_seconds,
                                                   kubelet_record=kubelet_record, partitions=mps),
    )
    inventory = devices.inventory()
    log.info("node agent starting node=%s gpus=%s slots_per_gpu=%d context_reserve=%s hook=%s metrics=%s:%d",
             args.node_name, ",".join(f"{g.index}:{g.uuid}:{'mps' if g.mps_enabled else 'nomps'}"
                                      for g in inventory.gpus), args.slots_per_gpu,
             describe_reserves(inventory.gpus), hook, metrics_address(args)[0], metrics.port)
    return Components(pods, arbiter, agent, stopping, metrics, mps, audit, models, model_access)


def model_store(args: argparse.Namespace, run_dir: Path, driver: SimulatedDriver | None,
                gpus: tuple[GpuDevice, ...], pods: NodePods, *,
                warn: Callable[[NodePod, str, str], None] | None = None) -> tuple[ModelStore, ModelAccessServer]:
    """The model store (its workers' sockets and logs under ``<state-dir>/model-store``, workers
    started on first need, what it holds in ``held.json`` there) and its pod-facing socket
    ``<run dir>/model.sock``; neither runs yet. ``warn``: how pods are told that a worker lost their
    model (real GPUs only: on the simulated GPU their mappings outlive the worker)."""
    from device_plugin.models.access import ModelAccessServer  # noqa: PLC0415
    from device_plugin.models.held_file import HELD_FILE_NAME  # noqa: PLC0415
    from device_plugin.models.store import (  # noqa: PLC0415
        ModelStore,
        ProcessWorkers,
        simulated_driver_dir,
        worker_env,
    )

    socket_dir = args.state_dir / "model-store"  # not "models": that is --model-dir's default
    try:
        lib_dir = simulated_driver_dir(driver, socket_dir / "driver") if driver is not None else None
    except OSError as error:
        raise StartupError(f"cannot prepare the simulated driver for the model store in {socket_dir}: "
                           f"{error.strerror or error}") from None
    workers = ProcessWorkers(socket_dir, {gpu.uuid: worker_env(gpu.uuid, driver, lib_dir) for gpu in gpus})
    synced = lambda: pods.wait_synced(0)  # noqa: E731
    model_dir = args.model_dir if args.model_dir is not None else args.state_dir / "models"
    store = ModelStore(node_name=args.node_name, model_dir=model_dir, gpus=tuple(gpu.uuid for gpu in gpus),
                       pods=pods, workers=workers, grace_s=args.model_grace_seconds, synced=synced,
                       held_file=socket_dir / HELD_FILE_NAME, warn=warn)
    access = ModelAccessServer(run_dir / keys.MODEL_SOCKET_NAME, pods, store, synced=synced)
    return store, access


def usage_audit(args: argparse.Namespace, backend: GpuBackend, driver: SimulatedDriver | None,
                arbiter: ArbiterThread, pods: NodePods, *,
                warn: Callable[[NodePod, str, str], None]) -> UsageAudit | None:
    """The audit of the arbiter's charges against the GPU's own per-process account: NVML's on
    real GPUs, the simulated driver's where it is installed; None where neither can say."""
    from device_plugin.arbiter.identity import pod_uid_of_pid  # noqa: PLC0415
    from device_plugin.gpu_usage import UsageAudit  # noqa: PLC0415

    gpu: ProcessGpuTime
    if isinstance(backend, NvmlGpus):
        gpu = NvmlProcessGpuTime(backend)
    elif driver is not None:
        from device_plugin.simulated_usage import SimulatedProcessGpuTime  # noqa: PLC0415

        gpu = SimulatedProcessGpuTime({uuid: Path(directory) for uuid, directory in driver.gpu_dirs.items()})
    else:
        log.warning("no per-process GPU accounting here (simulated GPUs without the simulated driver): "
                    "the charges are not audited")
        return None
    return UsageAudit(gpu, arbiter.usage, pods, warn, pod_uid_of_pid, threshold=args.unaccounted_threshold)


def run(parts: Components) -> None:
    """Serve until SIGTERM or SIGINT, then stop every part in order."""
    stop_on_signals(parts.stopping.set, logger=log)
    parts.pods.start()
    parts.arbiter.follow(parts.pods)
    if parts.models is not None and parts.model_access is not None:
        parts.models.start()
        try:
            parts.model_access.start()
        except OSError as error:  # the rest of the agent serves on; pods asking for a model cannot connect
            log.error("cannot serve the model socket %s: %s", parts.model_access.socket_path, error)
    parts.metrics.start()
    parts.agent.start()
    parts.mps.start()
    if parts.audit is not None:
        parts.audit.start()
    parts.stopping.wait()
    if parts.audit is not None:
        parts.audit.stop()
    parts.mps.stop()
    parts.agent.stop()
    parts.metrics.stop()
    if parts.model_access is not None:
        parts.model_access.stop()
    if parts.models is not None:
        parts.models.stop()  # its workers keep running: the pods' mappings stay valid
    parts.arbiter.stop()
    parts.pods.stop()


def raise_open_files_limit() -> None:
    """Hooks hold two connections per process: allow as many descriptors as the system lets us."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        trust = trust_from_flags(args.assignment_key_file, args.allow_unsigned_assignments,
                                 lambda path: Path(path).read_bytes())
    except AssignmentKeyError as error:
        print(f"fastgshare-node-agent: error: {error}", file=sys.stderr)  # one line
        return 2
    raise_open_files_limit()
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if not trust.signing:
        log.warning("%s: unsigned assignments are served (development only)", ALLOW_UNSIGNED_FLAG)
    try:
        early = start_arbiter(args)
    except StartupError as error:
        log.error("%s", error)
        return error.code
    try:
        run(build(args, early, trust))
    except StartupError as error:
        early.thread.stop()
        early.backend.close()
        log.error("%s", error)
        return error.code
    log.info("node agent stopped node=%s", args.node_name)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
