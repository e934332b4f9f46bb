"""``fastgshare-arbiter``: the arbiter alone, with shares from a file, for the demo, benchmarks and
``fastgshare run``.

In a cluster the node agent runs the arbiter with shares from the extender's assignments and
identifies peers by their cgroup. This entry point serves a table read from a file instead and,
with ``--trusted-env``, believes the pod name a hook sends; it is meant for one machine, never
for a shared node.

Shares file (JSON or YAML)::

    {"gpus": [{"uuid": "GPU-sim-0", "mps": true}],
     "pods": [{"pod": "demo/a", "gpu": "GPU-sim-0",
               "annotations": {"fastgshare/gpu_quota_request": "0.2", ...}}]}

Signals: SIGTERM and SIGINT stop it. **SIGHUP** reads the shares file again and serves it from
then on (:meth:`StaticShares.replace`, then :meth:`ArbiterServer.refresh_shares`, the path the
node agent's live share changes take): a new pod is known to the next HELLO, a registered pod's
changed share applies from the next decision, and connections stay as they are (a pod dropped
from the file keeps the connections it has, and new ones are refused). A file that cannot be
read, or whose ``gpus`` differ from those served (they are fixed at start), is logged and the
shares served so far stay. **SIGUSR1** writes the usage file at once.

Usage file (``--usage-file PATH``): each pod's use of the GPU as the arbiter's usage meter has it
(:mod:`fastgshare.usage`: the GPU time the hook reported per token, and the token waits), since the
pod first connected to this arbiter; rewritten whole (a reader sees the old file or the new one)
about once a second, on SIGUSR1 and when the arbiter stops::

    {"sequence": 12, "pid": 4242,
     "pods": [{"pod": "demo/a", "gpu": "GPU-sim-0", "usedSeconds": 1.5, "tokens": 310,
               "waitedSeconds": 2.9, "throttledSeconds": 2.8}]}

``sequence`` counts the writes; ``tokens`` the tokens granted; ``waitedSeconds`` the time the
pod's token requests waited for their grant, ``throttledSeconds`` the part of it the pod waited
for its own limit (it had used its limit in the window when it asked). A pod stays in the file
while it is in the shares file or the meter still holds its use.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import attrs

from device_plugin.arbiter.ratelimit import RepeatLimiter
from device_plugin.arbiter.runner import add_edge_arguments, add_timing_arguments, edge_options, timing_ns
from device_plugin.arbiter.server import ArbiterServer, GpuSettings, new_event_loop
from device_plugin.arbiter.shares import PodShare, StaticShares
from device_plugin.arbiter.state import StateFile
from fastgshare import __version__
from fastgshare.arbitration import TimeShare
from fastgshare.errors import InvalidShareSpec
from fastgshare.share import parse_share
from fastgshare.usage import PodUsage

log = logging.getLogger("device_plugin.arbiter")

USAGE_INTERVAL_S = 1.0


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


@attrs.frozen
class PodTotals:
    """One pod's counters: GPU time the hook reported, tokens granted, time waited for them, and the
    part of that wait the pod was at its own limit."""

    used_s: float = 0.0
    tokens: int = 0
    waited_s: float = 0.0
    throttled_s: float = 0.0

    @classmethod
    def of(cls, usage: PodUsage) -> PodTotals:
        return cls(usage.used_seconds_total, usage.wait_count, usage.wait_sum_seconds, usage.throttled_seconds_total)

    def __add__(self, other: PodTotals) -> PodTotals:
        return PodTotals(self.used_s + other.used_s, self.tokens + other.tokens, self.waited_s + other.waited_s,
                         self.throttled_s + other.throttled_s)

    def below(self, other: PodTotals) -> bool:
        """Whether any counter is lower than ``other``'s (the meter started the pod over)."""
        return (self.used_s < other.used_s or self.tokens < other.tokens or self.waited_s < other.waited_s
                or self.throttled_s < other.throttled_s)


@attrs.define
class _Tracked:
    base: PodTotals = PodTotals()  # what earlier lives of the pod in the meter counted
    last: PodTotals = PodTotals()  # what the meter counts in its current life
    missing: bool = False  # the meter forgot the pod: its next appearance starts over


class UsageTotals:
    """Each (GPU, pod)'s counters since it first connected. The usage meter forgets a pod once it has
    left and its last use has left the meter's window (10 s), and starts it over at zero when it comes
    back; fed every second, this notices (the pod was missing, or a counter went down) and adds on."""

    def __init__(self) -> None:
        self._pods: dict[tuple[str, str], _Tracked] = {}

    def update(self, pods: Iterable[PodUsage], known: Callable[[str], bool]) -> None:
        """Take a snapshot's pods; a pod in neither the snapshot nor the shares (``known``) is dropped."""
        seen = set()
        for usage in pods:
            key = (usage.gpu, usage.pod)
            seen.add(key)
            current = PodTotals.of(usage)
            tracked = self._pods.setdefault(key, _Tracked())
            if tracked.missing or current.below(tracked.last):
                tracked.base, tracked.missing = tracked.base + tracked.last, False
            tracked.last = current
        for key, tracked in list(self._pods.items()):
            if key not in seen:
                if known(key[1]):
                    tracked.missing = True
                else:
                    del self._pods[key]

    def totals(self) -> dict[tuple[str, str], PodTotals]:
        return {key: tracked.base + tracked.last for key, tracked in sorted(self._pods.items())}


