"""How a controller runs: its caches filled before any worker starts, and only while it leads.

- :class:`Workers`: start-sync-work. :meth:`Workers.start` starts every reflector, waits until each
  has listed once (a :class:`TimeoutError` names the cache that did not fill; its reflector's log says
  why), then starts the worker threads and the periodic loops (:meth:`Workers.every`);
  :meth:`Workers.stop` shuts the work queue, lets what is in flight finish (up to a grace period)
  and stops the watches; :attr:`Workers.alive` is the liveness the health check reports.
- :func:`run_elected`: the leader-elected run loop of a controller's process: wait for the Lease
  (unless leader election is off), start, hold the Lease until asked to stop (exit status 0, the
  Lease released) or until it is lost (1: stop reconciling at once, so the Deployment restarts this
  replica as a standby). A Lease namespace that does not exist, or caches that do not fill, is one
  line and status 1.

Both controllers (FaSTPods, FaSTFuncs) run on these; their ``reconcile`` and their handlers are theirs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from fastgshare_kube.errors import KubeConfigError
from fastgshare_kube.leader import LeaderElector
from fastgshare_kube.reflector import Reflector
from fastgshare_kube.workqueue import WorkQueue

log = logging.getLogger(__name__)

SYNC_TIMEOUT_S = 120.0


class Workers:
    """A controller's reflectors and threads; see the module docstring."""

    def __init__(self, queue: WorkQueue, *, sync_timeout_s: float = SYNC_TIMEOUT_S) -> None:
        self._queue = queue
        self._sync_timeout_s = sync_timeout_s
        self._reflectors: list[Reflector] = []
        self._threads: list[threading.Thread] = []
        self.stopping = threading.Event()

    def start(self, reflectors: Sequence[Reflector], threads: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """Start ``reflectors``, wait until each filled its store, then start ``threads`` (name, target)."""
        self._reflectors = list(reflectors)
        for reflector in self._reflectors:
            reflector.start()
        for reflector in self._reflectors:
            if not reflector.wait_synced(self._sync_timeout_s):
                raise TimeoutError(f"the {reflector.name} cache did not fill within {self._sync_timeout_s:.0f}s")
        self._threads = [threading.Thread(target=target, name=name, daemon=True) for name, target in threads]
        for thread in self._threads:
            thread.start()

    def every(self, period_s: float, action: Callable[[], None]) -> Callable[[], None]:
        """A thread's target that runs ``action`` every ``period_s`` until :meth:`stop`."""
        def loop() -> None:
            while not self.stopping.wait(period_s):
                action()
        return loop

    def stop(self, grace_s: float) -> None:
        """Stop taking keys, let what is in flight finish (all threads within ``grace_s``), stop the watches."""
        self.stopping.set()
        self._queue.shut_down()
        deadline = time.monotonic() + grace_s
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        for reflector in self._reflectors:
            reflector.stop()

    @property
    def alive(self) -> bool:
        """Every watch and every thread still running."""
        return all(reflector.alive for reflector in self._reflectors) and all(t.is_alive() for t in self._threads)


def run_elected(elector: LeaderElector | None, stopping: threading.Event, *, start: Callable[[], None],
                stop: Callable[[], None], not_filled_hint: str,
                started: Callable[[], None] | None = None) -> int:
    """Lead (or run alone when ``elector`` is None) until ``stopping`` is set or the Lease is lost;
    the exit status. ``start`` raises TimeoutError when the caches do not fill: logged with
    ``not_filled_hint`` (what to check). ``started`` runs once the controller runs."""
    try:
        if elector is not None and not elector.acquire(stopping):
            return 0
    except KubeConfigError as error:
        log.error("%s", error)
        return 1
    try:
        start()
    except TimeoutError as error:
        log.error("%s; %s", error, not_filled_hint)
        stop()
        if elector is not None:
            elector.release()
        return 1
    if started is not None:
        started()
    kept = elector.hold(stopping) if elector is not None else stopping.wait()
    stop()
    if elector is not None and kept:
        elector.release()
    return 0 if kept else 1
