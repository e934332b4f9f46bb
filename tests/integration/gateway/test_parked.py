"""Parked pods through a real gateway on loopback (endpoints injected, an in-memory store): a request for a
function whose pods are all parked goes to a parked pod at once and sends one wake-up, a JSON patch on the
parked child FaSTPod that tests it is still parked; a child woken meanwhile (the test fails) is left alone."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from fastgshare import keys
from fastgshare_gateway.endpoints import Endpoint
from tests.integration.gateway.harness import NS, MemoryStore, echo_app, gateway, serving

FN = (NS, "fn")
CHILD = "fn-q40-s12"


def fastfunc() -> dict[str, Any]:
    return {"apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND,
            "metadata": {"name": "fn", "namespace": NS},
            "spec": {"podSpec": {"containers": [{"name": "c", "image": "i"}]},
                     "scaling": {"policy": "rpr", "minReplicas": 0, "parked": 1}},
            "status": {"parked": {"fastPod": CHILD, "replicas": 1, "wakeQuotaRequest": "0.4",
                                  "wakeQuotaLimit": "0.5", "smPartition": 12, "memoryBytes": 2**30}}}


def parked_child(limit: str = "0") -> dict[str, Any]:
    return {"metadata": {"name": CHILD, "namespace": NS, "annotations": {
        keys.GPU_QUOTA_REQUEST: "0", keys.GPU_QUOTA_LIMIT: limit, keys.GPU_SM_PARTITION: "12", keys.GPU_MEM: "1Gi"}}}


def test_a_request_for_parked_pods_is_served_by_one_and_wakes_them_once() -> None:
    async def scenario() -> None:
        store = MemoryStore([parked_child()])
        gate = asyncio.Event()  # the parked pod answers once "woken"
        async with serving(echo_app("parked", gate=gate)) as pod, gateway(store=store) as (gw, url), \
                aiohttp.ClientSession() as client:
            gw.functions.upsert_fastfunc(fastfunc(), NS)
            gw.functions.set_endpoints(FN, [Endpoint("parked", pod, parked=True)])
            requests = [asyncio.create_task(client.get(f"{url}/function/fn")) for _ in range(3)]
            async with asyncio.timeout(10):
                while not store.wakes:
                    await asyncio.sleep(0.01)
            gate.set()
            for task in requests:
                answer = await task
                assert answer.status == 200
                assert (await answer.json())["pod"] == "parked"
            assert len(store.wakes) == 1  # single flight
            namespace, name, patch = store.wakes[0]
            assert (namespace, name) == (NS, CHILD)
            assert patch[0] == {"op": "test", "path": "/metadata/annotations/fastgshare~1gpu_quota_limit", "value": "0"}
            annotations = store.fastpods[(NS, CHILD)]["metadata"]["annotations"]
            assert (annotations[keys.GPU_QUOTA_REQUEST], annotations[keys.GPU_QUOTA_LIMIT]) == ("0.4", "0.5")
            assert keys.FASTPOD_WOKEN_ANNOTATION in annotations
            metrics = (await (await client.get(f"{url}/metrics")).text())
            assert 'fastgshare_gateway_wakeups_total{function_name="fn.fast-gshare-fn"} 1.0' in metrics
            assert 'fastgshare_gateway_parked_pods{function_name="fn.fast-gshare-fn"} 1.0' in metrics
            # awake: no more wake-ups
            gw.functions.set_endpoints(FN, [Endpoint("parked", pod)])
            assert (await client.get(f"{url}/function/fn")).status == 200
            assert len(store.wakes) == 1
    asyncio.run(scenario())


def test_a_child_woken_meanwhile_is_left_alone() -> None:
    async def scenario() -> None:
        store = MemoryStore([parked_child(limit="0.3")])  # raised by someone else before the wake-up landed
        async with serving(echo_app("p")) as pod, gateway(store=store) as (gw, url), aiohttp.ClientSession() as client:
            gw.functions.upsert_fastfunc(fastfunc(), NS)
            gw.functions.set_endpoints(FN, [Endpoint("p", pod, parked=True)])
            assert (await client.get(f"{url}/function/fn")).status == 200
            async with asyncio.timeout(10):
                while not store.wakes:
                    await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert store.fastpods[(NS, CHILD)]["metadata"]["annotations"][keys.GPU_QUOTA_LIMIT] == "0.3"
            assert (await client.get(f"{url}/function/fn")).status == 200
            assert len(store.wakes) == 1  # a 422 is no failure to retry: the single flight holds
    asyncio.run(scenario())


def test_a_request_that_finds_parked_pods_before_the_status_says_so_wakes_them_when_it_does() -> None:
    async def scenario() -> None:
        store = MemoryStore([parked_child()])
        gate = asyncio.Event()
        async with serving(echo_app("parked", gate=gate)) as pod, gateway(store=store) as (gw, url), \
                aiohttp.ClientSession() as client:
            not_yet = fastfunc()
            del not_yet["status"]  # the controller has not written status.parked yet
            gw.functions.upsert_fastfunc(not_yet, NS)
            gw.functions.set_endpoints(FN, [Endpoint("parked", pod, parked=True)])
            request = asyncio.create_task(client.get(f"{url}/function/fn"))
            await asyncio.sleep(0.2)
            assert store.wakes == []  # nothing to wake it to yet
            gw.functions.upsert_fastfunc(fastfunc(), NS)  # the status arrives: the wake-up goes, unasked
            async with asyncio.timeout(10):
                while not store.wakes:
                    await asyncio.sleep(0.01)
            gate.set()
            assert (await request).status == 200
            assert len(store.wakes) == 1
    asyncio.run(scenario())
