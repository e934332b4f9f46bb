"""Any NVIDIA GPU: the SM count from the CUDA driver, else NVML, else the model table; an unknown
model never stops the agent; a GPU in MIG mode is left out of sharing.

NVML is a fake pynvml module (as in test_host_side.py), naming GPUs as NVML names them; the driver
is a fake answer, or the simulated ``libcuda.so.1`` where the build made it. SM counts of the models:
L40S 142, GeForce RTX 4090 128, GH200 132 (its H100), H100 PCIe 114, H200 132 (NVIDIA data sheets).
"""

from __future__ import annotations

import logging
import os
import types
from pathlib import Path
from typing import Any

import pytest

from device_plugin.cuda_attributes import CudaUnavailable, DriverDevice, driver_devices, pci_key, uuid_text
from device_plugin.nvml import UNKNOWN_SM_COUNT, NvmlGpus, table_sm_count

REPO = Path(__file__).resolve().parents[3]

# NVML's names (nvmlDeviceGetName) of the models the issue names, and their SM counts.
MODELS = [("NVIDIA L40S", 142), ("NVIDIA GeForce RTX 4090", 128), ("NVIDIA GH200 480GB", 132),
          ("NVIDIA H100 PCIe", 114), ("NVIDIA H200", 132)]


class FakeNvmlError(Exception):
    def __init__(self, value: int = 0) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


NOT_SUPPORTED = 3


def fake_nvml(names: list[str], *, mig: frozenset[int] = frozenset(),
              attributes: dict[int, int] | None = None) -> Any:
    """A stand-in for pynvml with one GPU per name: handle i, UUID GPU-0000000i-..., PCI bus i+1.
    ``nvmlDeviceGetAttributes_v2`` answers only for the indices in ``attributes`` (NVML answers only
    for MIG instances); ``nvmlDeviceGetMigMode`` says enabled for the indices in ``mig``."""
    answers = attributes or {}
    module = types.SimpleNamespace(NVMLError=FakeNvmlError, NVML_ERROR_TIMEOUT=10, nvmlEventTypeXidCriticalError=8,
                                   NVML_ERROR_NOT_FOUND=6, NVML_SUCCESS=0)
    module.utilisation_asked = []

    def process_utilisation(handle: int, since_us: int) -> list[object]:
        module.utilisation_asked.append(handle)
        raise FakeNvmlError(module.NVML_ERROR_NOT_FOUND)

    def attributes_v2(handle: int) -> object:
        if handle not in answers:
            raise FakeNvmlError(NOT_SUPPORTED)
        return types.SimpleNamespace(multiprocessorCount=answers[handle])

    module.nvmlInit = lambda: None
    module.nvmlShutdown = lambda: None
    module.nvmlDeviceGetCount = lambda: len(names)
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetUUID = lambda handle: f"GPU-{handle:08x}-1111-2222-3333-444444444444".encode()
    module.nvmlDeviceGetName = lambda handle: names[handle].encode()
    module.nvmlDeviceGetPciInfo = lambda handle: types.SimpleNamespace(busId=f"00000000:{handle + 1:02X}:00.0".encode())
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(total=48 * 2**30)
    module.nvmlDeviceGetMigMode = lambda handle: (1, 1) if handle in mig else (0, 0)
    module.nvmlDeviceGetAttributes_v2 = attributes_v2
    module.nvmlDeviceGetProcessUtilization = process_utilisation
    module.nvmlEventSetCreate = lambda: "event-set"
    module.nvmlDeviceRegisterEvents = lambda handle, kind, event_set: None
    module.nvmlEventSetFree = lambda event_set: None
    return module


def no_driver() -> tuple[DriverDevice, ...]:
    raise CudaUnavailable("cannot load libcuda.so.1: libcuda.so.1: cannot open shared object file")


def gpus(names: list[str], tmp_path: Path, **options: object) -> NvmlGpus:
    driver = options.pop("driver", no_driver)
    return NvmlGpus(str(tmp_path), nvml=fake_nvml(names, **options), driver=driver)  # type: ignore[arg-type]


def test_the_driver_tells_the_sm_count_matched_by_uuid(tmp_path: Path) -> None:
    names = [name for name, _ in MODELS] + ["NVIDIA B300 SXM6 AC"]  # the last one no table knows
    counts = [sms for _, sms in MODELS] + [160]

    def driver() -> tuple[DriverDevice, ...]:  # in another order than NVML's, as CUDA_DEVICE_ORDER may be
        return tuple(DriverDevice(f"GPU-{i:08x}-1111-2222-3333-444444444444", f"0000:{0x80 + i:02x}:00.0", sms)
                     for i, sms in reversed(list(enumerate(counts))))

    assert [(d.model, d.sm_count) for d in gpus(names, tmp_path, driver=driver).devices()] == list(zip(names, counts,
                                                                                                       strict=True))


