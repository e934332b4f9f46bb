"""Running the arbiter: its timing flags (shared by the node agent and ``fastgshare-arbiter``),
and inside the node agent its own asyncio loop on a thread.

Shares come from the pod cache; whenever the cache changes, registered pods' shares are
re-read so quota changes reach running pods without a restart.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Protocol, TypedDict

from device_plugin.arbiter.server import (
    DEFAULT_HELLO_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS_PER_POD,
    ArbiterServer,
    ArbiterUsage,
    new_event_loop,
)
from fastgshare.arbitration import DEFAULT_MIN_TOKEN_NS, DEFAULT_WINDOW_NS

log = logging.getLogger(__name__)


def add_timing_arguments(parser: argparse.ArgumentParser) -> None:
    """``--window-ms`` and ``--min-token-ms``; read them back with :func:`timing_ns`."""
    parser.add_argument("--window-ms", type=float, default=DEFAULT_WINDOW_NS / 1e6,
                        help="the arbiter's scheduling window (default: %(default)s)")
    parser.add_argument("--min-token-ms", type=float, default=DEFAULT_MIN_TOKEN_NS / 1e6,
                        help="the arbiter's shortest token, so a round trip never dominates (default: %(default)s)")


class Timing(TypedDict):
    window_ns: int
    min_token_ns: int


def timing_ns(args: argparse.Namespace) -> Timing:
    """The ``window_ns`` and ``min_token_ns`` keyword arguments of :class:`ArbiterServer`."""
    return Timing(window_ns=int(args.window_ms * 1e6), min_token_ns=int(args.min_token_ms * 1e6))


def add_edge_arguments(parser: argparse.ArgumentParser) -> None:
    """Connection limits; read them back with :func:`edge_options`."""
    parser.add_argument("--max-connections-per-pod", type=int, default=DEFAULT_MAX_CONNECTIONS_PER_POD,
                        help="connections one pod (by its cgroup; one process outside pods) may hold open to the "
                             "arbiter; a hooked process uses two (default: %(default)s)")
    parser.add_argument("--hello-timeout-seconds", type=float, default=DEFAULT_HELLO_TIMEOUT_S,
                        help="close a connection that has not said HELLO within this long (default: %(default)s)")


class EdgeOptions(TypedDict):
    max_connections_per_pod: int
    hello_timeout_s: float


def edge_options(args: argparse.Namespace) -> EdgeOptions:
    """The matching keyword arguments of :class:`ArbiterServer`."""
    return EdgeOptions(max_connections_per_pod=args.max_connections_per_pod,
                       hello_timeout_s=args.hello_timeout_seconds)


class ChangeSource(Protocol):
    def snapshot(self) -> tuple[int, Sequence[object]]: ...

    def wait_for_change(self, seen_version: int, timeout_s: float) -> bool: ...


class ArbiterThread:
    def __init__(self, server: ArbiterServer, changes: ChangeSource | None = None) -> None:
        self.server = server
        self._changes = changes
        self._loop = new_event_loop()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._threads = [threading.Thread(target=self._serve, name="arbiter", daemon=True),
                         threading.Thread(target=self._follow_changes, name="arbiter-shares", daemon=True)]

    def start(self, timeout_s: float = 10) -> None:
        """Start serving (and following share changes, if the source was given); raises if the socket
        could not be opened."""
        self._threads[0].start()
        self._ready.wait(timeout_s)
        if self._failure is not None:
            raise self._failure
        if self._changes is not None:
            self._threads[1].start()

    def follow(self, changes: ChangeSource) -> None:
        """Re-read registered pods' shares whenever ``changes`` changes (the agent's pod cache, once it
        has one: the arbiter starts before it)."""
        self._changes = changes
        self._threads[1].start()
        self._loop.call_soon_threadsafe(self.server.refresh_shares)

    def usage(self, timeout_s: float = 2.0) -> ArbiterUsage:
        """The arbiter's usage snapshot, taken on its own loop (any thread may call this)."""
        async def take() -> ArbiterUsage:
            return self.server.usage()

        return asyncio.run_coroutine_threadsafe(take(), self._loop).result(timeout_s)

    def set_mps(self, gpu_uuid: str, enabled: bool) -> None:
        """The GPU's MPS started or stopped (:meth:`ArbiterServer.set_mps`, on the arbiter's loop)."""
        self._loop.call_soon_threadsafe(self.server.set_mps, gpu_uuid, enabled)

    def stop(self) -> None:
        self._stop.set()
        if self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        for thread in self._threads:
            if thread.is_alive():
                thread.join(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self.server.start())
        except OSError as error:
            self._failure = error
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()

    def _follow_changes(self) -> None:
        changes = self._changes
        assert changes is not None
        version, _ = changes.snapshot()
        while not self._stop.is_set():
            if changes.wait_for_change(version, timeout_s=1.0):
                version, _ = changes.snapshot()
                self._loop.call_soon_threadsafe(self.server.refresh_shares)
