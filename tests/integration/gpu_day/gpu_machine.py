"""The Python packages the lent GPU machine has (its image, read by this workplace on 2026-11-17),
as import names, and an import guard that lets a process import only those, the standard library
and this checkout: the dry run of ``bench/gpu/run.py`` runs under it, so a module the GPU machine
lacks fails here, not on the day (that machine has no network: nothing can be installed there).

The guard is a ``sitecustomize.py`` put first on ``PYTHONPATH``, so every Python process the dry
run starts (the parts, the arbiter, ``fastgshare run``, the programs it runs) has it too. A module
outside that set is looked for only where the checkout's own code is or inside an allowed package
(setuptools carries jaraco in ``setuptools/_vendor``, and uses it where none is installed).
"""

from __future__ import annotations

from pathlib import Path

# pip distribution names on the GPU machine (the image's list as this workplace read it).
DISTRIBUTIONS = (
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio",
    "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake", "colorama",
    "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit", "cupy-cuda13x",
    "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock", "flatbuffers", "flax",
    "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py", "hf-xet", "httpcore",
    "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig", "interface-meta", "jax",
    "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib", "kiwisolver", "lazy-loader",
    "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml", "markdown", "markdown-it-py",
    "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath", "msgpack", "multidict",
    "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja", "numba", "numba-cuda",
    "numpy", "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc", "nvidia-cuda-runtime",
    "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse",
    "nvidia-cusparselt-cu13", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13",
    "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless", "optax", "opt-einsum",
    "opt-einsum-fx", "optimistix", "orbax-checkpoint", "packaging", "pandas", "pathspec", "patsy", "peft", "pillow",
    "pip", "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf", "psutil", "pyarrow", "pybind11",
    "py-cpuinfo", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions", "pytest", "pytest-benchmark",
    "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist", "python-dateutil", "pytorch-lightning", "pyyaml",
    "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core", "scikit-image", "scikit-learn",
    "scipy", "seaborn", "sentencepiece", "sentence-transformers", "setuptools", "shellingham", "simplejson", "six",
    "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard", "tensorboard-data-server", "tensorstore",
    "threadpoolctl", "tifffile", "tiktoken", "timm", "tokenizers", "toolz", "torch", "torchaudio", "torchdiffeq",
    "torch-geometric", "torchmetrics", "torchvision", "tqdm", "transformers", "treescope", "triton", "typer",
    "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig", "werkzeug", "wheel", "wrapt",
    "xarray", "xxhash", "yarl", "zipp",
)

# Where the import name is not the distribution's name with "-" as "_".
IMPORT_NAMES = {
    "attrs": ("attr", "attrs"), "charset-normalizer": ("charset_normalizer",), "cuda-bindings": ("cuda",),
    "cuda-core": ("cuda",), "cupy-cuda13x": ("cupy", "cupy_backends"), "grpcio": ("grpc",),
    "huggingface-hub": ("huggingface_hub",), "markdown-it-py": ("markdown_it",), "nvidia-ml-py": ("pynvml",),
    "opencv-python-headless": ("cv2",), "pillow": ("PIL",), "protobuf": ("google",), "py-cpuinfo": ("cpuinfo",),
    "python-dateutil": ("dateutil",), "pyyaml": ("yaml", "_yaml"), "scikit-image": ("skimage",),
    "scikit-learn": ("sklearn",), "setuptools": ("setuptools", "pkg_resources", "_distutils_hack"),
    "pytest": ("pytest", "_pytest", "py"), "torch": ("torch", "torchgen", "functorch"),
    "jax-cuda13-plugin": ("jax_cuda13_plugin",), "numba-cuda": ("numba_cuda",),
}


def import_names() -> set[str]:
    names: set[str] = set()
    for distribution in DISTRIBUTIONS:
        if distribution.startswith("nvidia-"):
            names.add("nvidia")
        names.update(IMPORT_NAMES.get(distribution, (distribution.replace("-", "_"),)))
    return names


GUARD = '''"""Written by tests/integration/gpu_day/gpu_machine.py: only what the GPU machine has imports."""
import importlib.abc
import importlib.machinery
import os
import sys

_ALLOWED = frozenset(os.environ["GPU_DAY_ALLOWED_MODULES"].split(","))
_REPO = os.environ["GPU_DAY_REPO"]


def _in_repo(spec):
    """The checkout's own code, not what an environment inside the checkout (.venv) installed."""
    places = [str(p) for p in spec.submodule_search_locations or []] + ([spec.origin] if spec.origin else [])
    return bool(places) and all(place.startswith(_REPO + os.sep) and "site-packages" not in place
                                and not place.startswith(sys.prefix + os.sep) for place in places)


_allowed_dirs = []


def _inside_allowed(spec):
    """A package that an allowed one carries inside itself (setuptools' vendored jaraco, say)."""
    if not _allowed_dirs:
        for allowed in sorted(_ALLOWED):
            found = importlib.machinery.PathFinder.find_spec(allowed)
            if found is not None and found.submodule_search_locations:
                _allowed_dirs.extend(str(place) + os.sep for place in found.submodule_search_locations)
    places = [str(p) for p in spec.submodule_search_locations or []] + ([spec.origin] if spec.origin else [])
    return bool(places) and all(place.startswith(tuple(_allowed_dirs)) for place in places)


class _GpuMachineOnly(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if path is not None or name in sys.stdlib_module_names or name in _ALLOWED:
            return None
        if name.startswith(("_sysconfigdata", "__")) or name in ("sitecustomize", "usercustomize"):
            return None
        for entry in list(sys.path):  # the first place that is the checkout's or an allowed package's
            spec = importlib.machinery.PathFinder.find_spec(name, [entry])
            if spec is not None and (_in_repo(spec) or _inside_allowed(spec)):
                return spec
        raise ModuleNotFoundError(f"No module named {name!r} on the GPU machine (see {__file__})", name=name)


sys.meta_path.insert(0, _GpuMachineOnly())
'''


def guard_environment(directory: Path, repo: Path) -> dict[str, str]:
    """Write the guard into ``directory``; the variables that put it into every Python process."""
    (directory / "sitecustomize.py").write_text(GUARD)
    return {"PYTHONPATH": str(directory), "GPU_DAY_ALLOWED_MODULES": ",".join(sorted(import_names())),
            "GPU_DAY_REPO": str(repo)}
