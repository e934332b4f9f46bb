"""The node agent's NVML view of one simulated GPU, for test_nvml_agent.py: NVIDIA's own Python bindings
(``pynvml``, from ``nvidia-ml-py``) load the simulated ``libnvidia-ml.so.1`` and the agent's ``NvmlGpus``
asks it, and the simulated ``libcuda.so.1`` through its child query, as on a node.

``python -m tests.integration.simgpu.nvml_agent_probe CASE``, with the simulated libraries' directory
in ``LD_LIBRARY_PATH`` (pynvml opens ``libnvidia-ml.so.1`` by name, the agent's driver query
``libcuda.so.1``) and the simulated GPU's settings in the environment. Prints one JSON object; it
asserts nothing, the test does. Cases:

* ``agent``: ``NvmlGpus``'s devices, its log records, one ``next_event`` and ``close``; beside them
  what pynvml and the driver query see directly (name, UUID, PCI bus ids).
* ``codes``: NVML's return codes for calls the agent does not make the way that fails (a short
  buffer, an unsupported event type, a bad handle, before ``nvmlInit``).
"""

from __future__ import annotations

import ctypes as C
import json
import logging
import sys
import tempfile
from typing import Any

import pynvml

from device_plugin.cuda_attributes import CudaUnavailable, driver_devices
from device_plugin.nvml import NvmlGpus


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[dict[str, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append({"level": record.levelname, "message": record.getMessage()})


def text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def agent() -> dict[str, Any]:
    records = Records()
    logging.getLogger("device_plugin").addHandler(records)
    logging.getLogger("device_plugin").setLevel(logging.DEBUG)
    with tempfile.TemporaryDirectory() as mps_pipe_dir:  # no MPS control pipe
        gpus = NvmlGpus(mps_pipe_dir)
        devices = [{"uuid": d.uuid, "index": d.index, "model": d.model, "memory_bytes": d.memory_bytes,
                    "sm_count": d.sm_count} for d in gpus.devices()]
        event = gpus.next_event(0.05)
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        seen = {"name": text(pynvml.nvmlDeviceGetName(handle)), "uuid": text(pynvml.nvmlDeviceGetUUID(handle)),
                "pci_bus_id": text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                "pci_bus_id_legacy": text(pynvml.nvmlDeviceGetPciInfo(handle).busIdLegacy),
                "index": pynvml.nvmlDeviceGetIndex(handle)}
        gpus.close()
    try:
        driver = [{"uuid": d.uuid, "pci_bus_id": d.pci_bus_id, "sm_count": d.sm_count} for d in driver_devices()]
    except CudaUnavailable as error:
        driver = [{"error": str(error)}]
    return {"devices": devices, "log": records.lines, "event": event is not None, "nvml": seen, "driver": driver,
            "driver_name": driver_name()}


def driver_name() -> str | None:
    """cuDeviceGetName of the simulated driver (None where it cannot be loaded or initialised)."""
    try:
        cuda = C.CDLL("libcuda.so.1")
    except OSError:
        return None
    name = C.create_string_buffer(256)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetName(name, len(name), 0) != 0:
        return None
    return name.value.decode()


def codes() -> dict[str, Any]:
    lib = C.CDLL("libnvidia-ml.so.1")
    count = C.c_uint()
    before_init = lib.nvmlDeviceGetCount_v2(C.byref(count))
    lib.nvmlInit_v2()
    handle = C.c_void_p()
    lib.nvmlDeviceGetHandleByIndex_v2(0, C.byref(handle))
    short = C.create_string_buffer(4)
    events = C.c_void_p()
    lib.nvmlEventSetCreate(C.byref(events))
    data = C.create_string_buffer(64)  # nvmlEventData_t is 32 bytes
    current, pending = C.c_uint(), C.c_uint()
    answers = {
        "before_init": before_init,
        "name_short": lib.nvmlDeviceGetName(handle, short, 4),
        "uuid_short": lib.nvmlDeviceGetUUID(handle, short, 4),
        "name_bad_handle": lib.nvmlDeviceGetName(C.c_void_p(8), C.create_string_buffer(96), 96),
        "register_ecc": lib.nvmlDeviceRegisterEvents(handle, C.c_ulonglong(2), events),  # double-bit ECC
        "register_xid": lib.nvmlDeviceRegisterEvents(handle, C.c_ulonglong(8), events),
        "wait": lib.nvmlEventSetWait_v2(events, data, 10),
        "wait_no_data": lib.nvmlEventSetWait_v2(events, None, 10),
        "mig": lib.nvmlDeviceGetMigMode(handle, C.byref(current), C.byref(pending)),
        "mig_modes": [current.value, pending.value],
        "attributes": lib.nvmlDeviceGetAttributes_v2(handle, C.create_string_buffer(128)),
        "free": lib.nvmlEventSetFree(events),
    }
    lib.nvmlShutdown()
    return answers


def main() -> int:
    cases = {"agent": agent, "codes": codes}
    print(json.dumps(cases[sys.argv[1]]()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
