"""``fastgshare fn logs``: the /system/logs query it sends and what it prints, against a fake gateway on
loopback that answers NDJSON in chunks (and, for ``-f``, holds the answer open between lines)."""

from __future__ import annotations

import datetime
import io
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fastgshare_cli.fn_command import ENV_PASSWORD, UsageError, fn_main, since_time
from fastgshare_cli.main import build_parser

WAIT_S = 20.0  # a bound on waiting for what the test caused


def message(instance: str, text: str, second: int = 1) -> bytes:
    return json.dumps({"name": "hello", "namespace": "fast-gshare-fn", "instance": instance,
                       "timestamp": f"2026-12-04T03:22:{second:02d}Z", "text": text}).encode() + b"\n"


class FakeLogGateway:
    """``GET /system/logs``: ``first`` lines, then (``hold`` set) waits for ``release``, then ``rest``."""

    def __init__(self) -> None:
        self.queries: list[dict[str, str]] = []  # of /system/logs
        self.paths: list[str] = []
        self.function_status: dict[str, Any] | None = None  # GET /system/function/<name>; None: 404
        self.headers: list[dict[str, str]] = []
        self.status = 200
        self.first: list[bytes] = []
        self.rest: list[bytes] = []
        self.hold = False
        self.release = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                parts = urllib.parse.urlsplit(self.path)
                fake.paths.append(self.path)
                fake.headers.append(dict(self.headers.items()))
                if parts.path.startswith("/system/function/") and fake.function_status is not None:
                    body = json.dumps(fake.function_status).encode()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                if parts.path == "/system/logs":
                    fake.queries.append(dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True)))
                if parts.path != "/system/logs" or fake.status != 200:
                    body = b"name 'nope': no function of that name in namespace 'fast-gshare-fn'\n"
                    self.send_response(fake.status if fake.status != 200 else 404)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for line in fake.first:
                    self._chunk(line)
                if fake.hold:
                    fake.release.wait(WAIT_S)
                for line in fake.rest:
                    self._chunk(line)
                self._chunk(b"")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV_PASSWORD, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def gateway() -> Iterator[FakeLogGateway]:
    fake = FakeLogGateway()
    yield fake
    fake.close()


def run(*argv: str, out: io.StringIO | None = None) -> tuple[int, str, str]:
    out, err = out or io.StringIO(), io.StringIO()
    args = build_parser().parse_args(["fn", "logs", *argv])
    code = fn_main(args, out=out, err=err, stdin=io.BytesIO(b"s3cret\n"))
    return code, out.getvalue(), err.getvalue()


def test_one_pod_prints_the_bare_text_and_sends_the_query_faas_cli_would(gateway: FakeLogGateway) -> None:
    gateway.first = [message("hello-a", "loading model"), message("hello-a", "ready")]
    code, out, err = run("hello", "--gateway", gateway.url, "--tail", "20", "--instance", "hello-a")
    assert (code, out, err) == (0, "loading model\nready\n", "")
    assert gateway.queries == [{"name": "hello", "namespace": "fast-gshare-fn", "follow": "false", "tail": "20",
                                "instance": "hello-a"}]


def test_several_pods_prefix_each_line_with_its_pod(gateway: FakeLogGateway) -> None:
    gateway.first = [message("hello-a", "one"), message("hello-b", "two"), message("hello-a", "three")]
    code, out, _ = run("hello", "--gateway", gateway.url, "-n", "team-a", "--password-stdin")
    assert (code, out) == (0, "[hello-a] one\n[hello-b] two\n[hello-a] three\n")
    assert gateway.queries[0]["namespace"] == "team-a"
    assert gateway.headers[0]["Authorization"].startswith("Basic ")


