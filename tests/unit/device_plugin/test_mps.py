"""MPS that comes and goes (issue 36, item 4): the pure decisions, and the agent's follower of the
MPS control daemon with fakes for the arbiter, the events and the pods (the devices, the metrics
and the simulated daemon, simgpu/mps.py, are the real ones)."""

from __future__ import annotations

import threading
from pathlib import Path

import attrs
import pytest
from prometheus_client.core import Metric

from device_plugin.allocation import NodePod
from device_plugin.arbiter.native import NativePolicy
from device_plugin.arbiter.server import ArbiterUsage, engine_share
from device_plugin.devices import DeviceState
from device_plugin.metrics import NodeMetrics
from device_plugin.mps import (
    REASON_MPS_STARTED,
    REASON_MPS_STOPPED,
    REASON_PARTITION_NOT_APPLIED,
    MpsChange,
    UnappliedPartitions,
    mps_change,
    node_events,
    with_mps,
)
from device_plugin.mps_watch import MpsFollower
from fastgshare.arbitration import TimeShare
from fastgshare.inventory import parse_gpu_spec
from fastgshare.usage import UsageSnapshot
from simgpu import mps as simulated_mps
from tests.builders_k8s import assignment, pod_record

NODE = "n1"
GPUS = parse_gpu_spec("2x16GiB:80sm").devices(uuid_prefix="G")  # G-0, G-1


def test_a_gpu_has_mps_while_the_daemon_runs_unless_it_does_not_allow_it() -> None:
    allowed = {"G-0": True, "G-1": False}  # G-1: a simulated GPU specified :nomps
    assert [g.mps_enabled for g in with_mps(GPUS, allowed, daemon_running=True)] == [True, False]
    assert [g.mps_enabled for g in with_mps(GPUS, allowed, daemon_running=False)] == [False, False]
    assert [g.mps_enabled for g in with_mps(GPUS, {}, daemon_running=True)] == [True, True]  # real GPUs
    assert [g.healthy for g in with_mps(GPUS, {}, daemon_running=True)] == [True, True]  # nothing else changes


def test_a_change_names_the_gpus_whose_mps_started_or_stopped() -> None:
    assert mps_change({"G-0": False, "G-1": True}, {"G-0": True, "G-1": True}) == MpsChange(started=("G-0",))
    assert mps_change({"G-0": True, "G-1": True}, {"G-0": False, "G-1": False}) == MpsChange(stopped=("G-0", "G-1"))
    assert not mps_change({"G-0": True}, {"G-0": True})
    assert node_events(MpsChange(started=("G-0",)), "/p/control")[0][0] == REASON_MPS_STARTED
    [(reason, message)] = node_events(MpsChange(stopped=("G-0", "G-1")), "/p/control")
    assert reason == REASON_MPS_STOPPED
    assert "G-0, G-1" in message
    assert "/p/control" in message


def _pod(name: str, gpu: str, sm: int, **extra: object) -> NodePod:
    return pod_record(name, NODE, assigned=assignment(NODE, gpu, sm=sm), **extra)  # type: ignore[arg-type]


def test_a_pod_whose_partition_cannot_be_applied_is_warned_once_until_mps_returns() -> None:
    partitions = UnappliedPartitions()
    small, whole, elsewhere = _pod("small", "G-0", 25), _pod("whole", "G-0", 100), _pod("elsewhere", "G-1", 25)
    off = {"G-0": False, "G-1": True}
    [(pod, message)] = partitions.check([small, whole, elsewhere], off)
    assert pod.name == "small"
    assert "G-0" in message
    assert "25%" in message
    assert partitions.check([small, whole, elsewhere], off) == []  # once
    assert partitions.check([small], {"G-0": True, "G-1": True}) == []  # MPS is back: applied, forgotten
    assert [p.name for p, _ in partitions.check([small], off)] == ["small"]  # lost again: warned again


