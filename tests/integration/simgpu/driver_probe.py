"""A driver-API program for test_entry_points.py: it loads the simulated ``libcuda.so.1`` with ctypes,
runs one case and prints one JSON object of what it saw.

``python driver_probe.py CASE [ARG]``, with the library's path in ``SIMGPU_DRIVER`` and the simulated
GPU in ``FASTGSHARE_FAKE_GPU_DIR``. It asserts nothing: the test does, on the JSON. A driver call
that a case needs to go on and that fails ends the program with one line naming it.
"""

from __future__ import annotations

import ctypes as C
import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

lib = C.CDLL(os.environ["SIMGPU_DRIVER"])

NOT_SUPPORTED = 801
PER_THREAD = 2  # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
NEWEST = 13050  # a cudaVersion newer than every ABI of the 13.0 headers


def need(result: int, what: str) -> None:
    if result != 0:
        raise SystemExit(f"driver_probe: {what} returned CUresult {result}")


def u64(value: int) -> C.c_uint64:
    return C.c_uint64(value)


def size(value: int) -> C.c_size_t:
    return C.c_size_t(value)


def gpa(name: str, version: int, flags: int) -> tuple[int, int, int]:
    """cuGetProcAddress_v2: (result, symbol status, the pointer or 0)."""
    fn, status = C.c_void_p(), C.c_int(-1)
    result = lib.cuGetProcAddress_v2(name.encode(), C.byref(fn), version, u64(flags), C.byref(status))
    return result, status.value, fn.value or 0


def init_with_primary_context() -> C.c_void_p:
    need(lib.cuInit(0), "cuInit")
    ctx = C.c_void_p()
    need(lib.cuDevicePrimaryCtxRetain(C.byref(ctx), 0), "cuDevicePrimaryCtxRetain")
    need(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    return ctx


def alloc(nbytes: int) -> int:
    ptr = C.c_uint64()
    need(lib.cuMemAlloc_v2(C.byref(ptr), size(nbytes)), "cuMemAlloc_v2")
    return ptr.value


def pattern(nbytes: int, seed: int = 0) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(nbytes))


def read_list(path: str) -> list[tuple[str, str, list[str], list[str]]]:
    entries = []
    for line in Path(path).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        base, kind, abis, names = ([*line.split("\t"), "", ""])[:4]
        entries.append((base, kind, [a for a in abis.split(",") if a], [n for n in names.split(",") if n]))
    return entries


# --- cases ------------------------------------------------------------------------------------


def case_resolve(list_path: str) -> dict[str, Any]:
    """Every base name of the list through cuGetProcAddress (both ABIs, every version, both stream
    flags) and every exported name through dlsym; names the driver API lacks."""
    need(lib.cuInit(0), "cuInit")
    entries = read_list(list_path)
    failures: list[str] = []
    abis_checked = names_checked = 0
    for base, _, abis, names in entries:
        for flags in (0, PER_THREAD):
            result, status, fn = gpa(base, NEWEST, flags)
            if (result, status) != (0, 0) or fn == 0:
                failures.append(f"{base} flags={flags}: result {result} status {status} fn {fn:#x}")
        for abi in abis:
            since, _, suffix = abi.partition("_")
            result, status, fn = gpa(base, int(since), PER_THREAD if suffix else 0)
            abis_checked += 1
            if (result, status) != (0, 0) or fn == 0:
                failures.append(f"{base}@{abi}: result {result} status {status}")
        legacy = C.c_void_p()
        if lib.cuGetProcAddress(base.encode(), C.byref(legacy), NEWEST, u64(0)) != 0 or not legacy.value:
            failures.append(f"{base}: legacy cuGetProcAddress")
        for name in names:
            names_checked += 1
            try:
                getattr(lib, name)
            except AttributeError:
                failures.append(f"dlsym {name}")
    unknown = {name: list(gpa(name, NEWEST, 0)) for name in ("cuNoSuchEntryPoint", "cuMemAlloc_v2", "cudaMalloc")}
    return {
        "bases": len(entries),
        "implemented": sum(1 for e in entries if e[1] == "implemented"),
        "not_supported": sum(1 for e in entries if e[1] == "not-supported"),
        "abis_checked": abis_checked,
        "names_checked": names_checked,
        "failures": failures,
        "unknown": unknown,
        "bad_flags": gpa("cuInit", NEWEST, 4)[0],
    }


