"""The node agent's pod cache (:class:`device_plugin.kube.NodePods`) against a scripted API server.

A small HTTP server plays kube-apiserver for ``GET /api/v1/pods``: a list, then watches that
send exactly the lines a real server sends, ``BOOKMARK`` events included. The real Kubernetes
client and the real cache code run against it. (kube-apiserver v1.20 of the cluster tier sends
no bookmark within a test's patience; newer servers send one about every minute.)
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import attrs
import kubernetes.client
import pytest

from device_plugin.allocation import NodePod
from device_plugin.kube import NodePods
from fastgshare import keys
from fastgshare.codec import PodAssignment, encode_assignment
from fastgshare.share import share_annotations
from tests.builders import TEST_TRUST, make_share, signed_annotations
from tests.cluster.controlplane import wait_until

NODE = "gpu-node-1"


def pod(name: str, version: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}", "resourceVersion": version},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x"}]},
            "status": {"phase": "Pending"}}


def bookmark(version: str) -> dict[str, Any]:
    """A bookmark as the API server sends it: only the kind and the resourceVersion."""
    return {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                           "metadata": {"resourceVersion": version}}}


class ScriptedApi:
    """Answers lists with ``listing`` and the n-th watch with ``watches[n]`` (then nothing)."""

    def __init__(self, listing: list[dict[str, Any]], version: str, watches: list[list[dict[str, Any]]]) -> None:
        self.listing, self.version, self.watches = listing, version, watches
        self.requests: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def answer(self, query: dict[str, str]) -> bytes:
        with self.lock:
            self.requests.append(query)
            if query.get("watch") != "true":
                return json.dumps({"kind": "PodList", "apiVersion": "v1",
                                   "metadata": {"resourceVersion": self.version}, "items": self.listing}).encode()
            watched = sum(1 for q in self.requests if q.get("watch") == "true")
            events = self.watches[watched - 1] if watched <= len(self.watches) else []
        return b"".join(json.dumps(event).encode() + b"\n" for event in events)

    @property
    def lists(self) -> int:
        return sum(1 for q in self.requests if q.get("watch") != "true")

    def watch_versions(self) -> list[str]:
        return [q.get("resourceVersion", "") for q in self.requests if q.get("watch") == "true"]


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[ThreadingHTTPServer] = []

    def start(api: ScriptedApi) -> kubernetes.client.ApiClient:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query))
                body = api.answer(query)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        configuration = kubernetes.client.Configuration()
        configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
        return kubernetes.client.ApiClient(configuration)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_bookmarks_move_the_watch_on_without_a_relist(serve: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 15, defect 3: a BOOKMARK (a dict, not a V1Pod) was read as a pod, failed the watch and
    forced a relist every minute. It must only advance the resourceVersion the next watch starts from."""
    api = ScriptedApi([pod("before", "10")], "10", [
        [bookmark("12")],
        [{"type": "ADDED", "object": pod("after", "13")}, bookmark("15")],
    ])
    pods = NodePods(serve(api), NODE, trust=TEST_TRUST, retry_delay_s=0.05)
    pods.start()
    try:
        assert pods.wait_synced(10)
        wait_until(lambda: {p.name for p in pods.snapshot()[1]} == {"before", "after"},
                   what="the cache to see the pod added after the bookmark", timeout_s=10)
        wait_until(lambda: len(api.watch_versions()) >= 3, what="a third watch", timeout_s=10)
    finally:
        pods.stop()
    assert api.lists == 1
    assert api.watch_versions()[:3] == ["10", "12", "15"]
    assert not [r.getMessage() for r in caplog.records if "watch failed" in r.getMessage()]



def gpu_pod(version: str, assignment: PodAssignment, *, signed: bool = True) -> dict[str, Any]:
    """A running GPU pod whose share annotations ask for 0.3..0.6, 50 % SM, 1 GiB, with ``assignment``."""
    annotations = share_annotations(make_share(request=300, limit=600, sm=50))
    annotations.update(signed_annotations("uid-gpu", assignment) if signed
                       else {keys.POD_ASSIGNMENT_ANNOTATION: encode_assignment(assignment)})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "gpu", "namespace": "team-a", "uid": "uid-gpu", "resourceVersion": version,
                         "annotations": annotations},
            "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x",
                                                       "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}]},
            "status": {"phase": "Running"}}


