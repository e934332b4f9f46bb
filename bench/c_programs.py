"""Compiling the bench's C programs (load generators, null servers, timers) with the compiler of
the machine (``$CC``, else gcc, else cc), with the project's warnings and headers."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOOK_SOURCE = ROOT / "vgpu_hook" / "src"
WARNINGS = ["-Wall", "-Wextra", "-Werror", "-Wshadow", "-Wformat=2", "-Wstrict-prototypes", "-Wmissing-prototypes"]


def compile_program(binary: Path, *sources: Path) -> Path:
    """Build ``binary`` from ``sources`` (the protocol's and the hook's headers on the include path)."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or "cc"
    subprocess.run([compiler, "-std=gnu11", "-O2", *WARNINGS, f"-I{ROOT / 'vgpu_hook' / 'include'}",
                    f"-I{HOOK_SOURCE}", *map(str, sources), "-o", str(binary)], check=True)
    return binary