def test_finished_pods_are_not_warned_and_pods_that_left_are_forgotten() -> None:
    partitions = UnappliedPartitions()
    off = {"G-0": False}
    assert partitions.check([_pod("done", "G-0", 25, phase="Succeeded")], off) == []
    small = _pod("small", "G-0", 25)
    assert len(partitions.check([small], off)) == 1
    assert partitions.check([small], off, known=[small.uid]) == []
    assert partitions.check([], off, known=[]) == []
    assert len(partitions.check([small], off)) == 1  # it left and came back (same uid): a new warning


# --- the follower, with fakes --------------------------------------------------------------------

class FakeArbiter:
    def __init__(self) -> None:
        self.calls: list[tuple[str, bool]] = []

    def set_mps(self, gpu_uuid: str, enabled: bool) -> None:
        self.calls.append((gpu_uuid, enabled))


class FakeEvents:
    def __init__(self) -> None:
        self.node: list[tuple[str, str, str]] = []
        self.pods: list[tuple[str, str, str]] = []

    def node_event(self, node_name: str, reason: str, message: str) -> None:
        self.node.append((node_name, reason, message))

    def warn(self, pod: NodePod, reason: str, message: str) -> None:
        self.pods.append((pod.name, reason, message))


class FakePods:
    def __init__(self, pods: list[NodePod]) -> None:
        self.pods = pods

    def snapshot(self) -> tuple[int, list[NodePod]]:
        return 1, list(self.pods)


@attrs.define
class Followed:
    follower: MpsFollower
    devices: DeviceState
    arbiter: FakeArbiter
    events: FakeEvents
    pods: FakePods
    pipe_dir: Path

    def mps(self) -> list[bool]:
        return [gpu.mps_enabled for gpu in self.devices.inventory().gpus]


def _followed(tmp_path: Path, allowed: dict[str, bool], pods: list[NodePod]) -> Followed:
    pipe_dir = tmp_path / "nvidia-mps"
    devices = DeviceState(NODE, with_mps(GPUS, allowed, daemon_running=False), slots_per_gpu=4)
    arbiter, events, source = FakeArbiter(), FakeEvents(), FakePods(pods)
    follower = MpsFollower(pipe_dir, allowed=allowed, devices=devices, arbiter=arbiter, events=events,
                           pods=source, node_name=NODE, stopping=threading.Event())
    return Followed(follower, devices, arbiter, events, source, pipe_dir)


def _mps_gauge(devices: DeviceState) -> dict[str, float]:
    usage = ArbiterUsage(UsageSnapshot(window_s=10.0, pods=(), gpus=()), {})
    metrics = NodeMetrics(FakePods([]), lambda: usage, devices.inventory)
    families: dict[str, Metric] = {family.name: family for family in metrics.collect()}
    assert "fastgshare_gpu_mps_active" in families, sorted(families)
    return {sample.labels["gpu"]: sample.value for sample in families["fastgshare_gpu_mps_active"].samples}


def test_mps_starting_and_stopping_reaches_the_devices_the_arbiter_the_metric_and_the_node(tmp_path: Path) -> None:
    followed = _followed(tmp_path, {"G-0": True, "G-1": False}, [])
    assert not followed.follower.poll()
    simulated_mps.start(followed.pipe_dir)
    assert followed.follower.poll() == MpsChange(started=("G-0",))
    assert followed.mps() == [True, False]  # G-1 is :nomps: never
    assert followed.arbiter.calls == [("G-0", True)]
    assert _mps_gauge(followed.devices) == {"G-0": 1.0, "G-1": 0.0}
    assert [(node, reason) for node, reason, _ in followed.events.node] == [(NODE, REASON_MPS_STARTED)]
    assert not followed.follower.poll()  # nothing changed: nothing said again
    simulated_mps.stop(followed.pipe_dir)
    assert followed.follower.poll() == MpsChange(stopped=("G-0",))
    assert followed.mps() == [False, False]
    assert followed.arbiter.calls == [("G-0", True), ("G-0", False)]
    assert _mps_gauge(followed.devices) == {"G-0": 0.0, "G-1": 0.0}
    assert [reason for _, reason, _ in followed.events.node] == [REASON_MPS_STARTED, REASON_MPS_STOPPED]


