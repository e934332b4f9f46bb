"""Asynchronous invocations end to end on a real NATS JetStream: nothing is lost when the worker and the
gateway are killed (SIGKILL) mid-way; 429 and 500 are retried; a function that keeps failing is told to
the callback after ``--max-retries``; the gateway answers 503 (never 202) when NATS cannot store.

Recorded: the counts of the at-least-once run are printed as one ``at-least-once:`` JSON line
(``pytest -s`` shows it; docs/functions.md quotes a run)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastgshare import keys
from fastgshare_gateway.endpoints import Endpoint
from fastgshare_gateway.http import Gateway
from fastgshare_gateway.jetstream import AsyncQueue, connect, depths
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.pool import Limits
from fastgshare_gateway.queue import AsyncRequest
from fastgshare_gateway.routing import Functions
from tests.integration.queue.harness import (
    CallbackReceiver,
    FakeFunction,
    Processes,
    free_port,
    nats_server,
    need_nats,
    serving,
)

NS = keys.DEFAULT_FUNCTION_NAMESPACE
STREAM = "fastgshare-async-test"
N = 50
MAX_RETRIES = 3
WORKER_FLAGS = ("--max-inflight", "4", "--ack-wait", "2", "--retry-base", "0.05", "--retry-max", "0.5",
                "--max-retries", str(MAX_RETRIES), "--log-level", "info")
DEADLINE_S = 90.0  # to fail rather than hang; no assertion is about time


async def _queue(client: aiohttp.ClientSession, gateway: str, path: str, callback: str, body: bytes) -> str:
    async with client.post(f"{gateway}/async-function/counter{path}", data=body,
                           headers={"X-Callback-Url": callback}) as answer:
        assert answer.status == 202, await answer.text()
        return answer.headers["X-Call-Id"]


async def _wait_healthy(client: aiohttp.ClientSession, url: str, processes: Processes) -> None:
    for _ in range(600):
        try:
            async with client.get(url) as answer:
                if answer.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"the worker did not become healthy:\n{processes.tail('worker')}")


async def _metrics(client: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Each sample summed over its labels, by sample name."""
    async with client.get(url) as answer:
        text = await answer.text()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            sums[sample.name] = sums.get(sample.name, 0.0) + sample.value
    return sums


