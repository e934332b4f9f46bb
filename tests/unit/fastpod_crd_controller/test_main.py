"""The command line: every flag documented, impossible values refused with exit status 2."""

from __future__ import annotations

import pytest

from fastgshare_kube.process import parse_listen
from fastpod_crd_controller.main import build_parser, check_args, main

FLAGS = ["--kubeconfig", "--namespace", "--scheduler-name", "--host-ipc", "--no-host-ipc", "--workers",
         "--resync-seconds", "--leader-elect", "--no-leader-elect", "--lease-namespace", "--lease-name", "--identity",
         "--lease-duration-seconds", "--renew-deadline-seconds", "--retry-period-seconds", "--health-address",
         "--metrics-auth", "--log-level"]


def test_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: fastgshare-controller")
    for flag in FLAGS:
        assert flag in text
    documented = {option for action in build_parser()._actions for option in action.option_strings}
    assert documented == {*FLAGS, "-h", "--help", "--version"}


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    args = build_parser().parse_args([])
    assert (args.scheduler_name, args.host_ipc, args.leader_elect, args.workers, args.lease_namespace) == (
        "fastgshare-scheduler", False, True, 4, "fastgshare-system")
    monkeypatch.setenv("POD_NAMESPACE", "gpu-platform")
    assert build_parser().parse_args([]).lease_namespace == "gpu-platform"


@pytest.mark.parametrize(("argv", "message"), [
    (["--workers", "0"], "--workers must be >= 1, got 0"),
    (["--renew-deadline-seconds", "20"], "need --retry-period-seconds < --renew-deadline-seconds < "
                                         "--lease-duration-seconds, got 2.0 < 20.0 < 15.0"),
    (["--health-address", "8081"], "--health-address must be HOST:PORT, got '8081'"),
], ids=["workers", "durations", "address"])
def test_impossible_values_exit_2_and_say_why(argv: list[str], message: str,
                                              caplog: pytest.LogCaptureFixture) -> None:
    assert main(argv) == 2
    assert message in caplog.text


@pytest.mark.parametrize(("address", "where"), [(":8081", ("0.0.0.0", 8081)), ("[::1]:8081", ("::1", 8081))])
def test_the_health_address_is_read_as_every_service_reads_a_listen_address(
        address: str, where: tuple[str, int]) -> None:
    args = build_parser().parse_args(["--health-address", address])
    check_args(args)  # once refused: an empty host (all addresses), and IPv6 kept its brackets
    assert parse_listen(args.health_address, "--health-address") == where
