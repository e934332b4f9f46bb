"""The arbiter's memory ledger across a restart (issue 13, item 1): saved on every change,
loaded by the next arbiter, each process's reservations held for it until it reconnects."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from device_plugin.arbiter.client import ArbiterError
from device_plugin.arbiter.shares import PodShare
from device_plugin.arbiter.state import SavedPod, StateFile
from fastgshare.protocol import ErrorCode
from tests.integration.arbiter.test_server import GPU, RunningArbiter, pod_share

MIB = 1 << 20
LIMIT = 1 << 30  # pod_share's memory


def start(tmp_path: Path, *, alive: Callable[[int], bool] = lambda pid: True, **options: object) -> RunningArbiter:
    return RunningArbiter(tmp_path / "arbiter.sock", {"ns/a": pod_share(300, 500), "ns/b": pod_share(200, 1000)},
                          state=StateFile(tmp_path / "state.json"), alive=alive, **options)


def eventually(check: Callable[[], bool], within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_a_pod_at_its_limit_stays_at_its_limit_after_a_restart(tmp_path: Path) -> None:
    first = start(tmp_path)
    try:
        tenant = first.client()
        tenant.hello("ns/a", GPU)
        assert tenant.reserve(900 * MIB).granted
        assert not tenant.reserve(200 * MIB).granted
    finally:
        first.stop()  # a rolling update: every connection drops, the saved ledger stays
    saved = StateFile(tmp_path / "state.json").load()
    assert [(p.gpu, p.pod, p.memory_limit_bytes, sum(p.held.values())) for p in saved] == [(GPU, "ns/a", LIMIT,
                                                                                           900 * MIB)]
    second = start(tmp_path)
    try:
        other = second.client()  # another process of the pod, or the tenant before it re-reports
        other.hello("ns/a", GPU)
        assert other.reserve(0).pod_used_bytes == 900 * MIB
        assert not other.reserve(200 * MIB).granted  # still at its limit
        tenant = second.client()
        tenant.hello("ns/a", GPU)
        restored = tenant.restore(850 * MIB)  # it freed 50 MiB while the arbiter was away
        assert restored.granted
        assert restored.pod_used_bytes == 850 * MIB
        assert other.reserve(100 * MIB).granted
        assert not other.reserve(100 * MIB).granted
        tenant.close()  # the process exits: what it holds is free
        assert eventually(lambda: other.reserve(0).pod_used_bytes == 100 * MIB)
    finally:
        second.stop()


def test_restore_is_once_and_first_on_a_connection(tmp_path: Path) -> None:
    arbiter = start(tmp_path)
    try:
        tenant = arbiter.client()
        tenant.hello("ns/a", GPU)
        assert tenant.reserve(10 * MIB).granted
        with pytest.raises(ArbiterError) as caught:
            tenant.restore(900 * MIB)
        assert caught.value.reply.code == ErrorCode.BAD_FRAME
    finally:
        arbiter.stop()


def test_memory_of_processes_gone_during_the_restart_is_freed(tmp_path: Path) -> None:
    StateFile(tmp_path / "state.json").save([SavedPod(GPU, "ns/a", LIMIT, {111: 500 * MIB, 222: 400 * MIB})])
    living = {111}
    arbiter = start(tmp_path, alive=lambda pid: pid in living)
    try:
        probe = arbiter.client()
        probe.hello("ns/a", GPU)
        assert probe.reserve(0).pod_used_bytes == 500 * MIB  # pid 222 had exited: dropped at start
        living.clear()  # pid 111 exits without reconnecting
        assert eventually(lambda: probe.reserve(0).pod_used_bytes == 0)
    finally:
        arbiter.stop()
    assert json.loads((tmp_path / "state.json").read_text())["pods"][0]["held"] == {}


def test_memory_of_a_living_process_that_has_not_reconnected_stays_charged(tmp_path: Path) -> None:
    StateFile(tmp_path / "state.json").save([SavedPod(GPU, "ns/b", LIMIT, {111: 500 * MIB})])
    arbiter = start(tmp_path)  # pid 111 lives (alive says so) but does not reconnect
    try:
        probe = arbiter.client()
        probe.hello("ns/b", GPU)
        time.sleep(1.5)  # past a sweep of the orphans
        assert probe.reserve(0).pod_used_bytes == 500 * MIB
    finally:
        arbiter.stop()


def test_an_unreadable_state_file_is_set_aside(tmp_path: Path) -> None:
    (tmp_path / "state.json").write_text("{not json")
    assert StateFile(tmp_path / "state.json").load() == []
    assert (tmp_path / "state.unreadable").read_text() == "{not json"
    assert not (tmp_path / "state.json").exists()


class LoadingBook:
    """A share book like the agent's pod cache: knows nothing and is not ready until loaded."""

    def __init__(self, shares: dict[str, PodShare], uids: dict[str, str]) -> None:
        self._shares, self._uids, self.loaded = shares, uids, False

    def by_pod(self, pod_key: str) -> PodShare | None:
        return self._shares.get(pod_key) if self.loaded else None

    def pod_of_uid(self, uid: str) -> str | None:
        return self._uids.get(uid) if self.loaded else None

    def ready(self) -> bool:
        return self.loaded


def test_a_restarted_arbiter_serves_known_pods_before_the_pod_cache_is_loaded(tmp_path: Path) -> None:
    shares = {"ns/a": pod_share(300, 500)}
    first = start(tmp_path)
    try:
        tenant = first.client()
        tenant.hello("ns/a", GPU)
        tenant.token()  # a pod that holds no memory: its share is saved all the same
    finally:
        first.stop()
    book = LoadingBook(shares, {})
    second = RunningArbiter(tmp_path / "arbiter.sock", {}, state=StateFile(tmp_path / "state.json"),
                            alive=lambda pid: True)
    second.server._shares = book  # the agent's pod cache, still loading
    try:
        tenant = second.client()
        reply = tenant.hello("ns/a", GPU)  # from the saved ledger
        assert (reply.request_permille, reply.limit_permille) == (300, 500)
        assert tenant.token() == 30 * 1_000_000
        with pytest.raises(ArbiterError):
            second.client().hello("ns/unknown", GPU)
        book.loaded, book._shares = True, {}  # loaded: the pod is gone from this node
        with pytest.raises(ArbiterError) as caught:
            second.client().hello("ns/a", GPU)
        assert caught.value.reply.code == ErrorCode.UNKNOWN_CLIENT
    finally:
        second.stop()


def test_a_restore_above_the_pods_memory_limit_is_refused(tmp_path: Path) -> None:
    """Issue 42 row 6: MEM_RESTORE of 16 GiB from a pod whose limit is 1 GiB was accepted."""
    StateFile(tmp_path / "state.json").save([SavedPod(GPU, "ns/a", LIMIT, {111: 300 * MIB})])
    arbiter = start(tmp_path)
    try:
        greedy = arbiter.client()
        greedy.hello("ns/a", GPU)
        with pytest.raises(ArbiterError) as caught:
            greedy.restore(16 << 30)
        assert caught.value.reply.code == ErrorCode.BAD_FRAME
        assert "over its memory limit" in caught.value.reply.message
        with pytest.raises(ArbiterError):
            greedy.restore(LIMIT - 300 * MIB + 1)  # with the other process's 300 MiB: one byte over
        fitting = arbiter.client()
        fitting.hello("ns/a", GPU)
        assert fitting.restore(LIMIT - 300 * MIB).pod_used_bytes == LIMIT  # exactly the limit: taken
        assert not fitting.reserve(1).granted
    finally:
        arbiter.stop()
