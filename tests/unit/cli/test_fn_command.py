"""``fastgshare fn``: what it sends to the gateway's OpenFaaS API and what it prints, against a small
fake gateway (a real HTTP server on loopback that records every request)."""

from __future__ import annotations

import base64
import io
import json
import shlex
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml

from fastgshare_cli import fn_command
from fastgshare_cli.fn_command import ENV_GATEWAY, ENV_PASSWORD, Credentials, fn_main
from fastgshare_cli.main import build_parser, main


@attrs.frozen
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class FakeGateway:
    """Answers each (method, path) with a scripted (status, body); 404 "not found" otherwise."""

    def __init__(self) -> None:
        self.seen: list[Seen] = []
        self.answers: dict[tuple[str, str], tuple[int, bytes]] = {}
        self.authorization: str | None = None  # set: a request without this Authorization gets 401
        gateway = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                gateway.seen.append(Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()},
                                         body))
                status, answer = gateway.answers.get((self.command, self.path), (404, b"not found"))
                if gateway.authorization is not None and self.headers.get("Authorization") != gateway.authorization:
                    status, answer = 401, b"unauthorized"
                self.send_response(status)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            do_GET = do_POST = do_PUT = do_DELETE = _any

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No password in the environment and no kubeconfig to read the Secret with, unless a test sets them."""
    monkeypatch.delenv(ENV_PASSWORD, raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.setenv("HOME", str(tmp_path))


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    fake = FakeGateway()
    yield fake
    fake.close()


def run(*argv: str, stdin: bytes = b"") -> tuple[int, str, str]:
    args = build_parser().parse_args(["fn", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = fn_main(args, out, err, io.BytesIO(stdin))
    return code, out.getvalue(), err.getvalue()


def test_deploy_puts_a_function_deployment_then_posts_when_it_is_new(gateway: FakeGateway) -> None:
    gateway.answers[("POST", "/system/functions")] = (202, b"")
    code, out, err = run("deploy", "resnet", "--gateway", gateway.url, "--image", "fastgshare/fake-fn:local",
                         "--quota-request", "0.2", "--quota-limit", "0.5", "--sm", "50", "--memory", "1Gi",
                         "--replicas", "3", "--env", "FAKE_FN_GPU_MS=20", "--env", "B=x=y", "--label", "team=a")
    assert (code, err) == (0, "")
    assert [(s.method, s.path) for s in gateway.seen] == [("PUT", "/system/functions"), ("POST", "/system/functions")]
    assert gateway.seen[0].body == gateway.seen[1].body
    assert gateway.seen[1].headers["content-type"] == "application/json"
    assert gateway.seen[1].json() == {
        "service": "resnet", "image": "fastgshare/fake-fn:local", "namespace": "fast-gshare-fn",
        "envVars": {"FAKE_FN_GPU_MS": "20", "B": "x=y"},
        "labels": {"team": "a", "com.openfaas.scale.min": "3", "com.openfaas.scale.max": "3"},
        "annotations": {"fastgshare/gpu_quota_request": "0.2", "fastgshare/gpu_quota_limit": "0.5",
                        "fastgshare/gpu_sm_partition": "50", "fastgshare/gpu_mem": "1Gi"},
    }
    assert out.startswith("created function resnet in fast-gshare-fn (3 replicas")


def test_deploy_of_an_existing_function_is_one_put(gateway: FakeGateway) -> None:
    gateway.answers[("PUT", "/system/functions")] = (202, b"")
    code, out, _ = run("deploy", "f", "-n", "team-a", "--gateway", gateway.url, "--image", "img")
    assert code == 0
    [put] = gateway.seen
    assert put.method == "PUT"
    assert put.json()["namespace"] == "team-a"
    assert put.json()["annotations"] == {}  # no share flags: the gateway's defaults
    assert put.json()["labels"] == {"com.openfaas.scale.min": "1", "com.openfaas.scale.max": "1"}
    assert out.startswith("updated function f in team-a (1 replica,")


def test_the_gateways_refusal_is_one_line_with_its_message(gateway: FakeGateway) -> None:
    gateway.answers[("POST", "/system/functions")] = (400, b"fastgshare/gpu_sm_partition: must be 1..100\n")
    code, out, err = run("deploy", "f", "--gateway", gateway.url, "--image", "img")
    assert (code, out) == (1, "")
    assert err == ("fastgshare fn deploy: the gateway answered 400 Bad Request: "
                   "fastgshare/gpu_sm_partition: must be 1..100\n")


def test_a_json_error_message_is_unwrapped(gateway: FakeGateway) -> None:
    gateway.answers[("PUT", "/system/functions")] = (500, json.dumps({"message": "etcd\nis down"}).encode())
    code, _, err = run("deploy", "f", "--gateway", gateway.url, "--image", "img")
    assert code == 1
    assert err == "fastgshare fn deploy: the gateway answered 500 Internal Server Error: etcd is down\n"


@pytest.mark.parametrize(("argv", "says"), [
    (["--quota-request", "0.7", "--quota-limit", "0.5"], "--quota-request (fastgshare/gpu_quota_request): "
                                                         'request "0.7" is greater than'),
    (["--quota-limit", "2"], "--quota-limit (fastgshare/gpu_quota_limit):"),
    (["--sm", "0"], "--sm (fastgshare/gpu_sm_partition):"),
    (["--memory", "lots"], "--memory (fastgshare/gpu_mem):"),
    (["--replicas", "-1"], "--replicas -1: expected a whole number >= 0"),
    (["--env", "NOEQUALS"], "--env 'NOEQUALS': expected KEY=VALUE"),
    (["--env", "1BAD=x"], "--env '1BAD=x': expected KEY=VALUE with an environment variable name"),
    (["-n", "Bad_NS"], "--namespace 'Bad_NS': expected a DNS label"),
    (["--gateway", "ftp://x"], "--gateway 'ftp://x': expected http://HOST[:PORT]"),
    (["--gateway", "http://x:99999"], "--gateway 'http://x:99999': the port must be a number"),
    (["--timeout", "0"], "--timeout 0.0: expected seconds > 0"),
])
def test_bad_arguments_are_one_line_and_exit_2_without_calling(gateway: FakeGateway, argv: list[str],
                                                               says: str) -> None:
    args = ["deploy", "f", "--image", "img", *argv]
    if "--gateway" not in argv:
        args += ["--gateway", gateway.url]
    code, out, err = run(*args)
    assert (code, out) == (2, "")
    assert err.startswith(f"fastgshare fn deploy: {says}"), err
    assert err.count("\n") == 1
    assert gateway.seen == []


def test_a_bad_function_name_is_refused(gateway: FakeGateway) -> None:
    code, _, err = run("deploy", "My_Fn", "--gateway", gateway.url, "--image", "img")
    assert code == 2
    assert "NAME 'My_Fn': expected a DNS label" in err


def test_list_prints_a_table_of_functions(gateway: FakeGateway) -> None:
    gateway.answers[("GET", "/system/functions")] = (200, json.dumps([
        {"name": "resnet", "namespace": "fast-gshare-fn", "image": "fastgshare/fake-fn:local", "replicas": 3,
         "availableReplicas": 2, "invocationCount": 41.0,
         "annotations": {"fastgshare/gpu_quota_request": "0.2", "fastgshare/gpu_quota_limit": "0.5",
                         "fastgshare/gpu_sm_partition": "50", "fastgshare/gpu_mem": "1Gi"}},
        {"name": "bert", "namespace": "fast-gshare-fn", "image": "b:1", "replicas": 1, "availableReplicas": 1},
    ]).encode())
    code, out, err = run("list", "--gateway", gateway.url)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "NAMESPACE", "IMAGE", "READY", "INVOCATIONS", "SHARE"]
    assert lines[1].split() == ["bert", "fast-gshare-fn", "b:1", "1/1", "0", "-"]
    assert lines[2].split()[:5] == ["resnet", "fast-gshare-fn", "fastgshare/fake-fn:local", "2/3", "41"]
    assert lines[2].endswith("time 0.2..0.5, 50% SM, 1Gi")
    assert lines[1].index("b:1") == lines[2].index("fastgshare/fake-fn:local")  # aligned columns


def test_list_in_a_namespace_and_as_json(gateway: FakeGateway) -> None:
    functions = [{"name": "a", "namespace": "team", "replicas": 1}]
    gateway.answers[("GET", "/system/functions?namespace=team")] = (200, json.dumps(functions).encode())
    code, out, _ = run("ls", "-n", "team", "-o", "json", "--gateway", gateway.url)
    assert code == 0
    assert json.loads(out) == functions


def test_list_with_no_functions_and_with_a_bad_answer(gateway: FakeGateway) -> None:
    gateway.answers[("GET", "/system/functions")] = (200, b"[]")
    assert run("list", "--gateway", gateway.url)[:2] == (0, "no functions\n")
    gateway.answers[("GET", "/system/functions")] = (200, b"<html>")
    code, _, err = run("list", "--gateway", gateway.url)
    assert code == 1
    assert "is not a JSON list of functions" in err


def test_invoke_posts_the_data_and_prints_the_body_as_it_came(gateway: FakeGateway) -> None:
    gateway.answers[("POST", "/function/resnet")] = (200, b'{"pod": "p"}\n')
    code, out, err = run("invoke", "resnet", "--data", "hello", "--gateway", gateway.url)
    assert (code, out, err) == (0, '{"pod": "p"}\n', "")
    [seen] = gateway.seen
    assert seen.body == b"hello"
    assert seen.headers["content-type"] == "text/plain"


def test_invoke_reads_stdin_and_names_the_namespace(gateway: FakeGateway) -> None:
    gateway.answers[("POST", "/function/resnet.team")] = (200, b"ok")
    code, out, _ = run("invoke", "resnet", "-n", "team", "--gateway", gateway.url, stdin=b"\x00\x01 binary")
    assert (code, out) == (0, "ok")
    assert gateway.seen[0].body == b"\x00\x01 binary"


def test_invoke_writes_bytes_to_a_binary_stdout(gateway: FakeGateway, capsysbinary: pytest.CaptureFixture[bytes],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    gateway.answers[("POST", "/function/img")] = (200, b"\x89PNG\xff\x00")
    monkeypatch.setenv(ENV_GATEWAY, gateway.url)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"")))
    assert main(["fn", "invoke", "img"]) == 0
    assert capsysbinary.readouterr().out == b"\x89PNG\xff\x00"


def test_an_invocation_that_fails_names_the_function_and_the_status(gateway: FakeGateway) -> None:
    gateway.answers[("POST", "/function/slow")] = (503, b"queue timeout after 30 s")
    code, out, err = run("invoke", "slow", "-d", "", "--gateway", gateway.url)
    assert (code, out) == (1, "")
    assert err == ("fastgshare fn invoke: function slow: the gateway answered 503 Service Unavailable: "
                   "queue timeout after 30 s\n")


def test_delete_sends_the_name_and_namespace(gateway: FakeGateway) -> None:
    gateway.answers[("DELETE", "/system/functions")] = (202, b"")
    code, out, _ = run("delete", "resnet", "--gateway", gateway.url)
    assert (code, out) == (0, "deleted function resnet from fast-gshare-fn\n")
    assert gateway.seen[0].json() == {"functionName": "resnet", "namespace": "fast-gshare-fn"}


def test_deleting_a_missing_function_says_so(gateway: FakeGateway) -> None:
    code, _, err = run("rm", "ghost", "-n", "team", "--gateway", gateway.url)
    assert code == 1
    assert err.startswith("fastgshare fn delete: no function ghost in team (the gateway answered 404 Not Found")


def test_an_unreachable_gateway_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv(ENV_GATEWAY, f"http://127.0.0.1:{port}/")
    code, out, err = run("list")
    assert (code, out) == (1, "")
    assert err.startswith(f"fastgshare fn list: cannot reach the gateway at http://127.0.0.1:{port}: ")
    assert "--gateway URL" in err
    assert err.count("\n") == 1


def test_a_gateway_that_never_answers_times_out_in_one_line() -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)  # accepts the connection (backlog) and never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        code, _, err = run("list", "--gateway", url, "--timeout", "0.2")
    assert code == 1
    assert err == f"fastgshare fn list: no answer from the gateway at {url} within 0.2 s\n"


def test_the_examples_deploy_line_sends_what_the_fastpod_example_runs(gateway: FakeGateway) -> None:
    """examples/functions/README.md's `fastgshare fn deploy` line, as written, against the fake gateway."""
    examples = Path(__file__).resolve().parents[3] / "examples" / "functions"
    [line] = [line for line in (examples / "README.md").read_text().splitlines()
              if line.startswith("fastgshare fn deploy ")]
    gateway.answers[("POST", "/system/functions")] = (202, b"")
    code, _, err = run(*shlex.split(line)[2:], "--gateway", gateway.url)
    assert (code, err) == (0, "")
    sent = gateway.seen[-1].json()
    [fastpod] = yaml.safe_load_all((examples / "fake-fn-fastpod.yaml").read_text())
    container = fastpod["spec"]["podSpec"]["containers"][0]
    assert sent["image"] == container["image"]
    assert sent["namespace"] == fastpod["metadata"]["namespace"] == "fast-gshare-fn"
    assert sent["annotations"] == fastpod["metadata"]["annotations"]
    assert sent["labels"] == fastpod["metadata"]["labels"]
    assert sent["envVars"] == {e["name"]: e["value"] for e in container["env"]}
    assert int(sent["labels"]["com.openfaas.scale.max"]) == fastpod["spec"]["replicas"]


