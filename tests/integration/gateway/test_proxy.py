"""Invocations through a real gateway on loopback to real HTTP upstreams (endpoints injected, no
Kubernetes): routing, streaming, headers, the status codes of every failure, and the metrics."""

from __future__ import annotations

import asyncio
import os
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from fastgshare_gateway.endpoints import Endpoint
from fastgshare_gateway.http import Options
from fastgshare_gateway.pool import Limits
from tests.integration.gateway.harness import NS, echo_app, free_port_address, gateway, serving

FN = (NS, "fn")


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_request_reaches_the_pod_with_path_query_body_and_forwarding_headers() -> None:
    async def scenario() -> None:
        async with serving(echo_app("a")) as pod, gateway() as (gw, url), aiohttp.ClientSession() as client:
            gw.functions.set_endpoints(FN, [Endpoint("a", pod)])
            async with client.post(f"{url}/function/fn/created/x?q=1&r=2", data=b"hello",
                                   headers={"X-Call-Id": "call-1", "X-Forwarded-For": "10.9.9.9"}) as answer:
                assert answer.status == 201
                assert answer.headers["X-Call-Id"] == "call-1"
                seen = await answer.json()
            assert (seen["method"], seen["path"], seen["query"], seen["bodyLength"]) == (
                "POST", "/created/x", "q=1&r=2", 5)
            assert seen["headers"]["X-Forwarded-For"] == "10.9.9.9, 127.0.0.1"
            assert seen["headers"]["X-Forwarded-Host"] == url.removeprefix("http://")
            assert seen["headers"]["X-Call-Id"] == "call-1"
            async with client.get(f"{url}/function/fn.{NS}") as answer:  # name.namespace, no tail
                seen = await answer.json()
                assert seen["path"] == "/"
                assert answer.headers["X-Call-Id"]  # made up when the client sent none
    run(scenario())


def test_large_bodies_stream_both_ways_unchanged() -> None:
    async def scenario() -> None:
        body = os.urandom(8 * 2**20)
        async with serving(echo_app("a")) as pod, gateway() as (gw, url), aiohttp.ClientSession() as client:
            gw.functions.set_endpoints(FN, [Endpoint("a", pod)])

            async def chunks() -> Any:
                for start in range(0, len(body), 2**20):
                    yield body[start:start + 2**20]
            async with client.post(f"{url}/function/fn/echo", data=chunks()) as answer:
                assert answer.status == 200
                assert answer.headers["X-Pod"] == "a"
                assert await answer.read() == body
    run(scenario())


def test_unknown_functions_and_unserved_namespaces_are_404() -> None:
    async def scenario() -> None:
        async with gateway() as (gw, url), aiohttp.ClientSession() as client:
            gw.functions.set_endpoints(FN, [])
            for path in ("/function/nope", "/function/fn.other-namespace"):
                async with client.get(url + path) as answer:
                    assert answer.status == 404
                    assert "no function" in await answer.text()
    run(scenario())


def test_a_full_queue_is_429_and_a_queue_timeout_is_503() -> None:
    async def scenario() -> None:
        gate = asyncio.Event()
        limits = Limits(max_queue=1, queue_timeout_s=30, max_inflight=1)
        async with serving(echo_app("a", gate=gate)) as pod, gateway(limits) as (gw, url), \
                aiohttp.ClientSession() as client:
            gw.functions.set_endpoints(FN, [Endpoint("a", pod)])
            first = asyncio.create_task(client.get(f"{url}/function/fn"))
            second = asyncio.create_task(client.get(f"{url}/function/fn"))
            pool = gw.functions.pool(FN)
            assert pool is not None
            while pool.queued < 1:
                await asyncio.sleep(0.01)
            async with client.get(f"{url}/function/fn") as answer:
                assert answer.status == 429
            gate.set()
            for task in (first, second):
                answer = await task
                assert answer.status == 200
                answer.release()
        async with gateway(Limits(queue_timeout_s=0.05)) as (gw, url), aiohttp.ClientSession() as client:
            gw.functions.set_endpoints(FN, [])  # the function exists but has no ready pod
            async with client.get(f"{url}/function/fn") as answer:
                assert answer.status == 503
                assert "no ready pod" in await answer.text()
    run(scenario())


