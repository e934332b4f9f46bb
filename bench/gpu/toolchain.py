"""The setup part: what the GPU and the tools are, and everything the other parts run, built on
the machine itself (nothing is fetched; the GPU machine has no network).

- the hook and the simulated GPU: ``make -C vgpu_hook PYTHON=<this python>``;
- the arbiter's native engine for this interpreter, where the checkout has none (the GPU machine's
  Python is not the one the checkout was installed with): ``python setup.py build_ext --inplace``,
  the project's own recipe;
- ``tenant.c`` and ``ctxmem.c`` (gcc, cuda.h; the driver is found at run time, nothing to link);
- ``kernels.cu`` to PTX (``nvcc -ptx``). Without nvcc the dry run falls back to the simulated GPU's
  own tenant for the isolation and overhead parts and says so; on a GPU that is a problem.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path

from bench.gpu.part import OK, JsonDict, PartContext, Progress, one_line

WARNINGS = ["-Wall", "-Wextra", "-Werror", "-Wshadow", "-Wformat=2", "-Wstrict-prototypes", "-Wmissing-prototypes"]
PROGRAMS = {"tenant": ["tenant.c", "cudrv.c"], "ctxmem": ["ctxmem.c", "cudrv.c"]}
NVIDIA_SMI_FIELDS = "name,driver_version,memory.total,compute_mode,mig.mode.current,pci.bus_id"


def run_text(argv: list[str], timeout_s: float, cwd: Path | None = None) -> tuple[int, str]:
    """Exit status and output (stdout + stderr) of a command; 127 when it is not found, 124 when it
    ran past ``timeout_s``."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, cwd=cwd)
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv[:3])}: no answer within {timeout_s:.0f} s"
    return int(done.returncode), (done.stdout + done.stderr).strip()


def find_nvcc() -> str | None:
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None


def cuda_include(nvcc: str | None) -> Path | None:
    """Where cuda.h is: $CUDA_INCLUDE, beside nvcc, the nvidia-cuda-runtime wheel, /usr/local/cuda."""
    candidates = [os.environ.get("CUDA_INCLUDE")]
    if nvcc:
        candidates.append(str(Path(nvcc).resolve().parent.parent / "include"))
    spec = importlib.util.find_spec("nvidia.cu13") if importlib.util.find_spec("nvidia") else None
    if spec and spec.submodule_search_locations:
        candidates += [str(Path(p) / "include") for p in spec.submodule_search_locations]
    candidates.append("/usr/local/cuda/include")
    for candidate in candidates:
        if candidate and (Path(candidate) / "cuda.h").is_file() and (Path(candidate) / "cudaTypedefs.h").is_file():
            return Path(candidate)
    return None


def gpu_info(ctx: PartContext) -> JsonDict:
    if ctx.dry_run:
        return {"simulated": True, "note": "the simulated GPU of simgpu/ (16 GiB, kernel times from a setting)"}
    status, text = run_text(["nvidia-smi", f"--query-gpu={NVIDIA_SMI_FIELDS}", "--format=csv,noheader"], 60)
    if status != 0:
        return {"error": f"nvidia-smi: exit {status}: {text[-300:]}"}
    fields = [part.strip() for part in text.splitlines()[0].split(",")]
    info: JsonDict = dict(zip(NVIDIA_SMI_FIELDS.split(","), fields, strict=False))
    info["gpus"] = len(text.splitlines())
    return info


def tool_versions(ctx: PartContext, nvcc: str | None) -> JsonDict:
    versions: JsonDict = {"python": platform.python_version(), "machine": platform.machine()}
    if nvcc:
        versions["nvcc"] = run_text([nvcc, "--version"], 60)[1].splitlines()[-1:]
    versions["gcc"] = run_text(["gcc", "--version"], 30)[1].splitlines()[:1]
    status, text = run_text([ctx.python, "-c", "import torch; print(torch.__version__, torch.version.cuda)"], 180)
    versions["torch"] = text.splitlines()[-1] if status == 0 else f"not importable: {text.splitlines()[-1:]}"
    return versions


