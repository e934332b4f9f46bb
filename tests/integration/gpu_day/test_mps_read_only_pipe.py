"""The GPU day's check that MPS clients need no writes in their pipe directory (issue 42, item 6):
its client runs in a private mount namespace where the directory is read-only, as the node agent
mounts it into pods. No GPU here, so a stand-in client reports whether it could write there; the
GPU day runs NVIDIA's own client the same way."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from bench.gpu.mps import read_only_pipe_client
from bench.gpu.tenants import DAY, Program

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None,
                                reason="a private read-only bind mount needs root and unshare")

STAND_IN = """#!/bin/sh
# A stand-in MPS client: what the tenant prints when it cannot write into the pipe directory.
if touch "$CUDA_MPS_PIPE_DIRECTORY/planted" 2>/dev/null; then
    echo '{"error": "the pipe directory was writable"}'
else
    echo '{"busy_ms": 50.0, "sm_count": 132}'
fi
"""


def stand_in(client: Path) -> Program:
    return Program(kind=DAY, binary=str(client), ptx=str(client.parent / "kernels.ptx"))


def test_the_client_sees_the_pipe_directory_read_only_and_the_host_keeps_it_writable(tmp_path: Path) -> None:
    (tmp_path / "pipe").mkdir()
    client = tmp_path / "client"
    client.write_text(STAND_IN)
    client.chmod(0o755)
    found = read_only_pipe_client(stand_in(client), tmp_path, 8, 1)
    assert found == {"checked": True, "ok": True, "kernel_ms": 5.0}, found
    assert not (tmp_path / "pipe" / "planted").exists()
    (tmp_path / "pipe" / "daemon-file").write_text("x")  # the daemon's own view stays writable


def test_a_client_that_fails_is_reported_with_its_error(tmp_path: Path) -> None:
    (tmp_path / "pipe").mkdir()
    client = tmp_path / "client"
    client.write_text('#!/bin/sh\necho \'{"error": "cuInit: CUDA_ERROR_MPS_CONNECTION_FAILED"}\'\n')
    client.chmod(0o755)
    found = read_only_pipe_client(stand_in(client), tmp_path, 8, 1)
    assert found["checked"] is True
    assert found["ok"] is False
    assert "CUDA_ERROR_MPS_CONNECTION_FAILED" in found["error"]