def case_stubs(list_path: str) -> dict[str, Any]:
    """A sample of the not-supported entry points, called (without arguments: they take none)
    through cuGetProcAddress and by name; cuGetExportTable."""
    need(lib.cuInit(0), "cuInit")
    stubs = [e for e in read_list(list_path) if e[1] == "not-supported"]
    named = {"cuTexRefCreate", "cuGraphicsGLRegisterBuffer", "cuIpcGetMemHandle", "cuLogsCurrent", "cuDeviceGetLuid"}
    sample = [e for i, e in enumerate(stubs) if i % 7 == 0 or e[0] in named]
    through_gpa: dict[str, int] = {}
    by_name: dict[str, int] = {}
    for base, _, _, names in sample:
        _, _, fn = gpa(base, NEWEST, 0)
        through_gpa[base] = C.CFUNCTYPE(C.c_int)(fn)() if fn else -1
        for name in names:
            by_name[name] = getattr(lib, name)()
    table = C.c_void_p(0xDEAD)
    uuid = (C.c_ubyte * 16)()
    export = lib.cuGetExportTable(C.byref(table), uuid)
    return {"through_gpa": through_gpa, "by_name": by_name, "export_table": [export, table.value or 0]}


def case_attributes() -> dict[str, Any]:
    """Every attribute number from -1 to 199; the other device queries."""
    need(lib.cuInit(0), "cuInit")
    answers: dict[str, list[int]] = {}
    for attribute in range(-1, 200):
        value = C.c_int(-12345)
        answers[str(attribute)] = [lib.cuDeviceGetAttribute(C.byref(value), attribute, 0), value.value]
    major, minor = C.c_int(), C.c_int()
    need(lib.cuDeviceComputeCapability(C.byref(major), C.byref(minor), 0), "cuDeviceComputeCapability")
    prop = (C.c_int * 14)()  # CUdevprop: 14 ints
    need(lib.cuDeviceGetProperties(prop, 0), "cuDeviceGetProperties")
    bus_id = C.create_string_buffer(32)
    need(lib.cuDeviceGetPCIBusId(bus_id, 32, 0), "cuDeviceGetPCIBusId")
    device = C.c_int(-1)
    by_bus = lib.cuDeviceGetByPCIBusId(C.byref(device), bus_id.value)
    other_bus = lib.cuDeviceGetByPCIBusId(C.byref(C.c_int()), b"0000:41:00.0")
    peer = C.c_int(-1)
    need(lib.cuDeviceCanAccessPeer(C.byref(peer), 0, 0), "cuDeviceCanAccessPeer")
    return {
        "answers": answers,
        "capability": [major.value, minor.value],
        "properties": list(prop),
        "bus_id": bus_id.value.decode(),
        "by_bus_id": [by_bus, device.value],
        "other_bus_id": other_bus,
        "can_access_peer": peer.value,
        "p2p_attribute": lib.cuDeviceGetP2PAttribute(C.byref(C.c_int()), 1, 0, 0),
        "bad_device": lib.cuDeviceGetAttribute(C.byref(C.c_int()), 16, 1),
    }


def roundtrip_linear(results: dict[str, Any]) -> None:
    nbytes = 1 << 16
    a, b = alloc(nbytes), alloc(nbytes)
    data = pattern(nbytes)
    need(lib.cuMemcpyHtoD_v2(u64(a), data, size(nbytes)), "cuMemcpyHtoD_v2")
    need(lib.cuMemcpyDtoD_v2(u64(b), u64(a), size(nbytes)), "cuMemcpyDtoD_v2")
    need(lib.cuMemsetD8_v2(u64(b + 100), C.c_ubyte(0xAB), size(10)), "cuMemsetD8_v2")
    need(lib.cuMemsetD16_v2(u64(b + 200), C.c_ushort(0x1234), size(4)), "cuMemsetD16_v2")
    need(lib.cuMemsetD32_v2(u64(b + 400), C.c_uint(0xDEADBEEF), size(3)), "cuMemsetD32_v2")
    out = C.create_string_buffer(nbytes)
    need(lib.cuMemcpyDtoH_v2(out, u64(b), size(nbytes)), "cuMemcpyDtoH_v2")
    expected = bytearray(data)
    expected[100:110] = b"\xab" * 10
    expected[200:208] = (0x1234).to_bytes(2, "little") * 4
    expected[400:412] = (0xDEADBEEF).to_bytes(4, "little") * 3
    results["linear"] = out.raw == bytes(expected)
    unified = C.create_string_buffer(nbytes)  # cuMemcpy (unified) device -> host, per-thread ABI
    need(lib.cuMemcpy_ptds(u64(C.addressof(unified)), u64(a), size(nbytes)), "cuMemcpy_ptds")
    results["unified"] = unified.raw == data
    results["past_the_end"] = lib.cuMemcpyHtoD_v2(u64(a + nbytes - 10), data, size(100))
    results["unknown_device_pointer"] = lib.cuMemcpyDtoH_v2(out, u64(0x1000), size(16))
    results["misaligned_d32"] = lib.cuMemsetD32_v2(u64(a + 2), C.c_uint(0), size(1))
    results["null_host"] = lib.cuMemcpyHtoD_v2(u64(a), None, size(16))


