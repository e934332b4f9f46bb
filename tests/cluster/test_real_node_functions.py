"""Real-node tier: serverless functions on shared GPUs (issue 16).

``fastgshare cluster up`` runs the function controller and the gateway; the fake-fn image serves
HTTP on 8080 and runs each request's kernels on the simulated GPU through the hook. These tests
invoke functions through the gateway as a user (or faas-cli) would: plain HTTP, the OpenFaaS
provider API, the gateway's metrics.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from fastgshare import keys
from fastgshare_cluster.cluster import Cluster
from fastgshare_cluster.images import FAKE_FN_IMAGE_SHORT
from fastgshare_cluster.processes import wait_until
from simgpu.fake_fn import fnv1a64
from simgpu.state import sample_state
from tests.cluster.real_node import (  # noqa: F401 - the fixture core
    apply,
    assignment_of,
    fake_fn_pod_spec,
    http,
    inspect,
    real_node_core,
    share_annotations,
)

pytestmark = pytest.mark.realnode

NAMESPACE = keys.DEFAULT_FUNCTION_NAMESPACE


@pytest.fixture
def custom(real_cluster: Cluster) -> kubernetes.client.CustomObjectsApi:
    return kubernetes.client.CustomObjectsApi(real_cluster.api_client())


def _pods(core: kubernetes.client.CoreV1Api, selector: str) -> list[kubernetes.client.V1Pod]:
    return core.list_namespaced_pod(NAMESPACE, label_selector=selector).items


@pytest.fixture
def function_namespace(core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi) -> Iterator[str]:
    """The function namespace ``up`` created; emptied afterwards, owners first, as a user would."""
    yield NAMESPACE
    for plural in (keys.FASTFUNC_PLURAL, keys.FASTPOD_PLURAL):
        custom.delete_collection_namespaced_custom_object(keys.API_GROUP, "v1", NAMESPACE, plural)
    core.delete_collection_namespaced_pod(NAMESPACE)
    wait_until(lambda: not core.list_namespaced_pod(NAMESPACE).items, what=f"no pods left in {NAMESPACE}",
               timeout_s=90)


def running(core: kubernetes.client.CoreV1Api, selector: str, count: int, timeout_s: float = 180) -> None:
    def ready() -> bool:
        pods = _pods(core, selector)
        return len(pods) == count and all(
            any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []) for p in pods)
    wait_until(ready, what=f"{count} ready pods with {selector} in {NAMESPACE}", timeout_s=timeout_s)


def invoke(cluster: Cluster, name: str, payload: bytes, timeout_s: float = 60) -> dict[str, Any]:
    """POST to the function until the gateway has its endpoint (it follows the pods' watch), then once."""
    url = f"{cluster.gateway_url}/function/{name}/infer"
    answers: list[tuple[int, bytes]] = []

    def answered() -> bool:
        answers.append(http(url, method="POST", body=payload))
        return answers[-1][0] == 200

    wait_until(answered, what=f"a 200 from {url}", timeout_s=timeout_s, interval_s=0.5)
    return json.loads(answers[-1][1])


def invocations(cluster: Cluster, function_name: str) -> dict[str, float]:
    """The gateway's ``gateway_function_invocation_total`` for one function, by code."""
    _, text = http(f"{cluster.gateway_url}/metrics")
    found = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if sample.name == "gateway_function_invocation_total" and \
                    sample.labels.get("function_name") == function_name:
                found[sample.labels["code"]] = sample.value
    return found


def fake_fn_fastpod(name: str) -> dict[str, Any]:
    """A FaSTPod ``name`` of the fake-fn (2 ms of GPU time a request) written as the original's user flow
    writes a function: OpenFaaS scale labels, one fixed replica; in fast-gshare-fn it is a function."""
    return {
        "apiVersion": keys.FASTPOD_API_VERSION, "kind": keys.FASTPOD_KIND,
        "metadata": {"name": name, "labels": {keys.OPENFAAS_SCALE_MIN_LABEL: "1", keys.OPENFAAS_SCALE_MAX_LABEL: "1"},
                     "annotations": share_annotations(0.3, 0.5, 50, "256Mi")},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                 "podSpec": {"terminationGracePeriodSeconds": 1, "containers": [{
                     "name": "fn", "image": FAKE_FN_IMAGE_SHORT, "imagePullPolicy": "IfNotPresent",
                     "ports": [{"containerPort": keys.FUNCTION_PORT}],
                     "env": [{"name": "FAKE_FN_GPU_MS", "value": "2"}]}]}},
    }