def test_the_devices_revision_moves_when_mps_changes_so_the_inventory_is_republished(tmp_path: Path) -> None:
    followed = _followed(tmp_path, {}, [])
    before = followed.devices.revision()
    simulated_mps.start(followed.pipe_dir)
    followed.follower.poll()
    assert followed.devices.revision() != before
    assert followed.devices.set_mps("G-0", True) is False  # no change: no new revision


def test_mps_going_away_under_running_pods_warns_each_once(tmp_path: Path) -> None:
    running = _pod("running", "G-0", 25, allocated=True)
    whole = _pod("whole", "G-0", 100, allocated=True)
    waiting = _pod("waiting", "G-0", 25)  # not started yet: warned at Allocate
    followed = _followed(tmp_path, {}, [running, whole, waiting])
    simulated_mps.start(followed.pipe_dir)
    followed.follower.poll()
    assert followed.events.pods == []
    simulated_mps.stop(followed.pipe_dir)
    followed.follower.poll()
    [(name, reason, message)] = followed.events.pods
    assert (name, reason) == ("running", REASON_PARTITION_NOT_APPLIED)
    assert "G-0" in message
    followed.follower.allocated(running)  # another container of it: no second warning
    followed.follower.allocated(waiting)  # Allocate on a GPU without MPS: its warning
    assert [name for name, _, _ in followed.events.pods] == ["running", "waiting"]


def test_a_pod_allocated_on_a_gpu_with_mps_is_not_warned(tmp_path: Path) -> None:
    pod = _pod("fine", "G-0", 25)
    followed = _followed(tmp_path, {}, [pod])
    simulated_mps.start(followed.pipe_dir)
    followed.follower.poll()
    followed.follower.allocated(pod)
    assert followed.events.pods == []


def test_the_simulated_daemon_makes_and_removes_a_fifo(tmp_path: Path) -> None:
    pipe_dir = tmp_path / "deep" / "nvidia-mps"
    assert not simulated_mps.running(pipe_dir)
    control = simulated_mps.start(pipe_dir)
    assert control == pipe_dir / "control"
    assert simulated_mps.running(pipe_dir)
    simulated_mps.start(pipe_dir)  # already running: still one FIFO
    simulated_mps.stop(pipe_dir)
    assert not control.exists()
    simulated_mps.stop(pipe_dir)  # already stopped: nothing to do


@pytest.mark.parametrize("interval", [0.0, -1.0])
def test_a_poll_interval_that_is_not_positive_is_refused(tmp_path: Path, interval: float) -> None:
    with pytest.raises(ValueError, match="interval_s"):
        MpsFollower(tmp_path, allowed={}, devices=DeviceState(NODE, GPUS, 1), arbiter=FakeArbiter(),
                    events=FakeEvents(), pods=FakePods([]), node_name=NODE, stopping=threading.Event(),
                    interval_s=interval)


# --- the arbiter: without MPS a pod counts as the whole GPU --------------------------------------

@pytest.mark.parametrize(("mps", "together"), [(True, True), (False, False)])
def test_the_engine_lets_half_gpu_pods_hold_tokens_together_only_with_mps(mps: bool, together: bool) -> None:
    policy = NativePolicy(window_ns=100_000_000, min_token_ns=2_000_000)  # as the agent's engine: MPS rule on
    half = TimeShare(request_permille=500, limit_permille=1000, sm_percent=50)
    for pod in ("a", "b"):
        policy.add_client(pod, engine_share(half, mps))
    policy.request("a", now_ns=1_000, used_ns=0)
    policy.request("b", now_ns=1_000, used_ns=0)
    granted = {grant.client for grant in policy.schedule(now_ns=1_000).grants}
    assert granted == ({"a", "b"} if together else {"a"})
    assert engine_share(half, mps).request_permille == 500  # only the SM part changes
