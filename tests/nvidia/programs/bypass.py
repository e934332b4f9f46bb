"""A program that reaches the driver AROUND the hook, to prove the call-count comparison can fail.

It loads ``libcuda.so.1`` with ctypes (the hook's dlsym answers its lookups of hooked names with the
hook's wrappers) and allocates ``--size`` bytes through the hook; with ``--bypass`` it also takes the
driver's own ``cuMemAlloc_v2`` past the hook (the library's load address plus the symbol's offset
in its ELF dynamic symbol table: no dlsym, dlvsym or cuGetProcAddress involved, so nothing the
hook overrides) and allocates as much again with it. Both pointers are freed through the hook.
Needs no NVIDIA package. Writes one JSON object to ``--out``: ``results`` (the CUresult of each
call, 0 for success) and ``bypassed`` (whether the driver's own function was called).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import struct
import sys
from pathlib import Path

SHT_DYNSYM = 11
ELF64_SYM = struct.Struct("<IBBHQQ")  # st_name, st_info, st_other, st_shndx, st_value, st_size
ELF64_SHDR = struct.Struct("<IIQQQQIIQQ")  # name, type, flags, addr, offset, size, link, info, align, entsize


def dynamic_symbols(path: Path) -> dict[str, int]:
    """``{name: st_value}`` of an ELF64 shared object's dynamic symbol table."""
    data = path.read_bytes()
    section_offset, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count = struct.unpack_from("<HH", data, 0x3A)
    sections = [ELF64_SHDR.unpack_from(data, section_offset + i * entry_size) for i in range(count)]
    symbols: dict[str, int] = {}
    for _, kind, _, _, offset, size, link, _, _, _ in sections:
        if kind != SHT_DYNSYM:
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, ELF64_SYM.size):
            name_at, _, _, _, value, _ = ELF64_SYM.unpack_from(data, at)
            end = data.index(b"\0", strings + name_at)
            symbols[data[strings + name_at:end].decode()] = value
    return symbols


def loaded_path(soname: str) -> Path:
    """The file this process mapped for ``soname`` (/proc/self/maps)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) >= 6 and Path(fields[5]).name == soname:
            return Path(fields[5])
    raise RuntimeError(f"{soname} is not mapped")


def real_function(library: ctypes.CDLL, name: str, anchor: str) -> ctypes._CFuncPtr:
    """The driver's own ``name``: the address of ``anchor`` (a call the hook does not wrap, so
    dlsym returns the driver's) minus its offset gives the load address; plus ``name``'s offset."""
    symbols = dynamic_symbols(loaded_path("libcuda.so.1"))
    base = ctypes.cast(getattr(library, anchor), ctypes.c_void_p).value
    assert base is not None
    address = base - symbols[anchor] + symbols[name]
    prototype = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)
    return prototype(address)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--size", type=int, default=1 << 20)
    parser.add_argument("--bypass", action="store_true")
    args = parser.parse_args()
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context = ctypes.c_int(), ctypes.c_void_p()
    results = {"cuInit": cuda.cuInit(0), "cuDeviceGet": cuda.cuDeviceGet(ctypes.byref(device), 0)}
    results["cuDevicePrimaryCtxRetain"] = cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device)
    results["cuCtxSetCurrent"] = cuda.cuCtxSetCurrent(context)
    pointers = [ctypes.c_uint64(), ctypes.c_uint64()]
    results["hooked cuMemAlloc_v2"] = cuda.cuMemAlloc_v2(ctypes.byref(pointers[0]), ctypes.c_size_t(args.size))
    if args.bypass:
        driver_alloc = real_function(cuda, "cuMemAlloc_v2", anchor="cuInit")
        results["driver's own cuMemAlloc_v2"] = driver_alloc(ctypes.byref(pointers[1]), args.size)
    cuda.cuMemFree_v2.argtypes = [ctypes.c_uint64]
    for index, pointer in enumerate(pointers):
        if pointer.value:
            results[f"cuMemFree_v2 {index}"] = cuda.cuMemFree_v2(pointer.value)
    results["cuDevicePrimaryCtxRelease"] = cuda.cuDevicePrimaryCtxRelease(device)
    Path(args.out).write_text(json.dumps({"pid": os.getpid(), "results": results, "bypassed": args.bypass}))
    return 0 if all(code == 0 for code in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
