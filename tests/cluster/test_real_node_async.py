"""Asynchronous invocations on the cluster ``fastgshare cluster up`` starts: ``POST /async-function/...``
on its gateway is stored in its NATS JetStream, its queue worker calls the function (a FaSTPod on the
real node, through the gateway) and posts the answer to the caller's ``X-Callback-Url``; the worker's
``/metrics`` counts the call, and the function controller is given the worker to read.

Needs Debian's ``nats-server`` (``.ci/run`` installs it; ``up`` installs it when it may)."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import kubernetes.client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastgshare import keys
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.processes import LOOPBACK, free_ports, wait_until
from tests.cluster.real_node import apply, real_node_core  # noqa: F401 - the fixture core
from tests.cluster.test_real_node_functions import (  # noqa: F401 - the fixture function_namespace
    NAMESPACE,
    custom,
    fake_fn_fastpod,
    function_namespace,
    running,
)

pytestmark = pytest.mark.realnode


class Callbacks(http.server.ThreadingHTTPServer):
    """The caller's receiver: every POST it gets, as (path, headers, body)."""

    def __init__(self, port: int) -> None:
        self.received: list[tuple[str, dict[str, str], bytes]] = []
        super().__init__((LOOPBACK, port), _Receiver)


class _Receiver(http.server.BaseHTTPRequestHandler):
    server: Callbacks

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.server.received.append((self.path, dict(self.headers.items()), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def callbacks() -> Iterator[Callbacks]:
    server = Callbacks(free_ports(1)[0])
    thread = threading.Thread(target=server.serve_forever, name="callbacks", daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def post_async(url: str, body: bytes, callback_url: str) -> tuple[int, dict[str, str]]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"X-Callback-Url": callback_url})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers.items())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers.items())


def completed(cluster: Cluster, function_name: str) -> dict[str, float]:
    """The queue worker's ``fastgshare_queue_completed_total`` for one function, by code."""
    with urllib.request.urlopen(f"{cluster.queue_worker_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {sample.labels["code"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name == "fastgshare_queue_completed_total"
            and sample.labels.get("function_name") == function_name}


def test_an_async_call_reaches_the_function_and_its_answer_the_callback(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, function_namespace: str,  # noqa: F811
        callbacks: Callbacks) -> None:
    assert real_cluster.nats_url.startswith(f"nats://{LOOPBACK}:"), "cluster up started no nats-server"
    assert real_cluster.queue_worker_url
    state = json.loads((real_cluster.state_dir / "cluster.json").read_text())
    names = [component["name"] for component in state["components"]]
    assert {"nats-server", "fastgshare-queue-worker"} <= set(names)
    # the store lies under the state directory (down removes it), and the autoscaler reads the worker
    assert (real_cluster.state_dir / "nats" / "jetstream").is_dir()
    controller = next(c for c in state["components"] if c["name"] == "fastgshare-function-controller")
    argv = Path(f"/proc/{controller['pid']}/cmdline").read_bytes().split(b"\0")
    assert real_cluster.queue_worker_url.encode() in argv

    apply(real_cluster, function_namespace, fake_fn_fastpod("async-echo"))
    running(core, f"{keys.FASTPOD_NAME_LABEL}=async-echo", 1)

    callback_url = f"http://{LOOPBACK}:{callbacks.server_address[1]}/done"
    status, headers = post_async(f"{real_cluster.gateway_url}/async-function/async-echo/infer", b"a picture",
                                 callback_url)
    assert status == 202, headers
    call_id = headers["X-Call-Id"]
    # the gateway may not have the pod's endpoint yet: the worker retries 5xx until it has
    wait_until(lambda: bool(callbacks.received), what=f"the callback to {callback_url}", timeout_s=120)
    [(path, received, body)] = callbacks.received
    assert path == "/done"
    assert received["X-Call-Id"] == call_id
    assert received["X-Function-Name"] == f"async-echo.{NAMESPACE}"
    assert received["X-Function-Status"] == "200", body
    answer = json.loads(body)
    assert answer["echo"] == "a picture"
    assert answer["kernels"] > 0  # it ran on the (simulated) GPU, through the hook
    assert answer["pod"].startswith(f"{NAMESPACE}/async-echo-")
    wait_until(lambda: completed(real_cluster, f"async-echo.{NAMESPACE}").get("200") == 1,
               what="the worker's completed count", timeout_s=10)

    # a function that does not exist is refused before anything is stored
    assert post_async(f"{real_cluster.gateway_url}/async-function/nope", b"x", callback_url)[0] == 404