def test_follow_prints_each_line_as_it_comes_without_a_read_timeout(gateway: FakeLogGateway) -> None:
    gateway.first, gateway.rest, gateway.hold = [message("hello-a", "first")], [message("hello-b", "later")], True
    out = io.StringIO()
    result: list[tuple[int, str, str]] = []
    reader = threading.Thread(target=lambda: result.append(
        run("hello", "--gateway", gateway.url, "-f", "--timeout", "0.2", out=out)))
    reader.start()
    try:
        deadline = time.monotonic() + WAIT_S
        while out.getvalue() != "first\n" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert out.getvalue() == "first\n"  # printed while the gateway holds the answer open
        time.sleep(0.5)  # longer than --timeout: a follow has no read timeout once the answer began
    finally:
        gateway.release.set()
        reader.join(WAIT_S)
    assert result == [(0, "first\n[hello-b] later\n", "")]  # one ready pod known: prefixed from the second's on
    assert gateway.queries[0]["follow"] == "true"
    assert "/system/function/hello?namespace=fast-gshare-fn" in gateway.paths


def test_follow_prefixes_from_the_first_line_when_the_function_has_several_ready_pods(
        gateway: FakeLogGateway) -> None:
    gateway.first = [message("hello-a", "one"), message("hello-a", "two")]
    gateway.function_status = {"name": "hello", "replicas": 2, "availableReplicas": 2}
    assert run("hello", "--gateway", gateway.url, "-f") == (0, "[hello-a] one\n[hello-a] two\n", "")
    gateway.function_status = {"name": "hello", "replicas": 2, "availableReplicas": 1}
    assert run("hello", "--gateway", gateway.url, "-f") == (0, "one\ntwo\n", "")


def test_since_takes_a_duration_or_an_rfc3339_time() -> None:
    now = datetime.datetime(2026, 12, 4, 3, 30, 0, tzinfo=datetime.UTC)
    assert since_time("10m", now) == "2026-12-04T03:20:00Z"
    assert since_time("1h30m15s", now) == "2026-12-04T01:59:45Z"
    assert since_time("2026-12-04T03:00:00.123456789+01:00", now) == "2026-12-04T03:00:00.123456789+01:00"
    for bad in ("10", "10 min", "yesterday", "2026-12-04", "2026-12-04T25:00:00Z"):
        with pytest.raises(UsageError, match=r"^--since '.*': expected a duration"):
            since_time(bad, now)


def test_since_is_sent_as_a_time(gateway: FakeLogGateway) -> None:
    before = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    assert run("hello", "--gateway", gateway.url, "--since", "1h")[0] == 0
    sent = datetime.datetime.fromisoformat(gateway.queries[0]["since"])
    assert datetime.timedelta(minutes=59) <= before - sent <= datetime.timedelta(minutes=61)


@pytest.mark.parametrize(("argv", "line"), [
    (["hello", "--tail", "0"], "fastgshare fn logs: --tail '0': expected a whole number of lines >= 1"),
    (["hello", "--tail", "x"], "fastgshare fn logs: --tail 'x': expected a whole number of lines >= 1"),
    (["hello", "--since", "5 min"], "fastgshare fn logs: --since '5 min': expected a duration"),
    (["Hello"], "fastgshare fn logs: NAME 'Hello': expected a DNS label"),
])
def test_bad_flags_are_one_line_exit_2_and_nothing_is_sent(gateway: FakeLogGateway, argv: list[str],
                                                           line: str) -> None:
    code, out, err = run(*argv, "--gateway", gateway.url)
    assert (code, out, err.count("\n")) == (2, "", 1)
    assert err.startswith(line), err
    assert gateway.paths == []


def test_the_gateways_refusal_is_one_line_exit_1(gateway: FakeLogGateway) -> None:
    gateway.status = 404
    code, out, err = run("nope", "--gateway", gateway.url)
    assert (code, out) == (1, "")
    assert err == ("fastgshare fn logs: the gateway answered 404 Not Found: name 'nope': no function of that name "
                   "in namespace 'fast-gshare-fn'\n")


def test_a_line_that_is_no_log_message_is_one_line_exit_1(gateway: FakeLogGateway) -> None:
    gateway.first = [b"<html>proxy error</html>\n"]
    code, _, err = run("hello", "--gateway", gateway.url)
    assert code == 1
    assert err.startswith("fastgshare fn logs: the gateway's /system/logs sent a line that is not a log message")
