"""Any NVIDIA GPU, against NVIDIA's own bindings (issue 36, item 2): the node agent's ``NvmlGpus`` with the
real ``pynvml`` loading the simulated ``libnvidia-ml.so.1``, and its SM-count query loading the simulated
``libcuda.so.1``, in a child process (``nvml_agent_probe.py``; pynvml finds the library by its soname,
through ``LD_LIBRARY_PATH``). The simulated GPU takes each model's NVML name (``FASTGSHARE_FAKE_GPU_NAME``)
and an SM count unlike the model table's, so a device that carries it got it from the driver.

The models' table SM counts (NVIDIA data sheets, as in tests/unit/device_plugin/test_nvml_models.py):
L40S 142, GeForce RTX 4090 128, GH200 132, H100 PCIe 114, H200 132.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from device_plugin.cuda_attributes import pci_key
from device_plugin.nvml import UNKNOWN_SM_COUNT, table_sm_count

REPO = Path(__file__).resolve().parents[3]
PROBE = "tests.integration.simgpu.nvml_agent_probe"
UNKNOWN_MODEL = "NVIDIA Quasar Z9 Test"  # no family of the model table matches it
# NVML's name of each model, and an SM count the simulated driver reports (not the table's)
MODELS = [("NVIDIA L40S", 91), ("NVIDIA GeForce RTX 4090", 77), ("NVIDIA GH200 480GB", 66),
          ("NVIDIA H100 PCIe", 57), ("NVIDIA H200", 99), (UNKNOWN_MODEL, 42)]
MEMORY = "48G"
MEMORY_BYTES = 48 * 2**30

# NVML return codes (nvml.h)
SUCCESS, UNINITIALIZED, INVALID_ARGUMENT, NOT_SUPPORTED, INSUFFICIENT_SIZE, TIMEOUT = 0, 1, 2, 3, 7, 10


def run_probe(case: str, simgpu_build: Path, gpu_dir: Path,
              settings: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("FASTGSHARE_")}
    env.update({"LD_LIBRARY_PATH": os.pathsep.join(filter(None, [str(simgpu_build), env.get("LD_LIBRARY_PATH")])),
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
                "FASTGSHARE_FAKE_GPU_DIR": str(gpu_dir), "FASTGSHARE_FAKE_GPU_MEMORY": MEMORY, **settings})
    return subprocess.run([sys.executable, "-m", PROBE, case], capture_output=True, text=True, timeout=120, env=env,
                          cwd=REPO, check=False)


def probe(case: str, simgpu_build: Path, gpu_dir: Path, **settings: str) -> dict[str, Any]:
    done = run_probe(case, simgpu_build, gpu_dir, settings)
    assert done.returncode == 0, done.stderr
    seen: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return seen


def warnings(seen: dict[str, Any]) -> list[str]:
    return [line["message"] for line in seen["log"] if line["level"] == "WARNING"]


@pytest.mark.parametrize(("name", "sms"), MODELS, ids=[name for name, _ in MODELS])
def test_the_agent_takes_the_drivers_sm_count_for_any_model(simgpu_build: Path, gpu_dir: Path, name: str,
                                                             sms: int) -> None:
    seen = probe("agent", simgpu_build, gpu_dir, FASTGSHARE_FAKE_GPU_NAME=name, FASTGSHARE_FAKE_GPU_SMS=str(sms))
    (driver,) = seen["driver"]
    assert seen["devices"] == [{"uuid": driver["uuid"], "index": 0, "model": name, "memory_bytes": MEMORY_BYTES,
                                "sm_count": sms}]
    assert sms != table_sm_count(name)
    assert warnings(seen) == []
    assert seen["event"] is False  # the wait on the registered XID events timed out
    nvml = seen["nvml"]
    assert (nvml["name"], nvml["uuid"], nvml["index"]) == (name, driver["uuid"], 0)
    assert seen["driver_name"] == name  # cuDeviceGetName agrees with NVML
    assert pci_key(nvml["pci_bus_id"]) == driver["pci_bus_id"]
    assert len(nvml["pci_bus_id"].split(":")[0]) == 8  # NVML's 8-digit domain
    assert pci_key(nvml["pci_bus_id_legacy"]) == driver["pci_bus_id"]


@pytest.mark.parametrize(("name", "expected"), [("NVIDIA H100 PCIe", 114), (UNKNOWN_MODEL, UNKNOWN_SM_COUNT)])
def test_without_the_driver_the_table_decides_and_an_unknown_model_still_runs(
        simgpu_build: Path, gpu_dir: Path, tmp_path: Path, name: str, expected: int) -> None:
    seen = probe("agent", simgpu_build, gpu_dir, FASTGSHARE_FAKE_GPU_NAME=name,
                 FASTGSHARE_LIBCUDA=str(tmp_path / "no-libcuda.so.1"))
    assert [(d["model"], d["sm_count"]) for d in seen["devices"]] == [(name, expected)]
    cannot_tell = [line for line in warnings(seen) if "cannot tell the SM count" in line]
    assert len(cannot_tell) == (1 if name == UNKNOWN_MODEL else 0)


def test_a_gpu_in_mig_mode_is_left_out_with_one_line(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe("agent", simgpu_build, gpu_dir, FASTGSHARE_FAKE_GPU_NAME="NVIDIA H100 PCIe",
                 FASTGSHARE_FAKE_GPU_MIG="1")
    assert seen["devices"] == []
    (line,) = [line["message"] for line in seen["log"]]
    assert "MIG mode" in line
    assert seen["nvml"]["uuid"] in line
    assert "NVIDIA H100 PCIe" in line


def test_a_mig_capable_gpu_with_mig_off_is_shared(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe("agent", simgpu_build, gpu_dir, FASTGSHARE_FAKE_GPU_NAME="NVIDIA H200", FASTGSHARE_FAKE_GPU_MIG="0",
                 FASTGSHARE_FAKE_GPU_SMS="99")
    assert [(d["model"], d["sm_count"]) for d in seen["devices"]] == [("NVIDIA H200", 99)]


@pytest.mark.parametrize(("mig", "code", "modes"), [("", NOT_SUPPORTED, [0, 0]), ("0", SUCCESS, [0, 0]),
                                                    ("1", SUCCESS, [1, 1])])
def test_nvml_answers_with_its_documented_codes(simgpu_build: Path, gpu_dir: Path, mig: str, code: int,
                                                modes: list[int]) -> None:
    seen = probe("codes", simgpu_build, gpu_dir, FASTGSHARE_FAKE_GPU_MIG=mig)
    assert seen["before_init"] == UNINITIALIZED
    assert (seen["name_short"], seen["uuid_short"]) == (INSUFFICIENT_SIZE, INSUFFICIENT_SIZE)
    assert seen["name_bad_handle"] == INVALID_ARGUMENT
    assert (seen["register_ecc"], seen["register_xid"]) == (NOT_SUPPORTED, SUCCESS)
    assert (seen["wait"], seen["wait_no_data"]) == (TIMEOUT, INVALID_ARGUMENT)
    assert seen["mig"] == code
    if code == SUCCESS:
        assert seen["mig_modes"] == modes
    assert seen["attributes"] == NOT_SUPPORTED  # NVML answers it for MIG instances only
    assert seen["free"] == SUCCESS


@pytest.mark.parametrize(("setting", "value", "allowed"), [
    ("FASTGSHARE_FAKE_GPU_NAME", "x" * 96, "1 to 95 printable ASCII characters"),
    ("FASTGSHARE_FAKE_GPU_MIG", "on", "0 (MIG off) or 1 (MIG on)"),
])
def test_a_bad_setting_is_refused_with_one_line(simgpu_build: Path, gpu_dir: Path, setting: str, value: str,
                                                allowed: str) -> None:
    done = run_probe("agent", simgpu_build, gpu_dir, {setting: value})
    assert done.returncode != 0
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("fake libnvidia-ml:")]
    assert f"{setting}={value} is not" in line
    assert allowed in line
    assert "NVML failed to initialise" in done.stderr


def test_the_driver_refuses_a_bad_name_with_one_line(simgpu_build: Path, gpu_dir: Path) -> None:
    env = {**os.environ, "LD_LIBRARY_PATH": str(simgpu_build), "FASTGSHARE_FAKE_GPU_DIR": str(gpu_dir),
           "PYTHONPATH": str(REPO), "FASTGSHARE_FAKE_GPU_NAME": "tab\there"}
    done = subprocess.run([sys.executable, "-m", "device_plugin.cuda_attributes"], capture_output=True, text=True,
                          timeout=60, env=env, cwd=REPO, check=False)
    assert done.returncode != 0
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("fake libcuda:")]
    assert line == ("fake libcuda: FASTGSHARE_FAKE_GPU_NAME=tab\there is not a GPU name: "
                    "1 to 95 printable ASCII characters")
