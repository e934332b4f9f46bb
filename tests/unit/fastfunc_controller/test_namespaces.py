"""The function controller works in its function namespaces only (issue 37, item 6): its RBAC is a
Role there, so every list and watch it makes must be namespaced, one per namespace, and the
caches of several namespaces must not overwrite each other."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import kubernetes.client
import pytest

from fastfunc_controller import kube
from fastfunc_controller.controller import Controller
from fastfunc_controller.main import build_parser, main, watched_namespaces
from fastgshare import keys
from fastgshare_kube.events import EventRecorder
from tests.unit.fastfunc_controller.test_controller import FakeKube
from tests.unit.fastgshare_kube.fakes import ScriptedListWatch


@pytest.mark.parametrize(("argv", "namespaces"), [
    ([], [keys.DEFAULT_FUNCTION_NAMESPACE]),
    (["--namespace", "team-a"], ["team-a"]),
    (["--namespace", "team-a", "--namespace", "team-b"], ["team-a", "team-b"]),
    (["--all-namespaces"], None),
])
def test_it_works_in_the_function_namespace_unless_told_otherwise(argv: list[str], namespaces: list[str] | None
                                                                  ) -> None:
    assert watched_namespaces(build_parser().parse_args(argv)) == namespaces


@pytest.mark.parametrize(("argv", "message"), [
    (["--namespace", "team-a", "--all-namespaces"],
     "--namespace and --all-namespaces exclude each other; allowed: one or more --namespace NS, or --all-namespaces"),
    (["--namespace", ""], "--namespace '' is not a namespace name; allowed: a DNS-1123 label (a-z, 0-9, '-',"),
    (["--namespace", "Team_A"], "--namespace 'Team_A' is not a namespace name; allowed: a DNS-1123 label"),
])
def test_bad_namespace_flags_are_one_line(caplog: pytest.LogCaptureFixture, argv: list[str], message: str) -> None:
    assert main(argv) == 2
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    assert record.getMessage().startswith(message)


class _Recorder(http.server.BaseHTTPRequestHandler):
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.paths.append(self.path.split("?", 1)[0])
        body = json.dumps({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": "1"},
                           "items": []}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def recording_api() -> Iterator[tuple[kubernetes.client.ApiClient, list[str]]]:
    """An API client whose server answers every GET with an empty list and records the paths."""
    paths: list[str] = []
    handler = type("Handler", (_Recorder,), {"paths": paths})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = kubernetes.client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        with kubernetes.client.ApiClient(configuration) as api:
            yield api, paths
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_every_list_and_watch_is_namespaced_one_per_function_namespace(
        recording_api: tuple[kubernetes.client.ApiClient, list[str]]) -> None:
    api, paths = recording_api
    sources = kube.sources(api, ["fn-a", "fn-b"])
    for kind in (sources.fastfuncs, sources.fastpods, sources.services, sources.pods):
        assert isinstance(kind, dict)
        assert set(kind) == {"fn-a", "fn-b"}
        for source in kind.values():
            source.list()
    group = f"/apis/{keys.API_GROUP}/{keys.FASTFUNC_VERSION}"
    assert sorted(paths) == sorted(f"{prefix}/namespaces/{ns}/{plural}" for ns in ("fn-a", "fn-b")
                                   for prefix, plural in ((group, keys.FASTFUNC_PLURAL), (group, keys.FASTPOD_PLURAL),
                                                          ("/api/v1", "services"), ("/api/v1", "pods")))


def test_all_namespaces_lists_cluster_wide(recording_api: tuple[kubernetes.client.ApiClient, list[str]]) -> None:
    api, paths = recording_api
    sources = kube.sources(api, None)
    for source in (sources.fastfuncs, sources.fastpods, sources.services, sources.pods):
        assert not isinstance(source, dict)
        source.list()
    assert not [path for path in paths if "/namespaces/" in path]


def test_the_crd_check_lists_in_a_function_namespace(recording_api: tuple[kubernetes.client.ApiClient, list[str]]
                                                     ) -> None:
    api, paths = recording_api
    assert kube.check_crd(api, "fn-a") is None
    assert paths == [f"/apis/{keys.API_GROUP}/{keys.FASTFUNC_VERSION}/namespaces/fn-a/{keys.FASTFUNC_PLURAL}"]


def _fastfunc(namespace: str, name: str) -> dict[str, Any]:
    return {"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": f"{namespace}-{name}", "generation": 1,
                         "resourceVersion": "1"}}


def _listing(*objects: dict[str, Any]) -> ScriptedListWatch:
    source = ScriptedListWatch()
    source.lists.append((list(objects), "1"))
    return source


def test_the_caches_of_two_namespaces_do_not_overwrite_each_other() -> None:
    kube_fake = FakeKube()
    recorder = EventRecorder(kube_fake, component="test", instance="test", api_version=keys.FASTFUNC_API_VERSION,
                             kind=keys.FASTFUNC_KIND)
    controller = Controller(kube_fake, recorder)
    funcs = {"fn-a": _listing(_fastfunc("fn-a", "one")), "fn-b": _listing(_fastfunc("fn-b", "two"))}
    empty = {ns: _listing() for ns in funcs}
    try:
        controller.start(funcs, dict(empty), {ns: _listing() for ns in funcs}, {ns: _listing() for ns in funcs})
        assert sorted(controller.fastfuncs.list_keys()) == ["fn-a/one", "fn-b/two"]
        # a relist of one namespace replaces that namespace's objects only
        controller.fastfuncs.scoped("fn-a").replace([])
        assert controller.fastfuncs.list_keys() == ["fn-b/two"]
    finally:
        for source in [*funcs.values(), *empty.values()]:
            source.closed.set()
        controller.stop(grace_s=1)
