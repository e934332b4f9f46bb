"""``fastgshare cluster up``'s asynchronous invocations: a missing nats-server is one line and turns async
off (nothing else fails), the order ``down`` stops the pieces in, and the real nats-server and queue worker
``up`` starts, recorded in the state file, their store under the state directory, and stopped."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fastgshare_cluster import cluster
from fastgshare_cluster.cluster import NATS_MISSING, Options, _Startup, ensure_nats, nats_command
from fastgshare_cluster.processes import is_running


def test_without_nats_server_async_is_off_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: None)
    said: list[str] = []
    assert ensure_nats(install=False, say=said.append) is None
    assert said == ["nats-server is not installed (apt-get install nats-server): asynchronous invocations are off "
                    "and /async-function/* answers 501"]
    assert said == [NATS_MISSING]


def test_nats_server_is_installed_when_up_may_and_a_failed_install_only_turns_async_off(
        monkeypatch: pytest.MonkeyPatch) -> None:
    installed: list[list[str]] = []
    present = {"apt-get": "/usr/bin/apt-get"}
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kwargs: present.get(name))

    def apt_get(args: list[str], **_kwargs: object) -> subprocess.CompletedProcess[str]:
        installed.append(args)
        return subprocess.CompletedProcess(args, 100, "", "E: Unable to locate package nats-server")

    monkeypatch.setattr(subprocess, "run", apt_get)
    said: list[str] = []
    assert ensure_nats(install=True, say=said.append) is None
    assert installed == [["apt-get", "install", "-y", "-q", "--no-install-recommends", "nats-server"]]
    assert said == ["installing Debian package: nats-server", NATS_MISSING]

    def apt_get_works(args: list[str], **_kwargs: object) -> subprocess.CompletedProcess[str]:
        present["nats-server"] = "/usr/sbin/nats-server"
        return subprocess.CompletedProcess(args, 0, "", "")

    monkeypatch.setattr(subprocess, "run", apt_get_works)
    assert ensure_nats(install=True, say=said.append) == "/usr/sbin/nats-server"


def test_down_stops_the_worker_before_the_gateway_and_nats_after_it() -> None:
    rank = {name: cluster._stop_rank(name) for name in ("fastgshare-queue-worker", "fastgshare-gateway",
                                                        "nats-server", "fastgshare-function-controller", "etcd")}
    assert rank["fastgshare-queue-worker"] < rank["fastgshare-gateway"] < rank["nats-server"] < rank["etcd"]
    assert {"nats", "queue-worker"} <= set(cluster.RESTARTABLE)


def test_nats_listens_on_loopback_with_jetstream_in_the_given_store(tmp_path: Path) -> None:
    assert nats_command("/usr/sbin/nats-server", tmp_path / "nats", 4222, 8222) == [
        "/usr/sbin/nats-server", "-js", "-sd", str(tmp_path / "nats"), "-a", "127.0.0.1", "-p", "4222", "-m", "8222"]


@pytest.mark.skipif(shutil.which("nats-server") is None, reason="needs Debian's nats-server (apt-get install "
                                                                "nats-server)")
def test_up_starts_nats_and_a_worker_bound_to_its_stream_and_records_them(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    credentials = tmp_path / "gateway-auth"  # as up writes Secret basic-auth's keys
    credentials.mkdir()
    (credentials / "basic-auth-user").write_text("admin")
    (credentials / "basic-auth-password").write_text("secret")
    startup = _Startup(Options(state_dir=state_dir, die_with_parent=True), nats_server=shutil.which("nats-server"))
    try:
        queue = startup.start_queue("http://127.0.0.1:9", credentials)
        assert queue is not None
        queue.wait()  # nats-server's /healthz, then the worker's (200 once it made and bound the stream)
        assert queue.nats_url.startswith("nats://127.0.0.1:")
        assert (state_dir / "nats" / "jetstream").is_dir()
        recorded = json.loads((state_dir / cluster.STATE_FILE).read_text())["components"]
        assert [c["name"] for c in recorded] == ["nats-server", "fastgshare-queue-worker"]
        assert all(Path(c["log"]).parent == state_dir / "logs" for c in recorded)
        assert all(is_running(c["pid"], c["start_time"]) for c in recorded)
    finally:
        startup.processes.stop_all()
    assert not any(is_running(c["pid"], c["start_time"]) for c in recorded)
    assert _Startup(Options(state_dir=state_dir), nats_server=None).start_queue("http://127.0.0.1:9", tmp_path) is None
