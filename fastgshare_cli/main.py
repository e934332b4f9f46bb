"""Entry point of ``fastgshare``: argument parsing and the subcommands.

- ``fastgshare check PATH...``: validate every manifest (or workload list) in the files and
  directories and print each object's share, or every problem found (exit status 1 if any).
- ``fastgshare pack --gpu MODEL FILE...``: place a workload onto as few GPUs as the ledger
  allows and print the placement.
- ``fastgshare demo``: tenants sharing one simulated GPU under the real hook and arbiter.
- ``fastgshare cluster up | down | status``: the whole system on this machine.
- ``fastgshare fn deploy | list | invoke | delete``: functions through the gateway's OpenFaaS API.
- ``fastgshare plan``: pods per (quota, SM) configuration for a demand, from a profile.
- ``fastgshare profile run | show``: measure a function's profile under open-loop load, or print one.
- ``fastgshare run -- CMD``: any program under the hook and the arbiter with a GPU share, on a simulated or real GPU.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from rich.console import Console
from rich.table import Table

from fastgshare import __version__, keys
from fastgshare.errors import FastGShareError
from fastgshare.fleet import FleetPlacement, expand, pack_fleet
from fastgshare.gpu_models import KNOWN_MODELS, gpu_model_spec
from fastgshare.inventory import GPU_SPEC_HELP, GpuSpec
from fastgshare.packing import Rect
from fastgshare.placement import DEFAULT_POLICY, Policy, parse_policy
from fastgshare.quantity import format_bytes
from fastgshare.share import format_fraction
from fastgshare.workload import WorkloadItem, manifest_shares, parse_workload_list
from fastgshare_cli.check import run_check
from fastgshare_cli.cluster_command import add_parser as add_cluster_parser
from fastgshare_cli.cluster_command import cluster_main
from fastgshare_cli.demo import TENANT_HELP, demo_main
from fastgshare_cli.documents import DocumentError, load_documents
from fastgshare_cli.fn_command import add_parser as add_fn_parser
from fastgshare_cli.fn_command import fn_main
from fastgshare_cli.inspect_command import add_parser as add_inspect_parser
from fastgshare_cli.inspect_command import inspect_main
from fastgshare_cli.plan_command import add_parser as add_plan_parser
from fastgshare_cli.plan_command import run_plan
from fastgshare_cli.profile_command import add_parser as add_profile_parser
from fastgshare_cli.profile_command import profile_main
from fastgshare_cli.run_command import add_parser as add_run_parser
from fastgshare_cli.run_command import run_main

EXIT_OK, EXIT_INVALID = 0, 1
PIPE_WIDTH = 400
MAX_PACK_PODS = 100_000  # packing is quadratic in the pods per GPU: beyond this it would run for hours


def build_parser(prog: str = "fastgshare") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Spatio-temporal GPU sharing for Kubernetes: check shares, plan packing, inspect what pods get.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check", help="validate FaSTPod, Pod and workload manifests: the GPU share and the whole object",
        description="Print the parsed share of every FaSTPod, Pod or pod-template workload in the "
                    "files, or every problem with it: the share annotations, unknown fastgshare/ "
                    "annotations, what would make the share go unread (no vGPU limit, another "
                    "scheduler, a FaSTPod without spec.podSpec) and the Kubernetes schema. "
                    "Exit status 1 if any object is invalid.")
    check.add_argument("files", nargs="+", metavar="PATH",
                       help="YAML or JSON manifests or workload lists, directories (searched for .yaml, .yml "
                            "and .json files), or '-' for stdin")
    check.add_argument("-o", "--output", choices=["table", "json"], default="table",
                       help="output format (default: %(default)s)")
    check.add_argument("--no-webhook", action="store_true",
                       help="judge pods as on a cluster without fastgshare's admission webhook: a vGPU pod "
                            "naming the default scheduler (or another) is invalid rather than a note "
                            "that the webhook sets schedulerName: fastgshare-scheduler")

    pack = commands.add_parser(
        "pack", help="place a workload onto as few GPUs as possible",
        description="Place a workload on GPUs of one model with the scheduler's packing "
                    "(time x SM Maximal Rectangles plus memory) and print the placement. "
                    "FILE is a workload list ([{name, count, annotations}]) or manifests "
                    "(FaSTPods count spec.replicas).")
    pack.add_argument("files", nargs="+", metavar="FILE", help="workload list or manifests ('-' for stdin)")
    pack.add_argument("--gpu", required=True, metavar="MODEL",
                      help=f"GPU model ({', '.join(KNOWN_MODELS)}) or spec {GPU_SPEC_HELP}")
    pack.add_argument("--policy", default=DEFAULT_POLICY.value, choices=[p.value for p in Policy],
                      help="placement policy (default: %(default)s)")
    pack.add_argument("--slots-per-gpu", type=int, default=keys.DEFAULT_SLOTS_PER_GPU, metavar="N",
                      help="pods one GPU may hold (default: %(default)s)")
    pack.add_argument("-o", "--output", choices=["table", "json"], default="table",
                      help="output format (default: %(default)s)")

    demo = commands.add_parser(
        "demo", help="three tenants sharing one simulated GPU under the real hook and arbiter",
        description="Build the C hook and a fake GPU driver, start the arbiter, run tenants under the hook "
                    "and show configured versus achieved share of GPU time, live. Needs a checkout of "
                    "the project (it builds vgpu_hook/ and simgpu/) and gcc/make.")
    demo.add_argument("--seconds", type=float, default=15, help="how long the tenants run (default: %(default)s)")
    demo.add_argument("--tenant", action="append", metavar="SPEC", dest="tenants",
                      help=f"a tenant {TENANT_HELP}; repeat for more (default: three built-in tenants)")
    demo.add_argument("--plot", metavar="FILE", help="write a PNG of each tenant's share over time")
    add_plan_parser(commands)
    add_profile_parser(commands)
    add_inspect_parser(commands)
    add_cluster_parser(commands)
    add_fn_parser(commands)
    add_run_parser(commands)
    return parser


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl-fastgshare``: kubectl runs it for ``kubectl fastgshare ...``."""
    return main(argv, prog="kubectl fastgshare")