def test_the_driver_is_matched_by_pci_bus_id_when_the_uuids_differ(tmp_path: Path) -> None:
    def driver() -> tuple[DriverDevice, ...]:
        return (DriverDevice("GPU-ffffffff-0000-0000-0000-000000000000", pci_key("0000:02:00.0"), 114),)

    devices = gpus(["NVIDIA H200", "NVIDIA H100 PCIe"], tmp_path, driver=driver).devices()
    assert [d.sm_count for d in devices] == [132, 114]  # the H200 from the table, the H100 PCIe from the driver


def test_nvml_tells_where_the_driver_cannot(tmp_path: Path) -> None:
    assert [d.sm_count for d in gpus(["NVIDIA L40S"], tmp_path, attributes={0: 140}).devices()] == [140]


@pytest.mark.parametrize(("name", "sms"), MODELS)
def test_without_driver_and_nvml_the_table_knows_the_model(tmp_path: Path, name: str, sms: int) -> None:
    assert [d.sm_count for d in gpus([name], tmp_path).devices()] == [sms]


@pytest.mark.parametrize(("name", "sms"), [("Tesla V100-PCIE-16GB", 80), ("NVIDIA H100 80GB HBM3", 132),
                                           ("NVIDIA H100 NVL", 132), ("NVIDIA RTX A6000", 84), ("NVIDIA L40", 142),
                                           ("NVIDIA A100-SXM4-80GB", 108), ("NVIDIA A10", 72), ("NVIDIA A10G", None)])
def test_the_table_takes_the_longest_family_in_the_name(name: str, sms: int | None) -> None:
    assert table_sm_count(name) == sms


def test_an_unknown_model_does_not_stop_the_agent(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="device_plugin.nvml"):
        devices = gpus(["NVIDIA Hypothetical X9", "NVIDIA H200"], tmp_path).devices()
    assert [(d.model, d.sm_count) for d in devices] == [("NVIDIA Hypothetical X9", UNKNOWN_SM_COUNT),
                                                        ("NVIDIA H200", 132)]
    about_it = [r.getMessage() for r in caplog.records if "Hypothetical" in r.getMessage()]
    assert len(about_it) == 1
    assert "cannot tell the SM count" in about_it[0]


def test_a_gpu_in_mig_mode_is_left_out_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    module = fake_nvml(["NVIDIA H200", "NVIDIA H100 PCIe", "NVIDIA L40S"], mig=frozenset({1}))
    with caplog.at_level(logging.INFO, logger="device_plugin.nvml"):
        found = NvmlGpus(str(tmp_path), nvml=module, driver=no_driver)
    assert [(d.index, d.model) for d in found.devices()] == [(0, "NVIDIA H200"), (2, "NVIDIA L40S")]
    assert set(found.process_seconds(0, 1.0)) == {d.uuid for d in found.devices()}
    assert module.utilisation_asked == [0, 2]  # the MIG GPU's handle is not read either
    about_it = [r.getMessage() for r in caplog.records if "MIG" in r.getMessage()]
    assert len(about_it) == 1
    assert "GPU 1 GPU-00000001-1111-2222-3333-444444444444 (NVIDIA H100 PCIe) is in MIG mode" in about_it[0]


def test_only_mig_gpus_means_no_gpus_to_share_and_no_driver_query(tmp_path: Path) -> None:
    def driver() -> tuple[DriverDevice, ...]:
        raise AssertionError("the driver was asked for GPUs nobody shares")

    assert gpus(["NVIDIA H200"], tmp_path, mig=frozenset({0}), driver=driver).devices() == ()


@pytest.mark.parametrize(("given", "key"), [("00000000:65:00.0", "0000:65:00.0"), ("0000:65:00.0", "0000:65:00.0"),
                                            ("0000:C1:00.0", "0000:c1:00.0"), ("0001:0a:1f", "0001:0a:1f.0"),
                                            ("garbage", "garbage")])
def test_pci_bus_ids_in_one_spelling(given: str, key: str) -> None:
    assert pci_key(given) == key


def test_uuid_bytes_are_written_as_nvml_writes_them() -> None:
    raw = bytes.fromhex("b14ad8224a28499da0500632e5803738")
    assert uuid_text(raw) == "GPU-b14ad822-4a28-499d-a050-0632e5803738"


def test_a_node_without_the_driver_is_one_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with pytest.raises(CudaUnavailable, match=r"cannot load .*/no/libcuda\.so\.1"):
        driver_devices(str(tmp_path / "no" / "libcuda.so.1"))
