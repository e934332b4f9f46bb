"""The usage audit (issue 42 item 4): what the GPU says each pod used, against what the arbiter
charged it. The comparison is pure; the adapters run on a fake pynvml module and on a simulated
GPU state file written here in the driver's layout."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from device_plugin.allocation import NodePod, SimulatedDriver
from device_plugin.arbiter.server import ArbiterUsage
from device_plugin.discovery import SimulatedGpus
from device_plugin.gpu_usage import (
    REASON_GPU_TIME_UNACCOUNTED,
    ChargeCounter,
    ProcessTime,
    UsageAudit,
    pod_seconds,
    unaccounted,
)
from device_plugin.main import StartupError, build_parser, start_arbiter, usage_audit
from device_plugin.nvml import NvmlGpus, NvmlProcessGpuTime
from device_plugin.simulated_usage import SimulatedProcessGpuTime
from fastgshare.inventory import parse_gpu_spec
from fastgshare.usage import PodUsage, UsageSnapshot
from simgpu import state as simstate
from tests.unit.device_plugin.test_host_side import FakeNvmlError, fake_nvml

UID_A = "aaaaaaaa-0000-0000-0000-000000000001"
UID_B = "bbbbbbbb-0000-0000-0000-000000000002"
POD_A = NodePod(uid=UID_A, namespace="team-a", name="steady", node_name="n", phase="Running", resource_version="1")
POD_B = NodePod(uid=UID_B, namespace="team-b", name="bypass", node_name="n", phase="Running", resource_version="1")
PIDS = {101: UID_A, 102: UID_A, 201: UID_B, 300: None}


def charges(**totals: float) -> ArbiterUsage:
    """An arbiter snapshot on GPU-0 whose pods were charged ``totals`` seconds so far (keyword
    ``team_a__steady`` is the pod ``team-a/steady``)."""
    pods = tuple(PodUsage(pod=key.replace("__", "/").replace("_", "-"), gpu="GPU-0", share=0.0,
                          used_seconds_total=total, throttled_seconds_total=0.0, wait_bucket_counts=(),
                          wait_sum_seconds=0.0, wait_count=0)
                 for key, total in totals.items())
    return ArbiterUsage(UsageSnapshot(window_s=10.0, pods=pods, gpus=()), {})


# --- the comparison ---------------------------------------------------------------------------

def test_pod_seconds_sums_processes_per_pod_and_drops_processes_of_no_known_pod() -> None:
    reported = ProcessTime(10.0, {"GPU-0": {101: 1.0, 102: 0.5, 201: 7.0, 300: 2.0},
                                  "GPU-1": {201: 1.0, 999: 3.0}})
    found = pod_seconds(reported, PIDS.get, {UID_A: POD_A, UID_B: POD_B})
    assert found == {("GPU-0", "team-a/steady"): 1.5, ("GPU-0", "team-b/bypass"): 7.0,
                     ("GPU-1", "team-b/bypass"): 1.0}


def test_unaccounted_is_reported_minus_charged_share_for_pods_on_either_side() -> None:
    reported = {("GPU-0", "team-b/bypass"): 7.9, ("GPU-0", "team-a/steady"): 2.5}
    charged = {("GPU-0", "team-b/bypass"): 2.0, ("GPU-0", "team-a/steady"): 3.0, ("GPU-0", "team-a/idle"): 0.5}
    result = unaccounted(reported, charged, 10.0)
    assert result == pytest.approx({("GPU-0", "team-b/bypass"): 0.59, ("GPU-0", "team-a/steady"): -0.05,
                                    ("GPU-0", "team-a/idle"): -0.05})
    assert unaccounted(reported, charged, 0.0) == {}


def test_charges_are_the_difference_of_the_arbiter_counters_and_restart_from_zero() -> None:
    counter = ChargeCounter()
    assert counter.since_last(charges(team_a__steady=4.0)) == {("GPU-0", "team-a/steady"): 4.0}
    assert counter.since_last(charges(team_a__steady=6.5)) == {("GPU-0", "team-a/steady"): 2.5}
    assert counter.since_last(charges(team_a__steady=1.0)) == {("GPU-0", "team-a/steady"): 1.0}  # restarted


# --- the audit loop ---------------------------------------------------------------------------

class ScriptedGpu:
    def __init__(self, readings: list[ProcessTime | None]) -> None:
        self.readings = readings

    def read(self) -> ProcessTime | None:
        return self.readings.pop(0)


class Pods:
    def snapshot(self) -> tuple[int, list[NodePod]]:
        return 1, [POD_A, POD_B]


def test_the_audit_exports_the_difference_and_warns_once_per_pod_above_the_threshold() -> None:
    # team-b's pod ran 8 of 10 s on the GPU but was charged 2 s (its client bypassed the hook);
    # team-a's was charged a little more than it ran (tokens held are charged in full).
    bypass = ProcessTime(10.0, {"GPU-0": {101: 2.0, 201: 8.0}})
    gpu = ScriptedGpu([None, bypass, bypass, bypass])
    totals = iter([charges(team_a__steady=0.0, team_b__bypass=0.0), charges(team_a__steady=2.5, team_b__bypass=2.0),
                   charges(team_a__steady=5.0, team_b__bypass=4.0), charges(team_a__steady=7.5, team_b__bypass=6.0)])
    now = [0.0]
    warned: list[tuple[str, str, str]] = []
    audit = UsageAudit(gpu, lambda: next(totals), Pods(),
                       lambda pod, reason, msg: warned.append((pod.key, reason, msg)), PIDS.get,
                       threshold=0.05, clock=lambda: now[0])
    audit.tick()
    assert audit.latest() == {}  # the first reading is the baseline
    audit.tick()
    assert audit.latest() == pytest.approx({("team-a", "steady", "GPU-0"): -0.05, ("team-b", "bypass", "GPU-0"): 0.6})
    assert [(key, reason) for key, reason, _ in warned] == [("team-b/bypass", REASON_GPU_TIME_UNACCOUNTED)]
    assert "0.60" in warned[0][2]
    assert "GPU-0" in warned[0][2]
    now[0] = 60.0
    audit.tick()
    assert len(warned) == 1  # one Event per pod per few minutes
    now[0] = 400.0
    audit.tick()
    assert len(warned) == 2


def test_the_audit_does_not_warn_below_the_threshold() -> None:
    gpu = ScriptedGpu([None, ProcessTime(10.0, {"GPU-0": {201: 2.4}})])
    totals = iter([charges(team_b__bypass=0.0), charges(team_b__bypass=2.0)])
    warned: list[object] = []
    audit = UsageAudit(gpu, lambda: next(totals), Pods(), lambda *event: warned.append(event), PIDS.get,
                       threshold=0.05)
    audit.tick()
    audit.tick()
    assert audit.latest() == pytest.approx({("team-b", "bypass", "GPU-0"): 0.04})
    assert warned == []


# --- NVML's per-process utilisation -----------------------------------------------------------

def nvml_with_utilisation(process_samples: dict[str, list[tuple[int, int, int]]],
                          device_samples: dict[str, int]) -> types.SimpleNamespace:
    """The fake pynvml with per-process samples (pid, timestamp µs, smUtil) and a count of device
    utilisation samples per GPU; both filtered by the caller's timestamp as NVML does."""
    module = fake_nvml()
    module.NVML_SUCCESS, module.NVML_ERROR_NOT_FOUND, module.NVML_GPU_UTILIZATION_SAMPLES = 0, 6, 1
    module.since = []

    def process_utilisation(handle: str, since_us: int) -> list[types.SimpleNamespace]:
        module.since.append(since_us)
        samples = [types.SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
                   for pid, ts, sm in process_samples.get(handle, []) if ts > since_us]
        if not samples:
            raise FakeNvmlError(6)
        return samples

    def samples(handle: str, kind: int, since_us: int) -> tuple[int, list[types.SimpleNamespace]]:
        assert kind == 1
        return 1, [types.SimpleNamespace(timeStamp=since_us + i + 1, sampleValue=0)
                   for i in range(device_samples.get(handle, 0))]

    module.nvmlDeviceGetProcessUtilization = process_utilisation
    module.nvmlDeviceGetSamples = samples
    return module


