"""``fastgshare-arbiter``: the arbiter alone, with shares from a file, for the demo and benchmarks.

In a cluster the node agent runs the arbiter with shares from the extender's assignments and
identifies peers by their cgroup. This entry point serves a fixed table instead and, with
``--trusted-env``, believes the pod name a hook sends; it is meant for one machine, never for
a shared node.

Shares file (JSON or YAML)::

    {"gpus": [{"uuid": "GPU-sim-0", "mps": true}],
     "pods": [{"pod": "demo/a", "gpu": "GPU-sim-0",
               "annotations": {"fastgshare/gpu_quota_request": "0.2", ...}}]}
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from device_plugin.arbiter.runner import add_edge_arguments, add_timing_arguments, edge_options, timing_ns
from device_plugin.arbiter.server import ArbiterServer, GpuSettings, new_event_loop
from device_plugin.arbiter.shares import PodShare, StaticShares
from device_plugin.arbiter.state import StateFile
from fastgshare import __version__
from fastgshare.arbitration import TimeShare
from fastgshare.errors import InvalidShareSpec
from fastgshare.share import parse_share

log = logging.getLogger("device_plugin.arbiter")


class SharesFileError(Exception):
    """The shares file is unreadable or malformed; the message names the entry."""


def load_shares(path: Path) -> tuple[dict[str, GpuSettings], dict[str, PodShare]]:
    try:
        text = path.read_text()
        # JSON needs nothing but the standard library (the GPU benchmark machine has no PyYAML).
        data = json.loads(text) if path.suffix == ".json" else _load_yaml(text)
    except (OSError, ValueError) as error:
        raise SharesFileError(f"{path}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("gpus"), list) or not isinstance(data.get("pods"), list):
        raise SharesFileError(f"{path}: expected a mapping with 'gpus' and 'pods' lists")
    gpus = {}
    for entry in data["gpus"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("uuid"), str):
            raise SharesFileError(f"{path}: every gpus entry needs a 'uuid' string, got {entry!r}")
        gpus[entry["uuid"]] = GpuSettings(mps_enabled=bool(entry.get("mps", True)))
    pods = {}
    for entry in data["pods"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("pod"), str) or entry.get("gpu") not in gpus:
            raise SharesFileError(f"{path}: pods entry {entry!r} needs 'pod' and a 'gpu' listed under gpus")
        try:
            share = parse_share(entry.get("annotations") or {})
        except InvalidShareSpec as error:
            raise SharesFileError(f"{path}: pod {entry['pod']}: {error}") from None
        pods[entry["pod"]] = PodShare(entry["gpu"], TimeShare(share.request_permille, share.limit_permille,
                                                              share.sm_percent), share.memory_bytes)
    return gpus, pods


def _load_yaml(text: str) -> object:
    import yaml  # noqa: PLC0415 - optional here: JSON shares files need no YAML parser

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ValueError(str(error)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastgshare-arbiter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--socket", required=True, type=Path, help="unix socket to listen on")
    parser.add_argument("--shares", required=True, type=Path, help="shares file (see the module docs)")
    parser.add_argument("--trusted-env", action="store_true",
                        help="believe the pod name the hook sends (single-user machines only)")
    parser.add_argument("--state-file", type=Path, default=None,
                        help="keep the memory ledger here so a restarted arbiter knows what running processes "
                             "hold (default: not kept)")
    add_timing_arguments(parser)
    add_edge_arguments(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


async def serve(server: ArbiterServer) -> None:
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"arbiter ready socket={server.socket_path}", flush=True)
    await stop.wait()
    await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        gpus, pods = load_shares(args.shares)
    except SharesFileError as error:
        log.error("%s", error)
        return 2
    server = ArbiterServer(args.socket, gpus, StaticShares(pods), trusted_env=args.trusted_env,
                           state=StateFile(args.state_file) if args.state_file else None,
                           **timing_ns(args), **edge_options(args))
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(serve(server))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
