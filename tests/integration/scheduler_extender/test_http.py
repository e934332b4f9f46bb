"""The extender over real HTTP (the production server), and the real command as a process."""

from __future__ import annotations

import http.client
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fastgshare_cluster.processes import free_ports, http_ok, wait_until
from scheduler_extender.config import ExtenderConfig
from scheduler_extender.http.apps import create_app
from scheduler_extender.services import build_services
from tests.integration.scheduler_extender.harness import REPO, ExtenderProcess, get_json, serving
from tests.unit.scheduler_extender.conftest import FakeKube, node_record, pod_record, synced_state
from tests.unit.scheduler_extender.test_wire import PAYLOADS


@pytest.fixture
def extender() -> Iterator[tuple[str, FakeKube]]:
    state = synced_state(node_record("node-a"), node_record("node-b"))
    kube = FakeKube()
    kube.watch = state.upsert_pod
    with serving(create_app(build_services(ExtenderConfig(bind_wait_s=0), state, kube))) as url:
        yield url, kube


def test_scheduler_calls_on_one_kept_alive_connection(extender: tuple[str, FakeKube]) -> None:
    """The recorded v1.20 bodies, sent as Go's client sends them, on one HTTP/1.1 connection."""
    url, kube = extender
    uid = json.loads((PAYLOADS / "v1.20.2-cache-bind.json").read_text())["PodUID"]
    kube.add(pod_record("pod-cache", namespace="default", uid=uid))
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    answers = {}
    for verb in ("filter", "prioritize", "bind"):
        body = (PAYLOADS / f"v1.20.2-cache-{verb}.json").read_bytes()
        connection.request("POST", f"/{verb}", body=body, headers={
            "Content-Type": "application/json", "User-Agent": "Go-http-client/1.1", "Accept-Encoding": "gzip"})
        response = connection.getresponse()
        assert (response.status, response.getheader("Content-Type")) == (200, "application/json")
        answers[verb] = json.loads(response.read())
    connection.close()
    assert answers["filter"]["NodeNames"] == ["node-a", "node-b"]
    assert {entry["Host"] for entry in answers["prioritize"]} == {"node-a", "node-b"}
    assert answers["bind"] == {"Error": ""}
    assert kube.pods["default/pod-cache"].node_name == "node-b"


def test_garbage_on_the_wire_gets_a_json_4xx(extender: tuple[str, FakeKube]) -> None:
    url, _ = extender
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    connection.request("POST", "/filter", body=b"\xff\xfe not json", headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    assert response.status == 400
    assert "not valid JSON" in json.loads(response.read())["Error"]
    assert get_json(f"{url}/healthz") == {"status": "ok"}  # still serving


def test_command_help() -> None:
    done = subprocess.run([sys.executable, "-m", "scheduler_extender", "--help"], capture_output=True, text=True,
                          cwd=REPO, timeout=60, check=False)
    assert done.returncode == 0
    assert "--listen HOST:PORT" in done.stdout


def test_command_serves_unready_without_an_api_server_and_stops_on_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{free_ports(1)[0]}"}}],
        "users": [{"name": "u", "user": {}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    process = ExtenderProcess(kubeconfig, free_ports(1)[0], tmp_path / "extender.log")
    with pytest.raises(RuntimeError, match="did not become ready"):
        process.start(timeout_s=3)
    # Alive but not ready; on a loaded machine it may still be importing after those 3 s.
    wait_until(lambda: http_ok(f"{process.url}/healthz"), what="the extender's /healthz", timeout_s=60)
    assert get_json(f"{process.url}/healthz") == {"status": "ok"}
    answer = http.client.HTTPConnection(process.url.removeprefix("http://"), timeout=10)
    answer.request("POST", "/filter", body=(PAYLOADS / "v1.20.2-cache-filter.json").read_bytes(),
                   headers={"Content-Type": "application/json"})
    assert "has not synced" in json.loads(answer.getresponse().read())["Error"]
    assert process.stop(signal.SIGTERM) == 0
    log = process.log_path.read_text()
    assert "extender listening" in log
    assert "list/watch failed" in log
    assert "extender stopped" in log
