"""The OpenFaaS provider API on the gateway, as faas-cli calls it, over an in-memory FaSTFunc store:
routes, bodies and the status codes faas-cli relies on."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from fastgshare import keys
from fastgshare_gateway.http import AUTOSCALED_HEADER
from tests.integration.gateway.harness import NS, MemoryStore, gateway

DEPLOYMENT = {"service": "hello", "image": "fastgshare/fake-fn:local", "envProcess": "fake-fn",
              "labels": {"com.openfaas.scale.min": "2"},
              "annotations": {keys.GPU_QUOTA_REQUEST: "0.4", keys.GPU_SM_PARTITION: "12", keys.GPU_MEM: "1Gi"}}
FASTPOD = {"apiVersion": "fastgshare.caps.in.tum/v1", "kind": "FaSTPod",
           "metadata": {"name": "legacy", "namespace": NS, "labels": {"com.openfaas.scale.min": "1"}},
           "spec": {"replicas": 3, "podSpec": {"containers": [{"name": "c", "image": "old:1"}]}},
           "status": {"readyReplicas": 2}}


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


async def call(client: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with client.request(method, url, json=body) as answer:
        text = await answer.text()
        is_json = answer.content_type == "application/json"
        return answer.status, (await answer.json() if is_json else text)


def test_deploy_update_list_scale_delete_as_faas_cli_does() -> None:
    async def scenario() -> None:
        store = MemoryStore([FASTPOD])
        async with gateway(store=store) as (_, url), aiohttp.ClientSession() as client:
            # faas-cli deploy: PUT first; 404 means "not there", then POST
            assert (await call(client, "PUT", f"{url}/system/functions", DEPLOYMENT))[0] == 404
            assert (await call(client, "POST", f"{url}/system/functions", DEPLOYMENT)) == (202, "")
            stored = store.fastfuncs[(NS, "hello")]
            assert stored["kind"] == "FaSTFunc"
            assert stored["spec"]["fixed"] == {"quotaRequest": "0.4", "quotaLimit": "0.4", "smPartition": 12,
                                               "replicas": 2}
            status, text = await call(client, "POST", f"{url}/system/functions", DEPLOYMENT)
            assert status == 409
            assert "PUT" in text

            status, listed = await call(client, "GET", f"{url}/system/functions")
            assert status == 200
            assert [(f["name"], f["replicas"], f["availableReplicas"]) for f in listed] == [
                ("hello", 2, 0), ("legacy", 3, 2)]  # the FaSTPod written as a function, read-only
            status, one = await call(client, "GET", f"{url}/system/function/hello")
            assert (status, one["image"], one["envProcess"], one["namespace"]) == (
                200, "fastgshare/fake-fn:local", "fake-fn", NS)
            assert (await call(client, "GET", f"{url}/system/function/legacy"))[1]["image"] == "old:1"
            assert (await call(client, "GET", f"{url}/system/function/nope"))[0] == 404

            # scale-function sets the fixed replicas; a later update without a scale label keeps them
            assert (await call(client, "POST", f"{url}/system/scale-function/hello",
                               {"serviceName": "hello", "replicas": 4}))[0] == 202
            assert store.fastfuncs[(NS, "hello")]["spec"]["fixed"]["replicas"] == 4
            changed = {**DEPLOYMENT, "image": "fastgshare/fake-fn:v2", "labels": {}}
            assert (await call(client, "PUT", f"{url}/system/functions", changed))[0] == 202
            updated = store.fastfuncs[(NS, "hello")]
            assert updated["spec"]["podSpec"]["containers"][0]["image"] == "fastgshare/fake-fn:v2"
            assert updated["spec"]["fixed"]["replicas"] == 4
            assert "labels" not in updated["metadata"]
            assert (await call(client, "POST", f"{url}/system/scale-function/legacy", {"replicas": 1}))[0] == 400
            assert (await call(client, "POST", f"{url}/system/scale-function/nope", {"replicas": 1}))[0] == 404

            assert (await call(client, "DELETE", f"{url}/system/functions", {"functionName": "hello"}))[0] == 202
            assert (await call(client, "DELETE", f"{url}/system/functions", {"functionName": "hello"}))[0] == 404
            assert (NS, "hello") not in store.fastfuncs
    run(scenario())


def test_an_autoscaled_function_accepts_and_ignores_a_scale_request() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        async with gateway(store=store) as (_, url), aiohttp.ClientSession() as client:
            await call(client, "POST", f"{url}/system/functions", DEPLOYMENT)
            store.fastfuncs[(NS, "hello")]["spec"]["scaling"]["policy"] = "rpr"
            async with client.post(f"{url}/system/scale-function/hello", json={"replicas": 9}) as answer:
                assert answer.status == 202
                assert answer.headers[AUTOSCALED_HEADER] == "true"
            assert store.fastfuncs[(NS, "hello")]["spec"]["fixed"]["replicas"] == 2
    run(scenario())


def test_bad_bodies_are_400_listing_every_problem_and_nothing_is_created() -> None:
    async def scenario() -> None:
        store = MemoryStore()
        async with gateway(store=store) as (_, url), aiohttp.ClientSession() as client:
            status, text = await call(client, "POST", f"{url}/system/functions",
                                      {"service": "x", "image": "i", "limits": {"nvidia.com/gpu": "1"}})
            assert status == 400
            assert "limits[nvidia.com/gpu]" in text
            assert f"annotations[{keys.GPU_MEM}]" in text
            async with client.post(f"{url}/system/functions", data=b"{not json") as answer:
                assert answer.status == 400
            status, text = await call(client, "POST", f"{url}/system/functions", {**DEPLOYMENT, "namespace": "other"})
            assert status == 400
            assert "not served" in text
            assert (await call(client, "POST", f"{url}/system/scale-function/hello", {"replicas": -1}))[0] == 400
            assert store.fastfuncs == {}
    run(scenario())


def test_info_namespaces_health_and_501_for_what_is_not_provided() -> None:
    async def scenario() -> None:
        async with gateway(store=MemoryStore(), namespaces=(NS, "team-a")) as (_, url), \
                aiohttp.ClientSession() as client:
            status, info = await call(client, "GET", f"{url}/system/info")
            assert (status, info["provider"], info["orchestration"]) == (200, "fastgshare", "kubernetes")
            assert set(info["version"]) >= {"sha", "release"}
            assert await call(client, "GET", f"{url}/system/namespaces") == (200, [NS, "team-a"])
            assert (await call(client, "GET", f"{url}/healthz"))[0] == 200
            for method, path in (("POST", "/system/logs"), ("POST", "/system/secrets"),
                                 ("POST", "/system/namespace/x"), ("POST", "/async-function/hello"),
                                 ("GET", "/system/alert")):
                status, text = await call(client, method, url + path)
                assert status == 501, path
                assert text.startswith("not implemented: ")
    run(scenario())


def test_invocation_counts_appear_in_the_function_list() -> None:
    async def scenario() -> None:
        async with gateway(store=MemoryStore()) as (gw, url), aiohttp.ClientSession() as client:
            await call(client, "POST", f"{url}/system/functions", DEPLOYMENT)
            gw.metrics.invocation_done(f"hello.{NS}", 200, 0.01)
            gw.metrics.invocation_done(f"hello.{NS}", 500, 0.01)
            _, listed = await call(client, "GET", f"{url}/system/functions")
            assert listed[0]["invocationCount"] == 2
    run(scenario())