def watch_until(serve: Any, api: Any, version: str, what: str) -> tuple[list[NodePod], list[tuple[str, str]]]:
    """A node agent's pod cache on ``api`` until its one pod shows ``version``: (its records, the
    refusals it reported as (pod, message))."""
    reports: list[tuple[str, str]] = []
    pods = NodePods(serve(api), NODE, trust=TEST_TRUST, retry_delay_s=0.05,
                    report=lambda pod, message: reports.append((pod.key, message)))
    pods.start()
    try:
        assert pods.wait_synced(10)
        wait_until(lambda: pods.snapshot()[1][0].resource_version == version, what=what, timeout_s=10)
    finally:
        pods.stop()
    return pods.snapshot()[1], reports


def test_a_rewritten_assignment_is_applied_only_when_signed(serve: Any) -> None:
    """Issue 42, row 2: a forged assignment annotated onto a running pod was applied live (the whole
    GPU, 16 GiB). The cache keeps the trusted one and reports the forgery once; a signed change of
    the extender (a live share change) is applied."""
    assigned = PodAssignment(node_name=NODE, gpu_uuid="GPU-0", gpu_index=0,
                             share=make_share(request=300, limit=600, sm=50), assigned_at_ms=1_000)
    forged = PodAssignment(node_name=NODE, gpu_uuid="GPU-0", gpu_index=0,
                           share=make_share(request=1000, limit=1000, sm=100, mem=16 * 2**30), assigned_at_ms=1_000)
    lowered = PodAssignment(node_name=NODE, gpu_uuid="GPU-0", gpu_index=0,
                            share=make_share(request=300, limit=300, sm=50), assigned_at_ms=1_000)
    api = ScriptedApi([gpu_pod("10", assigned)], "10", [[
        {"type": "MODIFIED", "object": gpu_pod("11", forged, signed=False)},
        {"type": "MODIFIED", "object": gpu_pod("12", forged, signed=False)},  # the same forgery again
        {"type": "MODIFIED", "object": gpu_pod("13", lowered)},
    ]])
    [record], reports = watch_until(serve, api, "13", "the three changes")
    assert record.assignment == lowered
    assert len(reports) == 1
    assert reports[0][0] == "team-a/gpu"
    assert "carries no signature" in reports[0][1]
    assert "it keeps GPU GPU-0" in reports[0][1]


def test_a_forged_rewrite_keeps_the_trusted_assignment(serve: Any) -> None:
    assigned = PodAssignment(node_name=NODE, gpu_uuid="GPU-0", gpu_index=0,
                             share=make_share(request=300, limit=600, sm=50), assigned_at_ms=1_000)
    forged = PodAssignment(node_name=NODE, gpu_uuid="GPU-0", gpu_index=0,
                           share=make_share(request=1000, limit=1000, sm=100, mem=16 * 2**30), assigned_at_ms=1_000)
    api = ScriptedApi([gpu_pod("10", assigned)], "10", [[{"type": "MODIFIED", "object": gpu_pod("11", forged,
                                                                                                   signed=False)}]])
    [record], _ = watch_until(serve, api, "11", "the forgery")
    assert record.assignment == assigned  # what the arbiter's shares and Allocate read
    assert record.assignment_problem is not None


def test_an_older_signed_assignment_written_back_is_not_applied(serve: Any) -> None:
    """Issue 42, item 2: with the webhook down, a tenant writes back the first assignment the
    extender signed for its pod (0.3..0.6) after a live change to 0.3..0.3, stamped later. The
    signature is valid, but it is older than what the agent serves: kept out, reported once."""
    first = PodAssignment(node_name=NODE, gpu_uuid="GPU-0", gpu_index=0,
                          share=make_share(request=300, limit=600, sm=50), assigned_at_ms=1_000)
    lowered = attrs.evolve(first, share=make_share(request=300, limit=300, sm=50), assigned_at_ms=2_000)
    api = ScriptedApi([gpu_pod("10", first)], "10", [[
        {"type": "MODIFIED", "object": gpu_pod("11", lowered)},
        {"type": "MODIFIED", "object": gpu_pod("12", first)},  # the replay
    ]])
    [record], reports = watch_until(serve, api, "12", "the replay")
    assert record.assignment == lowered
    [(pod, message)] = reports
    assert pod == "team-a/gpu"
    assert "assigned at 1000 ms, before the assignment the node agent serves (2000 ms)" in message
    assert "it keeps GPU GPU-0 with" in message
