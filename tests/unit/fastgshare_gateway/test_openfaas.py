"""The OpenFaaS contract as FaSTFunc objects, field by field. The fixtures are written from
``openfaas/faas-provider`` ``types/function_deployment.go``, ``types/function_status.go`` and
``types/requests.go`` (the JSON names of their fields), as faas-cli sends them."""

from __future__ import annotations

from typing import Any

import pytest

from fastgshare import keys
from fastgshare_gateway import openfaas
from fastgshare_gateway.openfaas import InvalidDeployment, to_fastfunc

NS = keys.DEFAULT_FUNCTION_NAMESPACE

# What `faas-cli deploy` sends for a stack.yml function (FunctionDeployment / CreateFunctionRequest).
DEPLOYMENT: dict[str, Any] = {
    "service": "resnet50",
    "image": "example/resnet50:of-watchdog",
    "namespace": "fast-gshare-fn",
    "envProcess": "python index.py",
    "envVars": {"write_timeout": "10s", "MODEL": "resnet50"},
    "constraints": ["kubernetes.io/arch=amd64"],
    "secrets": [],
    "labels": {"com.openfaas.scale.min": "2", "com.openfaas.scale.max": "6", "team": "vision"},
    "annotations": {"fastgshare/gpu_quota_request": "0.4", "fastgshare/gpu_quota_limit": "0.6",
                    "fastgshare/gpu_sm_partition": "12", "fastgshare/gpu_mem": "2Gi", "note": "kept"},
    "limits": {"memory": "512Mi", "cpu": "1"},
    "requests": {"memory": "256Mi", "cpu": "100m"},
    "readOnlyRootFilesystem": True,
}


def problems_of(body: object) -> dict[str, str]:
    with pytest.raises(InvalidDeployment) as caught:
        to_fastfunc(body, NS)
    return {p.field: p.message for p in caught.value.problems}


def test_identity_and_the_one_container() -> None:
    fastfunc = to_fastfunc(DEPLOYMENT, NS)
    assert fastfunc["apiVersion"] == keys.FASTFUNC_API_VERSION == "fastgshare.caps.in.tum/v1"
    assert fastfunc["kind"] == "FaSTFunc"
    assert fastfunc["metadata"]["name"] == "resnet50"
    assert fastfunc["metadata"]["namespace"] == "fast-gshare-fn"
    [container] = fastfunc["spec"]["podSpec"]["containers"]
    assert container["name"] == "fn"
    assert container["image"] == "example/resnet50:of-watchdog"
    assert container["ports"] == [{"name": "http", "containerPort": 8080}]


def test_env_process_is_fprocess_first_then_env_vars_sorted() -> None:
    [container] = to_fastfunc(DEPLOYMENT, NS)["spec"]["podSpec"]["containers"]
    assert container["env"] == [{"name": "fprocess", "value": "python index.py"},
                                {"name": "MODEL", "value": "resnet50"}, {"name": "write_timeout", "value": "10s"}]


def test_resources_constraints_and_read_only_root() -> None:
    spec = to_fastfunc(DEPLOYMENT, NS)["spec"]
    [container] = spec["podSpec"]["containers"]
    assert container["resources"] == {"limits": {"memory": "512Mi", "cpu": "1"},
                                      "requests": {"memory": "256Mi", "cpu": "100m"}}
    assert container["securityContext"] == {"readOnlyRootFilesystem": True}
    assert spec["podSpec"]["nodeSelector"] == {"kubernetes.io/arch": "amd64"}


def test_share_annotations_make_a_fixed_function_and_scale_labels_its_bounds() -> None:
    fastfunc = to_fastfunc(DEPLOYMENT, NS)
    spec = fastfunc["spec"]
    assert spec["scaling"] == {"policy": "fixed", "minReplicas": 2, "maxReplicas": 6}
    assert spec["fixed"] == {"quotaRequest": "0.4", "quotaLimit": "0.6", "smPartition": 12, "replicas": 2}
    assert spec["memory"] == "2Gi"
    assert fastfunc["metadata"]["labels"] == DEPLOYMENT["labels"]
    assert fastfunc["metadata"]["annotations"] == DEPLOYMENT["annotations"]


