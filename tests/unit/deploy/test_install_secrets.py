"""deploy/install.sh's Secrets and key material (issue 37, items 1 and 11): it creates the gateway's
``basic-auth`` (user admin, a random password) and ``fastgshare-assignment-key`` (32 random bytes in hex) in
fastgshare-system when absent and keeps them when present, prints no secret value, and leaves no key
material in the temporary directory on any exit: success, a failure midway, or an interrupt."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from fastgshare import keys
from tests.unit.deploy.test_install_script import FAKE_KUBECTL, INSTALL

# A kubectl that knows Secrets (stored under $FAKE_LOG.secrets/NAME/KEY, from --from-file), and fails
# or hangs where a test asks; everything else as tests/unit/deploy/fake_kubectl.sh answers.
SECRET_KUBECTL = f"""#!/usr/bin/env bash
set -u
store="$FAKE_LOG.secrets"
if [ -n "${{FAKE_FAIL_ON:-}}" ] && [[ "$*" == *"$FAKE_FAIL_ON"* ]]; then
  echo "kubectl $*" >>"$FAKE_LOG"; echo "error: the server refused" >&2; exit 1
fi
case "$*" in
  *"get secret {keys.BASIC_AUTH_SECRET} "*|*"get secret {keys.ASSIGNMENT_KEY_SECRET} "*)
    echo "kubectl $*" >>"$FAKE_LOG"
    name=$(printf '%s' "$*" | sed 's/.*get secret \\([^ ]*\\).*/\\1/')
    [ -d "$store/$name" ] || {{ echo "Error from server (NotFound): secrets \\"$name\\" not found" >&2; exit 1; }}
    exit 0 ;;
  *"create secret generic"*"--dry-run"*) ;;
  *"create secret generic"*)
    echo "kubectl $*" >>"$FAKE_LOG"
    name=$(printf '%s' "$*" | sed 's/.*create secret generic \\([^ ]*\\).*/\\1/')
    mkdir -p "$store/$name"
    for arg in "$@"; do
      case "$arg" in --from-file=*) cp "${{arg#--from-file=}}" "$store/$name/";; esac
    done
    echo "secret/$name created"; exit 0 ;;
esac
if [ -n "${{FAKE_HANG_ON:-}}" ] && [[ "$*" == *"$FAKE_HANG_ON"* ]]; then
  echo "kubectl $*" >>"$FAKE_LOG"; touch "$FAKE_LOG.hanging"; sleep 60; exit 1
fi
exec "{FAKE_KUBECTL}" "$@"
"""


def setup(tmp_path: Path, **env: str) -> tuple[dict[str, str], Path, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(SECRET_KUBECTL)
    kubectl.chmod(0o755)
    temp = tmp_path / "tmp"
    temp.mkdir(exist_ok=True)
    log = tmp_path / "kubectl.log"
    full = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_LOG": str(log), "TMPDIR": str(temp),
            "FAKE_VERSION": "v1.30.6", "FASTGSHARE_WAIT_TIMEOUT": "1s", **env}
    return full, log, temp


def install(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    full, log, temp = setup(tmp_path, **env)
    result = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=120, check=False,
                            env=full, stdin=subprocess.DEVNULL)
    return result, Path(f"{log}.secrets"), temp


def test_absent_secrets_are_created_and_no_value_is_printed(tmp_path: Path) -> None:
    result, secrets, temp = install(tmp_path)
    assert result.returncode == 0, result.stderr
    auth = secrets / keys.BASIC_AUTH_SECRET
    assert (auth / keys.BASIC_AUTH_USER_KEY).read_text() == "admin"
    password = (auth / keys.BASIC_AUTH_PASSWORD_KEY).read_text()
    assert len(password) == 32
    assert password.isalnum()
    key = (secrets / keys.ASSIGNMENT_KEY_SECRET / keys.ASSIGNMENT_KEY_SECRET_KEY).read_bytes()
    assert re.fullmatch(rb"[0-9a-f]{64}", key), key  # text: nothing a reader's trim could take away
    output = result.stdout + result.stderr
    assert password not in output
    assert "get secret basic-auth -o jsonpath='{.data.basic-auth-password}' | base64 -d" in output
    calls = (tmp_path / "kubectl.log").read_text()
    assert password not in calls  # never on a command line (--from-file)
    assert list(temp.iterdir()) == []  # the key material and the webhook's key are gone


def test_a_second_run_keeps_both_secrets(tmp_path: Path) -> None:
    install(tmp_path)
    secrets = Path(f"{tmp_path / 'kubectl.log'}.secrets")
    before = (secrets / keys.BASIC_AUTH_SECRET / keys.BASIC_AUTH_PASSWORD_KEY).read_text()
    key = (secrets / keys.ASSIGNMENT_KEY_SECRET / keys.ASSIGNMENT_KEY_SECRET_KEY).read_bytes()
    result, _, temp = install(tmp_path)
    assert result.returncode == 0, result.stderr
    assert "gateway credentials: kept" in result.stdout
    assert "assignment key: kept" in result.stdout
    assert (secrets / keys.BASIC_AUTH_SECRET / keys.BASIC_AUTH_PASSWORD_KEY).read_text() == before
    assert (secrets / keys.ASSIGNMENT_KEY_SECRET / keys.ASSIGNMENT_KEY_SECRET_KEY).read_bytes() == key
    assert list(temp.iterdir()) == []


def test_a_failure_after_the_webhook_key_was_made_leaves_no_key_material(tmp_path: Path) -> None:
    # the webhook's Secret is applied from the key files: refuse it there (the leak of issue 37, row 11)
    result, _, temp = install(tmp_path, FAKE_FAIL_ON="create secret generic fastgshare-webhook-tls")
    assert result.returncode != 0
    assert list(temp.iterdir()) == []
    result, _, temp = install(tmp_path, FAKE_FAIL_ON="kustomize")
    assert result.returncode != 0
    assert list(temp.iterdir()) == []


def test_an_interrupt_midway_leaves_no_key_material(tmp_path: Path) -> None:
    full, log, temp = setup(tmp_path, FAKE_HANG_ON="kustomize")
    process = subprocess.Popen(["bash", str(INSTALL)], env=full, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not Path(f"{log}.hanging").exists():
            assert time.monotonic() < deadline, "install.sh did not reach the kustomize step"
            assert process.poll() is None, "install.sh ended early"
            time.sleep(0.05)
        assert any(temp.iterdir())  # the webhook's key is there while it runs
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
        process.wait(timeout=30)
        assert process.returncode != 0
        assert list(temp.iterdir()) == []
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the hanging fake kubectl, if still there


def test_functions_install_creates_the_gateway_secret_and_the_quota_leaving_no_key_material(tmp_path: Path) -> None:
    full, log, temp = setup(tmp_path)
    script = INSTALL.with_name("functions.sh")
    result = subprocess.run(["bash", str(script), "install"], capture_output=True, text=True, timeout=120,
                            check=False, env=full, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    password = Path(f"{log}.secrets") / keys.BASIC_AUTH_SECRET / keys.BASIC_AUTH_PASSWORD_KEY
    assert len(password.read_text()) == 32
    assert password.read_text() not in result.stdout + result.stderr
    assert "function-quota.yaml" in log.read_text()
    assert list(temp.iterdir()) == []