def roundtrip_async(results: dict[str, Any]) -> None:
    nbytes = 4096
    a = alloc(nbytes)
    data = pattern(nbytes, seed=3)
    need(lib.cuMemcpyHtoDAsync_v2(u64(a), data, size(nbytes), None), "cuMemcpyHtoDAsync_v2")
    need(lib.cuMemsetD8Async_ptsz(u64(a), C.c_ubyte(1), size(8), None), "cuMemsetD8Async_ptsz")
    out = C.create_string_buffer(nbytes)  # pageable: complete when the call returns
    need(lib.cuMemcpyDtoHAsync_v2_ptsz(out, u64(a), size(nbytes), None), "cuMemcpyDtoHAsync_v2_ptsz")
    results["async"] = out.raw == b"\x01" * 8 + data[8:]
    stream, pinned_in, pinned_out = C.c_void_p(), C.c_void_p(), C.c_void_p()
    need(lib.cuStreamCreate(C.byref(stream), 0), "cuStreamCreate")
    need(lib.cuMemAllocHost_v2(C.byref(pinned_in), size(nbytes)), "cuMemAllocHost_v2")
    need(lib.cuMemAllocHost_v2(C.byref(pinned_out), size(nbytes)), "cuMemAllocHost_v2")
    C.memmove(pinned_in, data, nbytes)
    for _ in range(20):  # queued in order on the stream: copy in, overwrite the head, copy out
        need(lib.cuMemcpyHtoDAsync_v2(u64(a), pinned_in, size(nbytes), stream), "cuMemcpyHtoDAsync_v2 (pinned)")
        need(lib.cuMemsetD32Async(u64(a), C.c_uint(0x05050505), size(4), stream), "cuMemsetD32Async")
        need(lib.cuMemcpyDtoHAsync_v2(pinned_out, u64(a), size(nbytes), stream), "cuMemcpyDtoHAsync_v2 (pinned)")
    need(lib.cuStreamSynchronize(stream), "cuStreamSynchronize")
    results["async_pinned_in_order"] = C.string_at(pinned_out, nbytes) == b"\x05" * 16 + data[16:]
    need(lib.cuStreamDestroy_v2(stream), "cuStreamDestroy_v2")


class Memcpy2D(C.Structure):
    """CUDA_MEMCPY2D."""

    _fields_ = [
        ("srcXInBytes", C.c_size_t), ("srcY", C.c_size_t), ("srcMemoryType", C.c_int), ("srcHost", C.c_void_p),
        ("srcDevice", C.c_uint64), ("srcArray", C.c_void_p), ("srcPitch", C.c_size_t),
        ("dstXInBytes", C.c_size_t), ("dstY", C.c_size_t), ("dstMemoryType", C.c_int), ("dstHost", C.c_void_p),
        ("dstDevice", C.c_uint64), ("dstArray", C.c_void_p), ("dstPitch", C.c_size_t),
        ("WidthInBytes", C.c_size_t), ("Height", C.c_size_t),
    ]


class ArrayDescriptor(C.Structure):
    """CUDA_ARRAY_DESCRIPTOR."""

    _fields_ = [("Width", C.c_size_t), ("Height", C.c_size_t), ("Format", C.c_int), ("NumChannels", C.c_uint)]


