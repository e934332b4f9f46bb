"""Hook installation, device state fan-out, simulated GPUs and the NVML adapter (fake module)."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from device_plugin.devices import DeviceState
from device_plugin.discovery import HealthEvent, SimulatedGpus
from device_plugin.hook_install import HookInstallError, install_hook
from device_plugin.nvml import NvmlGpus, NvmlUnavailable
from fastgshare.inventory import parse_gpu_spec

ELF = b"\x7fELF" + b"\x00" * 60


def test_hook_installs_under_a_content_versioned_name(tmp_path: Path) -> None:
    source = tmp_path / "hook.so"
    source.write_bytes(ELF + b"v1")
    first = install_hook(source, tmp_path / "lib")
    assert first.name.startswith("libfastgshare-hook.")
    assert first.suffix == ".so"
    assert first.read_bytes() == ELF + b"v1"
    assert install_hook(source, tmp_path / "lib") == first  # idempotent
    source.write_bytes(ELF + b"v2")
    second = install_hook(source, tmp_path / "lib")
    assert second != first
    assert first.read_bytes() == ELF + b"v1"  # the old version stays for running containers
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == sorted([first.name, second.name])


@pytest.mark.parametrize(("content", "message"), [(None, "cannot read hook library"),
                                                  (b"#!/bin/sh\n", "is not an ELF shared object")])
def test_hook_install_errors(tmp_path: Path, content: bytes | None, message: str) -> None:
    source = tmp_path / "hook.so"
    if content is not None:
        source.write_bytes(content)
    with pytest.raises(HookInstallError, match=message):
        install_hook(source, tmp_path / "lib")


def test_device_state_fans_out_changes_to_every_subscriber() -> None:
    gpus = parse_gpu_spec("2x8GiB:10sm").devices()
    state = DeviceState("n", gpus, slots_per_gpu=2)
    first, second = state.subscribe(), state.subscribe()
    assert [s.id for s in first.get_nowait()] == ["GPU-fake-0::0", "GPU-fake-0::1", "GPU-fake-1::0", "GPU-fake-1::1"]
    second.get_nowait()
    assert state.set_health("GPU-fake-1", False)
    assert not state.set_health("GPU-fake-1", False)  # no change, no message
    assert not state.set_health("GPU-unknown", False)
    for updates in (first, second):
        assert [s.health for s in updates.get_nowait()] == ["Healthy", "Healthy", "Unhealthy", "Unhealthy"]
        assert updates.empty()
    state.unsubscribe(first)
    state.set_health("GPU-fake-1", True)
    assert first.empty()
    assert not second.empty()
    assert state.inventory().advertised_slots == 4


def test_simulated_gpus_are_stable_per_node_and_flip_health() -> None:
    spec = parse_gpu_spec("2x80GiB:132sm")
    a, again, b = SimulatedGpus(spec, "node-a"), SimulatedGpus(spec, "node-a"), SimulatedGpus(spec, "node-b")
    assert a.devices() == again.devices()
    assert {g.uuid for g in a.devices()}.isdisjoint({g.uuid for g in b.devices()})
    assert a.next_event(0.01) is None
    a.set_health(a.devices()[0].uuid, False, "XID 48")
    assert a.next_event(0.01) == HealthEvent(a.devices()[0].uuid, False, "XID 48")
    with pytest.raises(KeyError):
        a.set_health("nope", False)


class FakeNvmlError(Exception):
    def __init__(self, value: int = 0) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


def fake_nvml(*, init_fails: bool = False, attributes: bool = True, events: list[tuple[int, str]] | None = None):
    """A stand-in for the pynvml module with two V100s, faithful to the calls the adapter makes."""
    pending = list(events or [])
    module = types.SimpleNamespace(NVMLError=FakeNvmlError, NVML_ERROR_TIMEOUT=10, nvmlEventTypeXidCriticalError=8)
    module.calls = []

    def init() -> None:
        if init_fails:
            raise FakeNvmlError(9)

    def attributes_v2(handle: int) -> object:
        if not attributes:
            raise FakeNvmlError(3)
        return types.SimpleNamespace(multiprocessorCount=80)

    def wait(event_set: object, timeout_ms: int) -> object:
        if not pending:
            raise FakeNvmlError(10)
        xid, uuid = pending.pop(0)
        return types.SimpleNamespace(eventData=xid, device=uuid)

    module.nvmlInit = init
    module.nvmlShutdown = lambda: module.calls.append("shutdown")
    module.nvmlDeviceGetCount = lambda: 2
    module.nvmlDeviceGetHandleByIndex = lambda i: f"GPU-v100-{i}"
    module.nvmlDeviceGetUUID = lambda handle: handle.encode()
    module.nvmlDeviceGetName = lambda handle: b"Tesla V100-PCIE-16GB"
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(total=16_945_512_448)
    module.nvmlDeviceGetAttributes_v2 = attributes_v2
    module.nvmlEventSetCreate = lambda: "event-set"
    module.nvmlDeviceRegisterEvents = lambda handle, kind, event_set: None
    module.nvmlEventSetWait_v2 = wait
    module.nvmlEventSetFree = lambda event_set: module.calls.append("free")
    return module


def test_nvml_devices(tmp_path: Path) -> None:
    (tmp_path / "control").touch()
    gpus = NvmlGpus(str(tmp_path), nvml=fake_nvml())  # type: ignore[arg-type]
    devices = gpus.devices()
    assert [(d.uuid, d.index, d.model, d.memory_bytes, d.sm_count, d.mps_enabled) for d in devices] == [
        ("GPU-v100-0", 0, "Tesla V100-PCIE-16GB", 16_945_512_448, 80, True),
        ("GPU-v100-1", 1, "Tesla V100-PCIE-16GB", 16_945_512_448, 80, True),
    ]


def test_nvml_sm_count_falls_back_to_the_model_table(tmp_path: Path) -> None:
    gpus = NvmlGpus(str(tmp_path), nvml=fake_nvml(attributes=False))  # type: ignore[arg-type]
    assert {d.sm_count for d in gpus.devices()} == {80}
    assert {d.mps_enabled for d in gpus.devices()} == {False}  # no MPS control pipe


def test_nvml_critical_xids_mark_unhealthy_application_xids_do_not(tmp_path: Path) -> None:
    module = fake_nvml(events=[(31, "GPU-v100-0"), (79, "GPU-v100-1")])
    gpus = NvmlGpus(str(tmp_path), nvml=module)  # type: ignore[arg-type]
    assert gpus.next_event(0.1) is None  # XID 31: the application's page fault
    assert gpus.next_event(0.1) == HealthEvent("GPU-v100-1", healthy=False, reason="critical XID 79")
    assert gpus.next_event(0.1) is None  # timeout
    gpus.close()
    assert module.calls == ["free", "shutdown"]


def test_nvml_init_failure_is_reported(tmp_path: Path) -> None:
    with pytest.raises(NvmlUnavailable, match="NVML failed to initialise"):
        NvmlGpus(str(tmp_path), nvml=fake_nvml(init_fails=True))  # type: ignore[arg-type]
