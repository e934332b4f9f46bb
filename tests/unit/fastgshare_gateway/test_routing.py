"""Pods to endpoints, the function index, and one function's admission queue."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from fastgshare import keys
from fastgshare_gateway.endpoints import Endpoint, EndpointIndex, pod_entry
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.pool import ColdStartTimeout, FunctionPool, Limits, QueueFull, QueueTimeout
from fastgshare_gateway.routing import Functions

NS = keys.DEFAULT_FUNCTION_NAMESPACE


def pod(name: str, *, namespace: str = NS, function: str | None = "fn", fastpod: str | None = None,
        ready: bool = True, ip: str | None = "10.0.0.1", deleting: bool = False) -> dict[str, Any]:
    labels = {**({keys.FUNCTION_LABEL: function} if function else {}),
              **({keys.FASTPOD_NAME_LABEL: fastpod} if fastpod else {})}
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                                "labels": labels}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": metadata, "status": status}


def test_a_pod_serves_when_ready_not_terminating_and_with_an_ip() -> None:
    assert pod_entry(pod("a")).endpoint == Endpoint(pod="a", address="10.0.0.1:8080")
    assert pod_entry(pod("a", ready=False)).endpoint is None
    assert pod_entry(pod("a", ip=None)).endpoint is None
    assert pod_entry(pod("a", deleting=True)).endpoint is None


def test_fastpod_pods_are_functions_only_in_the_default_function_namespace() -> None:
    assert pod_entry(pod("p-1", function=None, fastpod="resnet")).functions == ((NS, "resnet"),)
    assert pod_entry(pod("p-1", namespace="other", function=None, fastpod="resnet")).functions == ()
    # a FaSTFunc's child FaSTPod's pods serve the function, not the FaSTPod's name
    assert pod_entry(pod("p-1", function="fn", fastpod="fn-q40-s12")).functions == ((NS, "fn"),)


def test_the_index_follows_upserts_and_deletes() -> None:
    index = EndpointIndex()
    assert index.replace([pod("a", ip="10.0.0.1"), pod("b", ready=False)]) == {(NS, "fn")}
    assert [e.pod for e in index.endpoints((NS, "fn"))] == ["a"]
    index.upsert(pod("b", ip="10.0.0.2"))
    assert [e.address for e in index.endpoints((NS, "fn"))] == ["10.0.0.1:8080", "10.0.0.2:8080"]
    assert index.delete(pod("a")) == {(NS, "fn")}
    index.upsert(pod("b", function="other"))  # relabelled: moves to the other function
    assert index.endpoints((NS, "fn")) == []
    assert [e.pod for e in index.endpoints((NS, "other"))] == ["b"]


def share(request: str, limit: str) -> dict[str, str]:
    return {keys.GPU_QUOTA_REQUEST: request, keys.GPU_QUOTA_LIMIT: limit, keys.GPU_SM_PARTITION: "12",
            keys.GPU_MEM: "1Gi"}


def test_parked_pods_serve_only_while_the_function_has_no_other_pod() -> None:
    parked, awake = pod("a", ip="10.0.0.1"), pod("b", ip="10.0.0.2")
    parked["metadata"]["annotations"] = share("0", "0")
    awake["metadata"]["annotations"] = share("0.4", "0.4")
    assert pod_entry(parked).endpoint == Endpoint(pod="a", address="10.0.0.1:8080", parked=True)
    index = EndpointIndex()
    index.replace([parked])
    assert [(e.pod, e.parked) for e in index.endpoints((NS, "fn"))] == [("a", True)]
    index.upsert(awake)
    assert [(e.pod, e.parked) for e in index.endpoints((NS, "fn"))] == [("b", False)]
    woken = pod("a", ip="10.0.0.1")
    woken["metadata"]["annotations"] = share("0.4", "0.4")  # the FaSTPod controller carried the wake-up
    index.upsert(woken)
    assert [e.pod for e in index.endpoints((NS, "fn"))] == ["a", "b"]


def test_a_function_exists_by_fastfunc_or_pods_in_a_served_namespace() -> None:
    functions = Functions([NS], Limits(), GatewayMetrics())
    assert functions.pool((NS, "fn")) is None
    functions.upsert_pod(pod("a", ready=False))
    pool = functions.pool((NS, "fn"))
    assert pool is not None
    assert pool.endpoints == []
    functions.upsert_pod(pod("a"))
    assert [e.pod for e in pool.endpoints] == ["a"]  # the pool follows its pods
    functions.replace_fastfuncs(NS, [{"metadata": {"name": "zero", "namespace": NS}}])
    assert functions.pool((NS, "zero")) is not None  # no pods yet (scaled to zero): still a function
    functions.upsert_pod(pod("x", namespace="elsewhere"))
    assert functions.pool(("elsewhere", "fn")) is None  # not a served namespace


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def settle() -> None:
    """Let every woken task run (a queued request resumes through a few loop turns)."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_the_queue_is_bounded_fifo_and_times_out() -> None:
    async def scenario() -> None:
        pool = FunctionPool((NS, "fn"), Limits(max_queue=2, queue_timeout_s=30, max_inflight=1))
        pool.set_endpoints([Endpoint("a", "a:8080")])
        first = await pool.acquire()
        waiters = [asyncio.create_task(pool.acquire()) for _ in range(2)]
        await asyncio.sleep(0)
        assert pool.queued == 2
        with pytest.raises(QueueFull):
            await pool.acquire()
        pool.release(first)
        assert (await waiters[0]).pod == "a"
        assert not waiters[1].done()
        waiters[1].cancel()
        await settle()
        assert pool.queued == 0

        short = FunctionPool((NS, "fn"), Limits(max_queue=2, queue_timeout_s=0.01, max_inflight=1))
        with pytest.raises(QueueTimeout):
            await short.acquire()  # no endpoint at all
        assert short.queued == 0
        assert short.inflight == 0
    run(scenario())