HOST, DEVICE = 1, 2  # CUmemorytype


def roundtrip_2d(results: dict[str, Any]) -> None:
    width, height = 100, 6
    dptr, pitch = C.c_uint64(), C.c_size_t()
    need(lib.cuMemAllocPitch_v2(C.byref(dptr), C.byref(pitch), size(width), size(height), 4), "cuMemAllocPitch_v2")
    host = C.create_string_buffer(pattern(width * height, seed=5), width * height)
    to_device = Memcpy2D(srcMemoryType=HOST, srcHost=C.addressof(host), srcPitch=width, dstMemoryType=DEVICE,
                         dstDevice=dptr.value, dstPitch=pitch.value, WidthInBytes=width, Height=height)
    need(lib.cuMemcpy2D_v2(C.byref(to_device)), "cuMemcpy2D_v2 (host to pitched device)")
    need(lib.cuMemsetD2D32_v2(u64(dptr.value + 4), size(pitch.value), C.c_uint(0x01020304), size(2), size(3)),
         "cuMemsetD2D32_v2")
    out = C.create_string_buffer(width * height)
    to_host = Memcpy2D(srcMemoryType=DEVICE, srcDevice=dptr.value, srcPitch=pitch.value, dstMemoryType=HOST,
                       dstHost=C.addressof(out), dstPitch=width, WidthInBytes=width, Height=height)
    need(lib.cuMemcpy2D_v2(C.byref(to_host)), "cuMemcpy2D_v2 (pitched device to host)")
    expected = bytearray(host.raw)
    for row in range(3):
        expected[row * width + 4 : row * width + 12] = (0x01020304).to_bytes(4, "little") * 2
    results["pitch"] = pitch.value
    results["pitched_2d"] = out.raw == bytes(expected)
    to_device.dstPitch = width - 1  # a destination pitch narrower than a row
    results["narrow_pitch"] = lib.cuMemcpy2D_v2(C.byref(to_device))


def roundtrip_array_and_v1(results: dict[str, Any]) -> None:
    array = C.c_void_p()
    descriptor = ArrayDescriptor(Width=64, Height=4, Format=0x01, NumChannels=1)  # CU_AD_FORMAT_UNSIGNED_INT8
    need(lib.cuArrayCreate_v2(C.byref(array), C.byref(descriptor)), "cuArrayCreate_v2")
    data = pattern(256, seed=9)
    need(lib.cuMemcpyHtoA_v2(array, size(0), data, size(256)), "cuMemcpyHtoA_v2")
    out = C.create_string_buffer(256)
    need(lib.cuMemcpyAtoH_v2(out, array, size(0), size(256)), "cuMemcpyAtoH_v2")
    results["array"] = out.raw == data
    results["array_overrun"] = lib.cuMemcpyHtoA_v2(array, size(200), data, size(100))
    need(lib.cuArrayDestroy(array), "cuArrayDestroy")
    v1 = C.c_uint()
    need(lib.cuMemAlloc(C.byref(v1), C.c_uint(4096)), "cuMemAlloc (v1)")
    need(lib.cuMemcpyHtoD(v1, data, C.c_uint(256)), "cuMemcpyHtoD (v1)")
    out_v1 = C.create_string_buffer(256)
    need(lib.cuMemcpyDtoH_v2(out_v1, u64(v1.value), size(256)), "cuMemcpyDtoH_v2 of a v1 pointer")
    results["v1_pointer"] = v1.value
    results["v1"] = out_v1.raw == data


class AllocationProp(C.Structure):
    """CUmemAllocationProp (device 0, pinned)."""

    _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("locationType", C.c_int),
                ("locationId", C.c_int), ("win32HandleMetaData", C.c_void_p), ("allocFlags", C.c_ubyte * 8)]


class AccessDesc(C.Structure):
    """CUmemAccessDesc."""

    _fields_ = [("locationType", C.c_int), ("locationId", C.c_int), ("flags", C.c_int)]


GRANULARITY = 2 << 20


def vmm_map(va: int, handle: int) -> None:
    need(lib.cuMemMap(u64(va), size(GRANULARITY), size(0), u64(handle), u64(0)), "cuMemMap")
    access = AccessDesc(locationType=1, locationId=0, flags=3)
    need(lib.cuMemSetAccess(u64(va), size(GRANULARITY), C.byref(access), size(1)), "cuMemSetAccess")


