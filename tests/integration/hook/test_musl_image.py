"""A musl image (Alpine and the like) cannot load the hook: the process must not start unenforced.

The hook is built against glibc. musl's dynamic loader maps a preloaded library that exists, then
fails on what it needs (``ld-linux-x86-64.so.2``, glibc-only symbols such as ``__register_atfork``)
and ends the process with status 127 before ``main``. A preload path that does not exist is skipped
in silence: the hook file itself is what Allocate mounts.

Each test builds a program with ``musl-gcc`` and runs it in a chroot holding only musl's loader, the
program and the hook, as in an image without glibc. Needs root (chroot) and Debian's ``musl`` and
``musl-tools`` packages; skipped, with the reason, without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integration.hook.tenants import Build

MUSL_LOADER = Path("/lib/ld-musl-x86_64.so.1")
PROGRAM = '#include <stdio.h>\nint main(void) { puts("main ran"); return 0; }\n'

pytestmark = [
    pytest.mark.skipif(shutil.which("musl-gcc") is None or not MUSL_LOADER.exists(),
                       reason="needs musl's loader and musl-gcc (apt-get install musl musl-tools)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the musl image is a chroot: needs root"),
]


@pytest.fixture
def musl_root(tmp_path: Path, build: Build) -> Path:
    """A root file system with musl's loader, a musl program at /bin/program and the hook at /opt."""
    root = tmp_path / "root"
    for folder in ("lib", "bin", "opt"):
        (root / folder).mkdir(parents=True)
    shutil.copy(MUSL_LOADER.resolve(), root / "lib" / MUSL_LOADER.name)
    source = tmp_path / "program.c"
    source.write_text(PROGRAM)
    subprocess.run(["musl-gcc", "-o", str(root / "bin" / "program"), str(source)], check=True, timeout=120)
    shutil.copy(build.hook, root / "opt" / build.hook.name)
    return root


def run_in(root: Path, preload: str | None) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/bin"} | ({"LD_PRELOAD": preload} if preload is not None else {})
    return subprocess.run(["/bin/program"], env=env, preexec_fn=lambda: os.chroot(root),
                          cwd=root, capture_output=True, text=True, timeout=60, check=False)


def test_the_musl_program_runs_without_the_hook(musl_root: Path) -> None:
    result = run_in(musl_root, None)
    assert (result.returncode, result.stdout) == (0, "main ran\n"), result.stderr


def test_with_the_hook_preloaded_it_exits_127_before_main(musl_root: Path, build: Build) -> None:
    result = run_in(musl_root, f"/opt/{build.hook.name}")
    assert result.returncode == 127, (result.stdout, result.stderr)
    assert "main ran" not in result.stdout
    assert build.hook.name in result.stderr  # the loader names the hook it could not load


def test_a_preload_path_that_does_not_exist_is_skipped_in_silence(musl_root: Path) -> None:
    """Why the mount matters: without the file, musl runs the program unhooked and says nothing."""
    result = run_in(musl_root, "/opt/absent.so")
    assert (result.returncode, result.stdout, result.stderr) == (0, "main ran\n", "")
