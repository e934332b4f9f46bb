"""The controller's in-memory view of the cluster: FaSTPods and the pods they own.

Two stores, each fed by a :class:`~fastgshare_kube.reflector.Reflector`. The FaSTPod
store keeps the objects whole (the builder needs the podSpec); the pod store keeps a
:class:`PodInfo` per pod, the few fields reconcile looks at, indexed by owner. Every change,
relists included (a relist is diffed against the store), is reported to a handler with the old
and new value, so the controller can enqueue keys and settle its expectations. The stores are
thread-safe; readers get copies or frozen values (:class:`~fastpod_crd_controller.pods.PodInfo`),
never the live dicts.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fastpod_crd_controller.pods import PodInfo, pod_info

FaSTPodHandler = Callable[[str], None]
PodHandler = Callable[[PodInfo | None, PodInfo | None], None]


def _object_key(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


class FaSTPodStore:
    """FaSTPods by ``namespace/name``; reports the key of every change."""

    def __init__(self, on_change: FaSTPodHandler) -> None:
        self._lock = threading.Lock()
        self._objects: dict[str, dict[str, Any]] = {}
        self._on_change = on_change

    def get(self, key: str) -> dict[str, Any] | None:
        """A deep copy of the cached FaSTPod, safe to modify."""
        with self._lock:
            found = self._objects.get(key)
        return copy.deepcopy(found) if found is not None else None

    def list_keys(self) -> list[str]:
        with self._lock:
            return list(self._objects)

    def statuses(self) -> list[dict[str, Any]]:
        """Each cached FaSTPod reduced to ``{"status": ...}`` (a copy), for the metrics."""
        with self._lock:
            return [{"status": copy.deepcopy(obj.get("status") or {})} for obj in self._objects.values()]

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        fresh = {_object_key(obj): dict(obj) for obj in objects}
        with self._lock:
            changed = [key for key in self._objects.keys() | fresh.keys()
                       if self._objects.get(key) != fresh.get(key)]
            self._objects = fresh
        for key in changed:
            self._on_change(key)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        key = _object_key(obj)
        with self._lock:
            self._objects[key] = dict(obj)
        self._on_change(key)

    def delete(self, obj: Mapping[str, Any]) -> None:
        key = _object_key(obj)
        with self._lock:
            self._objects.pop(key, None)
        self._on_change(key)


class PodStore:
    """Pods (as :class:`PodInfo`) by uid, indexed by their controlling FaSTPod's uid."""

    def __init__(self, on_change: PodHandler) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, PodInfo] = {}
        self._by_owner: dict[str, set[str]] = {}
        self._on_change = on_change

    def owned_by(self, owner_uid: str) -> list[PodInfo]:
        with self._lock:
            return [self._pods[uid] for uid in self._by_owner.get(owner_uid, ())]

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)

    def replace(self, objects: Iterable[Mapping[str, Any]]) -> None:
        fresh = {info.uid: info for info in map(pod_info, objects)}
        with self._lock:
            old = self._pods
            for uid in old.keys() - fresh.keys():
                self._unindex(old[uid])
            for info in fresh.values():
                self._index(info)
            self._pods = fresh
        for uid in old.keys() | fresh.keys():
            if old.get(uid) != fresh.get(uid):
                self._on_change(old.get(uid), fresh.get(uid))

    def upsert(self, obj: Mapping[str, Any]) -> None:
        info = pod_info(obj)
        with self._lock:
            old = self._pods.get(info.uid)
            if old is not None:
                self._unindex(old)
            self._pods[info.uid] = info
            self._index(info)
        self._on_change(old, info)

    def delete(self, obj: Mapping[str, Any]) -> None:
        uid = (obj.get("metadata") or {}).get("uid", "")
        with self._lock:
            old = self._pods.pop(uid, None)
            if old is not None:
                self._unindex(old)
        self._on_change(old or pod_info(obj), None)

    def _index(self, info: PodInfo) -> None:
        if info.owner_uid:
            self._by_owner.setdefault(info.owner_uid, set()).add(info.uid)

    def _unindex(self, info: PodInfo) -> None:
        owned = self._by_owner.get(info.owner_uid)
        if owned is not None:
            owned.discard(info.uid)
            if not owned:
                del self._by_owner[info.owner_uid]
