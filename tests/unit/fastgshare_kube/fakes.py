"""In-memory stand-ins for the API the Kubernetes layer's loops work through: a scripted
:class:`~fastgshare_kube.reflector.ListWatch` and a :class:`~fastgshare_kube.leader.LeasePort`.
The services' tests use them too."""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from fastgshare_kube.errors import ApiError


class FakeLeases:
    """Leases in memory, written only with the resourceVersion read (else 409), as the API server does;
    :meth:`fail` queues errors for the next calls (``"get/leases"``, ``"create/leases"``, ``"update/leases"``)."""

    def __init__(self) -> None:
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.errors: dict[str, list[ApiError]] = {}
        self._versions = itertools.count(1)
        self._lock = threading.Lock()

    def fail(self, call: str, *errors: ApiError) -> None:
        """Make the next calls of ``call`` raise ``errors``, one each."""
        with self._lock:
            self.errors.setdefault(call, []).extend(errors)

    def _record(self, verb: str, resource: str, namespace: str, name: str) -> None:
        with self._lock:
            queued = self.errors.get(f"{verb}/{resource}")
            error = queued.pop(0) if queued else None
        if error is not None:
            raise error

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._record("get", "leases", namespace, name)
        found = self.leases.get((namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._record("create", "leases", namespace, body["metadata"]["name"])
        key = (namespace, body["metadata"]["name"])
        if key in self.leases:
            raise ApiError(409, "AlreadyExists", "leases already exists")
        return self._store_lease(key, body)

    def replace_lease(self, namespace: str, name: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._record("update", "leases", namespace, name)
        current = self.leases.get((namespace, name))
        if current is None:
            raise ApiError(404, "NotFound", "lease not found")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        return self._store_lease((namespace, name), body)

    def _store_lease(self, key: tuple[str, str], body: Mapping[str, Any]) -> dict[str, Any]:
        lease = copy.deepcopy(dict(body))
        lease["metadata"] = {**lease["metadata"], "resourceVersion": str(next(self._versions))}
        self.leases[key] = lease
        return copy.deepcopy(lease)


class ScriptedListWatch:
    """A ListWatch that answers lists and watches from scripts the test sets up.

    ``lists`` is a queue of (objects, resourceVersion) or exceptions to raise; ``watches`` a queue
    of event lists, each an event dict or an exception to raise at that point. An exhausted watch queue blocks until
    :meth:`close`.
    """

    def __init__(self) -> None:
        self.lists: list[tuple[list[dict[str, Any]], str] | Exception] = []
        self.watches: list[list[dict[str, Any] | Exception]] = []
        self.watched_from: list[str] = []
        self.closed = threading.Event()

    def list(self) -> tuple[list[dict[str, Any]], str]:
        if not self.lists:
            self.closed.wait()
            raise ApiError(0, "Closed")
        answer = self.lists.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def watch(self, resource_version: str, timeout_s: int) -> Iterator[dict[str, Any]]:
        self.watched_from.append(resource_version)
        if not self.watches:
            self.closed.wait()
            return
        for item in self.watches.pop(0):
            if isinstance(item, Exception):
                raise item
            yield item

    def close(self) -> None:
        self.closed.set()
