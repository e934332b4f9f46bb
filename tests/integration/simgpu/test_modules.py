"""Modules of the simulated driver from real images: NVRTC's PTX and cubin, fatbins, the library API
and the linker, as real processes (the stream-probe program of async_programs.py).

The images come from NVIDIA's NVRTC (the nvidia-cuda-nvrtc wheel, CUDA 13): without it these tests
are skipped. nvcc's own fatbins (compressed and not) are tested where nvcc is installed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.simgpu.async_programs import (
    GLOBALS,
    KERNEL_NAMES,
    build_probe,
    make_fatbin,
    nvcc_fatbin,
    nvrtc_compile,
    nvrtc_lib_dir,
    run_probe,
)

CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_IMAGE = 200
CUDA_ERROR_FILE_NOT_FOUND = 301
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_INVALID_VALUE = 1


@pytest.fixture(scope="module")
def probe(simgpu_build: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="stream-probe-") as directory:
        yield build_probe(Path(directory))


@pytest.fixture(scope="module")
def images() -> Iterator[dict[str, Path]]:
    """NVRTC's PTX (compute_90) and cubin (sm_90) of async_programs.KERNELS_CU, a fatbin of both, garbage."""
    lib_dir = nvrtc_lib_dir()
    if lib_dir is None:
        pytest.skip("the nvidia-cuda-nvrtc wheel (CUDA 13) is not installed: pip install nvidia-cuda-nvrtc==13.0.88")
    with tempfile.TemporaryDirectory(prefix="nvrtc-") as directory:
        work = Path(directory)
        ptx = nvrtc_compile(lib_dir, work, "compute_90")
        cubin = nvrtc_compile(lib_dir, work, "sm_90")
        garbage = work / "garbage.bin"
        garbage.write_bytes(bytes(range(1, 256)) * 4)
        yield {"ptx": ptx, "cubin": cubin, "fatbin": make_fatbin(ptx, cubin, work / "kernels.fatbin"),
               "garbage": garbage, "dir": work}


def _resolve_all(how: str, path: Path) -> str:
    """Load the image one way, resolve every kernel and a missing name, list and count them."""
    funcs = "; ".join(f"func f{i} m {name}" for i, name in enumerate(KERNEL_NAMES))
    return f"load m {how} {path}; {funcs}; func missing m no_such_kernel; count m"


@pytest.mark.parametrize("image", ["ptx", "cubin", "fatbin"])
@pytest.mark.parametrize("how", ["data", "dataex", "file", "library", "libfile"])
def test_an_nvrtc_image_loads_and_its_kernel_names_resolve(probe: Path, gpu_dir: Path, images: dict[str, Path],
                                                          image: str, how: str) -> None:
    run = run_probe(probe, gpu_dir, _resolve_all(how, images[image]))
    assert run.rc(0) == CUDA_SUCCESS, run.lines
    assert [run.rc(1 + i) for i in range(len(KERNEL_NAMES))] == [CUDA_SUCCESS] * len(KERNEL_NAMES)
    assert run.rc(1 + len(KERNEL_NAMES)) == CUDA_ERROR_NOT_FOUND
    listed = run.op(2 + len(KERNEL_NAMES))
    assert listed["count"] == len(KERNEL_NAMES)
    assert sorted(listed["names"]) == sorted(KERNEL_NAMES)


def test_the_fatbin_wrapper_of_cumoduleloadfatbinary_loads(probe: Path, gpu_dir: Path,
                                                            images: dict[str, Path]) -> None:
    run = run_probe(probe, gpu_dir, _resolve_all("fatbinary", images["fatbin"]))
    assert run.rc(0) == CUDA_SUCCESS
    assert run.rc(1) == CUDA_SUCCESS
    assert run.rc(1 + len(KERNEL_NAMES)) == CUDA_ERROR_NOT_FOUND


@pytest.mark.parametrize("how", ["data", "file", "library"])
def test_garbage_is_an_invalid_image(probe: Path, gpu_dir: Path, images: dict[str, Path], how: str) -> None:
    run = run_probe(probe, gpu_dir, f"load m {how} {images['garbage']}")
    assert run.rc(0) == CUDA_ERROR_INVALID_IMAGE


def test_a_module_file_that_does_not_exist_is_not_found(probe: Path, gpu_dir: Path, tmp_path: Path) -> None:
    run = run_probe(probe, gpu_dir, f"load m file {tmp_path / 'missing.cubin'}")
    assert run.rc(0) == CUDA_ERROR_FILE_NOT_FOUND


@pytest.mark.parametrize("image", ["ptx", "cubin"])
def test_parameter_layouts_come_from_the_image(probe: Path, gpu_dir: Path, images: dict[str, Path],
                                               image: str) -> None:
    # saxpy(float a, const float *x, float *y, int n)
    run = run_probe(probe, gpu_dir, f"load m data {images[image]}; func f m saxpy; params f; name f")
    assert run.op(2)["params"] == [[0, 4], [8, 8], [16, 8], [24, 4]]
    assert run.op(2)["end_rc"] == CUDA_ERROR_INVALID_VALUE
    assert run.op(3)["name"] == "saxpy"


