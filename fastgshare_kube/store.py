"""The object store a reflector fills: what a controller reads instead of the API.

A :class:`Store` is the :class:`~fastgshare_kube.reflector.Sink` of one kind of object (or of one
reflector per namespace, through :meth:`Store.scoped`). It keeps each object under its key
(``namespace/name`` unless told otherwise) as the service wants it: whole, handed out as a deep copy
on every read, or converted to a frozen record (``convert=..., frozen=True``), handed out as is. An
optional ``index`` files each object under a few values (the FaSTPod controller's pods under their
owner's uid) for :meth:`Store.indexed`.

Every change, relists included (a relist is diffed against the store), is reported to
``on_change(old, new)`` (``None`` for an object that appears or goes), after the store's lock is
released, so the handler may read the store; it is handed the stored values, to read, never to
change (the controllers' handlers only enqueue keys). A relist of
one namespace (a scoped sink) replaces only that namespace's objects. Thread-safe.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from fastgshare_kube.reflector import Sink

T = TypeVar("T")
R = TypeVar("R")

ChangeHandler = Callable[[T | None, T | None], None]


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of an API object (``/name`` for a cluster-scoped one)."""
    metadata = obj.get("metadata") or {}
    return f"{metadata.get('namespace', '')}/{metadata.get('name', '')}"


def whole(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Keep the object as the API served it (the default of :class:`Store`)."""
    return dict(obj)


def _namespace(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("namespace", ""))


class Store(Generic[T]):
    """Objects of one kind by key; see the module docstring."""

    def __init__(self, on_change: ChangeHandler[T], *, convert: Callable[[Mapping[str, Any]], T],
                 key: Callable[[Mapping[str, Any]], str] = object_key, frozen: bool = False,
                 index: Callable[[T], Iterable[str]] | None = None) -> None:
        self._on_change = on_change
        self._convert = convert
        self._key = key
        self._frozen = frozen
        self._index = index
        self._lock = threading.Lock()
        self._objects: dict[str, T] = {}
        self._namespaces: dict[str, str] = {}  # key -> the object's namespace, for scoped relists
        self._by_index: dict[str, set[str]] = {}

    # --- reads ------------------------------------------------------------------------------------
    def get(self, key: str) -> T | None:
        """The object (a copy, unless frozen), or None."""
        with self._lock:
            found = self._objects.get(key)
        return None if found is None else self._out(found)

    def list_keys(self) -> list[str]:
        with self._lock:
            return list(self._objects)

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    def select(self, keep: Callable[[T], bool] | None = None, *, namespace: str | None = None) -> list[T]:
        """The objects (copies, unless frozen) ``keep`` accepts, of ``namespace`` if given."""
        with self._lock:
            found = [obj for key, obj in self._objects.items()
                     if (namespace is None or self._namespaces.get(key) == namespace) and (keep is None or keep(obj))]
        return [self._out(obj) for obj in found]

    def indexed(self, value: str) -> list[T]:
        """The objects the ``index`` files under ``value`` (copies, unless frozen)."""
        with self._lock:
            found = [self._objects[key] for key in self._by_index.get(value, ())]
        return [self._out(obj) for obj in found]

    def each(self, view: Callable[[T], R]) -> list[R]:
        """``view`` of every object, taken under the lock: it must copy what it keeps and change nothing
        (the metrics read the FaSTPods' statuses so, without copying whole objects)."""
        with self._lock:
            return [view(obj) for obj in self._objects.values()]

    # --- the sink ---------------------------------------------------------------------------------
    def replace(self, objects: Iterable[Mapping[str, Any]], namespace: str | None = None) -> None:
        """A (re)list: of everything, or with ``namespace`` of that namespace's objects only."""
        fresh: dict[str, T] = {}
        namespaces: dict[str, str] = {}
        for obj in objects:
            key = self._key(obj)
            fresh[key], namespaces[key] = self._convert(obj), _namespace(obj)
        with self._lock:
            old = {key: obj for key, obj in self._objects.items()
                   if namespace is None or self._namespaces.get(key) == namespace}
            for key in old:
                self._remove_locked(key)
            for key, value in fresh.items():
                self._put_locked(key, value, namespaces[key])
        for key in old.keys() | fresh.keys():
            if old.get(key) != fresh.get(key):
                self._on_change(old.get(key), fresh.get(key))

    def scoped(self, namespace: str) -> Sink:
        """The sink of one namespace's reflector: its relists leave other namespaces' objects alone."""
        return _NamespaceSink(self, namespace)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        key, new = self._key(obj), self._convert(obj)
        with self._lock:
            old = self._remove_locked(key)
            self._put_locked(key, new, _namespace(obj))
        self._on_change(old, new)

    def delete(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            old = self._remove_locked(self._key(obj))
        self._on_change(old if old is not None else self._convert(obj), None)

    # --- inside the lock --------------------------------------------------------------------------
    def _put_locked(self, key: str, obj: T, namespace: str) -> None:
        self._objects[key] = obj
        self._namespaces[key] = namespace
        for value in self._index(obj) if self._index is not None else ():
            self._by_index.setdefault(value, set()).add(key)

    def _remove_locked(self, key: str) -> T | None:
        obj = self._objects.pop(key, None)
        self._namespaces.pop(key, None)
        if obj is not None and self._index is not None:
            for value in self._index(obj):
                filed = self._by_index.get(value)
                if filed is not None:
                    filed.discard(key)
                    if not filed:
                        del self._by_index[value]
        return obj

    def _out(self, obj: T) -> T:
        return obj if self._frozen else copy.deepcopy(obj)


class _NamespaceSink:
    def __init__(self, store: Store[Any], namespace: str) -> None:
        self._store, self._namespace = store, namespace

    def replace(self, objects: list[dict[str, Any]]) -> None:
        self._store.replace(objects, self._namespace)

    def upsert(self, obj: Mapping[str, Any]) -> None:
        self._store.upsert(obj)

    def delete(self, obj: Mapping[str, Any]) -> None:
        self._store.delete(obj)
