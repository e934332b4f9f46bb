"""The gateway against the real API server: the provider API creates, reads, updates, scales and deletes
real FaSTFunc objects (the CRD of ``deploy/crd``, its schema and defaults), and the pod watch turns a
function's Ready pods into endpoints. The gateway runs in-process with its real Kubernetes adapter; no
controller runs, so no pods are made from the FaSTFuncs (the real-node tier invokes functions)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import kubernetes.client
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from fastgshare import keys
from fastgshare_gateway.http import Gateway
from fastgshare_gateway.kube import KubeStore, Watches, load_api_client, missing_crd
from fastgshare_gateway.metrics import GatewayMetrics
from fastgshare_gateway.pool import Limits
from fastgshare_gateway.routing import Functions
from tests.cluster.controlplane import ControlPlane, wait_until
from tests.integration.gateway.harness import serving

CRD = Path(__file__).resolve().parents[2] / "deploy" / "crd" / "fastfuncs.yaml"


@pytest.fixture(scope="session")
def fastfunc_crd(api_client: kubernetes.client.ApiClient) -> None:
    extensions = kubernetes.client.ApiextensionsV1Api(api_client)
    body = yaml.safe_load(CRD.read_text())
    try:
        extensions.create_custom_resource_definition(body)
    except ApiException as error:
        if error.status != 409:
            raise

    def established() -> bool:
        crd = extensions.read_custom_resource_definition(body["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_until(established, what="the FaSTFunc CRD to be Established", timeout_s=60)


@pytest.fixture
def gateway_api(control_plane: ControlPlane) -> Iterator[Any]:
    api = load_api_client(str(control_plane.kubeconfig))
    yield api
    api.close()


def deployment(namespace: str, image: str = "fastgshare/fake-fn:local", **labels: str) -> dict[str, Any]:
    return {"service": "hello", "namespace": namespace, "image": image, "envProcess": "fake-fn",
            "labels": labels, "annotations": {keys.GPU_QUOTA_REQUEST: "0.4", keys.GPU_SM_PARTITION: "12",
                                              keys.GPU_MEM: "1Gi"}}


async def call(client: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> tuple[int, Any]:
    async with client.request(method, url, json=body) as answer:
        if answer.content_type == "application/json":
            return answer.status, await answer.json()
        return answer.status, await answer.text()


def test_the_provider_api_manages_real_fastfuncs(gateway_api: Any, api_client: kubernetes.client.ApiClient,
                                                 namespace: str, fastfunc_crd: None) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)

    def stored() -> dict[str, Any]:
        return custom.get_namespaced_custom_object(keys.API_GROUP, keys.FASTFUNC_VERSION, namespace,
                                                   keys.FASTFUNC_PLURAL, "hello")

    async def scenario() -> None:
        functions = Functions([namespace], Limits(), GatewayMetrics(), default_namespace=namespace)
        functions.replace_pods([])
        gateway = Gateway(functions, KubeStore(gateway_api))
        async with serving(gateway.app()) as address, aiohttp.ClientSession() as client:
            url = f"http://{address}/system"
            assert (await call(client, "PUT", f"{url}/functions", deployment(namespace)))[0] == 404
            assert await call(client, "POST", f"{url}/functions",
                              deployment(namespace, **{"com.openfaas.scale.min": "2"})) == (202, "")
            fastfunc = await asyncio.to_thread(stored)
            assert fastfunc["spec"]["scaling"]["policy"] == "fixed"
            assert fastfunc["spec"]["fixed"] == {"quotaRequest": "0.4", "quotaLimit": "0.4", "smPartition": 12,
                                                 "replicas": 2}
            assert fastfunc["spec"]["memory"] == "1Gi"
            assert (await call(client, "POST", f"{url}/functions", deployment(namespace)))[0] == 409

            status, listed = await call(client, "GET", f"{url}/functions?namespace={namespace}")
            assert status == 200
            assert [(f["name"], f["replicas"], f["image"]) for f in listed] == [
                ("hello", 2, "fastgshare/fake-fn:local")]
            assert listed[0]["createdAt"]
            status, one = await call(client, "GET", f"{url}/function/hello?namespace={namespace}")
            assert (status, one["envProcess"]) == (200, "fake-fn")

            assert (await call(client, "POST", f"{url}/scale-function/hello",
                               {"serviceName": "hello", "replicas": 3, "namespace": namespace}))[0] == 202
            assert (await asyncio.to_thread(stored))["spec"]["fixed"]["replicas"] == 3
            assert (await call(client, "PUT", f"{url}/functions", deployment(namespace, "example/v2")))[0] == 202
            fastfunc = await asyncio.to_thread(stored)
            assert fastfunc["spec"]["podSpec"]["containers"][0]["image"] == "example/v2"
            assert fastfunc["spec"]["fixed"]["replicas"] == 3  # an update without a scale label keeps the count

            delete = {"functionName": "hello", "namespace": namespace}
            assert (await call(client, "DELETE", f"{url}/functions", delete))[0] == 202
            assert (await call(client, "DELETE", f"{url}/functions", delete))[0] == 404
            assert (await call(client, "GET", f"{url}/function/hello?namespace={namespace}"))[0] == 404
    asyncio.run(scenario())


def test_the_pod_watch_makes_ready_function_pods_endpoints(gateway_api: Any, api_client: kubernetes.client.ApiClient,
                                                           namespace: str, fastfunc_crd: None) -> None:
    core = kubernetes.client.CoreV1Api(api_client)
    assert missing_crd(gateway_api, namespace) is None

    def make_pod(name: str, labels: dict[str, str], ip: str) -> None:
        core.create_namespaced_pod(namespace, {
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "fn", "image": "registry.invalid/fn:1"}]}})
        core.patch_namespaced_pod_status(name, namespace, {"status": {
            "podIP": ip, "conditions": [{"type": "Ready", "status": "True"}]}})

    async def scenario() -> None:
        functions = Functions([namespace], Limits(), GatewayMetrics(), default_namespace=namespace)
        watches = Watches(gateway_api, functions, asyncio.get_running_loop())
        watches.start()
        try:
            await asyncio.to_thread(make_pod, "fn-a", {keys.FUNCTION_LABEL: "fn"}, "10.1.0.1")
            await asyncio.to_thread(make_pod, "legacy-x", {keys.FASTPOD_NAME_LABEL: "legacy"}, "10.1.0.2")
            for key, address in (((namespace, "fn"), "10.1.0.1:8080"), ((namespace, "legacy"), "10.1.0.2:8080")):
                for _ in range(600):
                    pool = functions.pool(key)
                    if pool is not None and [e.address for e in pool.endpoints] == [address]:
                        break
                    await asyncio.sleep(0.05)
                else:
                    pytest.fail(f"{key} never got the endpoint {address}")
            assert functions.synced
        finally:
            await asyncio.to_thread(watches.stop)
    asyncio.run(scenario())


def test_the_fastfunc_watch_carries_settings_and_a_request_wakes_a_function_at_zero(
        gateway_api: Any, api_client: kubernetes.client.ApiClient, namespace: str, fastfunc_crd: None) -> None:
    custom = kubernetes.client.CustomObjectsApi(api_client)
    custom.create_namespaced_custom_object(keys.API_GROUP, keys.FASTFUNC_VERSION, namespace, keys.FASTFUNC_PLURAL, {
        "apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND, "metadata": {"name": "zero"},
        "spec": {"podSpec": {"containers": [{"name": "fn", "image": "registry.invalid/fn:1"}]}, "memory": "1Gi",
                 "slo": {"latencyMs": 200}, "scaling": {"policy": "fixed", "minReplicas": 0},
                 "fixed": {"quotaRequest": "0.5", "replicas": 0}}})

    def replicas() -> int:
        return custom.get_namespaced_custom_object(keys.API_GROUP, keys.FASTFUNC_VERSION, namespace,
                                                   keys.FASTFUNC_PLURAL, "zero")["spec"]["fixed"]["replicas"]

    async def scenario() -> None:
        functions = Functions([namespace], Limits(), GatewayMetrics(), default_namespace=namespace,
                              cold_start_timeout_s=0.5)
        gateway = Gateway(functions, KubeStore(gateway_api))
        watches = Watches(gateway_api, functions, asyncio.get_running_loop())
        watches.start()
        key = (namespace, "zero")
        try:
            async with asyncio.timeout(30):
                while (settings := functions.settings(key)) is None:
                    await asyncio.sleep(0.05)
            assert (settings.min_replicas, settings.replicas, settings.slo_s) == (0, 0, 0.2)
            async with serving(gateway.app()) as address, aiohttp.ClientSession() as client, \
                    client.get(f"http://{address}/function/zero.{namespace}") as answer:
                assert answer.status == 503  # no controller here: woken, but no pod comes
                assert "cold-start timeout" in await answer.text()
            assert await asyncio.to_thread(replicas) == 1
        finally:
            await asyncio.to_thread(watches.stop)
    asyncio.run(scenario())
