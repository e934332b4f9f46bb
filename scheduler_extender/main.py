"""``fastgshare-extender``: flags, wiring and signal handling (the composition root).

Everything is created here and passed in; no module keeps global state.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from fastgshare import __version__, keys
from fastgshare.assignment_signature import (
    ALLOW_UNSIGNED_FLAG,
    KEY_FILE_FLAG,
    AssignmentKeyError,
    AssignmentTrust,
    trust_from_flags,
)
from fastgshare.placement import DEFAULT_POLICY, Policy
from fastgshare_kube.events import EventRecorder
from fastgshare_kube.health import HealthServer
from fastgshare_kube.process import ListenAddressError, parse_listen, stop_on_signals
from scheduler_extender.config import (
    DEFAULT_BIND_WAIT_S,
    DEFAULT_BIND_WINDOW,
    DEFAULT_FILTER_PASSES,
    DEFAULT_LISTEN,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_SYSTEM_WRITERS,
    FILTER_PASSES,
    ConfigError,
    ExtenderConfig,
    parse_system_writers,
)
from scheduler_extender.http.apps import create_app, status_server
from scheduler_extender.http.guarded import HttpServer
from scheduler_extender.http.threaded import ThreadedHttpServer
from scheduler_extender.http.tls import ReloadingContext, TlsConfigError
from scheduler_extender.http.webhook import create_webhook_app
from scheduler_extender.kube import ClusterWatch, KubeApi, KubeConfigError, kubernetes_metrics_access, load_api_client
from scheduler_extender.services import build_services
from scheduler_extender.share_changes import ShareChanges
from scheduler_extender.state import ClusterState

log = logging.getLogger("scheduler_extender")

GIL_SWITCH_INTERVAL_S = 0.0005
# 32 binds at once (each on a scheduler connection of its own) and the two watches; the client opens
# (and does not keep) more connections when more binds write at once.
API_CONNECTIONS = 34
EVENT_COMPONENT = "fastgshare-extender"  # the source of the events on pods (live share changes)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastgshare-extender",
        description=f"The fastgshare kube-scheduler extender. The scheduler profile {keys.SCHEDULER_NAME} calls it "
                    f"(POST /filter, /prioritize, /bind) for pods requesting {keys.VGPU_RESOURCE}; it places each pod "
                    "on a GPU by its time, SM and memory share. Also serves /healthz, /readyz (ready once its cache "
                    "has synced), /metrics (Prometheus) and /inspect (JSON: every GPU's pods and free share; "
                    "?node=NAME for one node).")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help="address to serve on; an empty HOST means all addresses (default: %(default)s)")
    parser.add_argument("--metrics-listen", default="", metavar="HOST:PORT",
                        help="also serve only GET /healthz, /readyz and /metrics here (plain HTTP), for probes and "
                             "Prometheus when --listen is a loopback address (default: not served separately)")
    parser.add_argument("--metrics-auth", choices=keys.METRICS_AUTH_CHOICES, default=keys.METRICS_AUTH_KUBERNETES,
                        help="who may read /metrics on --metrics-listen: 'kubernetes' (default) a bearer token the API "
                             "server authenticates and allows get on the non-resource URL /metrics; 'none' anyone "
                             "who reaches the port (development only). /healthz and /readyz stay open")
    parser.add_argument("--webhook-listen", default="", metavar="HOST:PORT",
                        help="also serve the validating admission webhook (POST /validate: FaSTPods and pods with "
                             "fastgshare/ annotations, the messages of fastgshare check; the system annotations of "
                             "pods and nodes only from --system-writers) and the mutating one (POST /mutate: sets "
                             "schedulerName on vGPU pods naming the default scheduler) over TLS here; needs "
                             "--webhook-cert and --webhook-key (default: no webhook)")
    parser.add_argument("--webhook-cert", metavar="FILE", help="the webhook's TLS certificate (PEM); reloaded when "
                                                               "the file changes")
    parser.add_argument("--webhook-key", metavar="FILE", help="the webhook's TLS private key (PEM)")
    parser.add_argument("--system-writers", default=",".join(DEFAULT_SYSTEM_WRITERS), metavar="NAMES",
                        help=f"comma-separated user names (as the API server authenticates them) that may set, "
                             f"change or remove fastgshare's system annotations "
                             f"({', '.join((*keys.SYSTEM_POD_ANNOTATIONS, *keys.SYSTEM_NODE_ANNOTATIONS))}); the "
                             "webhook refuses anyone else, cluster admins included (default: %(default)s)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config, else ~/.kube/config)")
    parser.add_argument("--policy", default=DEFAULT_POLICY.value, choices=[p.value for p in Policy],
                        help=f"placement policy; a pod may override it with the annotation "
                             f"{keys.SCHEDULING_POLICY_ANNOTATION} (default: %(default)s)")
    parser.add_argument("--bind-wait-seconds", type=float, default=DEFAULT_BIND_WAIT_S, metavar="SECONDS",
                        help="a bind to a node with --bind-window pods waiting for its node agent (bound, not "
                             "allocated yet) waits up to this long for one of them, then proceeds; 0: binds never "
                             "wait. Keep it well below the scheduler's httpTimeout (default: %(default)s)")
    parser.add_argument("--bind-window", type=int, default=DEFAULT_BIND_WINDOW, metavar="PODS",
                        help="how many pods of one node may wait for its node agent at once before further binds "
                             "to it wait their turn; this keeps a node whose agent or kubelet is restarting from "
                             "taking pods kubelet would refuse. 1: one pod at a time (default: %(default)s)")
    parser.add_argument("--filter-passes", default=DEFAULT_FILTER_PASSES, choices=FILTER_PASSES,
                        help="best: of the nodes where the pod fits, only those the policy scores highest pass "
                             "filter, so the scheduler is left with one node in most cases and binds it without "
                             "scoring; fitting: every node where it fits passes and prioritize ranks them, weighed "
                             "against the scheduler's own score plugins (default: %(default)s)")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, metavar="BYTES",
                        help="larger request bodies are refused with 413 (default: %(default)s)")
    parser.add_argument(KEY_FILE_FLAG, metavar="PATH",
                        help="the key assignments are signed with (Secret fastgshare-assignment-key); required "
                             f"unless {ALLOW_UNSIGNED_FLAG}")
    parser.add_argument(ALLOW_UNSIGNED_FLAG, action="store_true",
                        help="run without a key: assignments are written unsigned and any readable one counts "
                             "(development only: anyone who may patch a pod can then claim GPU room)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def _settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[ExtenderConfig, str, int]:
    try:
        config = ExtenderConfig(policy=Policy(args.policy), bind_wait_s=args.bind_wait_seconds,
                                bind_window=args.bind_window, filter_passes=args.filter_passes,
                                max_body_bytes=args.max_body_bytes,
                                system_writers=parse_system_writers(args.system_writers))
        host, port = parse_listen(args.listen, "--listen", example="127.0.0.1:8888")
    except (ConfigError, ListenAddressError) as error:
        parser.error(str(error))
    return config, host, port


WebhookFactory = Callable[[KubeApi], HttpServer]


def _webhook(parser: argparse.ArgumentParser, args: argparse.Namespace,
             config: ExtenderConfig) -> WebhookFactory | None:
    """What makes the webhook's TLS server (not started) once the API is at hand (it reads a node's
    stored annotations, see :mod:`scheduler_extender.admission`), or None without --webhook-listen.
    The flags and the certificate are checked now."""
    if not args.webhook_listen:
        if args.webhook_cert or args.webhook_key:
            parser.error("--webhook-cert and --webhook-key need --webhook-listen HOST:PORT")
        return None
    if not (args.webhook_cert and args.webhook_key):
        parser.error("--webhook-listen needs --webhook-cert FILE and --webhook-key FILE (PEM)")
    try:
        host, port = parse_listen(args.webhook_listen, "--webhook-listen", example="0.0.0.0:8443")
        tls = ReloadingContext(args.webhook_cert, args.webhook_key)
    except (ListenAddressError, TlsConfigError) as error:
        parser.error(str(error))

    def make(kube: KubeApi) -> HttpServer:
        app = create_webhook_app(config.system_writers, stored_node=kube.read_node)
        return HttpServer(app, host, port, ssl_context=tls.context, name="extender-webhook")

    return make


def run(config: ExtenderConfig, host: str, port: int, kubeconfig: str | None, *, trust: AssignmentTrust,
        webhook: WebhookFactory | None = None, metrics_at: tuple[str, int] | None = None,
        metrics_auth: str = keys.METRICS_AUTH_KUBERNETES) -> None:
    """Serve until SIGTERM or SIGINT, then stop the servers and the watches."""
    api = load_api_client(kubeconfig, connections=API_CONNECTIONS)
    state = ClusterState(bind_wait_s=config.bind_wait_s, bind_window=config.bind_window, trust=trust)
    kube = KubeApi(api)
    services = build_services(config, state, kube)
    changes = ShareChanges(state, kube, EventRecorder(kube, component=EVENT_COMPONENT, instance=socket.gethostname(),
                                                      api_version="v1", kind="Pod"))
    server = ThreadedHttpServer(create_app(services), host, port)
    extra: list[HttpServer | HealthServer] = []
    try:
        if webhook is not None:
            extra.append(webhook(kube))
        if metrics_at is not None:
            access = kubernetes_metrics_access(api) if metrics_auth != keys.METRICS_AUTH_NONE else None
            extra.append(status_server(services, *metrics_at, access=access))
    except OSError:
        server.stop()
        for started in extra:
            started.stop()
        raise
    watch = ClusterWatch(api, state, follower=changes)
    stopping = threading.Event()

    restore_signals = stop_on_signals(stopping.set, logger=log)
    switch_interval = sys.getswitchinterval()
    # Filter and prioritize are latency-bound and the scheduler calls them one pod at a time,
    # while binds and the watches keep other threads busy: with Python's default 5 ms switch
    # interval a request can wait that long for the GIL several times over.
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    try:
        changes.start()
        watch.start()
        server.start()
        log.info("extender listening address=%s:%d policy=%s bind_wait_s=%s bind_window=%d filter_passes=%s",
                 server.host, server.port, config.policy.value, config.bind_wait_s, config.bind_window,
                 config.filter_passes)
        for other in extra:
            other.start()
            log.info("%s listening address=%s:%d", "admission webhook (TLS)" if other is webhook else
                     "status endpoints", other.host, other.port)
        stopping.wait()
    finally:
        for other in extra:
            other.stop()
        server.stop()
        watch.stop()
        changes.stop()
        restore_signals()
        sys.setswitchinterval(switch_interval)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    config, host, port = _settings(parser, args)
    try:
        trust = trust_from_flags(args.assignment_key_file, args.allow_unsigned_assignments,
                                 lambda path: Path(path).read_bytes())
    except AssignmentKeyError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)  # one line, no usage: the flags parsed
        return 2
    if not trust.signing:
        log.warning("%s: assignments are neither signed nor checked (development only)", ALLOW_UNSIGNED_FLAG)
    metrics_at = None
    if args.metrics_listen:
        try:
            metrics_at = parse_listen(args.metrics_listen, "--metrics-listen", example="0.0.0.0:8889")
        except ListenAddressError as error:
            parser.error(str(error))
    webhook = _webhook(parser, args, config)
    try:
        run(config, host, port, args.kubeconfig, trust=trust, webhook=webhook, metrics_at=metrics_at,
            metrics_auth=args.metrics_auth)
    except KubeConfigError as error:
        log.error("%s", error)
        return 1
    except OSError as error:
        log.error("cannot serve on %s: %s", " and ".join(filter(None, (args.listen, args.webhook_listen,
                                                                        args.metrics_listen))), error)
        return 1
    log.info("extender stopped")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