def roundtrip_vmm(results: dict[str, Any]) -> None:
    prop = AllocationProp(type=1, locationType=1, locationId=0)  # pinned, on device 0
    handles = [C.c_uint64(), C.c_uint64()]
    for handle in handles:
        need(lib.cuMemCreate(C.byref(handle), size(GRANULARITY), C.byref(prop), u64(0)), "cuMemCreate")
    first, second = C.c_uint64(), C.c_uint64()
    need(lib.cuMemAddressReserve(C.byref(first), size(2 * GRANULARITY), size(0), u64(0), u64(0)),
         "cuMemAddressReserve")
    need(lib.cuMemAddressReserve(C.byref(second), size(GRANULARITY), size(0), u64(0), u64(0)),
         "cuMemAddressReserve")
    vmm_map(first.value, handles[0].value)
    vmm_map(first.value + GRANULARITY, handles[1].value)
    vmm_map(second.value, handles[0].value)  # the first handle again, elsewhere
    data = pattern(1 << 20, seed=11)
    straddle = first.value + GRANULARITY - (1 << 19)  # half in each mapping
    need(lib.cuMemcpyHtoD_v2(u64(straddle), data, size(len(data))), "cuMemcpyHtoD_v2 across two mappings")
    out = C.create_string_buffer(len(data))
    need(lib.cuMemcpyDtoH_v2(out, u64(straddle), size(len(data))), "cuMemcpyDtoH_v2 across two mappings")
    results["vmm_across_mappings"] = out.raw == data
    alias = C.create_string_buffer(1 << 19)
    need(lib.cuMemcpyDtoH_v2(alias, u64(second.value + GRANULARITY - (1 << 19)), size(1 << 19)),
         "cuMemcpyDtoH_v2 from the second mapping of a handle")
    results["vmm_same_bytes_in_both_mappings"] = alias.raw == data[: 1 << 19]
    need(lib.cuMemUnmap(u64(first.value), size(2 * GRANULARITY)), "cuMemUnmap")
    results["vmm_unmapped"] = lib.cuMemcpyHtoD_v2(u64(first.value), data, size(16))
    need(lib.cuMemUnmap(u64(second.value), size(GRANULARITY)), "cuMemUnmap")
    for handle in handles:
        need(lib.cuMemRelease(handle), "cuMemRelease")
    need(lib.cuMemAddressFree(first, size(2 * GRANULARITY)), "cuMemAddressFree")
    need(lib.cuMemAddressFree(second, size(GRANULARITY)), "cuMemAddressFree")


def case_roundtrip() -> dict[str, Any]:
    """Data written to device memory reads back: linear, stream-ordered, pitched 2D, arrays, v1."""
    init_with_primary_context()
    results: dict[str, Any] = {}
    roundtrip_linear(results)
    roundtrip_async(results)
    roundtrip_2d(results)
    roundtrip_array_and_v1(results)
    roundtrip_vmm(results)
    return results


def attribute(number: int, ptr: int, kind: Any) -> tuple[int, Any]:
    value = kind()
    result = lib.cuPointerGetAttribute(C.byref(value), number, u64(ptr))
    return result, value.value


