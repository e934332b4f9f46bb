"""Issue 37 item 3: idle and slow clients on the webhook's port do not stall admission.

Before, the webhook (Cheroot) ran each TLS handshake in its one accepting thread with a 60 s
timeout: one TCP connection that sent nothing held every AdmissionReview behind it. Here 50 such
connections and 10 that trickle a request head stay open while AdmissionReviews are posted on new
connections, as the API server does: each is answered within 1 s (the issue's bound), and a forged
system annotation is still refused.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fastgshare import keys
from scheduler_extender.http.guarded import HttpServer
from scheduler_extender.http.tls import ReloadingContext
from scheduler_extender.http.webhook import create_webhook_app
from tests.integration.http_limits.flood import flood, raise_file_limit

SHARE = {keys.GPU_QUOTA_REQUEST: "0.4", keys.GPU_QUOTA_LIMIT: "0.8", keys.GPU_SM_PARTITION: "50", keys.GPU_MEM: "1Gi"}


def review(uid: str, annotations: dict[str, str]) -> dict[str, Any]:
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": uid, "namespace": "team-b", "annotations": annotations},
           "spec": {"schedulerName": keys.SCHEDULER_NAME,
                    "containers": [{"name": "c", "image": "i", "resources": {"limits": {keys.VGPU_RESOURCE: "1"}}}]}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                        "namespace": "team-b", "name": uid, "object": pod,
                        "userInfo": {"username": "system:serviceaccount:team-b:default"}}}


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, ssl.SSLContext]]:
    folder = tmp_path_factory.mktemp("webhook-tls")
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
                    "-out", str(cert), "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    server = HttpServer(create_webhook_app(), "127.0.0.1", 0, ssl_context=ReloadingContext(str(cert), str(key)).context,
                        name="test-webhook")
    server.start()
    client = ssl.create_default_context(cafile=str(cert))
    try:
        yield server.port, client
    finally:
        server.stop()


def post(port: int, client: ssl.SSLContext, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(seconds to the answer, the AdmissionReview's response), on a new TLS connection."""
    started = time.monotonic()
    connection = http.client.HTTPSConnection("localhost", port, context=client, timeout=10)
    try:
        connection.request("POST", "/validate", body=json.dumps(body), headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        assert answer.status == 200
        response = json.loads(answer.read())["response"]
    finally:
        connection.close()
    return time.monotonic() - started, response


def test_idle_and_slow_connections_do_not_delay_admission_reviews(webhook: tuple[int, ssl.SSLContext]) -> None:
    port, client = webhook
    raise_file_limit(4096)
    forged = {**SHARE, keys.POD_ASSIGNMENT_ANNOTATION: '{"v":1,"gpu":"GPU-1","request":1000}'}
    with flood(port, idle=50, slow=10, tls=client):
        for round_ in range(5):
            took, allowed = post(port, client, review(f"ok-{round_}", dict(SHARE)))
            assert allowed["allowed"] is True
            assert took < 1.0, f"a valid review took {took:.2f} s behind idle and slow connections"
            took, refused = post(port, client, review(f"forged-{round_}", forged))
            assert refused["allowed"] is False
            assert keys.POD_ASSIGNMENT_ANNOTATION in refused["status"]["message"]
            assert took < 1.0, f"a forged review took {took:.2f} s behind idle and slow connections"


def test_a_client_that_never_finishes_its_handshake_is_closed_in_seconds(webhook: tuple[int, ssl.SSLContext]) -> None:
    port, _ = webhook
    with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
        started = time.monotonic()
        assert idle.recv(1) == b""  # the server closed it
        assert time.monotonic() - started < 8  # the handshake deadline is 2 s
