"""The controller's caches: what a pod's PodInfo says, the owner index, and changes reported on relist."""

from __future__ import annotations

from fastgshare import keys
from fastpod_crd_controller.controller import fastpod_store, pod_store
from fastpod_crd_controller.pods import PodInfo, pod_info
from tests.unit.fastpod_crd_controller.objects import fastpod, pod


def test_pod_info_reads_owner_revision_readiness_and_assignment() -> None:
    raw = pod("web-a", fastpod(), node="n1", ready=True, phase="Running", assignment="{}", revision="r1")
    info = pod_info(raw)
    assert info == PodInfo(namespace="team-a", name="web-a", uid="uid-web-a", owner_uid="uid-web", owner_name="web",
                           revision="r1", node_name="n1", phase="Running", ready=True,
                           created="2026-01-01T00:00:00Z", deleting=False, assignment="{}")
    assert info.owner_key == "team-a/web"


def test_only_a_controlling_fastpod_owner_counts() -> None:
    raw = pod("p")
    raw["metadata"]["ownerReferences"] = [
        {"apiVersion": keys.FASTPOD_API_VERSION, "kind": "FaSTPod", "name": "web", "uid": "u1", "controller": False},
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u2", "controller": True},
    ]
    assert pod_info(raw).owner_key is None


def test_the_pod_store_indexes_by_owner_and_reports_relist_differences() -> None:
    changes: list[tuple[str | None, str | None]] = []
    store = pod_store(lambda old, new: changes.append((old.name if old else None, new.name if new else None)))
    owner = fastpod()
    store.replace([pod("a", owner), pod("b", owner)])
    store.upsert(pod("b", owner, node="n1"))
    store.replace([pod("b", owner, node="n1"), pod("c", owner)])
    assert sorted(p.name for p in store.indexed("uid-web")) == ["b", "c"]
    assert sorted(changes[:2], key=str) == [(None, "a"), (None, "b")]
    assert changes[2] == ("b", "b")
    assert sorted(changes[3:], key=str) == [("a", None), (None, "c")]


def test_the_fastpod_store_hands_out_copies_and_reports_keys() -> None:
    keys_seen: list[str] = []
    store = fastpod_store(keys_seen.append)
    store.replace([fastpod("a", uid="ua"), fastpod("b", uid="ub")])
    copy = store.get("team-a/a")
    assert copy is not None
    copy["spec"]["replicas"] = 99
    assert store.get("team-a/a")["spec"]["replicas"] == 3  # type: ignore[index]
    store.replace([fastpod("a", uid="ua")])
    assert sorted(keys_seen) == ["team-a/a", "team-a/b", "team-a/b"]
    assert store.list_keys() == ["team-a/a"]