def case_pointers() -> dict[str, Any]:
    """Pointer attributes of device, managed, page-locked and registered memory, and of a pointer
    the driver does not know; address ranges."""
    ctx = init_with_primary_context()
    dev, other = alloc(1 << 20), alloc(4096)
    managed = C.c_uint64()
    need(lib.cuMemAllocManaged(C.byref(managed), size(8192), 1), "cuMemAllocManaged")
    host = C.c_void_p()
    need(lib.cuMemAllocHost_v2(C.byref(host), size(4096)), "cuMemAllocHost_v2")
    buffer = C.create_string_buffer(8192)
    need(lib.cuMemHostRegister_v2(buffer, size(8192), 0), "cuMemHostRegister_v2")
    inside = dev + 4096
    results: dict[str, Any] = {
        "context": attribute(1, inside, C.c_void_p)[1] == ctx.value,
        "device": {n: attribute(n, inside, C.c_uint64) for n in (2, 3, 8, 9, 11, 12)},
        "device_host_pointer": attribute(4, inside, C.c_void_p)[0],
        "buffer_ids": [attribute(7, dev, C.c_uint64)[1], attribute(7, other, C.c_uint64)[1]],
        "managed": {n: attribute(n, managed.value, C.c_uint64) for n in (2, 4, 8)},
        "host": {n: attribute(n, host.value or 0, C.c_uint64) for n in (2, 3, 4)},
        "registered": attribute(2, C.addressof(buffer) + 10, C.c_uint)[1],
        "unknown": attribute(2, 0x1234, C.c_uint)[0],
        "pointers": {"dev": dev, "inside": inside, "managed": managed.value, "host": host.value or 0},
    }
    mapped = C.c_uint64()
    results["host_device_pointer"] = [lib.cuMemHostGetDevicePointer_v2(C.byref(mapped), host, 0), mapped.value]
    names = (C.c_int * 2)(2, 3)  # MEMORY_TYPE, DEVICE_POINTER of an unknown pointer: zeros, success
    memory_type, device_pointer = C.c_uint(7), C.c_uint64(7)
    data = (C.c_void_p * 2)(C.cast(C.byref(memory_type), C.c_void_p), C.cast(C.byref(device_pointer), C.c_void_p))
    results["attributes_unknown"] = [lib.cuPointerGetAttributes(2, names, data, u64(0x1234)), memory_type.value,
                                     device_pointer.value]
    base, extent = C.c_uint64(), C.c_size_t()
    results["range"] = [lib.cuMemGetAddressRange_v2(C.byref(base), C.byref(extent), u64(inside)), base.value,
                        extent.value]
    results["range_unknown"] = lib.cuMemGetAddressRange_v2(C.byref(base), C.byref(extent), u64(0x1234))
    results["register_twice"] = lib.cuMemHostRegister_v2(buffer, size(100), 0)
    results["unregister"] = [lib.cuMemHostUnregister(buffer), lib.cuMemHostUnregister(buffer)]
    need(lib.cuMemFreeHost(host), "cuMemFreeHost")
    results["freed_host"] = attribute(2, host.value or 0, C.c_uint)[0]
    return results


def case_contexts() -> dict[str, Any]:
    """The primary context's reference count and state; the per-thread context stack."""
    need(lib.cuInit(0), "cuInit")
    results: dict[str, Any] = {}

    def state() -> list[int]:
        flags, active = C.c_uint(), C.c_int()
        need(lib.cuDevicePrimaryCtxGetState(0, C.byref(flags), C.byref(active)), "cuDevicePrimaryCtxGetState")
        return [flags.value, active.value]

    def current() -> int:
        ctx = C.c_void_p()
        need(lib.cuCtxGetCurrent(C.byref(ctx)), "cuCtxGetCurrent")
        return ctx.value or 0

    results["before"] = state()
    results["alloc_without_context"] = lib.cuMemAlloc_v2(C.byref(C.c_uint64()), size(16))
    need(lib.cuDevicePrimaryCtxSetFlags_v2(0, 4), "cuDevicePrimaryCtxSetFlags_v2")
    primary, again = C.c_void_p(), C.c_void_p()
    need(lib.cuDevicePrimaryCtxRetain(C.byref(primary), 0), "cuDevicePrimaryCtxRetain")
    need(lib.cuDevicePrimaryCtxRetain(C.byref(again), 0), "cuDevicePrimaryCtxRetain")
    results["same_handle"] = primary.value == again.value
    results["retained_twice"] = state()
    need(lib.cuCtxPushCurrent_v2(primary), "cuCtxPushCurrent_v2")
    results["current_is_primary"] = current() == primary.value
    ctx_id, version, device = C.c_ulonglong(), C.c_uint(), C.c_int(-1)
    need(lib.cuCtxGetId(None, C.byref(ctx_id)), "cuCtxGetId")
    need(lib.cuCtxGetApiVersion(None, C.byref(version)), "cuCtxGetApiVersion")
    need(lib.cuCtxGetDevice(C.byref(device)), "cuCtxGetDevice")
    results["queries"] = [ctx_id.value > 0, version.value, device.value]
    need(lib.cuCtxSetLimit(0, size(4096)), "cuCtxSetLimit")
    limit = C.c_size_t()
    need(lib.cuCtxGetLimit(C.byref(limit), 0), "cuCtxGetLimit")
    results["stack_limit"] = limit.value
    results["bad_limit"] = lib.cuCtxGetLimit(C.byref(limit), 99)
    least, greatest = C.c_int(), C.c_int()
    need(lib.cuCtxGetStreamPriorityRange(C.byref(least), C.byref(greatest)), "cuCtxGetStreamPriorityRange")
    results["priorities"] = [least.value, greatest.value]
    created = C.c_void_p()
    need(lib.cuCtxCreate_v2(C.byref(created), 0, 0), "cuCtxCreate_v2")
    results["create_pushes"] = current() == created.value
    seen_elsewhere: list[int] = []
    worker = threading.Thread(target=lambda: seen_elsewhere.append(current()))
    worker.start()
    worker.join()
    results["other_thread_current"] = seen_elsewhere
    popped = C.c_void_p()
    need(lib.cuCtxPopCurrent_v2(C.byref(popped)), "cuCtxPopCurrent_v2")
    results["popped_created"] = popped.value == created.value and current() == primary.value
    need(lib.cuCtxPopCurrent_v2(C.byref(popped)), "cuCtxPopCurrent_v2")
    results["popped_primary"] = popped.value == primary.value and current() == 0
    results["pop_empty"] = lib.cuCtxPopCurrent_v2(C.byref(popped))
    results["destroy_primary"] = lib.cuCtxDestroy_v2(primary)
    results["destroy_created"] = [lib.cuCtxDestroy_v2(created), lib.cuCtxPushCurrent_v2(created)]
    need(lib.cuDevicePrimaryCtxRelease_v2(0), "cuDevicePrimaryCtxRelease_v2")
    results["released_once"] = state()
    need(lib.cuDevicePrimaryCtxRelease_v2(0), "cuDevicePrimaryCtxRelease_v2")
    results["released_twice"] = state()
    results["release_again"] = lib.cuDevicePrimaryCtxRelease_v2(0)
    need(lib.cuCtxSetCurrent(None), "cuCtxSetCurrent(NULL) on an empty stack")
    return results


