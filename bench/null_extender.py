"""A scheduler extender that decides nothing: the protocol's floor for ``bench.scheduling_throughput``.

``/filter`` passes every node (``nodeCacheCapable``: names in, names out), ``/prioritize`` scores
every node 0 (in the Go field names, see :mod:`scheduler_extender.wire`), and, with ``--bind``,
``/bind`` binds the pod with one API call (a ``Binding`` carrying the choice in its annotations,
which the API server copies onto the pod, as ours carries the assignment; the answer read but not
decoded).

With ``--choose`` it stands for an extender without the bind verb that makes the GPU choice in
``/filter``: it passes only the first node, so the scheduler must bind the pod there; with
``--record`` as well, it writes the choice onto the pod with one merge patch a pod, sent from a
pool of threads after ``/filter`` has answered (off the scheduling path), as such an extender
would have to if nothing else recorded the choice. It is
as cheap as a Python extender can be: a threaded HTTP/1.1 server with keep-alive and
``TCP_NODELAY`` (without it, Nagle's algorithm and delayed ACKs cost ~40 ms a request), JSON in
and out, an API client that keeps a connection for every request it may serve at once, nothing
else. Whatever our extender costs above this is ours to cut.

Until 2026-12 the bind left the answer unread, so its connection never went back to the client's
pool: 1,000 binds opened 330-410 TLS connections (counted with ``ss``), and this floor cost
8.2-8.9 CPU-s in the null extender and 7.7-8.0 in the API server instead of 4.5 and 5.3, at
75-84 pods/s instead of 98.

Run: ``python -m bench.null_extender --listen 127.0.0.1:PORT [--bind --kubeconfig FILE]``.
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes.client
import kubernetes.config

API_CONNECTIONS = 128  # as many as the server queues requests: no bind opens a connection of its own


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = API_CONNECTIONS

    def server_bind(self) -> None:
        super().server_bind()
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


RECORD_ANNOTATION = "bench.fastgshare/choice"


def handler(core: Any | None, *, choose: bool = False, recorder: ThreadPoolExecutor | None = None
            ) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the scheduler's client expects

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_POST(self) -> None:  # the name http.server calls
            raw = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            body = {key.casefold(): value for key, value in raw.items()}  # Go decodes keys case-insensitively
            verb = self.path.rstrip("/").rsplit("/", 1)[-1]
            names = body.get("nodenames") or []  # nodeCacheCapable: names in, names out
            if verb == "filter":
                chosen = names[:1] if choose else names
                answer: Any = {"NodeNames": chosen, "FailedNodes": {}, "Error": ""}
                if recorder is not None and chosen:
                    self._send(answer)
                    recorder.submit(self._record, body.get("pod") or {}, chosen[0])
                    return
            elif verb == "prioritize":
                answer = [{"Host": name, "Score": 0} for name in names]
            elif verb == "bind" and core is not None:
                answer = {"Error": self._bind(body)}
            else:
                self.send_error(404)
                return
            self._send(answer)

        def do_GET(self) -> None:
            self._send({"ok": True})

        def _bind(self, args: dict[str, Any]) -> str:
            name, namespace, node = args.get("podname"), args.get("podnamespace"), args.get("node")
            try:
                response = core.create_namespaced_binding(namespace, {  # type: ignore[union-attr]
                    "apiVersion": "v1", "kind": "Binding",
                    "metadata": {"name": name, "annotations": {RECORD_ANNOTATION: node}},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, _preload_content=False)
                response.read()  # to the end: only then does the connection go back to the pool
            except kubernetes.client.exceptions.ApiException as error:
                return f"bind {namespace}/{name}: {error.status} {error.reason}"
            return ""

        @staticmethod
        def _record(pod: dict[str, Any], node: str) -> None:
            metadata = pod.get("metadata") or {}
            try:
                response = core.patch_namespaced_pod(  # type: ignore[union-attr]
                    metadata.get("name"), metadata.get("namespace"),
                    {"metadata": {"annotations": {RECORD_ANNOTATION: node}}}, _preload_content=False,
                    _content_type="application/merge-patch+json")
                response.read()
            except kubernetes.client.exceptions.ApiException as error:
                print(f"record {metadata.get('name')}: {error.status} {error.reason}", flush=True)

        def _send(self, answer: Any) -> None:
            data = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, metavar="HOST:PORT")
    parser.add_argument("--bind", action="store_true", help="also serve /bind, with one API call per pod")
    parser.add_argument("--choose", action="store_true", help="/filter passes only the first node")
    parser.add_argument("--record", action="store_true",
                        help="with --choose: write the choice onto the pod, one merge patch a pod")
    parser.add_argument("--kubeconfig", help="for --bind and --record")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    core = None
    if args.bind or args.record:
        configuration = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=args.kubeconfig, client_configuration=configuration)
        configuration.connection_pool_maxsize = API_CONNECTIONS
        core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
    recorder = ThreadPoolExecutor(max_workers=API_CONNECTIONS // 2) if args.record else None
    server = _Server((host, int(port)), handler(core, choose=args.choose, recorder=recorder))
    print(f"null extender on {args.listen} bind={args.bind} choose={args.choose} record={args.record}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
