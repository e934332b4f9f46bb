"""The hook's C unit tests (``make -C vgpu_hook test``: quota, allocation table, charged sizes) pass."""

from __future__ import annotations

import subprocess
import sys

from tests.integration.hook.tenants import HOOK_DIR, Build


def test_make_test_runs_the_c_unit_tests(build: Build) -> None:
    result = subprocess.run(["make", "-C", str(HOOK_DIR), f"PYTHON={sys.executable}", "test"], capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test_quota:" in result.stdout
    assert "test_memory:" in result.stdout
    assert result.stdout.count(", 0 failed") == 2
