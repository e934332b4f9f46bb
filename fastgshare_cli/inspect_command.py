"""``fastgshare inspect`` (also ``kubectl fastgshare inspect``): every node → GPU → pod, configured
share next to achieved, read through the API server; ``--watch`` refreshes it."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TextIO

from fastgshare import keys
from fastgshare_cli.cluster_reader import MetricsCredentials, ReadError, read_cluster
from fastgshare_cli.inspection import NodeView, build_view, render_table, to_json
from fastgshare_kube import rest
from fastgshare_kube.client import KubeConfigError, load_api_client

CLEAR_SCREEN = "\x1b[H\x1b[2J"


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = commands.add_parser(
        "inspect", help="what every GPU pod was promised next to what it gets, node by node",
        description="List every GPU node, its GPUs (how busy, what area of time x SMs and memory the scheduler "
                    "has free) and their pods (request, limit, SMs and memory next to the share of GPU time "
                    "and the memory each used over the last 10 s), read through the API server: the nodes' "
                    "and pods' annotations and the node agents' /metrics via the pod or node proxy. Needs "
                    "get/list on nodes and pods, get on pods/proxy (or nodes/proxy), and for the achieved shares "
                    "a kubeconfig token allowed get on /metrics, or create on serviceaccounts/token for "
                    f"{keys.SYSTEM_NAMESPACE}/{keys.METRICS_READER_SERVICE_ACCOUNT}.")
    parser.add_argument("-o", "--output", choices=["table", "wide", "json"], default="table",
                        help="table, wide (adds phase, throttling, mean token wait) or json (default: %(default)s)")
    parser.add_argument("-w", "--watch", action="store_true", help="refresh until interrupted")
    parser.add_argument("--interval", type=float, default=2.0, metavar="SECONDS",
                        help="seconds between refreshes with --watch (default: %(default)s)")
    parser.add_argument("--node", help="only this node")
    parser.add_argument("-n", "--namespace", help="only pods of this namespace (free areas still count every pod)")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)")


def inspect_main(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr,
                 stop: threading.Event | None = None) -> int:
    """Print the view once, or every ``--interval`` seconds with ``--watch`` until ``stop`` or Ctrl-C."""
    if not args.interval > 0:
        err.write(f"fastgshare inspect: --interval must be > 0 seconds, got {args.interval}\n")
        return 2
    try:
        api = load_api_client(args.kubeconfig)
    except KubeConfigError as error:
        err.write(f"fastgshare inspect: {error}\n")
        return 1
    render = _renderer(args.output, qualify=args.namespace is None)
    try:
        with api:
            credentials = MetricsCredentials(api)
            return _loop(lambda: render(_view(api, args, credentials)), args, out, err, stop or threading.Event())
    except KeyboardInterrupt:
        return 0 if args.watch else 130


def _loop(show: Callable[[], str], args: argparse.Namespace, out: TextIO, err: TextIO,
          stop: threading.Event) -> int:
    while True:
        try:
            text = show()
        except ReadError as error:
            err.write(f"fastgshare inspect: {error}\n")
            if not args.watch:
                return 1
        else:
            if args.watch and args.output != "json":
                prefix = CLEAR_SCREEN if out.isatty() else ""
                text = f"{prefix}Every {args.interval:g}s: fastgshare inspect   {time.strftime('%H:%M:%S')}\n\n{text}"
            out.write(text)
            out.flush()
        if not args.watch or stop.wait(args.interval):
            return 0


def _view(api: rest.ApiClient, args: argparse.Namespace, credentials: MetricsCredentials) -> list[NodeView]:
    facts = read_cluster(api, node=args.node, credentials=credentials)
    return build_view(facts.nodes, facts.pods, facts.samples, namespace=args.namespace)


def _renderer(output: str, *, qualify: bool) -> Callable[[list[NodeView]], str]:
    if output == "json":
        return lambda view: json.dumps(to_json(view)) + "\n"
    wide = output == "wide"
    return lambda view: render_table(view, wide=wide, qualify=qualify)
