"""Leader election with a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection.

Several replicas of the controller may run; only the holder of the Lease reconciles. A
candidate takes the Lease when it does not exist, when its holder is empty (released), or when
the holder has not renewed it for ``lease_duration_s``, judged by this process's own clock
from the moment it *observed* the last change, so clock skew between machines does not matter.
Every write carries the resourceVersion it read, so two candidates never both win (the loser
gets 409 Conflict). The leader renews every ``retry_period_s``; if it cannot renew for
``renew_deadline_s`` it has lost the Lease and must stop reconciling at once. On a clean stop
it releases the Lease (empty holder), so a standby takes over without waiting out the duration.

Why not the official client's ``kubernetes.leaderelection`` (see docs/architecture.md): its
``LeaseLock`` builds its API from the global default configuration (not the ``--kubeconfig``
client), its loops cannot be stopped, it never releases the Lease on a clean stop, it judges expiry
by the wall clock, and a missing namespace is one more failed attempt, retried forever.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from fastgshare_kube.errors import ApiError, KubeConfigError

log = logging.getLogger(__name__)


class LeasePort(Protocol):
    """A ``coordination.k8s.io/v1`` Lease, read and written as a dict."""

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The lease, or ``None`` if there is none."""
        ...

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]: ...

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Replace the lease; 409 Conflict if its resourceVersion is stale."""
        ...


def micro_time(seconds: float) -> str:
    """A Lease time (``MicroTime``): ``2026-01-31T12:00:00.123456Z``."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for the Lease ``namespace/name``."""

    def __init__(self, leases: LeasePort, namespace: str, name: str, identity: str, *,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0, retry_period_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic, wall_clock: Callable[[], float] = time.time) -> None:
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("need retry period < renew deadline < lease duration, got "
                             f"{retry_period_s} < {renew_deadline_s} < {lease_duration_s}")
        self._leases = leases
        self.namespace, self.name, self.identity = namespace, name, identity
        self._duration_s = lease_duration_s
        self._renew_deadline_s = renew_deadline_s
        self._retry_s = retry_period_s
        self._clock = clock
        self._wall = wall_clock
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last read
        self._observed_at = 0.0
        self.is_leader = False

    def acquire(self, stop: threading.Event) -> bool:
        """Block until this candidate holds the Lease (True) or ``stop`` is set (False)."""
        log.info("waiting for leadership lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
        while not stop.is_set():
            if self.try_acquire_or_renew():
                log.info("became leader lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
                return True
            stop.wait(self._retry_s * random.uniform(1.0, 1.2))  # jitter, as client-go
        return False

    def hold(self, stop: threading.Event) -> bool:
        """Renew until ``stop`` is set (True) or the Lease is lost (False)."""
        last_renewed = self._clock()
        while not stop.wait(self._retry_s):
            if self.try_acquire_or_renew():
                last_renewed = self._clock()
            elif not self.is_leader or self._clock() - last_renewed > self._renew_deadline_s:
                self.is_leader = False
                log.error("lost leadership lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
                return False
        return True

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True if this candidate holds the Lease afterwards. Raises
        :class:`KubeConfigError` if the Lease's namespace does not exist: waiting cannot help."""
        now = self._wall()
        try:
            lease = self._leases.get_lease(self.namespace, self.name)
            if lease is None:
                self._create(now)
                return True
            if not self._may_take(lease.get("spec") or {}):
                self.is_leader = False
                return False
            self._leases.replace_lease(self.namespace, self.name, self._lease(lease, now))
        except ApiError as error:
            level = logging.DEBUG if error.conflict else logging.WARNING
            log.log(level, "lease=%s/%s attempt failed: %s", self.namespace, self.name, error)
            return False
        self.is_leader = True
        return True

    def _create(self, now: float) -> None:
        try:
            self._leases.create_lease(self.namespace, self._lease(None, now))
        except ApiError as error:
            if error.not_found:  # creating in a namespace that is not there
                raise KubeConfigError(f"the leader-election namespace {self.namespace!r} does not exist; create it, "
                                  "pass --lease-namespace NAMESPACE, or --no-leader-elect for a single replica"
                                  ) from None
            raise
        self.is_leader = True

    def release(self) -> None:
        """Give the Lease up (empty holder), if held; errors are logged."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = self._leases.get_lease(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            body = {**lease, "spec": {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1,
                                      "renewTime": micro_time(self._wall())}}
            self._leases.replace_lease(self.namespace, self.name, body)
            log.info("released leadership lease=%s/%s identity=%s", self.namespace, self.name, self.identity)
        except ApiError as error:
            log.warning("cannot release lease=%s/%s: %s", self.namespace, self.name, error)

    def _may_take(self, spec: Mapping[str, Any]) -> bool:
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed, self._observed_at = record, self._clock()
        if holder in ("", self.identity):
            return True
        duration = float(spec.get("leaseDurationSeconds") or self._duration_s)
        return self._clock() - self._observed_at > duration

    def _lease(self, current: Mapping[str, Any] | None, now: float) -> dict[str, Any]:
        spec = dict((current or {}).get("spec") or {})
        ours = spec.get("holderIdentity") == self.identity
        spec.update({
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self._duration_s),
            "renewTime": micro_time(now),
            "acquireTime": spec.get("acquireTime") if ours and spec.get("acquireTime") else micro_time(now),
            "leaseTransitions": int(spec.get("leaseTransitions") or 0) + (0 if ours or current is None else 1),
        })
        metadata = dict((current or {}).get("metadata") or {"name": self.name, "namespace": self.namespace})
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}


# --- the flags every leader-elected service takes ---------------------------------------------
def add_leader_election_arguments(parser: argparse.ArgumentParser, *, lease_name: str,
                                  lease_namespace: str) -> None:
    """``--[no-]leader-elect``, ``--lease-namespace`` (default ``$POD_NAMESPACE``, else
    ``lease_namespace``), ``--lease-name``, ``--identity`` and the three timings, with the defaults
    client-go uses; :func:`leader_election_problem` checks them."""
    parser.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=True,
                        help="run only while holding the Lease, so several replicas can run; "
                             "--no-leader-elect for a single replica (default: on)")
    parser.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE") or lease_namespace,
                        help="namespace of the leader-election Lease (default: $POD_NAMESPACE, else %(default)s)")
    parser.add_argument("--lease-name", default=lease_name,
                        help="name of the leader-election Lease (default: %(default)s)")
    parser.add_argument("--identity", default="",
                        help="this replica's name in the Lease (default: $POD_NAME or the host name, "
                             "plus a random suffix)")
    parser.add_argument("--lease-duration-seconds", type=float, default=15.0,
                        help="how long a standby waits after the leader's last renewal before taking over "
                             "(default: %(default)s)")
    parser.add_argument("--renew-deadline-seconds", type=float, default=10.0,
                        help="the leader gives up when it could not renew for this long (default: %(default)s)")
    parser.add_argument("--retry-period-seconds", type=float, default=2.0,
                        help="how often to try to acquire or renew the Lease (default: %(default)s)")


def leader_election_problem(args: argparse.Namespace) -> str | None:
    """Why the timings of :func:`add_leader_election_arguments` cannot work, else None."""
    if not args.retry_period_seconds < args.renew_deadline_seconds < args.lease_duration_seconds:
        return ("need --retry-period-seconds < --renew-deadline-seconds < --lease-duration-seconds, got "
                f"{args.retry_period_seconds} < {args.renew_deadline_seconds} < {args.lease_duration_seconds}")
    return None
