"""Build hooks: compile the kubelet APIs' .proto files (device plugin, pod resources) with grpcio-tools,
and the arbiter's native engine (C, ``arbiter_engine/``).

Metadata and dependencies are in setup.cfg. The generated modules land next to the .proto
in ``device_plugin/_api/`` (not committed) for regular and editable installs alike. The engine is
a plain shared library (no Python API: ``device_plugin.arbiter.native`` loads it with ctypes),
built as an extension module so that every install, editable or not, compiles it.
"""

from __future__ import annotations

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

API_DIR = Path(__file__).parent / "device_plugin" / "_api"
PROTOS = ("deviceplugin.proto", "podresources.proto")


def compile_protos() -> None:
    from grpc_tools import protoc  # noqa: PLC0415 - a build-time dependency, only present while building

    proto_include = Path(protoc.__file__).parent / "_proto"
    for proto in PROTOS:
        status = protoc.main([
            "grpc_tools.protoc", f"-I{API_DIR}", f"-I{proto_include}",
            f"--python_out={API_DIR}", f"--grpc_python_out={API_DIR}", f"--pyi_out={API_DIR}",
            str(API_DIR / proto),
        ])
        if status != 0:
            raise RuntimeError(f"protoc failed on {API_DIR / proto} (status {status})")
        # protoc writes "import deviceplugin_pb2"; make it a package-relative import.
        stem = proto.removesuffix(".proto")
        grpc_module = API_DIR / f"{stem}_pb2_grpc.py"
        text = grpc_module.read_text()
        grpc_module.write_text(text.replace(f"import {stem}_pb2 as", f"from . import {stem}_pb2 as"))


class BuildWithProtos(build_py):
    def run(self) -> None:
        compile_protos()
        super().run()


NATIVE_DIR = Path("arbiter_engine")
ENGINE = Extension(
    "device_plugin.arbiter._engine",
    sources=[str(NATIVE_DIR / name) for name in ("engine.c", "policy.c", "meter.c")],
    include_dirs=[str(NATIVE_DIR), "vgpu_hook/include"],
    depends=[str(NATIVE_DIR / name) for name in ("engine_abi.h", "grow.h")]
    + ["vgpu_hook/include/fastgshare_protocol.h", "vgpu_hook/include/fastgshare_byteorder.h"],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror", "-Wshadow", "-Wstrict-prototypes",
                        "-Wmissing-prototypes"],
    libraries=["pthread"],
)

setup(cmdclass={"build_py": BuildWithProtos}, ext_modules=[ENGINE])
