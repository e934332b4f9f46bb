"""In-memory stand-ins for the API: a recording KubePort/LeasePort and a scripted ListWatch.

``FakeKube`` records every call as a tuple (verb, resource, namespace, name), like client-go's
fake clientset, keeps what was written, and raises queued :class:`ApiError` s on demand.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from fastpod_crd_controller.errors import ApiError

Action = tuple[str, str, str, str]


class FakeKube:
    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.created: list[dict[str, Any]] = []
        self.checked: list[bool] = []  # create_pod's ``checked``, in call order
        self.statuses: list[dict[str, Any]] = []
        self.pod_patches: list[tuple[str, dict[str, Any]]] = []
        self.events: list[dict[str, Any]] = []
        self.event_patches: list[tuple[str, dict[str, Any]]] = []
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.errors: dict[str, list[ApiError]] = {}  # verb/resource -> errors to raise, in order
        self._names = itertools.count(1)
        self._versions = itertools.count(1)
        self._lock = threading.Lock()

    def fail(self, call: str, *errors: ApiError) -> None:
        """Make the next calls of ``call`` (e.g. ``"create/pods"``) raise ``errors``, one each."""
        self.errors.setdefault(call, []).extend(errors)

    def _record(self, verb: str, resource: str, namespace: str, name: str) -> None:
        with self._lock:
            self.actions.append((verb, resource, namespace, name))
            queued = self.errors.get(f"{verb}/{resource}")
            error = queued.pop(0) if queued else None
        if error is not None:
            raise error

    # --- KubePort -------------------------------------------------------------------------------
    def create_pod(self, namespace: str, body: Mapping[str, Any], *, checked: bool = False) -> dict[str, Any]:
        self.checked.append(checked)
        self._record("create", "pods", namespace, body["metadata"]["generateName"])
        pod = copy.deepcopy(dict(body))
        number = next(self._names)
        pod["metadata"].update(name=f"{body['metadata']['generateName']}{number:05d}", uid=f"uid-new-{number}")
        self.created.append(pod)
        return pod

    def patch_pod(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self._record("patch", "pods", namespace, name)
        self.pod_patches.append((name, copy.deepcopy(dict(body))))

    def delete_pod(self, namespace: str, name: str, uid: str) -> None:
        self._record("delete", "pods", namespace, name)

    def patch_fastpod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> None:
        self._record("patch", "fastpods/status", namespace, name)
        self.statuses.append(copy.deepcopy(dict(status)))

    def create_event(self, namespace: str, body: Mapping[str, Any]) -> None:
        self._record("create", "events", namespace, body["metadata"]["name"])
        self.events.append(copy.deepcopy(dict(body)))

    def patch_event(self, namespace: str, name: str, body: Mapping[str, Any]) -> None:
        self._record("patch", "events", namespace, name)
        self.event_patches.append((name, dict(body)))

    # --- LeasePort ------------------------------------------------------------------------------
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

    def writes(self) -> list[Action]:
        """The recorded calls, without reads and events."""
        return [a for a in self.actions if a[0] != "get" and a[1] != "events"]


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
