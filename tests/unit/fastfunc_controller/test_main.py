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


def test_prometheus_mode_and_direct_mode_exclude_each_other(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["--prometheus-url", "http://127.0.0.1:9090", "--gateway-url", "http://127.0.0.1:8080"]) == 2
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage().startswith("--prometheus-url and --gateway-url exclude each other; allowed: one of")


@pytest.mark.parametrize(("argv", "message"), [
    (["--prometheus-url", "prometheus:9090"],
     "--prometheus-url 'prometheus:9090' is not a Prometheus URL; allowed: http[s]://HOST[:PORT][/PREFIX]"),
    (["--prometheus-url", "http://p:9090", "--prometheus-scrape-interval-seconds", "0"],
     "--prometheus-scrape-interval-seconds must be 0.1..60, got 0.0"),
])
def test_a_bad_prometheus_flag_is_one_line(caplog: pytest.LogCaptureFixture, argv: list[str], message: str) -> None:
    assert main(argv) == 2
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage().startswith(message)


def test_queue_workers_are_read_in_direct_mode_only(caplog: pytest.LogCaptureFixture) -> None:
    assert main(["--prometheus-url", "http://127.0.0.1:9090", "--queue-worker-url", "http://127.0.0.1:8081"]) == 2
    assert main(["--queue-worker-url", "127.0.0.1:8081"]) == 2
    first, second = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert first.startswith("--prometheus-url and --queue-worker-url exclude each other; allowed: one of them")
    assert second.startswith("--queue-worker-url '127.0.0.1:8081' is not a URL; allowed: http[s]://")
