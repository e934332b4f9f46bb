"""``fastgshare-function-controller``: flags, wiring, leader election, health and signals.

The process checks that it can reach the API and that the FaSTFunc CRD is installed (one line
saying what to fix, never a traceback), waits to become leader (unless ``--no-leader-elect``),
fills its caches, reconciles until SIGTERM or SIGINT, releases the Lease and exits 0. Losing the
Lease stops it with status 1, so the Deployment restarts it as a standby.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import socket
import sys
import threading
import uuid
from collections.abc import Sequence

from fastfunc_controller import kube, names
from fastfunc_controller.controller import Controller
from fastfunc_controller.metrics_source import (
    GatewayMetrics,
    QueuedDemand,
    QueueWorkers,
    check_gateway_url,
    check_queue_worker_url,
)
from fastfunc_controller.prometheus_source import DEFAULT_SCRAPE_INTERVAL_S, PrometheusRates, check_prometheus_url
from fastgshare import __version__, keys
from fastgshare_kube.events import EventRecorder
from fastgshare_kube.health import start_health
from fastgshare_kube.leader import LeaderElector, add_leader_election_arguments, leader_election_problem
from fastgshare_kube.process import ListenAddressError, parse_listen, stop_on_signals
from fastgshare_kube.runner import run_elected

log = logging.getLogger("fastfunc_controller")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastgshare-function-controller",
        description=f"The FaSTFunc controller: runs every FaSTFunc ({keys.FASTFUNC_CRD_NAME}) as one FaSTPod per "
                    "(quota, SM) configuration, named <fn>-q<quota%%>-s<sm%%>, and a ClusterIP Service <fn> on port "
                    f"{keys.FUNCTION_PORT}; reports replicas, configurations and conditions (Ready, InvalidSpec, "
                    "ProfileMissing, Unschedulable, MetricsUnavailable) in the FaSTFunc's status. Policy fixed runs "
                    "spec.fixed; policies rpr and hpa are autoscaled from the function's profile and the request "
                    "rates the gateways count (--gateway-url, or Prometheus: --prometheus-url).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else ~/.kube/config)")
    parser.add_argument("--namespace", action="append", dest="namespaces", metavar="NS",
                        help="a function namespace: run the FaSTFuncs there; repeat for more (default "
                             f"{keys.DEFAULT_FUNCTION_NAMESPACE}). Its rights there are a Role "
                             "(deploy/function-controller/rbac.yaml): bind a copy in each namespace you add")
    parser.add_argument("--all-namespaces", action="store_true",
                        help="run the FaSTFuncs of every namespace instead; needs cluster-wide rights the shipped "
                             "RBAC does not grant (default: off)")
    parser.add_argument("--resync-seconds", type=float, default=300.0,
                        help="reconcile every FaSTFunc at least this often (default: %(default)s)")
    parser.add_argument("--gateway-url", action="append", default=[], metavar="URL",
                        help="a gateway whose /metrics (gateway_function_invocation_started_total) gives the "
                             "request rates that autoscale policies rpr and hpa; repeat it for every gateway "
                             "replica (default: none, and autoscaled functions keep their plan with "
                             "MetricsUnavailable=True)")
    parser.add_argument("--queue-worker-url", action="append", default=[], metavar="URL",
                        help="a queue worker (fastgshare-queue-worker) whose /metrics (fastgshare_queue_pending) "
                             "gives the asynchronous requests queued per function, added to its request rate as "
                             "pending / the long window; repeat it for every worker, or name a headless Service "
                             "(each replica is read; the largest count is taken). Direct mode only: with "
                             "--prometheus-url, Prometheus is asked for the same gauge (default: none)")
    parser.add_argument("--prometheus-url", default="", metavar="URL",
                        help="Prometheus mode, instead of --gateway-url: ask this Prometheus (its /api/v1/query) "
                             "for sum(rate(gateway_function_invocation_started_total{function_name=\"<fn>.<ns>\"}[W])) "
                             "over the long and the short window; it must scrape every gateway replica (default: off)")
    parser.add_argument("--prometheus-scrape-interval-seconds", type=float, default=DEFAULT_SCRAPE_INTERVAL_S,
                        metavar="SECONDS",
                        help="how often that Prometheus scrapes the gateways: each rate window is at least twice "
                             "this, as rate() needs two samples (default: %(default)s, so the 2 s panic window "
                             "holds)")
    parser.add_argument("--scrape-interval-seconds", type=float, default=1.0,
                        help="read the gateways' counters (Prometheus mode: check that Prometheus answers) this "
                             "often (default: %(default)s)")
    add_leader_election_arguments(parser, lease_name=names.LEASE_NAME, lease_namespace=keys.SYSTEM_NAMESPACE)
    parser.add_argument("--health-address", default="", metavar="HOST:PORT",
                        help="serve /healthz and /readyz here (default: off)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


class UsageError(Exception):
    """A flag value that cannot work; the message names it."""


NAMESPACE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def watched_namespaces(args: argparse.Namespace) -> list[str] | None:
    """The function namespaces the flags name, in order; None for every namespace."""
    if args.all_namespaces:
        return None
    return list(dict.fromkeys(args.namespaces or [keys.DEFAULT_FUNCTION_NAMESPACE]))


def namespace_problem(args: argparse.Namespace) -> str | None:
    """Why ``--namespace`` / ``--all-namespaces`` cannot work, else None."""
    if args.all_namespaces and args.namespaces:
        return ("--namespace and --all-namespaces exclude each other; allowed: one or more --namespace NS, "
                "or --all-namespaces")
    for namespace in args.namespaces or []:
        if not NAMESPACE_NAME.fullmatch(namespace):
            return (f"--namespace {namespace!r} is not a namespace name; allowed: a DNS-1123 label "
                    "(a-z, 0-9, '-', at most 63 characters)")
    return None


def source_problem(args: argparse.Namespace) -> str | None:
    """Why the rate source's flags (direct mode or Prometheus mode) cannot work, else None."""
    problems = [check_gateway_url(url) for url in args.gateway_url]
    problems += [check_queue_worker_url(url) for url in args.queue_worker_url]
    if args.prometheus_url:
        if args.queue_worker_url:
            problems.append("--prometheus-url and --queue-worker-url exclude each other; allowed: one of them "
                            "(with --prometheus-url, the queued requests are read from Prometheus: "
                            "max(fastgshare_queue_pending{function_name=...}))")
        if args.gateway_url:
            problems.append("--prometheus-url and --gateway-url exclude each other; allowed: one of them "
                            "(--gateway-url: scrape the gateways directly; --prometheus-url: ask Prometheus)")
        problems.append(check_prometheus_url(args.prometheus_url))
    return next((problem for problem in problems if problem is not None), None)


