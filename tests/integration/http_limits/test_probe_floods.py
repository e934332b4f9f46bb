"""Issue 37 item 5 (rows 5 and 6): 400 idle plus 40 slow connections do not block ``/healthz`` or
``/metrics`` of the extender's status port, a controller's health server and the node agent's
metrics server, and do not cost a thread each.

Before, the agent's metrics and the controllers' health servers (``http.server``'s
``ThreadingHTTPServer``) started a thread per connection with no timeout (400 idle connections: 400
threads), and the extender's status port (Cheroot, 32 threads) was blocked by 40 slow clients.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from device_plugin.metrics import NodeMetrics, metrics_server
from fastgshare.inventory import NodeInventory
from fastgshare_kube.health import HealthServer
from fastpod_crd_controller.metrics import ControllerMetrics
from tests.integration.http_limits.flood import flood, raise_file_limit

IDLE, SLOW = 400, 40
THREAD_SLACK = 4  # the flood's trickling thread and a few the libraries start


class _NoPods:
    def snapshot(self) -> tuple[int, list[Any]]:
        return 0, []


def _no_arbiter() -> Any:
    raise ConnectionError("no arbiter in this test")


def _extender_status() -> Any:
    from scheduler_extender.config import ExtenderConfig  # noqa: PLC0415
    from scheduler_extender.http.apps import status_server  # noqa: PLC0415
    from scheduler_extender.services import build_services  # noqa: PLC0415
    from scheduler_extender.state import ClusterState  # noqa: PLC0415

    try:
        from fastgshare.assignment_signature import AssignmentTrust  # noqa: PLC0415
        state = ClusterState(bind_wait_s=0.0, trust=AssignmentTrust(None))
    except ImportError:  # before assignments were signed
        state = ClusterState(bind_wait_s=0.0)  # type: ignore[call-arg]
    services = build_services(ExtenderConfig(), state, kube=None)  # type: ignore[arg-type]  # status binds nothing
    return status_server(services, "127.0.0.1", 0)


def _controller_health() -> Any:
    return HealthServer("127.0.0.1", 0, lambda: True, ControllerMetrics().exposition)


def _agent_metrics() -> Any:
    collector = NodeMetrics(_NoPods(), _no_arbiter, lambda: NodeInventory(node_name="gpu-1", gpus=()))
    return metrics_server("127.0.0.1", 0, collector, lambda: True)


SERVERS: dict[str, Callable[[], Any]] = {
    "extender status": _extender_status, "controller health": _controller_health, "agent metrics": _agent_metrics,
}


@pytest.fixture(params=list(SERVERS))
def server(request: pytest.FixtureRequest) -> Iterator[Any]:
    raise_file_limit(4 * (IDLE + SLOW) + 256)
    started = SERVERS[request.param]()
    started.start()
    try:
        yield started
    finally:
        started.stop()


def get(port: int, path: str) -> tuple[float, int, bytes]:
    begun = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        return time.monotonic() - begun, response.status, response.read()


def test_idle_and_slow_connections_block_neither_healthz_nor_metrics(server: Any) -> None:
    threads_before = threading.active_count()
    with flood(server.port, idle=IDLE, slow=SLOW):
        time.sleep(0.5)  # every connection reached the server
        for _ in range(3):
            took, status, _ = get(server.port, "/healthz")
            assert status == 200
            assert took < 1.0, f"/healthz took {took:.2f} s behind {IDLE} idle and {SLOW} slow connections"
            took, status, body = get(server.port, "/metrics")
            assert status == 200
            assert list(text_string_to_metric_families(body.decode())) is not None
            assert took < 1.0, f"/metrics took {took:.2f} s behind {IDLE} idle and {SLOW} slow connections"
        grown = threading.active_count() - threads_before  # the server's loop and pool were already there
        assert grown <= THREAD_SLACK, f"{grown} more threads for {IDLE + SLOW} clients"
        assert server.connections <= 256  # capped; the oldest waiting connections made room