def test_nothing_is_lost_when_the_worker_and_the_gateway_are_killed_and_retries_reach_the_callback() -> None:
    need_nats()

    async def scenario() -> dict[str, Any]:
        function, receiver, processes = FakeFunction(delay_s=0.2), CallbackReceiver(), Processes()
        try:
            with nats_server() as nats_url:
                async with serving(function.app()) as fn_address, serving(receiver.app()) as cb_address, \
                        aiohttp.ClientSession() as client:
                    callback = f"http://{cb_address}/done"
                    gateway1, gateway_url = await processes.gateway(nats_url, STREAM, {"counter": fn_address})
                    # half the calls stored while no worker runs
                    ids = [await _queue(client, gateway_url, "", callback, f"job {i}".encode()) for i in range(N // 2)]
                    worker_port = free_port()
                    worker1 = await processes.worker(nats_url, STREAM, gateway_url, worker_port, *WORKER_FLAGS)
                    await asyncio.wait_for(function.seen.wait(), DEADLINE_S)
                    while len(function.calls) < 5:  # mid-way: calls done and calls in flight
                        await asyncio.sleep(0.01)
                    await processes.sigkill(worker1)
                    await processes.sigkill(gateway1)
                    killed_after = len(function.calls)
                    # a new gateway (same NATS) takes the other half; a new worker runs what is left
                    _, gateway_url = await processes.gateway(nats_url, STREAM, {"counter": fn_address})
                    ids += [await _queue(client, gateway_url, "", callback, f"job {i}".encode())
                            for i in range(N // 2, N)]
                    worker_port = free_port()
                    await processes.worker(nats_url, STREAM, gateway_url, worker_port, *WORKER_FLAGS)
                    await _wait_healthy(client, f"http://127.0.0.1:{worker_port}/healthz", processes)
                    await receiver.wait_for(set(ids), DEADLINE_S)
                    # retries: 429 then 500 then 200; and a function that keeps failing
                    flaky = [await _queue(client, gateway_url, "/flaky", callback, b"") for _ in range(3)]
                    broken = [await _queue(client, gateway_url, "/broken", callback, b"") for _ in range(2)]
                    await receiver.wait_for(set(flaky + broken), DEADLINE_S)
                    metrics = await _metrics(client, f"http://127.0.0.1:{worker_port}/metrics")
                    return {"ids": ids, "flaky": flaky, "broken": broken, "calls": dict(function.calls),
                            "received": dict(receiver.received), "metrics": metrics, "killedAfter": killed_after,
                            "workerLog": processes.tail("worker")}
        finally:
            await processes.close()

    result = asyncio.run(scenario())
    ids, calls, received = result["ids"], result["calls"], result["received"]
    assert len(set(ids)) == N
    missing = [i for i in ids if calls.get(i, 0) < 1]
    assert not missing, f"{len(missing)} calls never ran: {missing[:5]}\n{result['workerLog']}"
    no_callback = [i for i in ids if i not in received]
    assert not no_callback, f"{len(no_callback)} calls without a callback\n{result['workerLog']}"
    for call_id in ids:
        headers, body = received[call_id][-1]
        assert headers["X-Function-Status"] == "200"
        assert headers["X-Function-Name"] == f"counter.{NS}"
        assert headers["X-Answer"] == "yes"  # the function's own headers come along
        assert float(headers["X-Duration-Seconds"]) > 0
        assert body.startswith(f"done {call_id} ".encode())
    duplicates = sum(calls[i] - 1 for i in ids)
    for call_id in result["flaky"]:
        headers, _ = received[call_id][-1]
        assert (headers["X-Function-Status"], headers["X-Fastgshare-Attempts"]) == ("200", "3")
        assert calls[call_id] == 3
    for call_id in result["broken"]:
        headers, body = received[call_id][-1]
        assert (headers["X-Function-Status"], headers["X-Fastgshare-Attempts"]) == ("500", str(MAX_RETRIES + 1))
        assert body == b"broken\n"
    metrics = result["metrics"]
    assert metrics["fastgshare_queue_failures_total"] == len(result["broken"])
    assert metrics["fastgshare_queue_retries_total"] >= 2 * len(result["flaky"]) + MAX_RETRIES * len(result["broken"])
    summary = {"N": N, "executed": sum(1 for i in ids if calls.get(i, 0) >= 1),
               "executions": sum(calls[i] for i in ids),
               "duplicates": duplicates, "callbacks": sum(len(received[i]) for i in ids),
               "killedAfterCalls": result["killedAfter"],
               "secondWorker": {k: metrics.get(k, 0.0) for k in (
                   "fastgshare_queue_redeliveries_total", "fastgshare_queue_duplicates_total",
                   "fastgshare_queue_retries_total", "fastgshare_queue_failures_total")},
               "flaky": {"calls": len(result["flaky"]), "attemptsEach": 3},
               "broken": {"calls": len(result["broken"]), "attemptsEach": MAX_RETRIES + 1, "callbackStatus": 500}}
    print("at-least-once:", json.dumps(summary))


def test_the_gateway_answers_503_not_202_when_nats_cannot_store() -> None:
    need_nats()

    async def scenario() -> tuple[tuple[int, str], tuple[int, str]]:
        functions = Functions([NS], Limits(), GatewayMetrics())
        functions.replace_pods([])
        functions.set_endpoints((NS, "counter"), [Endpoint("counter-0", "127.0.0.1:1")])
        queue = AsyncQueue("nats://127.0.0.1:1", STREAM, publish_timeout_s=1.0)
        gateway = Gateway(functions, None, async_queue=queue)
        try:
            async with serving(gateway.app()) as address, aiohttp.ClientSession() as client:
                url = f"http://{address}/async-function/counter"
                with nats_server() as nats_url:
                    queue.url = nats_url
                    await queue.start()
                    while not queue.connected:
                        await asyncio.sleep(0.05)
                    async with client.post(url, data=b"x") as answer:
                        stored = (answer.status, answer.headers.get("X-Call-Id", ""))
                # the server killed under a connected gateway: nothing acknowledges
                async with client.post(url, data=b"x") as answer:
                    return stored, (answer.status, await answer.text())
        finally:
            await queue.close()

    (status, call_id), (refused, text) = asyncio.run(scenario())
    assert (status, len(call_id)) == (202, 36)
    assert refused == 503, text
    assert text.startswith("not queued, retry later: JetStream did not store it"), text


@pytest.mark.parametrize("unused", [None])
def test_nats_server_is_found(unused: None) -> None:
    assert need_nats()


def test_the_queue_depth_per_function_is_the_stream_s_count_of_unacknowledged_messages() -> None:
    need_nats()

    async def scenario() -> tuple[dict[tuple[str, str], int], bool]:
        with nats_server() as nats_url:
            producer = AsyncQueue(nats_url, STREAM)
            await producer.start()
            while not producer.connected:
                await asyncio.sleep(0.05)
            try:
                for i, name in enumerate(["resize", "resize", "resize", "ocr", "ocr"]):
                    stored = queue_request(f"00000000-0000-4000-8000-00000000000{i}", name)
                    assert not await producer.publish(stored)
                again = await producer.publish(queue_request("00000000-0000-4000-8000-000000000000", "resize"))
                reader = await connect(nats_url, name="test-reader")
                try:
                    return await depths(reader.jetstream(), STREAM), again
                finally:
                    await reader.close()
            finally:
                await producer.close()

    found, duplicate = asyncio.run(scenario())
    assert found == {(NS, "resize"): 3, (NS, "ocr"): 2}
    assert duplicate  # the same X-Call-Id within the duplicate window is stored once


def queue_request(call_id: str, name: str) -> AsyncRequest:
    return AsyncRequest(call_id=call_id, function=name, namespace=NS, method="POST", path="", query="", headers=(),
                        body=b"x", callback_url=None, queued_at=0.0)
