"""``fastgshare-queue-worker``'s flags: bad values are one line and exit 2; credentials it cannot read are
one line and exit 1, before any connection."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastgshare import keys
from fastgshare_queue.main import build_parser, main

GATEWAY = ["--gateway-url", "http://127.0.0.1:8080"]


@pytest.mark.parametrize(("flags", "says"), [
    (["--gateway-url", "127.0.0.1:8080"], "not a URL"),
    ([*GATEWAY, "--nats-url", "127.0.0.1:4222"], "not a NATS URL"),
    ([*GATEWAY, "--async-stream", "a b"], "allowed 1 to 64"),
    ([*GATEWAY, "--max-inflight", "0"], "whole number >= 1"),
    ([*GATEWAY, "--max-retries", "-1"], "whole number >= 0"),
    ([*GATEWAY, "--retry-base", "0"], "must be > 0"),
    ([*GATEWAY, "--ack-wait", "soon"], "is not a number"),
])
def test_bad_flags_are_one_line_naming_the_value(flags: list[str], says: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(flags)
    assert exited.value.code == 2
    [line] = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert says in line
    assert repr(flags[-1]) in line


def test_the_gateway_url_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([])
    assert exited.value.code == 2
    assert "--gateway-url" in capsys.readouterr().err


def test_a_bad_listen_address_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*GATEWAY, "--listen", "nowhere"])
    assert exited.value.code == 2
    assert "--listen" in capsys.readouterr().err


def test_unreadable_credentials_are_one_line_and_exit_1(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / keys.BASIC_AUTH_USER_KEY).write_text("admin")
    assert main([*GATEWAY, "--basic-auth-dir", str(tmp_path), "--nats-url", "nats://127.0.0.1:1",
                 "--listen", "127.0.0.1:0"]) == 1
    assert keys.BASIC_AUTH_PASSWORD_KEY in caplog.text


def test_defaults() -> None:
    args = build_parser().parse_args(GATEWAY)
    assert (args.nats_url, args.async_stream, args.max_inflight, args.max_retries, args.listen) == (
        "nats://127.0.0.1:4222", "fastgshare-async", 8, 5, "0.0.0.0:8081")