def test_pods_arriving_serve_the_queue_and_the_idle_hook_fires() -> None:
    woken: list[tuple[str, str]] = []

    async def scenario() -> None:
        pool = FunctionPool((NS, "fn"), Limits(max_queue=5, queue_timeout_s=30), on_idle_wait=woken.append)
        waiter = asyncio.create_task(pool.acquire())
        await asyncio.sleep(0)
        assert woken == [(NS, "fn")]
        pool.set_endpoints([Endpoint("a", "a:8080")])
        assert (await waiter).pod == "a"
        assert pool.inflight == 1
    run(scenario())


def test_the_idle_hook_may_hold_a_request_longer_than_the_queue_timeout() -> None:
    async def scenario() -> None:
        held = FunctionPool((NS, "fn"), Limits(queue_timeout_s=0.01), on_idle_wait=lambda key: 30.0)
        waiter = asyncio.create_task(held.acquire())
        await asyncio.sleep(0.05)  # past the queue timeout: still held
        assert not waiter.done()
        held.set_endpoints([Endpoint("a", "a:8080")])
        assert (await waiter).pod == "a"
        short = FunctionPool((NS, "fn"), Limits(queue_timeout_s=30), on_idle_wait=lambda key: 0.01)
        with pytest.raises(ColdStartTimeout):
            await short.acquire()
        assert short.queued == 0
    run(scenario())


def test_a_retry_takes_another_pod_or_none() -> None:
    async def scenario() -> None:
        pool = FunctionPool((NS, "fn"), Limits(max_inflight=1))
        pool.set_endpoints([Endpoint("a", "a:8080"), Endpoint("b", "b:8080")])
        first = await pool.acquire()
        other = pool.retry_endpoint([first.pod])
        assert other is not None
        assert other.pod != first.pod
        assert pool.retry_endpoint([first.pod]) is None  # the other is full now
    run(scenario())


