"""In-memory stand-ins for the API: a recording KubePort (and, from the layer's fakes, the scripted ListWatch).

``FakeKube`` records every call as a tuple (verb, resource, namespace, name), like client-go's
fake clientset, keeps what was written, and raises queued :class:`ApiError` s on demand.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Mapping
from typing import Any

from fastpod_crd_controller.errors import ApiError
from tests.unit.fastgshare_kube.fakes import ScriptedListWatch

__all__ = ["FakeKube", "ScriptedListWatch"]

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
        self.errors: dict[str, list[ApiError]] = {}  # verb/resource -> errors to raise, in order
        self._names = itertools.count(1)
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

    def writes(self) -> list[Action]:
        """The recorded calls, without reads and events."""
        return [a for a in self.actions if a[0] != "get" and a[1] != "events"]
