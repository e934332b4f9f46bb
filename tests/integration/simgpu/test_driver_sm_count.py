"""The node agent's SM-count query (device_plugin.cuda_attributes: cuDeviceGetAttribute, the UUID and
the PCI bus id, in a short child process) against the simulated driver, built for the test (issue 36,
item 2). The unit tests (tests/unit/device_plugin/test_nvml_models.py) cover the matching and the
fallbacks with fakes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from device_plugin.cuda_attributes import driver_devices, pci_key

REPO = Path(__file__).resolve().parents[3]


def test_the_simulated_driver_answers_through_the_real_query(simgpu_build: Path, gpu_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FASTGSHARE_FAKE_GPU_DIR", str(gpu_dir))
    monkeypatch.setenv("FASTGSHARE_FAKE_GPU_SMS", "114")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    (device,) = driver_devices(str(simgpu_build / "libcuda.so.1"))
    assert device.sm_count == 114
    assert device.uuid.startswith("GPU-")
    assert len(device.uuid) == len("GPU-b14ad822-4a28-499d-a050-0632e5803738")
    assert device.pci_bus_id == pci_key(device.pci_bus_id)
