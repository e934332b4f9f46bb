"""Basic auth from the mounted Secret's files: the check, the re-read on rotation, and which routes
need it."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest

from fastgshare import keys
from fastgshare_gateway.auth import AuthConfigError, BasicAuth, needs_auth


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def write(directory: Path, user: str, password: str) -> None:
    (directory / keys.BASIC_AUTH_USER_KEY).write_text(user)
    (directory / keys.BASIC_AUTH_PASSWORD_KEY).write_text(password + "\n")  # kubectl/echo add a newline


def test_only_the_exact_credentials_pass(tmp_path: Path) -> None:
    write(tmp_path, "admin", "s3cret")
    auth = BasicAuth(tmp_path)
    assert auth.check(header("admin", "s3cret"))
    assert auth.check("basic " + header("admin", "s3cret").split()[1])  # the scheme is case-insensitive
    for bad in (None, "", header("admin", "s3cre"), header("admin", "s3cret "), header("root", "s3cret"),
                header("admin", ""), "Bearer abc", "Basic !!!not-base64", "Basic " + base64.b64encode(b"x").decode()):
        assert not auth.check(bad), bad


def test_a_rotated_secret_applies_without_a_restart(tmp_path: Path) -> None:
    write(tmp_path, "admin", "old")
    auth = BasicAuth(tmp_path)
    assert auth.check(header("admin", "old"))
    # the kubelet swaps a directory symlink; any change of the file (inode, size, mtime) is seen
    password = tmp_path / keys.BASIC_AUTH_PASSWORD_KEY
    replacement = tmp_path / "new-password"
    replacement.write_text("rotated-password")
    os.replace(replacement, password)
    assert auth.check(header("admin", "rotated-password"))
    assert not auth.check(header("admin", "old"))


def test_a_file_missing_mid_rotation_keeps_the_last_credentials(tmp_path: Path) -> None:
    write(tmp_path, "admin", "kept")
    auth = BasicAuth(tmp_path)
    (tmp_path / keys.BASIC_AUTH_PASSWORD_KEY).unlink()
    assert auth.check(header("admin", "kept"))


@pytest.mark.parametrize("missing", [keys.BASIC_AUTH_USER_KEY, keys.BASIC_AUTH_PASSWORD_KEY])
def test_a_missing_or_empty_file_at_start_is_one_line_naming_it(tmp_path: Path, missing: str) -> None:
    write(tmp_path, "admin", "pw")
    (tmp_path / missing).unlink()
    with pytest.raises(AuthConfigError, match=missing):
        BasicAuth(tmp_path)
    (tmp_path / missing).write_text("  \n")
    with pytest.raises(AuthConfigError, match=f"{missing} is empty"):
        BasicAuth(tmp_path)


def test_system_routes_need_auth_functions_only_when_asked_probes_never() -> None:
    for route in ("/system/functions", "/system/function/{name}", "/system/scale-function/{name}",
                  "/system/info", "/system/{tail}", "/", "/ui/"):
        assert needs_auth(route, auth_functions=False), route
    for route in ("/function/{name}", "/function/{name}/{tail}", "/async-function/{tail}"):
        assert not needs_auth(route, auth_functions=False)
        assert needs_auth(route, auth_functions=True)
    for route in ("/healthz", "/metrics"):
        assert not needs_auth(route, auth_functions=True)