def test_defaults_limit_is_the_request_sm_is_whole_replicas_one_or_kept() -> None:
    body = {"service": "f", "image": "i", "annotations": {keys.GPU_QUOTA_REQUEST: "0.25", keys.GPU_MEM: "1000"}}
    fastfunc = to_fastfunc(body, NS)
    assert fastfunc["metadata"]["namespace"] == NS
    assert fastfunc["spec"]["fixed"] == {"quotaRequest": "0.25", "quotaLimit": "0.25", "smPartition": 100,
                                         "replicas": 1}
    assert to_fastfunc(body, NS, replicas=4)["spec"]["fixed"]["replicas"] == 4  # an update keeps the count
    only_memory = to_fastfunc({"service": "f", "image": "i", "annotations": {keys.GPU_MEM: "1Gi"}}, NS)
    assert only_memory["spec"]["fixed"]["quotaRequest"] == only_memory["spec"]["fixed"]["quotaLimit"] == "1"
    bare = to_fastfunc(body, NS)["spec"]["podSpec"]["containers"][0]
    assert "env" not in bare
    assert "resources" not in bare
    assert "securityContext" not in bare


def test_every_problem_is_listed_at_once_naming_the_field() -> None:
    found = problems_of({"service": "Bad_Name", "image": "", "limits": {"nvidia.com/gpu": "1"},
                         "labels": {"com.openfaas.scale.min": "3", "com.openfaas.scale.max": "x"},
                         "annotations": {keys.GPU_QUOTA_REQUEST: "1.5", keys.GPU_MEM: "1Gi"},
                         "secrets": ["db"], "constraints": ["nolabel"], "envVars": {"A": 1}, "extra": 1})
    assert set(found) == {"service", "image", "limits[nvidia.com/gpu]", "labels[com.openfaas.scale.max]",
                          f"annotations[{keys.GPU_QUOTA_REQUEST}]", "secrets", "constraints[0]", "envVars", "extra"}
    assert "gpu_quota_request" in found["limits[nvidia.com/gpu]"]  # says where the share goes instead


def test_gpu_memory_is_required_and_min_may_not_exceed_max() -> None:
    assert f"annotations[{keys.GPU_MEM}]" in problems_of({"service": "f", "image": "i"})
    found = problems_of({"service": "f", "image": "i", "annotations": {keys.GPU_MEM: "1Gi"},
                         "labels": {"com.openfaas.scale.min": "5", "com.openfaas.scale.max": "2"}})
    assert set(found) == {"labels[com.openfaas.scale.min]"}
    assert problems_of([1]) == {"body": "must be a JSON object (an OpenFaaS FunctionDeployment)"}


def test_error_message_names_field_value_and_what_is_allowed() -> None:
    with pytest.raises(InvalidDeployment) as caught:
        to_fastfunc({"service": "f", "image": "i", "annotations": {keys.GPU_MEM: "1Gi",
                                                                   keys.GPU_SM_PARTITION: "150"}}, NS)
    text = str(caught.value)
    assert keys.GPU_SM_PARTITION in text
    assert "150" in text
    assert "1..100" in text


def stored(fastfunc: dict[str, Any], **status: Any) -> dict[str, Any]:
    """As the API server returns it."""
    fastfunc = dict(fastfunc)
    fastfunc["metadata"] = {**fastfunc["metadata"], "creationTimestamp": "2026-01-02T03:04:05Z", "uid": "u"}
    fastfunc["status"] = status
    return fastfunc


