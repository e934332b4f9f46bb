"""The function controller's process: misconfiguration is one line and an exit status, never a traceback."""

from __future__ import annotations

import pytest

from fastfunc_controller.main import main


def test_a_missing_kubeconfig_is_one_line_and_status_2(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["--kubeconfig", "/nonexistent/kubeconfig", "--no-leader-elect"]) == 2
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage().startswith("--kubeconfig /nonexistent/kubeconfig: no such file; pass the path")
    assert record.exc_info is None


def test_impossible_lease_timings_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["--renew-deadline-seconds", "20"]) == 2
    assert "need --retry-period-seconds < --renew-deadline-seconds < --lease-duration-seconds" in caplog.text
