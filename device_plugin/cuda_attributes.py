"""The SM count of each GPU as the node's CUDA driver (``libcuda.so.1``) reports it.

NVML has no SM count for a whole GPU (``nvmlDeviceGetAttributes_v2`` answers only for MIG
instances), so the node agent asks the driver: ``cuDeviceGetAttribute`` with
``CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`` (16), each device named by ``cuDeviceGetUuid`` and
``cuDeviceGetPCIBusId`` so the agent can match it to NVML's device.

The driver is loaded in a short-lived child process (``python -m device_plugin.cuda_attributes``,
one JSON object per device on stdout): ``cuInit`` stays out of the long-lived agent, a driver that
hangs is cut off by a timeout, and whatever fails (no ``libcuda.so.1`` in the container, no
``compute`` driver capability, an error) is one reason string, never an exception the agent
must survive. :func:`parse_devices` and :func:`pci_key` are pure.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

import attrs

CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
LIBRARY_ENV = "FASTGSHARE_LIBCUDA"  # the driver library to load (tests: the simulated driver)
DEFAULT_LIBRARY = "libcuda.so.1"
DEFAULT_TIMEOUT_S = 30.0


@attrs.frozen
class DriverDevice:
    """One device as the CUDA driver reports it."""

    uuid: str  # NVML's spelling: "GPU-" and the 16 bytes as 8-4-4-4-12 hex digits
    pci_bus_id: str  # pci_key() form: "dddd:bb:dd.f", lower case
    sm_count: int


class CudaUnavailable(RuntimeError):
    """The driver could not be asked (a reason for the one log line)."""


def uuid_text(raw: bytes) -> str:
    """``cuDeviceGetUuid``'s 16 bytes as NVML writes a GPU's UUID."""
    digits = raw.hex()
    return f"GPU-{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:32]}"


def pci_key(bus_id: str) -> str:
    """A PCI bus id in one spelling: NVML writes an 8-digit domain (``00000000:65:00.0``), CUDA
    a 4-digit one (``0000:65:00.0``); both become ``0000:65:00.0``. Unparsable: as given, lower case."""
    try:
        domain, bus, rest = bus_id.strip().split(":")
        device, function = rest.split(".") if "." in rest else (rest, "0")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{int(function, 16):x}"
    except ValueError:
        return bus_id.strip().lower()


def parse_devices(output: str) -> tuple[DriverDevice, ...]:
    """The child's stdout, one JSON object per line, as devices; a malformed line is an error."""
    devices = []
    for line in output.splitlines():
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            device = DriverDevice(uuid=str(raw["uuid"]), pci_bus_id=pci_key(str(raw["pciBusId"])),
                                  sm_count=int(raw["smCount"]))
        except (ValueError, KeyError, TypeError) as error:
            raise CudaUnavailable(f"unreadable answer from the driver query {line!r}: {error}") from None
        if device.sm_count <= 0:
            raise CudaUnavailable(f"the driver reports {device.sm_count} SMs for {device.uuid}")
        devices.append(device)
    return tuple(devices)


def driver_devices(library: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[DriverDevice, ...]:
    """Every device the driver sees, asked in a child process; :class:`CudaUnavailable` says why not."""
    env = {key: value for key, value in os.environ.items() if key != "CUDA_VISIBLE_DEVICES"}  # all devices
    if library:
        env[LIBRARY_ENV] = library
    try:
        done = subprocess.run([sys.executable, "-m", "device_plugin.cuda_attributes"], env=env, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise CudaUnavailable(f"the CUDA driver did not answer within {timeout_s:g} s") from None
    except OSError as error:
        raise CudaUnavailable(f"cannot run the driver query: {error}") from None
    if done.returncode != 0:
        reason = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise CudaUnavailable(reason[0])
    return parse_devices(done.stdout)


def _check(result: int, call: str) -> None:
    if result != 0:
        raise CudaUnavailable(f"{call} failed with CUresult {result}")


def query(library: str) -> list[dict[str, object]]:
    """Load ``library`` here and ask it (the child's side: it runs ``cuInit``)."""
    try:
        cuda = ctypes.CDLL(library)
    except OSError as error:
        raise CudaUnavailable(f"cannot load {library}: {error}") from None
    _check(cuda.cuInit(0), "cuInit")
    count = ctypes.c_int()
    _check(cuda.cuDeviceGetCount(ctypes.byref(count)), "cuDeviceGetCount")
    devices: list[dict[str, object]] = []
    for ordinal in range(count.value):
        device, sms = ctypes.c_int(), ctypes.c_int()
        uuid, bus_id = ctypes.create_string_buffer(16), ctypes.create_string_buffer(64)
        _check(cuda.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        _check(cuda.cuDeviceGetAttribute(ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device),
               "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")
        _check(cuda.cuDeviceGetUuid(uuid, device), "cuDeviceGetUuid")
        _check(cuda.cuDeviceGetPCIBusId(bus_id, len(bus_id), device), "cuDeviceGetPCIBusId")
        devices.append({"uuid": uuid_text(uuid.raw), "pciBusId": bus_id.value.decode(), "smCount": sms.value})
    return devices


def main() -> int:
    library = os.environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY
    try:
        for device in query(library):
            print(json.dumps(device))
    except CudaUnavailable as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
