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
import signal
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType

from fastfunc_controller import kube, names
from fastfunc_controller.controller import Controller
from fastgshare import __version__, keys
from fastgshare_kube.events import EventRecorder
from fastgshare_kube.leader import LeaderElector

log = logging.getLogger("fastfunc_controller")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastgshare-function-controller",
        description=f"The FaSTFunc controller: runs every FaSTFunc ({keys.FASTFUNC_CRD_NAME}) as one FaSTPod per "
                    "(quota, SM) configuration, named <fn>-q<quota%%>-s<sm%%>, and a ClusterIP Service <fn> on port "
                    f"{keys.FUNCTION_PORT}; reports replicas, configurations and conditions (Ready, InvalidSpec, "
                    "ProfileMissing, Unschedulable) in the FaSTFunc's status. Policy fixed runs spec.fixed.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else ~/.kube/config)")
    parser.add_argument("--namespace", default="",
                        help="watch FaSTFuncs of this namespace only (default: all namespaces)")
    parser.add_argument("--resync-seconds", type=float, default=300.0,
                        help="reconcile every FaSTFunc at least this often (default: %(default)s)")
    parser.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                        help="run only while holding the Lease, so several replicas can run; "
                             "--no-leader-elect for a single replica (default: on)")
    parser.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE") or keys.SYSTEM_NAMESPACE,
                        help="namespace of the leader-election Lease (default: $POD_NAMESPACE, else %(default)s)")
    parser.add_argument("--lease-name", default=names.LEASE_NAME,
                        help="name of the leader-election Lease (default: %(default)s)")
    parser.add_argument("--identity", default="",
                        help="this replica's name in the Lease (default: $POD_NAME or the host name, plus a random "
                             "suffix)")
    parser.add_argument("--lease-duration-seconds", type=float, default=15.0,
                        help="how long a standby waits after the leader's last renewal (default: %(default)s)")
    parser.add_argument("--renew-deadline-seconds", type=float, default=10.0,
                        help="the leader gives up when it could not renew for this long (default: %(default)s)")
    parser.add_argument("--retry-period-seconds", type=float, default=2.0,
                        help="how often to try to acquire or renew the Lease (default: %(default)s)")
    parser.add_argument("--health-address", default="", metavar="HOST:PORT",
                        help="serve /healthz and /readyz here (default: off)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


class UsageError(Exception):
    """A flag value that cannot work; the message names it."""


def check_args(args: argparse.Namespace) -> None:
    if args.resync_seconds <= 0:
        raise UsageError(f"--resync-seconds must be > 0, got {args.resync_seconds}")
    if not args.retry_period_seconds < args.renew_deadline_seconds < args.lease_duration_seconds:
        raise UsageError("need --retry-period-seconds < --renew-deadline-seconds < --lease-duration-seconds, got "
                         f"{args.retry_period_seconds} < {args.renew_deadline_seconds} < "
                         f"{args.lease_duration_seconds}")
    if args.health_address and not _parse_address(args.health_address):
        raise UsageError(f"--health-address must be HOST:PORT, got {args.health_address!r}")


def _parse_address(text: str) -> tuple[str, int] | None:
    host, _, port = text.rpartition(":")
    return (host, int(port)) if host and port.isdigit() else None


def run(args: argparse.Namespace, stopping: threading.Event, api: kube.ApiClient | None = None) -> int:
    """Check, elect, reconcile until ``stopping`` is set or leadership is lost; the exit status.
    ``api`` replaces the client ``--kubeconfig`` describes (tests). Raises KubeConfigError."""
    identity = args.identity or f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    api = api or kube.load_api_client(args.kubeconfig)
    if problem := kube.check_crd(api):
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
    controller = Controller(client, recorder, resync_s=args.resync_seconds)
    health = _start_health(args, lambda: elector is None or not elector.is_leader or controller.healthy)
    try:
        return _lead(args, controller, elector, stopping, api)
    finally:
        if health is not None:
            health.shutdown()
            health.server_close()


def _lead(args: argparse.Namespace, controller: Controller, elector: LeaderElector | None,
          stopping: threading.Event, api: kube.ApiClient) -> int:
    try:
        if elector is not None and not elector.acquire(stopping):
            return 0
    except kube.KubeConfigError as error:
        log.error("%s", error)
        return 1
    namespace = args.namespace or None
    try:
        controller.start(kube.fastfunc_source(api, namespace), kube.fastpod_source(api, namespace),
                         kube.service_source(api, namespace), kube.pod_source(api, namespace))
    except TimeoutError as error:
        log.error("%s; are the FaSTFunc and FaSTPod CRDs installed and may this account list FaSTFuncs, FaSTPods, "
                  "Services and pods (deploy/function-controller/rbac.yaml)?", error)
        controller.stop()
        if elector is not None:
            elector.release()
        return 1
    kept = elector.hold(stopping) if elector is not None else stopping.wait()
    controller.stop()
    if elector is not None and kept:
        elector.release()
    return 0 if kept else 1


def _start_health(args: argparse.Namespace, check: Callable[[], bool]) -> ThreadingHTTPServer | None:
    """``/healthz`` and ``/readyz``: 200 while the process is sound (a standby is), else 503."""
    address = _parse_address(args.health_address) if args.health_address else None
    if address is None:
        return None

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            if self.path not in ("/healthz", "/readyz"):
                self.send_error(404)
                return
            ok = check()
            self.send_response(200 if ok else 503)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(b"ok\n" if ok else b"unhealthy\n")

        def log_message(self, format: str, *args: object) -> None:
            log.debug("health %s", format % args)

    server = ThreadingHTTPServer(address, Handler)
    threading.Thread(target=server.serve_forever, name="health", daemon=True).start()
    return server


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

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