PTX = b""".version 8.0
.target sm_90
.address_size 64
.visible .entry probe_kernel(.param .u64 p)
{
    ret;
}
"""


def case_occupancy() -> dict[str, Any]:
    """The occupancy calculator on a kernel loaded from PTX, and on a handle that is none."""
    init_with_primary_context()
    module, function = C.c_void_p(), C.c_void_p()
    need(lib.cuModuleLoadData(C.byref(module), C.c_char_p(PTX)), "cuModuleLoadData")
    need(lib.cuModuleGetFunction(C.byref(function), module, b"probe_kernel"), "cuModuleGetFunction")
    regs = C.c_int(-1)
    results: dict[str, Any] = {"num_regs": [lib.cuFuncGetAttribute(C.byref(regs), 4, function), regs.value]}
    for block, smem in ((128, 0), (256, 0), (1024, 0), (1025, 0), (256, 100 * 1024)):
        blocks = C.c_int(-1)
        need(lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(C.byref(blocks), function, block, size(smem)),
             "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        results[f"blocks_{block}_{smem}"] = blocks.value
    grid, block_size = C.c_int(), C.c_int()
    need(lib.cuOccupancyMaxPotentialBlockSize(C.byref(grid), C.byref(block_size), function, None, size(0), 0),
         "cuOccupancyMaxPotentialBlockSize")
    results["potential"] = [grid.value, block_size.value]
    per_block = C.c_size_t()
    need(lib.cuOccupancyAvailableDynamicSMemPerBlock(C.byref(per_block), function, 2, 256),
         "cuOccupancyAvailableDynamicSMemPerBlock")
    results["dynamic_smem_for_2"] = per_block.value
    results["bad_handle"] = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(C.byref(C.c_int()), None, 128, size(0))
    results["bad_flags"] = lib.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(
        C.byref(C.c_int()), function, 128, size(0), 7)
    return results


CASES: dict[str, Callable[..., dict[str, Any]]] = {
    "resolve": case_resolve,
    "stubs": case_stubs,
    "attributes": case_attributes,
    "roundtrip": case_roundtrip,
    "pointers": case_pointers,
    "contexts": case_contexts,
    "occupancy": case_occupancy,
}

if __name__ == "__main__":
    print(json.dumps(CASES[sys.argv[1]](*sys.argv[2:])))
