"""``fastgshare-controller``: flags, wiring, leader election and signal handling.

Everything is created here and passed in; no module keeps global state. The process waits to
become leader (unless ``--no-leader-elect``), fills its caches, reconciles until SIGTERM or
SIGINT, lets the reconciles in flight finish, releases the Lease and exits 0. Losing the Lease
stops reconciling at once and exits 1, so the Deployment restarts it as a standby.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Sequence

from fastgshare import __version__, keys
from fastgshare_kube.health import start_health
from fastgshare_kube.leader import LeaderElector, add_leader_election_arguments, leader_election_problem
from fastgshare_kube.process import ListenAddressError, parse_listen, stop_on_signals
from fastgshare_kube.runner import run_elected
from fastpod_crd_controller import kube, names
from fastpod_crd_controller.builder import PodConfig
from fastpod_crd_controller.controller import Controller, Settings
from fastpod_crd_controller.errors import ConfigError
from fastpod_crd_controller.events import BackgroundEvents, EventRecorder
from fastpod_crd_controller.metrics import ControllerMetrics

log = logging.getLogger("fastpod_crd_controller")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastgshare-controller",
        description=f"The FaSTPod controller: keeps spec.replicas pods for every FaSTPod "
                    f"({keys.FASTPOD_CRD_NAME}), each built from the whole spec.podSpec with the FaSTPod's "
                    f"GPU share annotations, one {keys.VGPU_RESOURCE} slot per GPU container and the fastgshare "
                    "scheduler; reports status (replicas, per-pod node and GPU, conditions) through the status "
                    "subresource and invalid specs as an InvalidSpec condition and a Warning event.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else ~/.kube/config)")
    parser.add_argument("--namespace", default="",
                        help="watch FaSTPods and pods of this namespace only (default: all namespaces)")
    parser.add_argument("--scheduler-name", default=keys.SCHEDULER_NAME,
                        help="schedulerName of the pods, the kube-scheduler profile with the fastgshare extender; "
                             "a podSpec that names a scheduler keeps it (default: %(default)s)")
    parser.add_argument("--host-ipc", action=argparse.BooleanOptionalAction, default=False,
                        help="give every pod hostIPC: true, for drivers whose MPS clients need the host's IPC "
                             "namespace (Pod Security's baseline level forbids it). Without it only a podSpec "
                             "that sets hostIPC: true gets it (default: off)")
    parser.add_argument("--workers", type=int, default=4,
                        help="FaSTPods reconciled in parallel (default: %(default)s)")
    parser.add_argument("--resync-seconds", type=float, default=300.0,
                        help="reconcile every FaSTPod at least this often (default: %(default)s)")
    add_leader_election_arguments(parser, lease_name=names.LEASE_NAME, lease_namespace=keys.SYSTEM_NAMESPACE)
    parser.add_argument("--health-address", default="", metavar="HOST:PORT",
                        help="serve /healthz, /readyz and /metrics (Prometheus) here (default: off)")
    parser.add_argument("--metrics-auth", choices=keys.METRICS_AUTH_CHOICES, default=keys.METRICS_AUTH_KUBERNETES,
                        help="who may read /metrics on --health-address: 'kubernetes' (default) a bearer token the API "
                             "server authenticates and allows get on the non-resource URL /metrics; 'none' anyone "
                             "who reaches the port (development only). /healthz and /readyz stay open")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


class UsageError(Exception):
    """A flag value that cannot work; the message names it."""


def check_args(args: argparse.Namespace) -> None:
    if args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.resync_seconds <= 0:
        raise UsageError(f"--resync-seconds must be > 0, got {args.resync_seconds}")
    if (problem := leader_election_problem(args)) is not None:
        raise UsageError(problem)
    if args.health_address:
        try:
            parse_listen(args.health_address, "--health-address", example="0.0.0.0:8081")
        except ListenAddressError as error:
            raise UsageError(str(error)) from None


def default_identity() -> str:
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def run(args: argparse.Namespace, stopping: threading.Event, api: kube.ApiClient | None = None) -> int:
    """Elect, reconcile until ``stopping`` is set or leadership is lost; the exit status.

    ``api`` replaces the client ``--kubeconfig`` describes (tests pass one that impersonates
    the controller's service account).
    """
    identity = args.identity or default_identity()
    api = api or kube.load_api_client(args.kubeconfig)
    client = kube.KubeClient(api)
    elector = None
    if args.leader_elect:
        elector = LeaderElector(client, args.lease_namespace, args.lease_name, identity,
                                lease_duration_s=args.lease_duration_seconds,
                                renew_deadline_s=args.renew_deadline_seconds,
                                retry_period_s=args.retry_period_seconds)
    metrics = ControllerMetrics()
    recorder = BackgroundEvents(EventRecorder(client, instance=identity))
    controller = Controller(client, PodConfig(scheduler_name=args.scheduler_name, host_ipc=args.host_ipc), recorder,
                            settings=Settings(workers=args.workers, resync_s=args.resync_seconds), observer=metrics)
    metrics.follow(depth=lambda: len(controller.queue), leader=lambda: elector is None or elector.is_leader,
                   fastpods=controller.fastpod_statuses)
    access = kube.kubernetes_metrics_access(api) if args.metrics_auth != keys.METRICS_AUTH_NONE else None
    health = start_health(args.health_address, lambda: elector is None or not elector.is_leader or controller.healthy,
                           metrics.exposition, access=access)
    try:
        namespace = args.namespace or None
        # gc.freeze once running: what exists then (the client's generated modules and models, the synced
        # caches) lives as long as the process; frozen, later collections no longer walk it (unfrozen,
        # the collector took ~15 % of the controller's CPU while it created pods, perf under bench.controller).
        return run_elected(elector, stopping, started=gc.freeze, stop=controller.stop,
                           start=lambda: controller.start(kube.fastpod_source(api, namespace),
                                                          kube.pod_source(api, namespace)),
                           not_filled_hint=f"is the FaSTPod CRD ({keys.FASTPOD_CRD_NAME}) installed and may this "
                                           "account list FaSTPods and pods?")
    finally:
        recorder.stop()
        if health is not None:
            health.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        check_args(args)
    except UsageError as error:
        log.error("%s", error)
        return 2
    stopping = threading.Event()
    stop_on_signals(stopping.set, logger=log)
    try:
        status = run(args, stopping)
    except ConfigError as error:
        log.error("%s", error)
        return 2
    log.info("controller stopped status=%d", status)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
