"""The controller as a command (``python -m fastpod_crd_controller``) and its health endpoint."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from fastgshare_kube.health import HealthServer


def command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fastpod_crd_controller", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_help_lists_the_flags() -> None:
    done = command("--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: fastgshare-controller")
    for flag in ("--kubeconfig", "--scheduler-name", "--workers", "--leader-elect", "--lease-namespace"):
        assert flag in done.stdout


def test_an_impossible_flag_value_exits_2_with_the_reason() -> None:
    done = command("--workers", "0")
    assert done.returncode == 2
    assert "--workers must be >= 1, got 0" in done.stderr


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return error.code


@pytest.mark.parametrize(("healthy", "expected"), [(True, 200), (False, 503)])
def test_healthz_reports_the_check(healthy: bool, expected: int) -> None:
    server = HealthServer("127.0.0.1", 0, lambda: healthy)
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert status_of(f"{base}/healthz") == expected
        assert status_of(f"{base}/readyz") == expected
        assert status_of(f"{base}/metrics") == 404
    finally:
        server.stop()


def test_a_kubeconfig_that_is_not_there_is_one_clear_line(tmp_path: object) -> None:
    """Issue 15, defect 7: it was a traceback ending in 'Invalid kube-config file. No configuration found.'"""
    done = command("--kubeconfig", "/nonexistent/kubeconfig")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.endswith("--kubeconfig /nonexistent/kubeconfig: no such file; pass the path of a kubeconfig "
                         "file, or leave the flag out to use the in-cluster config, else ~/.kube/config")