@pytest.mark.parametrize("image", ["ptx", "cubin"])
def test_module_globals_have_their_declared_size_and_memory(probe: Path, gpu_dir: Path, images: dict[str, Path],
                                                            image: str) -> None:
    script = f"load m data {images[image]}; " + "; ".join(f"global m {name}" for name in GLOBALS)
    script += "; global m no_such_variable"
    run = run_probe(probe, gpu_dir, script)
    for index, (name, size) in enumerate(GLOBALS.items(), start=1):
        assert (run.rc(index), run.op(index)["size"]) == (CUDA_SUCCESS, size), name
    assert run.rc(1 + len(GLOBALS)) == CUDA_ERROR_NOT_FOUND


def test_a_module_global_holds_what_is_copied_into_it(probe: Path, gpu_dir: Path, images: dict[str, Path]) -> None:
    run = run_probe(probe, gpu_dir, f"load m data {images['ptx']}; global m coef")
    if run.op(1)["copy_rc"] == 801:  # CUDA_ERROR_NOT_SUPPORTED: the driver's copies are not built
        pytest.skip("cuMemcpyHtoD/DtoH answer not-supported in this build of the simulated driver")
    assert run.op(1)["round_trip"] is True


def test_the_linker_output_holds_the_union_of_its_inputs(probe: Path, gpu_dir: Path, images: dict[str, Path],
                                                          tmp_path: Path) -> None:
    other = tmp_path / "other.ptx"
    other.write_text(".version 8.0\n.target sm_90\n.address_size 64\n"
                     ".visible .entry extra_kernel(.param .u64 p)\n{\n ret;\n}\n"
                     ".visible .global .align 8 .b8 table[24];\n")
    script = (f"link out cubin:{images['cubin']} ptx:{other}; func a out saxpy; func b out extra_kernel; "
              "func c out no_such_kernel; count out; global out table; func d out extra_kernel; params d")
    run = run_probe(probe, gpu_dir, script)
    assert run.rc(0) == CUDA_SUCCESS, run.lines
    assert run.op(0)["size"] > 0
    assert [run.rc(1), run.rc(2), run.rc(3)] == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_ERROR_NOT_FOUND]
    assert sorted(run.op(4)["names"]) == sorted([*KERNEL_NAMES, "extra_kernel"])
    assert (run.rc(5), run.op(5)["size"]) == (CUDA_SUCCESS, 24)
    assert run.op(7)["params"] == [[0, 8]]


def test_a_library_kernel_is_a_function_too(probe: Path, gpu_dir: Path, images: dict[str, Path]) -> None:
    script = (f"load m library {images['cubin']}; kernel k m saxpy; name k; kernel missing m nope; "
              "launch k null; sync null")
    run = run_probe(probe, gpu_dir, script)
    assert [run.rc(0), run.rc(1), run.rc(2), run.rc(3)] == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS,
                                                           CUDA_ERROR_NOT_FOUND]
    assert run.op(2)["name"] == "saxpy"
    assert [run.rc(4), run.rc(5)] == [CUDA_SUCCESS, CUDA_SUCCESS]


def test_the_fakecubin_spin_kernel_still_accepts_any_name(probe: Path, gpu_dir: Path, tmp_path: Path) -> None:
    image = tmp_path / "spin.fake"
    image.write_bytes(b"FAKECUBIN tests\0")
    run = run_probe(probe, gpu_dir, f"load m data {image}; func f m spin; func g m anything_at_all; params f")
    assert [run.rc(0), run.rc(1), run.rc(2)] == [CUDA_SUCCESS, CUDA_SUCCESS, CUDA_SUCCESS]
    assert run.op(3)["params"] == [[0, 8]]  # the spin kernel's one microsecond count


@pytest.mark.parametrize("compress", [False, True], ids=["uncompressed", "compressed"])
def test_an_nvcc_fatbin_loads(probe: Path, gpu_dir: Path, images: dict[str, Path], compress: bool) -> None:
    fatbin = nvcc_fatbin(images["dir"], compress)
    if fatbin is None:
        pytest.skip("nvcc is not installed (or could not build the fatbin)")
    run = run_probe(probe, gpu_dir, f"load m data {fatbin}; func f m saxpy; func g m no_such_kernel")
    assert [run.rc(0), run.rc(1)] == [CUDA_SUCCESS, CUDA_SUCCESS]
    # A fatbin whose every entry is compressed cannot be read: any name resolves (documented).
    assert run.rc(2) == (CUDA_SUCCESS if compress else CUDA_ERROR_NOT_FOUND)