def check_args(args: argparse.Namespace) -> None:
    if (problem := namespace_problem(args)) is not None:
        raise UsageError(problem)
    if args.resync_seconds <= 0:
        raise UsageError(f"--resync-seconds must be > 0, got {args.resync_seconds}")
    if not 0.1 <= args.scrape_interval_seconds <= 60:
        raise UsageError(f"--scrape-interval-seconds must be 0.1..60, got {args.scrape_interval_seconds}")
    if (problem := source_problem(args)) is not None:
        raise UsageError(problem)
    if not 0.1 <= args.prometheus_scrape_interval_seconds <= 60:
        raise UsageError("--prometheus-scrape-interval-seconds must be 0.1..60, got "
                         f"{args.prometheus_scrape_interval_seconds}")
    if (problem := leader_election_problem(args)) is not None:
        raise UsageError(problem)
    if args.health_address:
        try:
            parse_listen(args.health_address, "--health-address", example="0.0.0.0:8081")
        except ListenAddressError as error:
            raise UsageError(str(error)) from None


def run(args: argparse.Namespace, stopping: threading.Event, api: kube.ApiClient | None = None) -> int:
    """Check, elect, reconcile until ``stopping`` is set or leadership is lost; the exit status.
    ``api`` replaces the client ``--kubeconfig`` describes (tests). Raises KubeConfigError."""
    identity = args.identity or f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    api = api or kube.load_api_client(args.kubeconfig)
    namespaces = watched_namespaces(args)
    if problem := kube.check_crd(api, namespaces[0] if namespaces else None):
        log.error("%s", problem)
        return 1
    client = kube.KubeClient(api)
    elector = None
    if args.leader_elect:
        elector = LeaderElector(client, args.lease_namespace, args.lease_name, identity,
                                lease_duration_s=args.lease_duration_seconds,
                                renew_deadline_s=args.renew_deadline_seconds,
                                retry_period_s=args.retry_period_seconds)
    recorder = EventRecorder(client, component=names.COMPONENT, instance=identity,
                             api_version=keys.FASTFUNC_API_VERSION, kind=keys.FASTFUNC_KIND)
    metrics: GatewayMetrics | PrometheusRates | QueuedDemand
    if args.prometheus_url:
        metrics = PrometheusRates(args.prometheus_url, scrape_interval_s=args.prometheus_scrape_interval_seconds)
    else:
        metrics = GatewayMetrics(args.gateway_url)
        if not args.gateway_url:
            log.warning("no --gateway-url nor --prometheus-url: functions of policy rpr and hpa read no request rate "
                        "and keep their plan")
        if args.queue_worker_url:
            metrics = QueuedDemand(metrics, QueueWorkers(args.queue_worker_url))
    controller = Controller(client, recorder, resync_s=args.resync_seconds, metrics=metrics,
                            tick_s=args.scrape_interval_seconds, free_space=client.free_space)
    health = start_health(args.health_address, lambda: elector is None or not elector.is_leader or controller.healthy)
    try:
        return run_elected(elector, stopping, start=lambda: _start(args, controller, api), stop=controller.stop,
                           not_filled_hint="are the FaSTFunc and FaSTPod CRDs installed and may this account list "
                                           "FaSTFuncs, FaSTPods, Services and pods "
                                           "(deploy/function-controller/rbac.yaml)?")
    finally:
        if health is not None:
            health.stop()


def _start(args: argparse.Namespace, controller: Controller, api: kube.ApiClient) -> None:
    namespaces = watched_namespaces(args)
    log.info("running the FaSTFuncs of namespaces=%s", ",".join(namespaces) if namespaces else "all")
    sources = kube.sources(api, namespaces)
    controller.start(sources.fastfuncs, sources.fastpods, sources.services, sources.pods)


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
    except kube.KubeConfigError as error:
        log.error("%s", error)
        return 2
    except OSError as error:  # the health address cannot be bound
        log.error("--health-address %s: %s", args.health_address, error)
        return 2
    log.info("function controller stopped status=%d", status)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
