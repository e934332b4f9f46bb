"""``GET /system/logs`` end to end: the gateway in this process, its real Kubernetes adapter
(:class:`~fastgshare_gateway.kube.KubePodLogs`, the kubernetes client over HTTP) against a small aiohttp
server playing kube-apiserver's pod list and pod log endpoints (``timestamps``, ``tailLines``,
``sinceSeconds``, ``follow`` with a chunked answer that stays open), as faas-cli would call it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import kubernetes.client
from aiohttp import web

from fastgshare import keys
from fastgshare_gateway.http import Gateway, Options
from fastgshare_gateway.kube import KubePodLogs
from fastgshare_gateway.logs import LogLimits
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.pool import Limits
from fastgshare_gateway.routing import Functions
from tests.integration.gateway.harness import NS, serving

WAIT_S = 20.0  # a bound on waiting for something the test caused, not a measured time


def stamp(second: int) -> str:
    return f"2026-12-04T03:22:{second:02d}.{second * 1111:06d}123Z"


def pod(name: str, function: str, *, label: str = keys.FUNCTION_LABEL) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "labels": {label: function}},
            "spec": {"containers": [{"name": "fn", "image": "fake-fn"}, {"name": "sidecar", "image": "x"}]},
            "status": {"phase": "Running"}}


class FakeApiServer:
    """Pods and their logs as kube-apiserver serves them; every log request and its query recorded."""

    def __init__(self) -> None:
        self.pods: list[dict[str, Any]] = []
        self.history: dict[str, list[str]] = {}  # pod -> lines, each "<timestamp> <text>"
        self.live: dict[str, asyncio.Queue[str]] = {}  # pod -> lines written while a follower reads
        self.log_queries: list[tuple[str, dict[str, str]]] = []
        self.open_follows: set[str] = set()
        self.closed_follows: list[str] = []
        self.forbidden = False
        self.waiting: set[str] = set()  # pods whose container has not started

    def add(self, pod_object: dict[str, Any], *lines: str) -> None:
        self.pods.append(pod_object)
        name = pod_object["metadata"]["name"]
        self.history[name] = list(lines)
        self.live[name] = asyncio.Queue()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/namespaces/{ns}/pods", self.list_pods)
        app.router.add_get("/api/v1/namespaces/{ns}/pods/{pod}/log", self.pod_log)
        return app

    async def list_pods(self, request: web.Request) -> web.StreamResponse:
        key, _, value = request.query.get("labelSelector", "").partition("=")
        items = [p for p in self.pods if p["metadata"]["namespace"] == request.match_info["ns"]
                 and p["metadata"]["labels"].get(key) == value]
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"},
                                  "items": items})

    async def pod_log(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["pod"]
        self.log_queries.append((name, dict(request.query)))
        if self.forbidden:
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403,
                                      "message": f'pods "{name}" is forbidden: User "system:serviceaccount:'
                                                 'fastgshare-system:fastgshare-gateway" cannot get resource '
                                                 '"pods/log"'}, status=403)
        if name in self.waiting:
            return web.json_response({"kind": "Status", "status": "Failure", "reason": "BadRequest", "code": 400,
                                      "message": f'container "fn" in pod "{name}" is waiting to start: '
                                                 'ContainerCreating'}, status=400)
        lines = self.history[name]
        if tail := request.query.get("tailLines"):
            lines = lines[-int(tail):]
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for line in lines:
            await response.write(line.encode() + b"\n")
        if request.query.get("follow") != "true":
            await response.write_eof()
            return response
        self.open_follows.add(name)
        try:
            while request.transport is not None and not request.transport.is_closing():
                with contextlib.suppress(TimeoutError):
                    line = await asyncio.wait_for(self.live[name].get(), 0.05)
                    await response.write(line.encode() + b"\n")
        except ConnectionError:
            pass
        finally:
            self.open_follows.discard(name)
            self.closed_follows.append(name)
        return response


@contextlib.asynccontextmanager
async def gateway_with_api(api: FakeApiServer, limits: LogLimits | None = None,
                           ) -> AsyncIterator[tuple[Gateway, str]]:
    async with serving(api.app()) as api_address:
        configuration = kubernetes.client.Configuration()
        configuration.host = f"http://{api_address}"
        with kubernetes.client.ApiClient(configuration) as client:
            functions = Functions((NS,), Limits(), GatewayMetrics())
            functions.replace_pods([])
            for name in ("hello", "legacy", "other"):  # as the gateway's FaSTFunc watch would have them
                functions.upsert_fastfunc({"metadata": {"name": name, "namespace": NS}, "spec": {}})
            gateway = Gateway(functions, None, Options(log_limits=limits or LogLimits()),
                              pod_logs=KubePodLogs(client, NS))
            async with serving(gateway.app()) as address:
                yield gateway, f"http://{address}"


async def eventually(condition: Any, what: str) -> None:
    try:
        async with asyncio.timeout(WAIT_S):
            while not condition():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"waited {WAIT_S:g}s for {what}") from None


def three_pods(api: FakeApiServer) -> None:
    api.add(pod("hello-q40-s12-aaaaa", "hello"), f"{stamp(1)} loading model", f"{stamp(4)} ready on :8080",
            f"{stamp(7)} POST / 200 12ms")
    api.add(pod("hello-q20-s6-bbbbb", "hello"), f"{stamp(2)} loading model", f"{stamp(5)} ready on :8080")
    api.add(pod("other-q40-s12-ccccc", "other"), f"{stamp(3)} not hello's")


def test_logs_of_every_pod_of_the_function_sorted_by_time_as_ndjson() -> None:
    async def scenario() -> None:
        api = FakeApiServer()
        three_pods(api)
        async with gateway_with_api(api) as (_, url), aiohttp.ClientSession() as client, client.get(
                f"{url}/system/logs", params={"name": "hello", "tail": "2"}) as answer:
            assert answer.status == 200
            assert answer.headers["Content-Type"] == "application/x-ndjson"
            body = await answer.text()
        messages = [json.loads(line) for line in body.splitlines()]
        assert [(m["instance"], m["text"]) for m in messages] == [
            ("hello-q20-s6-bbbbb", "loading model"), ("hello-q40-s12-aaaaa", "ready on :8080"),
            ("hello-q20-s6-bbbbb", "ready on :8080"), ("hello-q40-s12-aaaaa", "POST / 200 12ms")]
        assert messages[0] == {"name": "hello", "namespace": NS, "instance": "hello-q20-s6-bbbbb",
                               "timestamp": stamp(2), "text": "loading model"}
        assert sorted(pod for pod, _ in api.log_queries) == ["hello-q20-s6-bbbbb", "hello-q40-s12-aaaaa"]
        for _, query in api.log_queries:
            assert (query["timestamps"], query["tailLines"], query["follow"]) == ("true", "2", "false")
            assert query["container"] == "fn"  # the function's container, not a sidecar
    asyncio.run(scenario())


def test_since_and_instance_narrow_the_answer_and_a_fastpod_function_is_found_by_its_label() -> None:
    async def scenario() -> None:
        api = FakeApiServer()
        three_pods(api)
        api.add(pod("legacy-0", "legacy", label=keys.FASTPOD_NAME_LABEL), f"{stamp(6)} a FaSTPod function")
        async with gateway_with_api(api) as (_, url), aiohttp.ClientSession() as client:
            params = {"name": "hello", "instance": "hello-q40-s12-aaaaa", "since": stamp(4)}
            async with client.get(f"{url}/system/logs", params=params) as answer:
                texts = [json.loads(line)["text"] for line in (await answer.text()).splitlines()]
            assert texts == ["ready on :8080", "POST / 200 12ms"]  # stamp(1) dropped by its timestamp
            assert [pod for pod, _ in api.log_queries] == ["hello-q40-s12-aaaaa"]
            assert int(api.log_queries[0][1]["sinceSeconds"]) >= 1
            async with client.get(f"{url}/system/logs", params={"name": "legacy"}) as answer:
                assert [json.loads(line)["text"] for line in (await answer.text()).splitlines()] == [
                    "a FaSTPod function"]
    asyncio.run(scenario())


def test_follow_streams_new_lines_and_new_pods_until_the_client_goes_away() -> None:
    async def scenario() -> None:
        api = FakeApiServer()
        api.add(pod("hello-q40-s12-aaaaa", "hello"), f"{stamp(1)} loading model")
        limits = LogLimits(pod_poll_s=0.2)
        async with gateway_with_api(api, limits) as (gateway, url):
            client = aiohttp.ClientSession()
            try:
                answer = await client.get(f"{url}/system/logs", params={"name": "hello", "follow": "true"})
                assert answer.status == 200
                assert answer.headers["Transfer-Encoding"] == "chunked"
                async with asyncio.timeout(WAIT_S):
                    assert json.loads(await answer.content.readline())["text"] == "loading model"
                    await api.live["hello-q40-s12-aaaaa"].put(f"{stamp(9)} POST / 200 9ms")
                    assert json.loads(await answer.content.readline())["text"] == "POST / 200 9ms"
                    # a pod that starts while the client follows is read too
                    api.add(pod("hello-q40-s12-ddddd", "hello"), f"{stamp(10)} second pod up")
                    second = json.loads(await answer.content.readline())
                    assert (second["instance"], second["text"]) == ("hello-q40-s12-ddddd", "second pod up")
                assert api.open_follows == {"hello-q40-s12-aaaaa", "hello-q40-s12-ddddd"}
                assert gateway.logs.active == 1
            finally:
                await client.close()  # the client goes away mid-stream
            await eventually(lambda: not api.open_follows and gateway.logs.active == 0,
                             "the gateway to close both pod streams and finish the answer")
            assert sorted(api.closed_follows) == ["hello-q40-s12-aaaaa", "hello-q40-s12-ddddd"]
    asyncio.run(scenario())


def test_a_follow_ends_at_its_line_cap_and_closes_the_pod_streams() -> None:
    async def scenario() -> None:
        api = FakeApiServer()
        api.add(pod("hello-q40-s12-aaaaa", "hello"), *(f"{stamp(s)} line {s}" for s in range(5)))
        async with gateway_with_api(api, LogLimits(max_lines=3)) as (gateway, url), \
                aiohttp.ClientSession() as client:
            async with asyncio.timeout(WAIT_S), client.get(
                    f"{url}/system/logs", params={"name": "hello", "follow": "1"}) as answer:
                lines = (await answer.text()).splitlines()  # ends: the gateway closed the answer
            assert [json.loads(line)["text"] for line in lines] == ["line 0", "line 1", "line 2"]
            await eventually(lambda: not api.open_follows and gateway.logs.active == 0, "the pod stream closed")
    asyncio.run(scenario())


def test_a_quiet_follow_ends_at_its_time_cap() -> None:
    async def scenario() -> None:
        api = FakeApiServer()
        api.add(pod("hello-q40-s12-aaaaa", "hello"), f"{stamp(1)} only line")
        async with gateway_with_api(api, LogLimits(follow_timeout_s=0.5)) as (gateway, url), \
                aiohttp.ClientSession() as client:
            async with asyncio.timeout(WAIT_S), client.get(
                    f"{url}/system/logs", params={"name": "hello", "follow": "true"}) as answer:
                lines = (await answer.text()).splitlines()  # ends although the pod's stream stays open
            assert [json.loads(line)["text"] for line in lines] == ["only line"]
            await eventually(lambda: not api.open_follows and gateway.logs.active == 0, "the pod stream closed")
    asyncio.run(scenario())


def test_past_the_answers_at_once_a_log_request_gets_429() -> None:
    async def scenario() -> None:
        api = FakeApiServer()
        api.add(pod("hello-q40-s12-aaaaa", "hello"), f"{stamp(1)} loading model")
        async with gateway_with_api(api, LogLimits(max_requests=1)) as (gateway, url), \
                aiohttp.ClientSession() as client:
            async with client.get(f"{url}/system/logs", params={"name": "hello", "follow": "true"}) as following:
                await following.content.readline()
                async with client.get(f"{url}/system/logs", params={"name": "hello"}) as second:
                    assert second.status == 429
                    assert (await second.text()).startswith("1 log requests are in progress")
            await eventually(lambda: gateway.logs.active == 0, "the follower's answer to end")
            async with client.get(f"{url}/system/logs", params={"name": "hello"}) as third:
                assert third.status == 200
    asyncio.run(scenario())


def test_bad_input_unknown_functions_and_refused_rights_get_one_line_each() -> None:
    async def scenario() -> None:
        api = FakeApiServer()
        three_pods(api)
        async with gateway_with_api(api) as (_, url), aiohttp.ClientSession() as client:
            async def get(params: dict[str, str]) -> tuple[int, str]:
                async with client.get(f"{url}/system/logs", params=params) as answer:
                    return answer.status, await answer.text()

            for params, status, start in [
                    ({}, 400, "name: missing"),
                    ({"name": "hello", "tail": "x"}, 400, "tail 'x': expected a whole number"),
                    ({"name": "hello", "since": "5m"}, 400, "since '5m': expected an RFC 3339 time"),
                    ({"name": "hello", "follow": "maybe"}, 400, "follow 'maybe'"),
                    ({"name": "hello", "namespace": "team-b"}, 400, "namespace 'team-b' is not served"),
                    ({"name": "nope"}, 404, "name 'nope': no function"),
                    ({"name": "hello", "instance": "other-q40-s12-ccccc"}, 404, "instance 'other-q40-s12-ccccc'")]:
                code, text = await get(params)
                assert (code, text.count("\n")) == (status, 1), (params, text)
                assert text.startswith(start), text
            assert "hello-q20-s6-bbbbb, hello-q40-s12-aaaaa" in text  # the instances there are
            assert api.log_queries == []
            api.forbidden = True
            code, text = await get({"name": "hello"})
            assert code == 502
            assert "pods/log" in text, text
            assert "RBAC" in text, text
    asyncio.run(scenario())


def test_a_pod_still_starting_is_skipped_and_read_once_it_runs_when_following() -> None:
    async def scenario() -> None:
        api = FakeApiServer()
        three_pods(api)
        api.waiting.add("hello-q20-s6-bbbbb")
        async with gateway_with_api(api, LogLimits(pod_poll_s=0.2)) as (_, url), aiohttp.ClientSession() as client:
            async with client.get(f"{url}/system/logs", params={"name": "hello"}) as answer:
                assert answer.status == 200
                assert {json.loads(line)["instance"] for line in (await answer.text()).splitlines()} == {
                    "hello-q40-s12-aaaaa"}
            async with client.get(f"{url}/system/logs", params={"name": "hello",
                                                                 "instance": "hello-q20-s6-bbbbb"}) as answer:
                assert (answer.status, await answer.text()) == (200, "")  # no log yet: no lines, no error
            async with client.get(f"{url}/system/logs", params={"name": "hello", "follow": "true",
                                                                 "instance": "hello-q20-s6-bbbbb"}) as answer:
                assert answer.status == 200
                api.waiting.clear()  # its container started: the next poll reads it
                async with asyncio.timeout(WAIT_S):
                    assert json.loads(await answer.content.readline())["text"] == "loading model"
    asyncio.run(scenario())


def test_a_function_scaled_to_zero_has_no_lines() -> None:
    async def scenario() -> None:
        async with gateway_with_api(FakeApiServer()) as (_, url), aiohttp.ClientSession() as client, client.get(
                f"{url}/system/logs", params={"name": "hello"}) as answer:
            assert (answer.status, await answer.text()) == (200, "")
    asyncio.run(scenario())