# --- credentials, as faas-cli takes them ----------------------------------------------------------
ADMIN = "Basic " + base64.b64encode(b"admin:s3cret-pw").decode()


def test_password_stdin_is_sent_as_basic_auth_on_every_call(gateway: FakeGateway) -> None:
    gateway.authorization = ADMIN
    gateway.answers[("GET", "/system/functions")] = (200, b"[]")
    gateway.answers[("POST", "/system/functions")] = (202, b"")
    gateway.answers[("DELETE", "/system/functions")] = (202, b"")
    assert run("list", "--gateway", gateway.url, "--password-stdin", stdin=b"s3cret-pw\n")[0] == 0
    code, out, err = run("deploy", "f", "--gateway", gateway.url, "--image", "i", "--memory", "1Gi",
                         "--password-stdin", stdin=b"s3cret-pw\n")
    assert (code, err) == (0, "")
    assert run("delete", "f", "--gateway", gateway.url, "--password-stdin", stdin=b"s3cret-pw")[0] == 0
    assert {s.headers.get("authorization") for s in gateway.seen} == {ADMIN}
    assert "s3cret-pw" not in out + err


def test_the_password_from_the_environment_and_another_user(gateway: FakeGateway,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    gateway.authorization = "Basic " + base64.b64encode(b"ops:pw").decode()
    gateway.answers[("GET", "/system/functions")] = (200, b"[]")
    monkeypatch.setenv(ENV_PASSWORD, "pw")
    assert run("list", "--gateway", gateway.url, "--gateway-user", "ops")[0] == 0


def test_without_credentials_a_401_says_how_to_give_them_in_one_line(gateway: FakeGateway) -> None:
    gateway.authorization = ADMIN
    code, out, err = run("list", "--gateway", gateway.url)
    assert (code, out) == (1, "")
    assert err.count("\n") == 1
    assert "401" in err
    assert "--password-stdin" in err
    assert ENV_PASSWORD in err
    assert "no kubeconfig" in err
    code, _, err = run("list", "--gateway", gateway.url, "--password-stdin", stdin=b"wrong")
    assert code == 1
    assert "refused the credentials of user 'admin'" in err
    assert "wrong" not in err


def test_after_a_401_the_secret_is_read_once_and_the_request_sent_again(gateway: FakeGateway,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    gateway.authorization = ADMIN
    gateway.answers[("POST", "/function/echo")] = (200, b"hi")
    lookups: list[str | None] = []

    def from_secret(kubeconfig: str | None) -> tuple[Credentials | None, str]:
        lookups.append(kubeconfig)
        return Credentials("admin", "s3cret-pw"), ""
    monkeypatch.setattr(fn_command, "secret_credentials", from_secret)
    code, out, _ = run("invoke", "echo", "--gateway", gateway.url, "--data", "x", "--kubeconfig", "/k")
    assert (code, out) == (0, "hi")
    assert lookups == ["/k"]
    assert [s.headers.get("authorization") for s in gateway.seen] == [None, ADMIN]


def test_password_stdin_with_invoke_needs_data_and_an_empty_password_is_refused(gateway: FakeGateway) -> None:
    code, _, err = run("invoke", "echo", "--gateway", gateway.url, "--password-stdin", stdin=b"pw\n")
    assert code == 2
    assert "--data" in err
    code, _, err = run("list", "--gateway", gateway.url, "--password-stdin", stdin=b"\n")
    assert code == 2
    assert "--password-stdin" in err
    assert gateway.seen == []


def test_credentials_never_show_the_password() -> None:
    assert "pw-123" not in repr(Credentials("admin", "pw-123"))