def main(argv: Sequence[str] | None = None, prog: str = "fastgshare") -> int:
    args = build_parser(prog).parse_args(argv)
    _interruptible()
    own_streams: dict[str, Callable[[argparse.Namespace], int]] = {"inspect": inspect_main, "fn": fn_main,
                                                                   "run": run_main}
    if args.command in own_streams:  # they write to sys.stdout and sys.stderr themselves
        return own_streams[args.command](args)
    console, errors = _console(), _console(stderr=True)
    if args.command == "check":
        return run_check(args.files, args.output, console, errors, webhook=not args.no_webhook)
    if args.command == "demo":
        return demo_main(args.tenants, args.seconds, args.plot, console, errors)
    if args.command == "cluster":
        return cluster_main(args, console, errors)
    if args.command in ("plan", "profile"):
        return (run_plan if args.command == "plan" else profile_main)(args, console, errors)
    return run_pack(args, console, errors)


def _interruptible() -> None:
    """Ctrl-C (SIGINT) stops a command cleanly, also when it was started with SIGINT ignored (as a
    shell without job control starts background commands): Python would then never raise
    KeyboardInterrupt, and ``demo``, ``inspect --watch`` and ``cluster up`` could not be stopped."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _console(*, stderr: bool = False) -> Console:
    """A console; one that is not a terminal (a pipe, a file) is wide, so tables never fold names."""
    console = Console(stderr=stderr, soft_wrap=True)
    if not console.is_terminal:
        console = Console(stderr=stderr, soft_wrap=True, width=max(console.width, PIPE_WIDTH))
    return console


def _table(*columns: str, title: str | None = None) -> Table:
    """A table that wraps long cells instead of cutting them off on narrow terminals."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


