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

import kubernetes.client
import pytest

from device_plugin.kube import NodePods
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
    pods = NodePods(serve(api), NODE, retry_delay_s=0.05)
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