def test_function_status_round_trips_what_was_deployed() -> None:
    status = openfaas.function_status(stored(to_fastfunc(DEPLOYMENT, NS), replicas=3, readyReplicas=1), 7)
    assert status == {
        "name": "resnet50", "image": "example/resnet50:of-watchdog", "namespace": NS,
        "envProcess": "python index.py", "envVars": {"MODEL": "resnet50", "write_timeout": "10s"},
        "constraints": ["kubernetes.io/arch=amd64"], "labels": DEPLOYMENT["labels"],
        "annotations": DEPLOYMENT["annotations"], "limits": DEPLOYMENT["limits"], "requests": DEPLOYMENT["requests"],
        "readOnlyRootFilesystem": True, "replicas": 2, "availableReplicas": 1, "invocationCount": 7,
        "createdAt": "2026-01-02T03:04:05Z",
    }


def test_replicas_of_an_autoscaled_function_come_from_its_status() -> None:
    fastfunc = stored(to_fastfunc(DEPLOYMENT, NS), replicas=5, readyReplicas=4)
    fastfunc["spec"] = {**fastfunc["spec"], "scaling": {"policy": "rpr"}}
    status = openfaas.function_status(fastfunc)
    assert (status["replicas"], status["availableReplicas"], status["invocationCount"]) == (5, 4, 0)


# The original's function example: a plain FaSTPod in fast-gshare-fn with OpenFaaS scale labels.
FASTPOD = {
    "apiVersion": "fastgshare.caps.in.tum/v1", "kind": "FaSTPod",
    "metadata": {"name": "resnet-pytorch", "namespace": NS, "creationTimestamp": "2026-01-01T00:00:00Z",
                 "labels": {"com.openfaas.scale.max": "10", "com.openfaas.scale.min": "1"},
                 "annotations": {keys.GPU_QUOTA_REQUEST: "0.5", keys.GPU_SM_PARTITION: "50"}},
    "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "resnet-pytorch"}},
             "podSpec": {"containers": [{"name": "resnet", "image": "yukiozhu/resnet:fast",
                                         "env": [{"name": "fprocess", "value": "python main.py"}]}]}},
    "status": {"replicas": 2, "readyReplicas": 1},
}


def test_a_fastpod_is_listed_as_a_function_read_only() -> None:
    status = openfaas.fastpod_status(FASTPOD, 3)
    assert status["name"] == "resnet-pytorch"
    assert status["image"] == "yukiozhu/resnet:fast"
    assert (status["replicas"], status["availableReplicas"], status["invocationCount"]) == (2, 1, 3)
    assert status["labels"] == FASTPOD["metadata"]["labels"]
    assert status["envProcess"] == "python main.py"
    assert openfaas.is_function_fastpod(FASTPOD)
    child = {**FASTPOD, "metadata": {**FASTPOD["metadata"], "labels": {keys.FUNCTION_LABEL: "resnet"}}}
    assert not openfaas.is_function_fastpod(child)  # a FaSTFunc's child is listed through its FaSTFunc


def test_scale_and_delete_requests() -> None:
    assert openfaas.parse_scale_request({"serviceName": "f", "replicas": 3, "namespace": NS}, "f") == 3
    assert openfaas.parse_scale_request({"replicas": 0}, "f") == 0
    for bad in ({"replicas": -1}, {"replicas": "2"}, {"replicas": True}, {"serviceName": "g", "replicas": 1}, []):
        with pytest.raises(InvalidDeployment):
            openfaas.parse_scale_request(bad, "f")
    assert openfaas.scale_patch(4) == {"spec": {"fixed": {"replicas": 4}}}
    assert openfaas.parse_delete_request({"functionName": "f"}, NS) == ("f", NS)
    assert openfaas.parse_delete_request({"functionName": "f", "namespace": "other"}, NS) == ("f", "other")
    with pytest.raises(InvalidDeployment):
        openfaas.parse_delete_request({"namespace": NS}, NS)


def test_function_names_select_a_namespace_with_a_dot() -> None:
    assert openfaas.split_function_name("fn", NS) == ("fn", NS)
    assert openfaas.split_function_name("fn.team-a", NS) == ("fn", "team-a")
