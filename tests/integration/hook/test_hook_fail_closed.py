"""Without a working arbiter the hook refuses launches with one clear line and never hangs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from fastgshare import keys
from fastgshare.protocol import ErrorCode, ErrorReply
from simgpu.state import read_state
from tests.integration.hook.fake_arbiter import FakeArbiter, Script
from tests.integration.hook.tenants import Build, TenantResult, finish_tenant, run_tenant, start_tenant

StartArbiter = Callable[[Script], FakeArbiter]
NOT_PERMITTED = 800


NO_RECONNECT = {keys.ENV_HOOK_RECONNECT_S: "0"}  # a lost link fails closed at once


def _assert_refused(result: TenantResult, gpu_dir: Path, reason: str, launched: int = 0) -> None:
    assert result.returncode == 2, result.stderr
    assert result.summary["first_error"] == NOT_PERMITTED
    assert result.summary["first_error_name"] == "CUDA_ERROR_NOT_PERMITTED"
    assert result.summary["launches"] == launched
    *_, line = result.hook_lines
    assert len(result.hook_lines) == 1 or "lost the arbiter" in result.hook_lines[0]
    assert reason in line
    assert "fail closed" in line
    assert read_state(gpu_dir).by_pid(result.summary["pid"]).kernels == launched  # nothing ran unthrottled


def test_without_the_socket_variable_every_launch_is_refused(build: Build, gpu_dir: Path) -> None:
    result = run_tenant(build, gpu_dir, "--launches", "5", "--keep-going")
    _assert_refused(result, gpu_dir, "FASTGSHARE_ARBITER_SOCKET is not set")
    assert result.summary["errors"] == 5  # every launch, and still one line
    assert result.summary["elapsed_s"] < 1.0


@pytest.mark.parametrize("path", ["linked", "procaddr-v2"])
def test_an_unreachable_arbiter_refuses_launches(build: Build, gpu_dir: Path, short_tmp: Path, path: str) -> None:
    socket_path = short_tmp / "nobody-listens.sock"
    result = run_tenant(build, gpu_dir, "--path", path, "--launches", "3",
                        env={"FASTGSHARE_ARBITER_SOCKET": str(socket_path)})
    _assert_refused(result, gpu_dir, f"cannot connect to the arbiter at {socket_path}")


def test_an_arbiter_closing_the_connection_mid_run_stops_launches(build: Build, gpu_dir: Path,
                                                                  start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(token_ns=1, close_after_tokens=3))
    result = run_tenant(build, gpu_dir, "--launches", "10", "--duration-us", "100", arbiter=arbiter, env=NO_RECONNECT)
    _assert_refused(result, gpu_dir, "the arbiter closed the connection", launched=3)


def test_an_arbiter_that_does_not_come_back_fails_closed_after_the_reconnect_bound(
        build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(silent_tokens=True))
    process = start_tenant(build, gpu_dir, "--launches", "3", arbiter=arbiter,
                           env={"FASTGSHARE_HOOK_RECONNECT_S": "0.5"})
    assert arbiter.wait_for(lambda requests: len(requests) == 2)  # HELLO, then the TOKEN left unanswered
    started = time.monotonic()
    arbiter.close()  # and nobody listens any more
    result = finish_tenant(process, timeout_s=10)
    assert 0.4 <= time.monotonic() - started < 3.0
    _assert_refused(result, gpu_dir, "no arbiter within 500 ms of losing it")
    assert "lost the arbiter (the arbiter closed the connection); reconnecting for up to 500 ms" in \
        result.hook_lines[0]


def test_an_arbiter_dying_while_a_launch_waits_for_a_token(build: Build, gpu_dir: Path,
                                                           start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(silent_tokens=True))
    process = start_tenant(build, gpu_dir, "--launches", "3", arbiter=arbiter, env=NO_RECONNECT)
    assert arbiter.wait_for(lambda requests: len(requests) == 2)  # HELLO, then the TOKEN left unanswered
    started = time.monotonic()
    arbiter.close()
    result = finish_tenant(process, timeout_s=10)
    assert time.monotonic() - started < 2.0  # not the 30 s reply timeout
    _assert_refused(result, gpu_dir, "the arbiter closed the connection")


def test_a_reply_that_never_comes_times_out(build: Build, gpu_dir: Path, start_arbiter: StartArbiter) -> None:
    arbiter = start_arbiter(Script(silent_tokens=True))
    result = run_tenant(build, gpu_dir, "--launches", "3", arbiter=arbiter,
                        env={"FASTGSHARE_HOOK_REPLY_TIMEOUT_MS": "300", **NO_RECONNECT})
    _assert_refused(result, gpu_dir, "no reply from the arbiter within 300 ms")
    assert 0.25 <= result.summary["elapsed_s"] < 3.0


def test_an_error_reply_is_reported_with_its_code_and_message(build: Build, gpu_dir: Path,
                                                              start_arbiter: StartArbiter) -> None:
    refusal = ErrorReply(ErrorCode.UNKNOWN_CLIENT, "pid 42 belongs to no pod on this node")
    arbiter = start_arbiter(Script(hello_error=refusal))
    result = run_tenant(build, gpu_dir, "--launches", "2", arbiter=arbiter)
    _assert_refused(result, gpu_dir, "arbiter refused HELLO: UNKNOWN_CLIENT (3): pid 42 belongs to no pod on this node")


@pytest.mark.parametrize(("variable", "value", "reason"), [
    ("FASTGSHARE_SYNC_AT_TOKEN_END", "maybe", "FASTGSHARE_SYNC_AT_TOKEN_END=maybe is not 0 or 1"),
    ("FASTGSHARE_HOOK_REPLY_TIMEOUT_MS", "soon", "FASTGSHARE_HOOK_REPLY_TIMEOUT_MS=soon is not a positive number"),
    ("FASTGSHARE_HOOK_RECONNECT_S", "-1", "FASTGSHARE_HOOK_RECONNECT_S=-1 is not a number of seconds"),
    ("FASTGSHARE_POD", "x" * 400, "FASTGSHARE_POD is longer than 319 bytes"),
])
def test_an_unusable_setting_fails_closed(build: Build, gpu_dir: Path, start_arbiter: StartArbiter, *, variable: str,
                                          value: str, reason: str) -> None:
    arbiter = start_arbiter(Script())
    result = run_tenant(build, gpu_dir, "--launches", "2", arbiter=arbiter, env={variable: value})
    _assert_refused(result, gpu_dir, reason)
    assert arbiter.requests == []
