"""The runs' shared session with a real standalone arbiter: a joining run whose share the arbiter does
not take (it reloads another file) gets one line instead of starting CMD, and its share is withdrawn."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastgshare.share import ShareSpec, share_annotations
from fastgshare_cli import run_session
from fastgshare_cli.run_gpu import simulated_gpu
from fastgshare_cli.run_session import RunSession, SessionError, hello_answer
from fastgshare_cli.sandbox import arbiter_command, write_shares
from tests.integration.run.conftest import Runs

GPU = simulated_gpu("1x16GiB:80sm")
SHARE = ShareSpec(request_permille=300, limit_permille=300, sm_percent=100, memory_bytes=1 << 30)


def test_a_run_the_arbiter_does_not_take_is_refused_with_one_line(runs: Runs, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_session, "ARBITER_RELOAD_TIMEOUT_S", 1.0)
    fixed = tmp_path / "fixed.json"  # what this arbiter reads on SIGHUP: only the first run's share
    write_shares(fixed, GPU.uuid, GPU.mps, {"run/1": share_annotations(SHARE)})
    session = RunSession(runs.state, lambda sock, shares, usage: arbiter_command(sock, fixed))
    first = session.join("1", "run/1", GPU, explicit_gpu=False, share_for=lambda gpu: SHARE)
    try:
        [arbiter] = runs.arbiters()
        with pytest.raises(SessionError) as refused:
            session.join("2", "run/2", GPU, explicit_gpu=False, share_for=lambda gpu: SHARE)
        message = str(refused.value)
        assert ("did not take the run's share within 1 s (HELLO as run/2: pod run/2 has no fastgshare assignment"
                in message)
        assert "\n" not in message
        assert runs.arbiters() == [arbiter]  # the run going keeps its arbiter
        assert sorted(path.name for path in (runs.state / "runs").iterdir()) == ["1.json"]
        assert '"run/2"' not in (runs.state / "shares-1.json").read_text()
        assert hello_answer(runs.state / "arbiter.sock", "run/1", GPU.uuid) is None
    finally:
        session.leave(first)
    assert runs.arbiters() == []
    assert not runs.state.exists()