def test_pods_of_capacity_10_and_30_under_load_get_requests_1_to_3() -> None:
    """Saturated: the fast pod finishes three requests while the slow one finishes one."""
    async def scenario() -> dict[str, int]:
        pool = FunctionPool((NS, "fn"), Limits(max_queue=10_000, max_inflight=4))
        pool.set_endpoints([Endpoint("slow", "s:8080", capacity=10), Endpoint("fast", "f:8080", capacity=30)])
        tasks = [asyncio.create_task(pool.acquire()) for _ in range(2000)]
        await asyncio.sleep(0)
        counts = {"slow": 0, "fast": 0}
        held: dict[str, list[Endpoint]] = {"slow": [], "fast": []}
        pending = tasks
        while pending:
            await settle()
            for task in [t for t in pending if t.done()]:
                counts[task.result().pod] += 1
                held[task.result().pod].append(task.result())
            pending = [t for t in pending if not t.done()]
            for name, finishing in (("slow", 1), ("fast", 3)):  # one tick of service
                for endpoint in held[name][:finishing]:
                    held[name].remove(endpoint)
                    pool.release(endpoint)
        return counts
    counts = run(scenario())
    assert counts["fast"] / counts["slow"] == pytest.approx(3, rel=0.1)


def test_a_function_at_zero_gets_one_wake_up_until_a_pod_is_ready_or_the_cold_start_timeout() -> None:
    now = [0.0]
    sent: list[tuple[tuple[str, str], dict[str, Any]]] = []
    functions = Functions([NS], Limits(queue_timeout_s=30), GatewayMetrics(), cold_start_timeout_s=100,
                          clock=lambda: now[0])
    functions.waker = lambda key, patch: sent.append((key, patch))
    functions.upsert_fastfunc({"metadata": {"name": "zero", "namespace": NS},
                               "spec": {"scaling": {"minReplicas": 0}, "fixed": {"replicas": 0}}})
    functions.upsert_fastfunc({"metadata": {"name": "one", "namespace": NS}, "spec": {"fixed": {"replicas": 0}}})
    key = (NS, "zero")
    assert [functions.on_idle_wait(key) for _ in range(3)] == [100, 100, 100]
    assert sent == [(key, {"spec": {"fixed": {"replicas": 1}}})]
    assert functions.on_idle_wait((NS, "one")) is None  # minReplicas 1: the queue timeout, no wake-up
    functions.upsert_pod(pod("a", function="zero"))  # woken
    functions.upsert_pod(pod("a", function="zero", ready=False))  # ...and gone again
    functions.on_idle_wait(key)
    assert len(sent) == 2
    now[0] = 99.0
    functions.on_idle_wait(key)
    assert len(sent) == 2
    now[0] = 101.0  # the cold-start timeout passed without a pod: the next request tries again
    functions.on_idle_wait(key)
    assert len(sent) == 3
    functions.wake_failed(key)
    functions.on_idle_wait(key)
    assert len(sent) == 4


def test_a_pod_that_could_not_be_reached_is_left_out_for_a_while_unless_all_are() -> None:
    async def scenario() -> None:
        now = [100.0]
        pool = FunctionPool((NS, "fn"), Limits(max_inflight=100, eject_s=10), clock=lambda: now[0])
        pool.set_endpoints([Endpoint("dead", "dead:8080", capacity=1000), Endpoint("live", "live:8080")])
        first = await pool.acquire()
        assert first.pod == "dead"  # the dispatcher prefers the big pod
        pool.unreachable("dead")
        pool.release(first)
        chosen = [(await pool.acquire()).pod for _ in range(20)]
        assert set(chosen) == {"live"}
        now[0] += 10.5  # the time is up: the pod is tried again
        assert (await pool.acquire()).pod == "dead"
        pool.unreachable("dead")
        pool.unreachable("live")  # every pod left out: better a chance than no pod
        assert (await pool.acquire()).pod in {"dead", "live"}
    run(scenario())