def test_a_fastpod_written_like_the_originals_function_is_served_by_the_gateway(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, function_namespace: str) -> None:
    """The original FaST-GShare's user flow: a plain FaSTPod in fast-gshare-fn with OpenFaaS scale
    labels and fixed replicas is a function at /function/<fastpod-name>."""
    apply(real_cluster, function_namespace, fake_fn_fastpod("resnet-like"))
    running(core, f"{keys.FASTPOD_NAME_LABEL}=resnet-like", 1)
    answer = invoke(real_cluster, "resnet-like", b"a picture")
    assert answer["echo"] == "a picture"
    assert answer["kernels"] > 0  # it ran on the (simulated) GPU, through the hook
    assert answer["pod"].startswith(f"{NAMESPACE}/resnet-like-")
    admin = gateway_admin(real_cluster)
    status, listed = http(f"{real_cluster.gateway_url}/system/functions", auth=admin)
    assert status == 200
    [listed_fn] = [f for f in json.loads(listed) if f["name"] == "resnet-like"]
    assert listed_fn["replicas"] == 1
    # its logs through the provider API (read from the pod through the API server), as faas-cli logs reads them
    status, body = http(f"{real_cluster.gateway_url}/system/logs?name=resnet-like&tail=20", auth=admin)
    assert status == 200, body
    messages = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
    assert any('"event": "ready"' in message["text"] for message in messages), messages
    assert {message["instance"] for message in messages} == {answer["pod"].split("/")[1]}
    assert {message["name"] for message in messages} == {"resnet-like"}
    assert http(f"{real_cluster.gateway_url}/system/logs?name=resnet-like&tail=20")[0] == 401


def gateway_admin(cluster: Cluster) -> tuple[str, str]:
    """The gateway's basic-auth user and password, as ``fastgshare cluster up`` mounts Secret basic-auth."""
    directory = cluster.state_dir / "gateway-auth"
    return ((directory / keys.BASIC_AUTH_USER_KEY).read_text().strip(),
            (directory / keys.BASIC_AUTH_PASSWORD_KEY).read_text().strip())


def test_a_function_deployed_through_the_openfaas_api_answers_scales_and_is_deleted(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi,
        function_namespace: str) -> None:
    gateway, admin = real_cluster.gateway_url, gateway_admin(real_cluster)
    deployment = {  # what faas-cli sends (types/function_deployment.go)
        "service": "echo-gpu", "image": FAKE_FN_IMAGE_SHORT, "namespace": NAMESPACE,
        "envVars": {"FAKE_FN_GPU_MS": "2"},
        "labels": {"team": "ml"},
        "annotations": {keys.GPU_QUOTA_REQUEST: "0.2", keys.GPU_QUOTA_LIMIT: "0.4", keys.GPU_SM_PARTITION: "30",
                        keys.GPU_MEM: "256Mi"},
    }
    # /system/* needs the credentials of Secret basic-auth (cluster up writes them to gateway-auth/)
    assert http(f"{gateway}/system/functions", method="POST", body=json.dumps(deployment).encode())[0] == 401
    assert http(f"{gateway}/system/functions", method="PUT", body=json.dumps(deployment).encode(), auth=admin)[0] == 404
    status, body = http(f"{gateway}/system/functions", method="POST", body=json.dumps(deployment).encode(), auth=admin)
    assert status == 202, body
    selector = f"{keys.FUNCTION_LABEL}=echo-gpu"
    running(core, selector, 1)
    [pod] = _pods(core, selector)
    assert pod.metadata.annotations[keys.GPU_QUOTA_LIMIT] == "0.4"
    assert pod.metadata.annotations[keys.GPU_SM_PARTITION] == "30"

    answers = [invoke(real_cluster, "echo-gpu", f"request {index}".encode()) for index in range(3)]
    assert [a["echo"] for a in answers] == ["request 0", "request 1", "request 2"]
    wait_until(lambda: invocations(real_cluster, f"echo-gpu.{NAMESPACE}").get("200") == 3,
               what="3 invocations counted once each", timeout_s=10)

    status, body = http(f"{gateway}/system/function/echo-gpu", auth=admin)
    assert status == 200
    assert json.loads(body)["replicas"] == 1

    status, _ = http(f"{gateway}/system/scale-function/echo-gpu", method="POST",
                     body=json.dumps({"serviceName": "echo-gpu", "replicas": 2}).encode(), auth=admin)
    assert status == 202
    running(core, selector, 2)
    wait_until(lambda: json.loads(http(f"{gateway}/system/function/echo-gpu", auth=admin)[1])["availableReplicas"] == 2,
               what="2 available replicas reported", timeout_s=60)
    assert core.read_namespaced_service("echo-gpu", NAMESPACE).spec.ports[0].port == keys.FUNCTION_PORT

    status, _ = http(f"{gateway}/system/functions", method="DELETE",
                     body=json.dumps({"functionName": "echo-gpu", "namespace": NAMESPACE}).encode(), auth=admin)
    assert status == 202

    def all_gone() -> bool:
        fastfuncs = custom.list_namespaced_custom_object(keys.API_GROUP, "v1", NAMESPACE, keys.FASTFUNC_PLURAL)
        fastpods = custom.list_namespaced_custom_object(keys.API_GROUP, "v1", NAMESPACE, keys.FASTPOD_PLURAL,
                                                        label_selector=selector)
        services = core.list_namespaced_service(NAMESPACE, field_selector="metadata.name=echo-gpu").items
        return not fastfuncs["items"] and not fastpods["items"] and not services and not _pods(core, selector)

    started = time.monotonic()
    wait_until(all_gone, what="the FaSTFunc, its FaSTPods, pods and Service gone", timeout_s=120)
    print(f"deleted function gone after {time.monotonic() - started:.1f}s")
    assert http(f"{gateway}/system/function/echo-gpu", auth=admin)[0] == 404


