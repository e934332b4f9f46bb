"""The command line and the settings: documented flags, and errors naming the flag and what is allowed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scheduler_extender.config import ConfigError, ExtenderConfig
from scheduler_extender.main import main


@pytest.mark.parametrize("flag", ["--listen", "--webhook-listen", "--metrics-listen"])
@pytest.mark.parametrize("text", ["8888", "host:", "host:http", "host:70000"])
def test_a_bad_listen_address_names_its_flag_and_the_form(flag: str, text: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Every listener's address is read by fastgshare_kube.process.parse_listen (its forms are tested
    there): one line naming the flag, the value and what is allowed, exit status 2."""
    extra = ["--webhook-cert", "c.pem", "--webhook-key", "k.pem"] if flag == "--webhook-listen" else []
    with pytest.raises(SystemExit) as caught:
        main([flag, text, *extra, "--allow-unsigned-assignments"])
    assert caught.value.code == 2
    assert f"{flag} must be HOST:PORT, got {text!r} (PORT 0..65535" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"bind_wait_s": -1}, "--bind-wait-seconds must be in 0..600, got -1", id="negative-wait"),
        pytest.param({"bind_window": 0}, "--bind-window must be in 1..1000, got 0", id="empty-window"),
        pytest.param({"filter_passes": "all"}, "--filter-passes must be one of best, fitting, got 'all'",
                     id="unknown-filter-passes"),
        pytest.param({"max_body_bytes": 10}, "--max-body-bytes must be >= 1024, got 10", id="tiny-body"),
    ],
)
def test_invalid_settings_name_the_flag(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ExtenderConfig(**kwargs)  # type: ignore[arg-type]


def test_help_documents_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--help"])
    assert caught.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--listen HOST:PORT", "--kubeconfig", "--policy {binpack,spread}", "--bind-wait-seconds",
                 "--filter-passes {best,fitting}",
                 "--max-body-bytes", "--log-level", "/inspect", "fastgshare/scheduling_policy"):
        assert flag in text


def test_bad_flag_value_exits_2_with_the_reason(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--listen", "nowhere"])
    assert caught.value.code == 2
    assert "--listen must be HOST:PORT, got 'nowhere'" in capsys.readouterr().err


def test_unreadable_kubeconfig_exits_1_with_a_message(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["--kubeconfig", str(tmp_path / "missing"), "--listen", "127.0.0.1:0",
                     "--allow-unsigned-assignments"]) == 1
    assert f"--kubeconfig {tmp_path / 'missing'}: no such file" in caplog.text


@pytest.mark.parametrize(("setup", "message"), [
    (None, "--assignment-key-file PATH is required"),
    ("missing", "cannot read the assignment key"),
    ("short", "the assignment key has 31 bytes; at least 32"),
])
def test_an_unusable_assignment_key_exits_2_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          setup: str | None, message: str) -> None:
    key = tmp_path / "key"
    if setup == "short":
        key.write_bytes(b"k" * 31)
    flags = [] if setup is None else ["--assignment-key-file", str(key)]
    assert main(["--kubeconfig", str(tmp_path / "missing"), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert message in err[0]