def build_hook(ctx: PartContext) -> tuple[str | None, str]:
    status, text = run_text(["make", "-C", str(ctx.repo / "vgpu_hook"), f"PYTHON={ctx.python}"], 400)
    hook = ctx.repo / "vgpu_hook" / "build" / "libfastgshare-hook.so"
    if status != 0 or not hook.is_file():
        return None, f"make -C vgpu_hook: exit {status}: {text[-600:]}"
    return str(hook), ""


def arbiter_engine(ctx: PartContext) -> str:
    """'present', 'built', or why it could not be built (the arbiter cannot start without it)."""
    if importlib.util.find_spec("device_plugin.arbiter._engine") is not None:
        return "present"
    status, text = run_text([ctx.python, "setup.py", "build_ext", "--inplace"], 300, cwd=ctx.repo)
    importlib.invalidate_caches()
    if status == 0 and importlib.util.find_spec("device_plugin.arbiter._engine") is not None:
        return "built"
    return f"setup.py build_ext --inplace: exit {status}: {text[-600:]}"


def build_program(ctx: PartContext, name: str, include: Path) -> tuple[str | None, str]:
    sources = [str(ctx.repo / "bench" / "gpu" / source) for source in PROGRAMS[name]]
    binary = ctx.scratch("bin") / name
    status, text = run_text(["gcc", "-std=gnu11", "-O2", *WARNINGS, "-isystem", str(include),
                             f"-I{ctx.repo / 'abi'}", "-o", str(binary), *sources, "-ldl", "-lm"], 120)
    return (str(binary), "") if status == 0 else (None, f"gcc {name}: exit {status}: {text[-600:]}")


def build_ptx(ctx: PartContext, nvcc: str | None) -> tuple[str | None, str]:
    if nvcc is None:
        return None, "nvcc not found ($NVCC, PATH, /usr/local/cuda/bin)"
    ptx = ctx.scratch("bin") / "kernels.ptx"
    status, text = run_text([nvcc, "-ptx", "-o", str(ptx), str(ctx.repo / "bench" / "gpu" / "kernels.cu")], 180)
    return (str(ptx), "") if status == 0 else (None, f"nvcc -ptx: exit {status}: {text[-600:]}")


def setup(ctx: PartContext, progress: Progress) -> JsonDict:
    """Build everything; the result's ``build`` is what the other parts get (also when some failed)."""
    progress.put("gpu", gpu_info(ctx))
    nvcc = find_nvcc()
    include = cuda_include(nvcc)
    found: dict[str, str | None] = {}
    problems: dict[str, str] = {}

    def record(name: str, outcome: tuple[str | None, str]) -> None:
        found[name] = outcome[0]
        if outcome[0] is None:
            problems[name] = outcome[1]
        progress.put("build", {**found, "problems": dict(problems)})

    record("hook", build_hook(ctx))
    engine = arbiter_engine(ctx)
    progress.put("arbiter_engine", engine)
    for name in PROGRAMS:
        record(name, build_program(ctx, name, include) if include else (None, "cuda.h not found"))
    record("ptx", build_ptx(ctx, nvcc))
    simgpu_tenant = ctx.repo / "simgpu" / "build" / "tenant"
    if ctx.dry_run:
        record("simgpu_tenant", (str(simgpu_tenant), "") if simgpu_tenant.is_file() else (None, "not built"))
    progress.put("cuda_include", str(include) if include else None)
    progress.put("tools", tool_versions(ctx, nvcc))
    expected = {"hook", "tenant", "ctxmem"} | ({"simgpu_tenant"} if ctx.dry_run else {"ptx"})
    missing = sorted(name for name in expected if problems.get(name))
    if engine not in ("present", "built"):
        missing.append("arbiter engine")
        problems["arbiter_engine"] = engine
    result = dict(progress.data)
    if ctx.dry_run and "ptx" in problems:
        result["note"] = ("no PTX (" + problems["ptx"] + "): the isolation and overhead parts use the simulated "
                          "GPU's own tenant (simgpu/build/tenant)")
    result["status"] = OK if not missing else (
        f"failed: could not build {', '.join(missing)}: " + one_line(problems.get(missing[0].replace(' ', '_'), "")))
    return result

