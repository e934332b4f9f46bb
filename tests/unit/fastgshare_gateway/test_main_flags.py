"""The gateway's access flags: no credentials and no ``--no-auth`` refuses to start with one line;
unreadable credentials are one line and exit 1, before any Kubernetes call."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastgshare import keys
from fastgshare_gateway.main import build_parser, main


def test_without_basic_auth_dir_or_no_auth_it_refuses_to_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--listen", "127.0.0.1:0"])
    assert exited.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1
    assert "--basic-auth-dir" in lines[0]
    assert "--no-auth" in lines[0]


@pytest.mark.parametrize("flags", [["--no-auth", "--basic-auth-dir", "/x"], ["--no-auth", "--auth-functions"],
                                   ["--no-auth", "--max-replicas", "0"],
                                   ["--no-auth", "--allowed-image-prefixes", "a/,,b/"]])
def test_contradictory_or_bad_access_flags_are_usage_errors(flags: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(flags)
    assert exited.value.code == 2


def test_unreadable_credentials_are_one_line_and_exit_1(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / keys.BASIC_AUTH_USER_KEY).write_text("admin")
    assert main(["--basic-auth-dir", str(tmp_path), "--kubeconfig", str(tmp_path / "none")]) == 1
    assert keys.BASIC_AUTH_PASSWORD_KEY in caplog.text


def test_defaults() -> None:
    args = build_parser().parse_args(["--no-auth"])
    assert (args.max_replicas, args.allowed_image_prefixes, args.auth_functions, args.basic_auth_dir) == (
        100, (), False, None)
    args = build_parser().parse_args(["--allowed-image-prefixes", "ghcr.io/a/, registry.example/b/"])
    assert args.allowed_image_prefixes == ("ghcr.io/a/", "registry.example/b/")


def test_the_server_limits_default_to_numbers() -> None:
    # The defaults once came from slotted attrs classes' attributes: member descriptors, not values,
    # and every connection then failed the connection cap's comparison.
    args = build_parser().parse_args(["--no-auth"])
    assert (args.max_connections, args.idle_timeout, args.body_timeout) == (1000, 15.0, 10.0)


def test_a_bad_listen_address_is_one_line_naming_the_flag_the_value_and_what_is_allowed(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--no-auth", "--listen", "8080"])
    assert exited.value.code == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "--listen must be HOST:PORT, got '8080' (PORT 0..65535, e.g. 0.0.0.0:8080" in line


@pytest.mark.parametrize(("flags", "says"), [(["--nats-url", "http://x:4222"], "not a NATS URL"),
                                             (["--nats-url", "nats://"], "not a NATS URL"),
                                             (["--async-stream", "a.b"], "allowed 1 to 64")])
def test_bad_async_flags_are_one_line_naming_the_value(flags: list[str], says: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--no-auth", *flags])
    assert exited.value.code == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert flags[0] in line
    assert repr(flags[1]) in line
    assert says in line


def test_async_invocations_are_off_unless_a_nats_url_is_given() -> None:
    args = build_parser().parse_args(["--no-auth"])
    assert (args.nats_url, args.async_stream) == (None, "fastgshare-async")
    args = build_parser().parse_args(["--no-auth", "--nats-url", "nats://nats:4222", "--async-stream", "q"])
    assert (args.nats_url, args.async_stream) == ("nats://nats:4222", "q")