# --- pack --------------------------------------------------------------------------------
def run_pack(args: argparse.Namespace, console: Console, errors: Console) -> int:
    try:
        gpu = gpu_model_spec(args.gpu)
        policy = parse_policy(args.policy)
        if args.slots_per_gpu < 1:
            raise DocumentError(f"--slots-per-gpu must be >= 1, got {args.slots_per_gpu}")
        items = [item for path in args.files for item in _workload_items(path)]
        if (pods := sum(item.count for item in items)) > MAX_PACK_PODS:
            raise DocumentError(f"the workload has {pods} pods; pack places at most {MAX_PACK_PODS} (lower the "
                                "counts or replicas)")
    except (DocumentError, FastGShareError) as error:
        errors.print(f"fastgshare pack: {error}", markup=False, highlight=False)
        return EXIT_INVALID
    placement = pack_fleet(expand(items), gpu, slots_per_gpu=args.slots_per_gpu, policy=policy)
    if args.output == "json":
        console.print_json(json.dumps(_placement_json(placement, gpu, items)))
    else:
        _print_placement(console, placement, gpu, items)
    return EXIT_INVALID if placement.unplaced else EXIT_OK


def _workload_items(path: str) -> list[WorkloadItem]:
    documents = load_documents(path)
    if len(documents) == 1 and isinstance(documents[0], list):
        return list(parse_workload_list(documents[0]))
    items: list[WorkloadItem] = []
    problems: list[str] = []
    for doc in documents:
        for found in manifest_shares(doc):
            if found.error is not None:
                problems.append(f"{found.kind}/{found.name}: {found.error}")
            elif found.share is not None and found.replicas > 0:
                items.append(WorkloadItem(name=found.name, count=found.replicas, share=found.share))
    if problems:
        raise DocumentError(f"{path}: " + "; ".join(problems))
    if not items:
        raise DocumentError(f"{path}: no workload found (no objects with a GPU share)")
    return items


def _print_placement(console: Console, placement: FleetPlacement, gpu: GpuSpec,
                     items: Sequence[WorkloadItem]) -> None:
    table = _table("GPU", "pod", "time slot", "SM %", "memory", title=f"placement on {gpu.model}")
    for ledger in placement.gpus:
        for key in sorted(ledger.pods, key=lambda k: _slot_order(ledger.layout.get(k), k)):
            rect = ledger.layout.get(key)
            time = (f"{format_fraction(rect.x)}-{format_fraction(rect.right)}" if rect
                    else "best effort")
            sm = f"{rect.y}-{rect.top}" if rect else str(ledger.pods[key].sm_percent)
            table.add_row(str(ledger.gpu.index), key, time, sm, format_bytes(ledger.pods[key].memory_bytes))
        table.add_row("", "[b]GPU total[/b]", f"{ledger.area_fraction:.1%} of time x SM", "",
                      f"{format_bytes(ledger.used_memory)} / {format_bytes(ledger.gpu.memory_bytes)}",
                      end_section=True)
    console.print(table)
    pods = sum(item.count for item in items)
    placed = pods - len(placement.unplaced)
    if not placed:
        console.print(f"none of the {pods} pods fits an empty {gpu.model}", highlight=False)
    else:
        count = f"{placed} of {pods} pods" if placement.unplaced else f"{pods} pods"
        missing = len(placement.unplaced)
        unplaced = f"; {missing} fit{'s' if missing == 1 else ''} no GPU" if missing else ""
        console.print(f"{count} on {len(placement.gpus)} x {gpu.model} (one pod per GPU would need {placed})"
                      f"{unplaced}", highlight=False)
    for key, reason in placement.unplaced:
        console.print(f"[red]not placed[/red] {key}: {reason}", highlight=False)


def _slot_order(rect: Rect | None, key: str) -> tuple[int, int, str]:
    return (rect.x, rect.y, key) if rect else (keys.TIME_UNITS, 0, key)


def _placement_json(placement: FleetPlacement, gpu: GpuSpec,
                    items: Sequence[WorkloadItem]) -> dict[str, object]:
    return {
        "gpuModel": gpu.model,
        "gpuCount": len(placement.gpus),
        "podCount": sum(item.count for item in items),
        "gpus": [
            {
                "index": ledger.gpu.index,
                "areaFraction": round(ledger.area_fraction, 4),
                "memoryBytes": ledger.used_memory,
                "pods": [
                    {"name": key, "time": [rect.x, rect.right], "sm": [rect.y, rect.top]}
                    if (rect := ledger.layout.get(key)) else {"name": key, "bestEffort": True}
                    for key in sorted(ledger.pods)
                ],
            }
            for ledger in placement.gpus
        ],
        "unplaced": [{"name": key, "reason": reason} for key, reason in placement.unplaced],
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
