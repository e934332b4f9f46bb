"""The memory coverage matrix on the fake GPU, and the check that ties it to the hook's one symbol list.

The matrix itself (rows, ways, what an enforced cell must show) lives in ``memory_matrix.py`` so
the GPU machine can run it without pytest. The launch half of the matrix is
``test_hook_gating.py::test_every_launch_path_is_gated``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.hook.memory_matrix import (
    ROWS,
    Setup,
    cell_problems,
    escaped,
    fake_setup,
    render,
    run_matrix,
    run_memcheck_cell,
)
from tests.integration.hook.symbols import exported_names, hooked_symbols
from tests.integration.hook.tenants import BUILD, Build, tenant_env

# The launch half of the matrix (test_hook_gating.py): its APIs, each with its _ptsz variant.
LAUNCH_COVERAGE = {f"{name}{suffix}" for name in ("cuLaunchKernel", "cuLaunchKernelEx", "cuLaunchCooperativeKernel",
                                                  "cuGraphLaunch") for suffix in ("", "_ptsz")}
# The resolver itself: every gpa-* column reaches its paths through it, re-resolved through itself.
RESOLVER_COVERAGE = {"cuGetProcAddress", "cuGetProcAddress_v2"}


@pytest.fixture
def setup(build: Build) -> Iterator[Setup]:
    with tempfile.TemporaryDirectory(prefix="fakegpu-") as gpu, \
            tempfile.TemporaryDirectory(prefix="fgs-m-", dir="/tmp") as sockets:
        yield fake_setup(Path(gpu), Path(sockets), BUILD)


def test_every_memory_path_is_enforced_through_every_way(setup: Setup, capsys: pytest.CaptureFixture[str]) -> None:
    results = run_matrix(setup)
    table = render(results, "fake GPU 16 GiB")
    with capsys.disabled():
        print("\n" + table)
    assert all(problems is not None for problems in results.values())
    assert not escaped(results), f"{table}\n\nescaping cells: {escaped(results)}"


def test_without_the_hook_every_path_escapes(setup: Setup) -> None:
    """The matrix can fail: with the hook absent each path shows ✗ (checked one way per path)."""
    for row in ROWS:
        run, events = run_memcheck_cell(setup, row, "linked", hook=False)
        assert run.returncode == 0, run.stderr
        assert cell_problems(row, run, events), row.case


def test_every_hooked_symbol_is_exported_resolvable_and_covered(build: Build, gpu_dir: Path) -> None:
    rows = hooked_symbols()
    symbols = {row.symbol for row in rows}
    # Exported: exactly the list, plus the dlsym and dlvsym overrides.
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not installed")
    listing = subprocess.run(["nm", "-D", "--defined-only", str(build.hook)], capture_output=True, text=True,
                             check=True).stdout
    assert {line.split()[-1] for line in listing.splitlines() if line.strip()} == exported_names()
    # Resolvable: by dlsym on the library's handle, and (driver rows) through both cuGetProcAddress
    # ABIs by base name at the row's version and flag, always to the hook's own export.
    lines = "".join(f"nvml {r.symbol}\n" if r.base is None else f"cuda {r.symbol} {r.base} {r.since} {r.per_thread}\n"
                    for r in rows)
    resolved = subprocess.run([str(build.memcheck), "resolve"], input=lines, capture_output=True, text=True,
                              timeout=30, check=True, env=tenant_env(build, gpu_dir, hook=True))
    answers = [json.loads(line) for line in resolved.stdout.splitlines()]
    assert [a["symbol"] for a in answers] == [r.symbol for r in rows]
    unresolved = {a["symbol"]: a for a in answers if not all(v for k, v in a.items() if k != "symbol")}
    assert not unresolved
    # Covered: every row by the memory matrix or the launch matrix; no matrix row names a symbol
    # the hook does not list.
    memory_coverage = set().union(*(row.symbols for row in ROWS))
    assert memory_coverage <= symbols
    assert symbols - memory_coverage - LAUNCH_COVERAGE - RESOLVER_COVERAGE == set()
