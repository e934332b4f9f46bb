"""Which GPU ``fastgshare run`` uses, and what NVML says about it.

Owns the choice behind ``--gpu SPEC|real``: a simulated GPU described by a GPU spec (the grammar
of :func:`fastgshare.inventory.parse_gpu_spec`, one GPU: ``1x16GiB:80sm``), or this machine's
NVIDIA GPU through NVML (``pynvml``); without ``--gpu``, the real GPU when NVML finds one, else
the simulated default. It is the user command's only NVML adapter.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs

from fastgshare import keys
from fastgshare.errors import InvalidInventory
from fastgshare.inventory import GPU_SPEC_HELP, parse_gpu_spec
from simgpu import build as simgpu_build

DEFAULT_SIMULATED_GPU = "1x16GiB:80sm"
REAL = "real"
SIMULATED_GPU_UUID = "GPU-fastgshare-run-0"
GPU_HELP = f'"real" (this machine\'s NVIDIA GPU, through NVML) or a simulated GPU {GPU_SPEC_HELP} with COUNT 1'


class GpuChoiceError(Exception):
    """The GPU asked for cannot be used; the message is one line, without the flag's name."""


@attrs.frozen(kw_only=True)
class GpuChoice:
    """The one GPU a run uses: ``spec`` is the GPU spec as written (simulated) or ``"real"``."""

    spec: str
    simulated: bool
    uuid: str
    memory_bytes: int
    sm_count: int  # 0 where NVML does not say (a real GPU's count only matters to the simulated one)
    mps: bool  # simulated: the spec's :mps/:nomps; real: an MPS control daemon is running

    def same_device(self, other: GpuChoice) -> bool:
        """Whether ``other`` describes the same GPU (a model name in a spec makes no difference)."""
        return (self.simulated, self.uuid, self.memory_bytes, self.sm_count, self.mps) == (
            other.simulated, other.uuid, other.memory_bytes, other.sm_count, other.mps)

    def to_json(self) -> dict[str, object]:
        return {"spec": self.spec, "simulated": self.simulated, "uuid": self.uuid, "memoryBytes": self.memory_bytes,
                "smCount": self.sm_count, "mps": self.mps}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuChoice:
        """The choice :meth:`to_json` wrote; ``KeyError``, ``TypeError`` or ``ValueError`` if it is not one."""
        return cls(spec=str(data["spec"]), simulated=bool(data["simulated"]), uuid=str(data["uuid"]),
                   memory_bytes=int(data["memoryBytes"]), sm_count=int(data["smCount"]), mps=bool(data["mps"]))


def simulated_gpu(spec: str) -> GpuChoice:
    """The simulated GPU a spec describes; :class:`GpuChoiceError` if it is malformed or not one GPU."""
    try:
        parsed = parse_gpu_spec(spec)
    except InvalidInventory as error:
        raise GpuChoiceError(str(error)) from None
    if parsed.count != 1:
        raise GpuChoiceError(f'GPU spec "{spec}" has {parsed.count} GPUs; a run uses one; allowed: {GPU_HELP}')
    return GpuChoice(spec=spec.strip(), simulated=True, uuid=SIMULATED_GPU_UUID, memory_bytes=parsed.memory_bytes,
                     sm_count=parsed.sm_count, mps=parsed.mps_enabled)


def choose_gpu(flag: str | None, environ: Mapping[str, str], nvml: ModuleType | None = None) -> GpuChoice:
    """The GPU for ``--gpu flag`` (None: the real GPU if NVML finds one, else the simulated default)."""
    if flag is None:
        return find_real_gpu(environ, nvml) or simulated_gpu(DEFAULT_SIMULATED_GPU)
    if flag.strip() == REAL:
        found = find_real_gpu(environ, nvml, explain=True)
        assert found is not None  # explain=True raises instead
        return found
    return simulated_gpu(flag)


def find_real_gpu(environ: Mapping[str, str], nvml: ModuleType | None = None, *,
                  explain: bool = False) -> GpuChoice | None:
    """This machine's NVIDIA GPU (the first of ``CUDA_VISIBLE_DEVICES`` if set, else NVML's index 0), or
    None; with ``explain``, :class:`GpuChoiceError` saying why there is none instead of None."""
    try:
        module = nvml or _import_pynvml()
        module.nvmlInit()
        handle = _handle(module, environ)
        uuid = _text(module.nvmlDeviceGetUUID(handle))
        memory = int(module.nvmlDeviceGetMemoryInfo(handle).total)
        sm_count = _sm_count(module, handle)
    except GpuChoiceError:
        if explain:
            raise
        return None
    except Exception as error:  # pynvml raises its NVMLError subclasses, and OSError, for a missing driver
        if explain:
            raise GpuChoiceError(f"no NVIDIA GPU through NVML ({type(error).__name__}: {error}); "
                                 f"allowed: {GPU_HELP}") from None
        return None
    if nvml is None and _loaded_simulated_nvml():
        if explain:
            raise GpuChoiceError(f"NVML here is the simulated GPU's ({simgpu_build.NVML}), not NVIDIA's; "
                                 f"allowed: {GPU_HELP}")
        return None
    return GpuChoice(spec=REAL, simulated=False, uuid=uuid, memory_bytes=memory, sm_count=sm_count,
                     mps=mps_running(environ))


def mps_running(environ: Mapping[str, str]) -> bool:
    """Whether an MPS control daemon serves this user's pipe directory (its ``control`` socket exists)."""
    pipe_dir = environ.get(keys.ENV_MPS_PIPE_DIRECTORY) or keys.DEFAULT_MPS_PIPE_DIRECTORY
    return (Path(pipe_dir) / "control").exists()


def _import_pynvml() -> Any:
    try:
        import pynvml  # noqa: PLC0415 - loaded only where a run asks NVML
    except ImportError as error:
        raise GpuChoiceError(f"pynvml is not installed ({error}); allowed: {GPU_HELP}") from None
    return pynvml


def _handle(nvml: Any, environ: Mapping[str, str]) -> Any:
    """NVML's handle of the first GPU ``CUDA_VISIBLE_DEVICES`` names (an index or a ``GPU-`` UUID), or of index 0."""
    first = (environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")[0].strip()
    if first.startswith("GPU-"):
        return nvml.nvmlDeviceGetHandleByUUID(first)
    if first and not first.isdigit():
        raise GpuChoiceError(f'CUDA_VISIBLE_DEVICES "{first}" names no whole GPU (MIG instances are not '
                             "supported); allowed: an index or a GPU- UUID")
    return nvml.nvmlDeviceGetHandleByIndex(int(first) if first else 0)


def _sm_count(nvml: Any, handle: Any) -> int:
    try:
        return int(nvml.nvmlDeviceGetAttributes_v2(handle).multiprocessorCount)
    except Exception:  # older drivers lack it; the count is informational for a real GPU
        return 0


def _loaded_simulated_nvml() -> bool:
    """Whether the ``libnvidia-ml`` this process loaded is the simulated GPU's (its directory on the
    library path): that one answers NVML too, but is no GPU of this machine."""
    try:
        maps = Path(f"/proc/{os.getpid()}/maps").read_text()
    except OSError:
        return False
    return str(simgpu_build.BUILD) in maps


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