MODEL_BYTES = 256 << 20
POD_MEMORY = 3 << 30  # the pod's own memory; 5 x (3 GiB + 256 MiB) > 16 GiB, 5 x 3 GiB + 256 MiB < 16 GiB


def _model_file(path: Path) -> bytes:
    """The weights: 256 MiB whose every 4 KiB page differs (so a window read from the wrong place fails)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pattern = bytearray(MODEL_BYTES)
    seed = bytes(range(256)) * 16
    for page in range(MODEL_BYTES // 4096):
        pattern[page * 4096:page * 4096 + 8] = page.to_bytes(8, "little")
        pattern[page * 4096 + 8:(page + 1) * 4096] = seed[:4088]
    path.write_bytes(pattern)
    return bytes(pattern)


def test_four_pods_of_a_function_hold_its_model_once_answer_from_it_and_a_fifth_fits(
        real_cluster: Cluster, core: kubernetes.client.CoreV1Api, custom: kubernetes.client.CustomObjectsApi,
        function_namespace: str) -> None:
    """Issue 40: a FaSTFunc with ``spec.model``; its pods map the weights the node's model store loaded once
    per GPU. The simulated GPU's own accounting holds the model once for 4 pods; each answer carries a
    window of the weights read back from the GPU, checked against the file; a fifth pod lands on the same
    GPU, where without sharing (each pod its own copy) the extender would have no room for it."""
    name = "shared-model"
    models_dir = real_cluster.node_agent_state_dir / "models"
    weights = _model_file(models_dir / name / "weights.bin")
    before = {gpu: _memory_used(real_cluster, gpu) for gpu in _gpus(real_cluster)}
    try:
        custom.create_namespaced_custom_object(keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, NAMESPACE,
                                               keys.FASTFUNC_PLURAL, {
            "apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND, "metadata": {"name": name},
            "spec": {"podSpec": fake_fn_pod_spec({"FAKE_FN_GPU_MS": "1", "FAKE_FN_MODEL": "weights"}),
                     "memory": str(POD_MEMORY),
                     "fixed": {"quotaRequest": "0.1", "quotaLimit": "0.5", "smPartition": 20, "replicas": 4},
                     "model": {"name": "weights", "bytes": MODEL_BYTES, "source": {"path": f"{name}/weights.bin"}}}})
        selector = f"{keys.FUNCTION_LABEL}={name}"
        running(core, selector, 4)
        pods = _pods(core, selector)
        [gpu] = {assignment_of(pod).gpu_uuid for pod in pods}
        held = _memory_used(real_cluster, gpu) - before[gpu]
        print(f"\n4 pods with model sharing: the simulated GPU holds {held} bytes more "
              f"(without sharing each pod would load its own copy: {4 * MODEL_BYTES})")
        assert MODEL_BYTES <= held < 2 * MODEL_BYTES, held

        seen_pods, windows = set(), 0
        deadline = time.monotonic() + 60
        while (len(seen_pods) < 4 or windows < 12) and time.monotonic() < deadline:
            answer = invoke(real_cluster, name, b"x")
            model = answer["model"]
            assert (model["name"], model["bytes"]) == ("weights", MODEL_BYTES)
            offset, length = model["offset"], model["length"]
            assert model["fnv1a64"] == fnv1a64(weights[offset:offset + length]), answer
            seen_pods.add(answer["pod"])
            windows += 1
        assert len(seen_pods) == 4, seen_pods

        custom.patch_namespaced_custom_object(keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, NAMESPACE,
                                              keys.FASTFUNC_PLURAL, name, {"spec": {"fixed": {"replicas": 5}}})
        running(core, selector, 5)
        gpus = {assignment_of(pod).gpu_uuid for pod in _pods(core, selector)}
        assert gpus == {gpu}, "the fifth pod went to another GPU"
        shown = inspect(real_cluster, "-n", NAMESPACE, "-o", "json")
        assert f"{NAMESPACE}/{name}/weights" in shown, shown
        held_five = _memory_used(real_cluster, gpu) - before[gpu]
        assert held_five < 2 * MODEL_BYTES, held_five
    finally:
        custom.delete_namespaced_custom_object(keys.FASTFUNC_GROUP, keys.FASTFUNC_VERSION, NAMESPACE,
                                               keys.FASTFUNC_PLURAL, name)
        wait_until(lambda: not _pods(core, f"{keys.FUNCTION_LABEL}={name}"), what=f"the pods of {name} gone",
                   timeout_s=120)


def _memory_used(cluster: Cluster, gpu: str) -> int:
    """What the simulated GPU's own pool says is allocated (0 before any process used it)."""
    snapshot = sample_state(cluster.fake_gpu_dir(gpu))
    return 0 if snapshot is None else snapshot.mem_used


def _gpus(cluster: Cluster) -> list[str]:
    return sorted(path.name for path in (cluster.node_agent_state_dir / "fake-gpus").iterdir())