def test_an_unreachable_pod_is_retried_once_on_another_then_502() -> None:
    async def scenario() -> None:
        dead = free_port_address()
        async with serving(echo_app("live")) as live, gateway() as (gw, url), aiohttp.ClientSession() as client:
            gw.functions.set_endpoints(FN, [Endpoint("dead", dead, capacity=1000), Endpoint("live", live)])
            for _ in range(3):  # the dead pod is chosen first (much more capacity): each is retried
                async with client.post(f"{url}/function/fn", data=b"body") as answer:
                    assert answer.status == 200
                    assert (await answer.json())["bodyLength"] == 4
            gw.functions.set_endpoints(FN, [Endpoint("dead", dead), Endpoint("dead2", free_port_address()),
                                            Endpoint("dead3", free_port_address())])
            async with client.get(f"{url}/function/fn") as answer:
                assert answer.status == 502  # one retry only
            pool = gw.functions.pool(FN)
            assert pool is not None
            assert pool.inflight == 0
    run(scenario())


def test_an_upstream_that_does_not_answer_in_time_is_504() -> None:
    async def scenario() -> None:
        async with serving(echo_app("slow", delay_s=5)) as pod, \
                gateway(options=Options(upstream_timeout_s=0.2)) as (gw, url), aiohttp.ClientSession() as client:
            gw.functions.set_endpoints(FN, [Endpoint("slow", pod)])
            async with client.get(f"{url}/function/fn") as answer:
                assert answer.status == 504
    run(scenario())


def test_metrics_count_each_invocation_once_with_openfaas_names() -> None:
    async def scenario() -> None:
        dead = free_port_address()
        async with serving(echo_app("a")) as pod, gateway() as (gw, url), aiohttp.ClientSession() as client:
            gw.functions.set_endpoints(FN, [Endpoint("a", pod), Endpoint("dead", dead, capacity=1000)])
            for _ in range(5):
                async with client.get(f"{url}/function/fn") as answer:  # retried: still one invocation
                    assert answer.status == 200
            async with client.get(f"{url}/function/fn/created") as answer:
                assert answer.status == 201
            async with client.get(f"{url}/metrics") as answer:
                found = samples(await answer.text())
        name = f"fn.{NS}"
        assert found[("gateway_function_invocation_total", (("code", "200"), ("function_name", name)))] == 5
        assert found[("gateway_function_invocation_total", (("code", "201"), ("function_name", name)))] == 1
        assert found[("gateway_function_invocation_started_total", (("function_name", name),))] == 6
        assert found[("gateway_functions_seconds_count", (("code", "200"), ("function_name", name)))] == 5
        assert found[("gateway_service_count", (("function_name", name),))] == 2
        assert found[("fastgshare_gateway_queue_depth", (("function_name", name),))] == 0
        assert found[("fastgshare_gateway_inflight", (("function_name", name),))] == 0
    run(scenario())


def test_slo_violations_count_a_slow_answer_and_a_502_but_not_a_fast_200() -> None:
    async def scenario() -> None:
        slo = {"metadata": {"name": "fn", "namespace": NS}, "spec": {"slo": {"latencyMs": 1000}}}
        async with serving(echo_app("fast")) as fast, serving(echo_app("slow", delay_s=1.5)) as slow, \
                gateway() as (gw, url), aiohttp.ClientSession() as client:
            gw.functions.upsert_fastfunc(slo)  # as the FaSTFunc watch reports it
            gw.functions.set_endpoints(FN, [Endpoint("fast", fast)])
            async with client.get(f"{url}/function/fn") as answer:  # well within 1 s on any machine
                assert answer.status == 200
            async with client.get(f"{url}/metrics") as answer:
                found = samples(await answer.text())
            violations = ("fastgshare_gateway_slo_violations_total", (("function_name", f"fn.{NS}"),))
            assert found[violations] == 0
            gw.functions.set_endpoints(FN, [Endpoint("slow", slow)])
            async with client.get(f"{url}/function/fn") as answer:  # 1.5 s against an SLO of 1 s
                assert answer.status == 200
            gw.functions.set_endpoints(FN, [Endpoint("dead", free_port_address())])
            async with client.get(f"{url}/function/fn") as answer:
                assert answer.status == 502
            async with client.get(f"{url}/metrics") as answer:
                found = samples(await answer.text())
            assert found[violations] == 2
    run(scenario())
