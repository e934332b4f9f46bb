"""What NVIDIA's user space sees of the simulated driver: every entry point answers, the device's
attribute table, contexts as the real driver keeps them, memory whose data round-trips, pointer
attributes, occupancy; and cuda-bindings (12.9 and 13) resolving every name it asks for.

Each test runs a real process against ``simgpu/build/libcuda.so.1`` and a fresh simulated GPU:
``driver_probe.py`` (ctypes) prints what one case saw as JSON, and the test asserts on it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
PROBE = HERE / "driver_probe.py"
REPO = HERE.parents[2]
BINDINGS_12 = Path(sys.prefix) / "cuda-bindings-12.9"  # the Makefile's install target puts it there

SUCCESS, INVALID_VALUE, INVALID_DEVICE, INVALID_CONTEXT, NOT_FOUND, NOT_SUPPORTED = 0, 1, 101, 201, 500, 801
ATTRIBUTES = range(1, 162)  # CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK .. CUDA 13.5's last


def probe(build: Path, gpu_dir: Path, case: str, *args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    environment = {**os.environ, "SIMGPU_DRIVER": str(build / "libcuda.so.1"),
                   "FASTGSHARE_FAKE_GPU_DIR": str(gpu_dir), **(env or {})}
    result = subprocess.run([sys.executable, str(PROBE), case, *args], capture_output=True, text=True, timeout=120,
                            env=environment, check=False)
    assert result.returncode == 0, f"driver_probe {case} exited {result.returncode}:\n{result.stderr[-3000:]}"
    answer: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return answer


def entry_list(build: Path) -> Path:
    return build / "gen" / "entry_points.tsv"


def test_every_entry_point_resolves_to_a_function(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe(simgpu_build, gpu_dir, "resolve", str(entry_list(simgpu_build)))
    assert seen["failures"] == []
    assert seen["bases"] == seen["implemented"] + seen["not_supported"]
    assert seen["bases"] > 500
    assert seen["implemented"] > 150
    assert seen["names_checked"] >= seen["bases"]
    for name, (result, status, fn) in seen["unknown"].items():  # like the real driver: base names only
        assert (result, status, fn) == (NOT_FOUND, 1, 0), name
    assert seen["bad_flags"] == INVALID_VALUE


def test_entry_points_without_a_meaning_here_answer_not_supported(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe(simgpu_build, gpu_dir, "stubs", str(entry_list(simgpu_build)))
    assert len(seen["through_gpa"]) > 40
    assert set(seen["through_gpa"].values()) == {NOT_SUPPORTED}
    assert set(seen["by_name"].values()) == {NOT_SUPPORTED}
    assert seen["export_table"] == [NOT_SUPPORTED, 0]  # NVRTC asks for it after cuInit


def test_every_device_attribute_answers(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe(simgpu_build, gpu_dir, "attributes")
    answers = {int(number): tuple(pair) for number, pair in seen["answers"].items()}
    assert [n for n in ATTRIBUTES if answers[n][0] != SUCCESS] == []
    assert [n for n in answers if n not in ATTRIBUTES and answers[n][0] != INVALID_VALUE] == []
    values = {n: answers[n][1] for n in ATTRIBUTES}
    assert (values[75], values[76]) == (9, 0) == tuple(seen["capability"])  # compute capability 9.0
    assert (values[10], values[1], values[16]) == (32, 1024, 80)  # warp, threads a block, SMs (default)
    assert (values[41], values[83], values[31]) == (1, 1, 1)  # unified addressing, managed, concurrent kernels
    assert seen["properties"][:4] == [1024, 1024, 1024, 64]  # CUdevprop: threads a block, block dims
    assert seen["by_bus_id"] == [SUCCESS, 0]
    assert seen["bus_id"] == "0000:00:00.0"
    assert seen["other_bus_id"] == INVALID_DEVICE
    assert seen["can_access_peer"] == 0
    assert seen["p2p_attribute"] == INVALID_DEVICE
    assert seen["bad_device"] == INVALID_DEVICE


def test_every_attribute_of_the_header_enum_answers(simgpu_build: Path, gpu_dir: Path) -> None:
    header = _cuda_h()
    if header is None:
        pytest.skip("no cuda.h to read CUdevice_attribute from (the build found one: CUDA_INCLUDE?)")
    enum = header.read_text().split("typedef enum CUdevice_attribute_enum", 1)[1].split("} CUdevice_attribute;")[0]
    numbers = {int(word.split("=")[1].split(",")[0]) for word in enum.replace(" ", "").splitlines()
               if word.startswith("CU_DEVICE_ATTRIBUTE_") and "=" in word and "_MAX=" not in word}
    answers = probe(simgpu_build, gpu_dir, "attributes")["answers"]
    assert numbers
    assert [n for n in sorted(numbers) if answers[str(n)][0] != SUCCESS] == []


def test_the_sm_count_is_a_setting(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe(simgpu_build, gpu_dir, "attributes", env={"FASTGSHARE_FAKE_GPU_SMS": "132"})
    assert seen["answers"]["16"] == [SUCCESS, 132]
    environment = {**os.environ, "SIMGPU_DRIVER": str(simgpu_build / "libcuda.so.1"),
                   "FASTGSHARE_FAKE_GPU_DIR": str(gpu_dir), "FASTGSHARE_FAKE_GPU_SMS": "lots"}
    bad = subprocess.run([sys.executable, str(PROBE), "attributes"], capture_output=True, text=True, timeout=60,
                         env=environment, check=False)
    assert bad.returncode != 0
    assert "FASTGSHARE_FAKE_GPU_SMS=lots is not a whole number of SMs from 1 to 1024" in bad.stderr


def test_device_memory_round_trips_data(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe(simgpu_build, gpu_dir, "roundtrip")
    assert seen["linear"]
    assert seen["unified"]
    assert seen["async"]  # stream-ordered HtoD and memset, then a pageable DtoH that completes on return
    assert seen["async_pinned_in_order"]  # page-locked both ways: queued on a stream, in order
    assert seen["pitched_2d"]
    assert seen["pitch"] == 256
    assert seen["array"]
    assert seen["v1"]
    assert 0 < seen["v1_pointer"] < 1 << 32
    assert seen["vmm_across_mappings"]  # a copy across two back-to-back cuMemMap mappings
    assert seen["vmm_same_bytes_in_both_mappings"]  # one handle mapped twice shows one memory
    for refused in ("past_the_end", "unknown_device_pointer", "misaligned_d32", "null_host", "narrow_pitch",
                    "array_overrun", "vmm_unmapped"):
        assert seen[refused] == INVALID_VALUE, refused


def test_pointer_attributes(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe(simgpu_build, gpu_dir, "pointers")
    ptr = seen["pointers"]
    device = {int(k): tuple(v) for k, v in seen["device"].items()}
    assert device[2] == (SUCCESS, 2)  # CU_MEMORYTYPE_DEVICE
    assert device[3] == (SUCCESS, ptr["inside"])  # the device pointer
    assert (device[8], device[9]) == ((SUCCESS, 0), (SUCCESS, 0))  # not managed, device 0
    assert (device[11], device[12]) == ((SUCCESS, ptr["dev"]), (SUCCESS, 1 << 20))  # the allocation's range
    assert seen["context"] is True
    assert seen["device_host_pointer"] == INVALID_VALUE
    assert len(set(seen["buffer_ids"])) == 2
    assert seen["managed"] == {"2": [SUCCESS, 2], "4": [SUCCESS, ptr["managed"]], "8": [SUCCESS, 1]}
    assert seen["host"] == {"2": [SUCCESS, 1], "3": [SUCCESS, ptr["host"]], "4": [SUCCESS, ptr["host"]]}
    assert seen["host_device_pointer"] == [SUCCESS, ptr["host"]]
    assert seen["registered"] == 1  # CU_MEMORYTYPE_HOST
    assert seen["unknown"] == INVALID_VALUE
    assert seen["attributes_unknown"] == [SUCCESS, 0, 0]
    assert seen["range"] == [SUCCESS, ptr["dev"], 1 << 20]
    assert seen["range_unknown"] == NOT_FOUND
    assert seen["register_twice"] == 712  # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    assert seen["unregister"] == [SUCCESS, 713]  # then CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
    assert seen["freed_host"] == INVALID_VALUE


def test_contexts_primary_retains_and_the_thread_stack(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe(simgpu_build, gpu_dir, "contexts")
    assert seen["before"] == [0, 0]
    assert seen["alloc_without_context"] == INVALID_CONTEXT
    assert seen["same_handle"]
    assert seen["retained_twice"] == [4, 1]
    assert seen["current_is_primary"]
    assert seen["queries"] == [True, 3020, 0]
    assert seen["stack_limit"] == 4096
    assert seen["bad_limit"] == 215
    assert seen["priorities"] == [0, -5]
    assert seen["create_pushes"]
    assert seen["other_thread_current"] == [0]
    assert seen["popped_created"]
    assert seen["popped_primary"]
    assert seen["pop_empty"] == INVALID_CONTEXT
    assert seen["destroy_primary"] == INVALID_CONTEXT
    assert seen["destroy_created"] == [SUCCESS, INVALID_CONTEXT]
    assert seen["released_once"] == [4, 1]
    assert seen["released_twice"] == [4, 0]
    assert seen["release_again"] == INVALID_CONTEXT


def _blocks_per_sm(block: int, regs: int) -> int:
    """CUDA's occupancy rule on the modelled SM: 2048 threads, 32 blocks, 64 Ki registers allocated
    per warp in units of 256, 228 KiB shared memory with 1 KiB reserved a block (none asked here)."""
    warps = -(-block // 32)
    per_warp = -(-regs * 32 // 256) * 256
    return min(32, 2048 // (warps * 32), 65536 // (warps * per_warp), 233472 // 1024)


def test_occupancy(simgpu_build: Path, gpu_dir: Path) -> None:
    seen = probe(simgpu_build, gpu_dir, "occupancy")
    result, regs = seen["num_regs"]
    regs = regs if result == SUCCESS and regs > 0 else 32  # the calculator's default without an answer
    for block in (128, 256, 1024):
        assert seen[f"blocks_{block}_0"] == _blocks_per_sm(block, regs), block
    assert seen["blocks_1025_0"] == 0  # more threads than a block may have
    assert seen["blocks_256_102400"] == 0  # more dynamic shared memory than the 48 KiB default allows
    grid, block = seen["potential"]
    assert block % 32 == 0
    assert 0 < block <= 1024
    assert grid == _blocks_per_sm(block, regs) * 80
    assert seen["dynamic_smem_for_2"] == 233472 // 2 - 1024
    assert (seen["bad_handle"], seen["bad_flags"]) == (400, INVALID_VALUE)


@pytest.mark.parametrize("version", ["13", "12.9"])
def test_cuda_bindings_resolves_every_name_and_round_trips(simgpu_build: Path, gpu_dir: Path, tmp_path: Path,
                                                          version: str) -> None:
    pythonpath = os.environ.get("PYTHONPATH", "")
    if version == "12.9":
        if not (BINDINGS_12 / "cuda" / "bindings").is_dir():
            pytest.skip(f"cuda-bindings 12.9 is not installed at {BINDINGS_12} (make install puts it there)")
        pythonpath = os.pathsep.join(p for p in (str(BINDINGS_12), pythonpath) if p)
    elif importlib.util.find_spec("cuda.bindings") is None:
        pytest.skip("cuda-bindings is not installed in this environment (setup.cfg, extra nvidia)")
    log = tmp_path / "lookups.log"
    environment = {**os.environ, "LD_LIBRARY_PATH": str(simgpu_build), "FASTGSHARE_FAKE_GPU_DIR": str(gpu_dir),
                   "FASTGSHARE_FAKE_GPU_PROC_LOG": str(log), "PYTHONPATH": pythonpath}
    result = subprocess.run([sys.executable, "-c", _BINDINGS_PROGRAM], capture_output=True, text=True, timeout=120,
                            env=environment, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["version"].startswith(version)
    assert seen["round_trip"]
    assert seen["context_device"] == 0
    lookups = [line.split() for line in log.read_text().splitlines()]
    missing = sorted({name for name, _, _, status in lookups if status != "0"})
    assert len({name for name, *_ in lookups}) > 400
    assert missing == []


def _cuda_h() -> Path | None:
    spec = importlib.util.find_spec("nvidia.cu13")
    candidates = [Path(p) / "include" / "cuda.h" for p in (spec.submodule_search_locations or [])] if spec else []
    candidates.append(Path("/usr/local/cuda/include/cuda.h"))
    return next((c for c in candidates if c.is_file()), None)


_BINDINGS_PROGRAM = """
import json
import cuda.bindings
from cuda.bindings import driver as d

def ok(answer):
    assert answer[0] == d.CUresult.CUDA_SUCCESS, answer
    return answer[1:] if len(answer) > 2 else (answer[1] if len(answer) == 2 else None)

ok(d.cuInit(0))
device = ok(d.cuDeviceGet(0))
ctx = ok(d.cuDevicePrimaryCtxRetain(device))
ok(d.cuCtxSetCurrent(ctx))
ptr = ok(d.cuMemAlloc(1 << 20))
data = bytes(range(256)) * 16
ok(d.cuMemcpyHtoD(ptr, data, len(data)))
out = bytearray(len(data))
ok(d.cuMemcpyDtoH(out, ptr, len(data)))
context_device = ok(d.cuCtxGetDevice())
ok(d.cuMemFree(ptr))
ok(d.cuDevicePrimaryCtxRelease(device))
print(json.dumps({"version": cuda.bindings.__version__, "round_trip": bytes(out) == data,
                  "context_device": int(context_device)}))
"""
