"""The object store the reflectors fill: copies out, frozen records, the index, relists diffed and scoped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fastgshare_kube.store import Store, object_key, whole


def obj(namespace: str, name: str, **fields: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"uid-{name}"}, "spec": dict(fields)}


class Changes:
    def __init__(self) -> None:
        self.seen: list[tuple[str | None, str | None]] = []

    def __call__(self, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> None:
        self.seen.append((object_key(old) if old else None, object_key(new) if new else None))


def test_a_read_is_a_copy_the_caller_may_change() -> None:
    store = Store(Changes(), convert=whole)
    store.upsert(obj("a", "x", replicas=1))
    got = store.get("a/x")
    assert got is not None
    got["spec"]["replicas"] = 99
    [selected] = store.select()
    selected["spec"]["replicas"] = 98
    assert store.get("a/x") == obj("a", "x", replicas=1)


def test_a_relist_reports_only_what_changed() -> None:
    changes = Changes()
    store = Store(changes, convert=whole)
    store.replace([obj("a", "x"), obj("a", "y")])
    changes.seen.clear()
    store.replace([obj("a", "x"), obj("a", "y", replicas=2), obj("a", "z")])
    assert sorted(changes.seen, key=str) == [("a/y", "a/y"), (None, "a/z")]
    assert sorted(store.list_keys()) == ["a/x", "a/y", "a/z"]


def test_deleting_an_object_never_seen_still_reports_it_gone() -> None:
    changes = Changes()
    store = Store(changes, convert=whole)
    store.delete(obj("a", "ghost"))
    assert changes.seen == [("a/ghost", None)]
    assert len(store) == 0


def test_a_scoped_relist_replaces_only_its_namespace() -> None:
    changes = Changes()
    store = Store(changes, convert=whole)
    store.scoped("a").replace([obj("a", "x")])
    store.scoped("b").replace([obj("b", "x"), obj("b", "y")])
    changes.seen.clear()
    store.scoped("a").replace([])
    assert sorted(store.list_keys()) == ["b/x", "b/y"]
    assert changes.seen == [("a/x", None)]
    assert [o["metadata"]["name"] for o in store.select(lambda o: o["metadata"]["name"] == "y", namespace="b")] == ["y"]
    assert store.select(namespace="a") == []


@attrs.frozen
class Record:
    name: str
    owner: str


def record(raw: Mapping[str, Any]) -> Record:
    return Record(name=raw["metadata"]["name"], owner=raw["spec"].get("owner", ""))


def test_frozen_records_are_indexed_and_the_index_follows_changes() -> None:
    seen: list[tuple[Record | None, Record | None]] = []
    store = Store(lambda old, new: seen.append((old, new)), convert=record, frozen=True,
                  key=lambda raw: raw["metadata"]["uid"], index=lambda r: (r.owner,) if r.owner else ())
    store.replace([obj("a", "p", owner="o1"), obj("a", "q", owner="o1"), obj("a", "r")])
    assert sorted(r.name for r in store.indexed("o1")) == ["p", "q"]
    store.upsert(obj("a", "q", owner="o2"))
    assert [r.name for r in store.indexed("o1")] == ["p"]
    assert [r.name for r in store.indexed("o2")] == ["q"]
    assert seen[-1] == (Record("q", "o1"), Record("q", "o2"))
    store.delete(obj("a", "p", owner="o1"))
    assert store.indexed("o1") == []
    assert store.get("uid-q") is store.get("uid-q")  # frozen: handed out as is, not copied


def test_each_reads_every_object_under_the_lock() -> None:
    store = Store(Changes(), convert=whole)
    store.replace([obj("a", "x", replicas=1), obj("b", "y", replicas=2)])
    assert sorted(store.each(lambda o: o["spec"]["replicas"])) == [1, 2]