def test_nvml_process_time_weights_each_sample_by_the_device_sample_period(tmp_path: Path) -> None:
    start_us = 1_000_000_000
    # GPU 0: 10 sample periods over 10 s; pid 201 ran 100 % in 6 of them and 50 % in 2, pid 101 20 % in 5.
    process = {"GPU-v100-0": [(201, start_us + n, 100) for n in range(1, 7)] + [(201, start_us + 7, 50),
                                                                                 (201, start_us + 8, 50)]
               + [(101, start_us + n, 20) for n in range(1, 6)]}
    module = nvml_with_utilisation(process, {"GPU-v100-0": 10, "GPU-v100-1": 10})
    clock = iter([start_us / 1e6, start_us / 1e6 + 10.0])
    reader = NvmlProcessGpuTime(NvmlGpus(str(tmp_path), nvml=module), clock=lambda: next(clock))  # type: ignore[arg-type]
    assert reader.read() is None
    reading = reader.read()
    assert reading is not None
    assert reading.elapsed_s == pytest.approx(10.0)
    assert reading.seconds["GPU-v100-0"] == pytest.approx({201: 7.0, 101: 1.0})
    assert reading.seconds["GPU-v100-1"] == {}  # NOT_FOUND: nothing ran there
    assert module.since == [start_us, start_us]  # asked for the samples since the previous reading


