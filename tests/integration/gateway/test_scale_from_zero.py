"""Scale from zero through a real gateway on loopback (endpoints injected, an in-memory FaSTFunc store):
requests for a function at zero replicas are held while one wake-up patch goes out, and answered once a
pod is ready; the cold-start timeout; functions that may not scale to zero."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from fastgshare_gateway.endpoints import Endpoint
from fastgshare_gateway.pool import Limits
from tests.integration.gateway.harness import NS, MemoryStore, echo_app, gateway, serving

FN = (NS, "fn")


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def fastfunc(min_replicas: int, replicas: int) -> dict[str, Any]:
    return {"apiVersion": "fastgshare.caps.in.tum/v1", "kind": "FaSTFunc",
            "metadata": {"name": "fn", "namespace": NS},
            "spec": {"podSpec": {"containers": [{"name": "c", "image": "i"}]},
                     "scaling": {"policy": "fixed", "minReplicas": min_replicas},
                     "fixed": {"quotaRequest": "1", "smPartition": 100, "replicas": replicas}}}


def stored(min_replicas: int, replicas: int) -> MemoryStore:
    store = MemoryStore()
    store.create_fastfunc(NS, fastfunc(min_replicas, replicas))
    return store


async def until(condition: Any, timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def test_requests_for_a_function_at_zero_are_held_one_wake_up_is_sent_and_they_are_answered() -> None:
    async def scenario() -> None:
        store = stored(0, 0)
        limits = Limits(queue_timeout_s=0.05)  # far shorter than the hold: the cold-start timeout applies
        async with serving(echo_app("a")) as pod, gateway(limits, store=store) as (gw, url), \
                aiohttp.ClientSession() as client:
            gw.functions.upsert_fastfunc(fastfunc(0, 0))  # as the watch reports it
            requests = [asyncio.create_task(client.get(f"{url}/function/fn")) for _ in range(4)]
            pool = gw.functions.pool(FN)
            assert pool is not None
            await until(lambda: pool.queued == 4 and store.patches)
            await asyncio.sleep(0.2)  # well past the queue timeout: still held
            assert pool.queued == 4
            assert store.patches == [(NS, "fn", {"spec": {"fixed": {"replicas": 1}}})]
            assert store.fastfuncs[FN]["spec"]["fixed"]["replicas"] == 1
            gw.functions.set_endpoints(FN, [Endpoint("a", pod)])  # the first pod is ready
            for task in requests:
                answer = await task
                assert answer.status == 200
                assert (await answer.json())["pod"] == "a"
            assert len(store.patches) == 1
    run(scenario())


def test_a_function_that_does_not_become_ready_in_time_is_503() -> None:
    async def scenario() -> None:
        store = stored(0, 0)
        async with gateway(Limits(queue_timeout_s=30), store=store, cold_start_timeout_s=0.2) as (gw, url), \
                aiohttp.ClientSession() as client:
            gw.functions.upsert_fastfunc(fastfunc(0, 0))
            async with client.get(f"{url}/function/fn") as answer:
                assert answer.status == 503
                text = await answer.text()
            assert "did not become ready within the cold-start timeout (0.2s" in text
            assert len(store.patches) == 1
    run(scenario())


def test_a_function_with_min_replicas_one_is_not_woken_and_gets_503_after_the_queue_timeout() -> None:
    async def scenario() -> None:
        store = stored(1, 0)
        async with gateway(Limits(queue_timeout_s=0.1), store=store) as (gw, url), \
                aiohttp.ClientSession() as client:
            gw.functions.upsert_fastfunc(fastfunc(1, 0))
            async with client.get(f"{url}/function/fn") as answer:
                assert answer.status == 503
                assert "no ready pod took the request within 0.1s" in await answer.text()
            assert store.patches == []
    run(scenario())


def test_scale_to_zero_only_when_min_replicas_is_zero() -> None:
    async def scenario() -> None:
        store = stored(2, 2)
        store.create_fastfunc(NS, {**fastfunc(0, 1), "metadata": {"name": "idle", "namespace": NS}})
        async with gateway(store=store) as (_, url), aiohttp.ClientSession() as client:
            async with client.post(f"{url}/system/scale-function/fn", json={"replicas": 0}) as answer:
                assert answer.status == 400
                assert "minReplicas is 2" in await answer.text()
            async with client.post(f"{url}/system/scale-function/idle", json={"replicas": 0}) as answer:
                assert answer.status == 202
        assert store.patches == [(NS, "idle", {"spec": {"fixed": {"replicas": 0}}})]
        assert store.fastfuncs[FN]["spec"]["fixed"]["replicas"] == 2
    run(scenario())
