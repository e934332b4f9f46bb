"""Prometheus mode against a real Prometheus (Debian's ``prometheus``) on loopback: it scrapes two
small gateway stand-ins every second, whose ``gateway_function_invocation_started_total`` counters advance
at rates the test sets, and the function controller's :class:`PrometheusRates` reports those rates
(summed over codes and gateways) through the reference's PromQL; then why it has none, once the
gateways and then Prometheus are gone. Every process and server stops, also on failure."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from fastfunc_controller.prometheus_source import PrometheusRates
from fastfunc_controller.rates import Rates
from fastgshare_cluster.processes import LOOPBACK, ManagedProcess, free_ports, http_ok, wait_until

FN, BUSY, IDLE = "fn.ns", "busy.ns", "idle.ns"
LONG_S, SHORT_S = 10.0, 2.0


def tolerance(rate: float) -> float:
    return 0.1 * rate + 0.3


class Counters:
    """A gateway's invocation counters by (function, code), each advancing at a rate (req/s) from
    the moment it was set; read at scrape time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], tuple[float, float, float]] = {}  # -> (count then, then, rate)

    def set_rate(self, function: str, code: str, rate: float) -> None:
        now = time.monotonic()
        with self._lock:
            count, then, old = self._counts.get((function, code), (0.0, now, 0.0))
            self._counts[(function, code)] = (count + old * (now - then), now, rate)

    def exposition(self) -> str:
        now = time.monotonic()
        with self._lock:
            lines = [f'gateway_function_invocation_started_total{{code="{code}",function_name="{function}"}} '
                     f"{count + rate * (now - then):.3f}"
                     for (function, code), (count, then, rate) in sorted(self._counts.items())]
        return "# TYPE gateway_function_invocation_started_total counter\n" + "".join(f"{line}\n" for line in lines)


@contextmanager
def gateway_stand_in(counters: Counters) -> Iterator[ThreadingHTTPServer]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = counters.exposition().encode()
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="gateway-stand-in", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop(server)
        thread.join(5)


def stop(server: ThreadingHTTPServer) -> None:
    if server.socket.fileno() != -1:
        server.shutdown()
        server.server_close()


def prometheus_binary() -> str:
    found = shutil.which("prometheus") or ("/usr/bin/prometheus" if Path("/usr/bin/prometheus").exists() else None)
    if found is None:
        if os.environ.get("FASTGSHARE_REQUIRE_CLUSTER") == "1":
            pytest.fail("prometheus is required (FASTGSHARE_REQUIRE_CLUSTER=1): apt-get install prometheus")
        print("skipping: no prometheus binary (apt-get install prometheus; CI installs it)")
        pytest.skip("no prometheus binary (apt-get install prometheus; CI installs it)")
    return found


@contextmanager
def prometheus(binary: str, targets: list[str], directory: Path) -> Iterator[tuple[str, ManagedProcess]]:
    """Prometheus on loopback scraping ``targets`` every second; stopped and its data removed at the end."""
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
              "scrape_configs": [{"job_name": "fastgshare-gateway", "static_configs": [{"targets": targets}]}]}
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    (port,) = free_ports(1)
    url = f"http://{LOOPBACK}:{port}"
    process = ManagedProcess("prometheus", [
        binary, f"--config.file={directory / 'prometheus.yml'}", f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address={LOOPBACK}:{port}", "--storage.tsdb.retention.time=1h"], directory / "prometheus.log")
    try:
        wait_until(lambda: http_ok(f"{url}/-/ready"), what="prometheus /-/ready", timeout_s=60, watched=process)
        yield url, process
    finally:
        process.stop()
        shutil.rmtree(directory / "data", ignore_errors=True)


def read(source: PrometheusRates, function: str) -> Rates | str:
    source.scrape()
    return source.read(function, LONG_S, SHORT_S)


def rates(source: PrometheusRates, function: str) -> Rates:
    answer = read(source, function)
    assert isinstance(answer, Rates), answer
    return answer


def test_the_prometheus_source_reports_the_gateways_rates_and_why_it_has_none(tmp_path: Path) -> None:
    binary = prometheus_binary()
    a, b = Counters(), Counters()
    a.set_rate(FN, "200", 3)
    a.set_rate(FN, "500", 1)
    a.set_rate(BUSY, "200", 10)
    b.set_rate(FN, "200", 2)
    with ExitStack() as stack:
        server_a = stack.enter_context(gateway_stand_in(a))
        server_b = stack.enter_context(gateway_stand_in(b))
        targets = [f"{LOOPBACK}:{server.server_address[1]}" for server in (server_a, server_b)]
        url, process = stack.enter_context(prometheus(binary, targets, tmp_path))
        source = PrometheusRates(url, scrape_interval_s=1.0)

        wait_until(lambda: isinstance(read(source, FN), Rates), what="Prometheus holds the gateways' counters",
                   timeout_s=30, watched=process)
        time.sleep(LONG_S + 2)  # the long window is full
        for _ in range(3):
            seen = rates(source, FN)
            assert seen.long == pytest.approx(6, abs=tolerance(6)), seen  # 3 + 1 (codes) + 2 (gateways)
            assert seen.short == pytest.approx(6, abs=tolerance(6)), seen
            busy = rates(source, BUSY)
            assert busy.long == pytest.approx(10, abs=tolerance(10)), busy
            assert rates(source, IDLE) == Rates(long=0, short=0)  # never requested: 0, as in direct mode
            time.sleep(0.5)

        a.set_rate(FN, "200", 23)  # a burst: 26 req/s in all
        time.sleep(SHORT_S + 1.5)
        seen = rates(source, FN)
        assert seen.short == pytest.approx(26, abs=tolerance(26)), seen  # the panic window sees it
        assert 6 < seen.long < seen.short - 5, seen  # the long one averages

        stop(server_a)
        stop(server_b)
        wait_until(lambda: "holds no gateway_function_invocation_started_total series" in str(read(source, FN)),
                   what="the gateways' series stale", timeout_s=15, watched=process)
        process.stop()
        why = read(source, FN)
        assert isinstance(why, str)
        assert why.startswith(f"cannot query Prometheus at {url} (count(gateway_function_invocation_started_total))"
                              ": "), why
        assert why.endswith("; the current plan is kept"), why