def usage_document(totals: dict[tuple[str, str], PodTotals], sequence: int, pid: int) -> dict[str, object]:
    """The usage file's content (its format: the module's docs)."""
    return {"sequence": sequence, "pid": pid,
            "pods": [{"pod": pod, "gpu": gpu, "usedSeconds": round(counters.used_s, 6), "tokens": counters.tokens,
                      "waitedSeconds": round(counters.waited_s, 6),
                      "throttledSeconds": round(counters.throttled_s, 6)}
                     for (gpu, pod), counters in totals.items()]}


class UsageFile:
    """Writes the usage file from the server's meter (call :meth:`write` on the arbiter's loop)."""

    def __init__(self, path: Path, server: ArbiterServer, book: StaticShares) -> None:
        self.path = path
        self._server, self._book = server, book
        self._totals = UsageTotals()
        self._sequence = 0
        self._log = RepeatLimiter(log)

    def write(self) -> None:
        self._totals.update(self._server.usage().usage.pods, lambda pod: self._book.by_pod(pod) is not None)
        self._sequence += 1
        document = usage_document(self._totals.totals(), self._sequence, os.getpid())
        partial = self.path.with_name(self.path.name + ".partial")
        try:
            partial.write_text(json.dumps(document))
            os.replace(partial, self.path)
        except OSError as error:
            self._log.warning("cannot write the usage file %s: %s", self.path, error)

    async def keep_writing(self) -> None:
        while True:
            self.write()
            await asyncio.sleep(USAGE_INTERVAL_S)


class SharesReloader:
    """SIGHUP: the shares file again, served from then on through the node agent's path for live changes."""

    def __init__(self, path: Path, gpus: dict[str, GpuSettings], book: StaticShares, server: ArbiterServer) -> None:
        self._path, self._gpus, self._book, self._server = path, dict(gpus), book, server

    def reload(self) -> bool:
        """Whether the file was taken; if not, the reason is logged and the shares served so far stay."""
        try:
            gpus, pods = load_shares(self._path)
        except SharesFileError as error:
            log.error("%s; still serving the shares read before", error)
            return False
        if gpus != self._gpus:
            log.error("%s: its gpus (%s) differ from those served (%s), which are fixed when the arbiter starts; "
                      "still serving the shares read before", self._path, _describe(gpus), _describe(self._gpus))
            return False
        self._book.replace(pods)
        self._server.refresh_shares()
        log.info("shares reloaded from %s: %d pods", self._path, len(pods))
        return True


def _describe(gpus: dict[str, GpuSettings]) -> str:
    return ", ".join(f"{uuid} mps={settings.mps_enabled}" for uuid, settings in sorted(gpus.items()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastgshare-arbiter", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--socket", required=True, type=Path, help="unix socket to listen on")
    parser.add_argument("--shares", required=True, type=Path,
                        help="shares file (see the module docs); read again on SIGHUP")
    parser.add_argument("--trusted-env", action="store_true",
                        help="believe the pod name the hook sends (single-user machines only)")
    parser.add_argument("--state-file", type=Path, default=None,
                        help="keep the memory ledger here so a restarted arbiter knows what running processes "
                             "hold (default: not kept)")
    parser.add_argument("--usage-file", type=Path, default=None,
                        help="write each pod's GPU time and token waits here (JSON), about once a second, on "
                             "SIGUSR1 and at exit (default: not written)")
    add_timing_arguments(parser)
    add_edge_arguments(parser)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


async def serve(server: ArbiterServer, reloader: SharesReloader | None = None, usage: UsageFile | None = None) -> None:
    """Serve until SIGTERM or SIGINT. The other signals' handlers come before the socket listens, so a
    client that sees it listen may send them (their default would end the process)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reloader.reload if reloader is not None else _ignore)
    loop.add_signal_handler(signal.SIGUSR1, usage.write if usage is not None else _ignore)
    await server.start()
    writer = loop.create_task(usage.keep_writing()) if usage is not None else None
    print(f"arbiter ready socket={server.socket_path}", flush=True)
    await stop.wait()
    if writer is not None and usage is not None:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        usage.write()  # before the engine, and its meter, go
    await server.stop()


def _ignore() -> None:
    """A signal that asks for something this arbiter was not started to do."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        gpus, pods = load_shares(args.shares)
    except SharesFileError as error:
        log.error("%s", error)
        return 2
    book = StaticShares(pods)
    server = ArbiterServer(args.socket, gpus, book, trusted_env=args.trusted_env,
                           state=StateFile(args.state_file) if args.state_file else None,
                           **timing_ns(args), **edge_options(args))
    usage = UsageFile(args.usage_file, server, book) if args.usage_file is not None else None
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        runner.run(serve(server, SharesReloader(args.shares, gpus, book, server), usage))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