# --- the simulated GPU's own accounting -------------------------------------------------------

def write_state(directory: Path, procs: list[tuple[int, int, int, int]]) -> None:
    """A state file in the simulated driver's layout: (pid as the process saw it, status, busy ns, first start)."""
    header = simstate._HEADER.pack(simstate.MAGIC, simstate.LAYOUT_VERSION, simstate._HEADER.size,
                                   simstate._PROC.size, simstate.MAX_PROCS, 2, 100, 100, 1 << 30, 0, 0, len(procs),
                                   0, 0, b"\0" * 16)
    body = b"".join(simstate._PROC.pack(pid, status, 0, 0, 0, 0, 0, 0, 1, busy, 0, start, 0, 0, 0, 0)
                    for pid, status, busy, start in procs)
    (directory / simstate.STATE_FILE).write_bytes(header + body)


def test_simulated_process_time_is_each_live_process_busy_time_by_host_pid(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    alive, exited = simstate.STATUS_ALIVE, simstate.STATUS_EXITED
    holders = {0: 4101, 1: 4201}  # the host pids holding each slot's lock (the pods' pid 1s)
    monkeypatch.setattr("device_plugin.simulated_usage.slot_holders", lambda directory: dict(holders))
    now = [100.0]
    reader = SimulatedProcessGpuTime({"GPU-0": tmp_path}, clock=lambda: now[0])
    write_state(tmp_path, [(1, alive, 2_000_000_000, 5), (1, alive, 1_000_000_000, 7)])
    assert reader.read() is None
    write_state(tmp_path, [(1, alive, 2_500_000_000, 5), (1, alive, 9_000_000_000, 7), (9, exited, 4_000_000_000, 8)])
    now[0] = 110.0
    reading = reader.read()
    assert reading is not None
    assert reading.elapsed_s == 10.0
    assert reading.seconds == {"GPU-0": pytest.approx({4101: 0.5, 4201: 8.0})}
    # Slot 1 reused by a new process (another start): all of its busy time is new.
    holders[1] = 4301
    write_state(tmp_path, [(1, alive, 2_500_000_000, 5), (1, alive, 300_000_000, 20)])
    now[0] = 120.0
    reading = reader.read()
    assert reading is not None
    assert reading.seconds == {"GPU-0": pytest.approx({4301: 0.3})}


def test_simulated_process_time_is_empty_before_any_process_used_the_gpu(tmp_path: Path) -> None:
    reader = SimulatedProcessGpuTime({"GPU-0": tmp_path / "never-used"}, clock=lambda: 1.0)
    assert reader.read() is None
    assert reader.read() == ProcessTime(0.0, {"GPU-0": {}})


# --- the flag ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "1.5", "-0.1"])
def test_a_threshold_outside_0_to_1_is_refused_naming_the_flag(value: str) -> None:
    args = build_parser().parse_args(["--node-name", "n", "--unaccounted-threshold", value])
    with pytest.raises(StartupError, match=r"^--unaccounted-threshold .*: expected a share of GPU time in \(0, 1\]"):
        start_arbiter(args)


def test_the_threshold_defaults_to_five_points() -> None:
    assert build_parser().parse_args(["--node-name", "n"]).unaccounted_threshold == 0.05


# --- the wiring -------------------------------------------------------------------------------

def test_the_agent_audits_with_nvml_on_real_gpus_and_the_simulated_account_where_simulated(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--node-name", "n", "--unaccounted-threshold", "0.1"])
    arbiter = types.SimpleNamespace(usage=charges)
    nvml = NvmlGpus(str(tmp_path), nvml=nvml_with_utilisation({}, {}))  # type: ignore[arg-type]
    audit = usage_audit(args, nvml, None, arbiter, Pods(), warn=lambda *event: None)  # type: ignore[arg-type]
    assert audit is not None
    assert isinstance(audit._gpu, NvmlProcessGpuTime)
    assert audit._threshold == 0.1
    simulated = SimulatedGpus(parse_gpu_spec("1x16GiB:80sm"), "n")
    driver = SimulatedDriver(libcuda="", libnvidia_ml="", gpu_dirs={"GPU-0": str(tmp_path)}, gpu_memory={})
    audit = usage_audit(args, simulated, driver, arbiter, Pods(), warn=lambda *event: None)  # type: ignore[arg-type]
    assert audit is not None
    assert isinstance(audit._gpu, SimulatedProcessGpuTime)
    assert usage_audit(args, simulated, None, arbiter, Pods(), warn=lambda *event: None) is None  # type: ignore[arg-type]
