"""Bodies an attacker would send to the provider API: each is an :class:`InvalidDeployment` naming the
field (a 400), never an exception that escapes as a 500; and the admin's limits (replicas, images)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fastgshare import keys
from fastgshare_gateway import openfaas
from fastgshare_gateway.openfaas import InvalidDeployment, parse_body, parse_delete_request, parse_scale_request
from fastgshare_gateway.policy import DeployPolicy

NS = keys.DEFAULT_FUNCTION_NAMESPACE
GOOD: dict[str, Any] = {"service": "hello", "image": "registry.example/team/fn:1",
                        "annotations": {keys.GPU_MEM: "1Gi"}}


def fields_of(call: Any, *args: Any) -> dict[str, str]:
    with pytest.raises(InvalidDeployment) as caught:
        call(*args)
    return {p.field: p.message for p in caught.value.problems}


def nested(depth: int) -> Any:
    value: Any = "a"
    for _ in range(depth):
        value = [value]
    return value


def test_deep_nesting_is_refused_at_the_body() -> None:
    for raw in (b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
                json.dumps({**GOOD, "labels": {"x": nested(40)}}).encode()):
        assert "nested deeper" in fields_of(parse_body, raw)["body"]


def test_huge_numbers_are_named_by_their_field_not_an_exception() -> None:
    body = parse_body(b'{"serviceName": "hello", "replicas": ' + b"9" * 10_000 + b"}")
    assert "replicas" in fields_of(parse_scale_request, body, "hello")
    body = parse_body(b'{"serviceName": "hello", "replicas": 1e999}')
    assert "replicas" in fields_of(parse_scale_request, body, "hello")
    body = parse_body(json.dumps({**GOOD, "readOnlyRootFilesystem": 10 ** 40}).encode())
    assert "readOnlyRootFilesystem" in fields_of(openfaas.to_fastfunc, body, NS)


def test_not_json_and_non_standard_constants_are_400_at_the_body() -> None:
    for raw in (b"{", b"\xff\xfe", b'{"replicas": NaN}', b'{"replicas": Infinity}', b"", b"null x"):
        assert "body" in fields_of(parse_body, raw)


@pytest.mark.parametrize(("field", "value"), [
    ("service", {"a": 1}), ("service", ["x"]), ("namespace", ["x"]), ("namespace", 5), ("image", 7),
    ("envProcess", ["sh"]), ("envVars", ["A=1"]), ("labels", "x"), ("annotations", {"a": 1}),
    ("limits", {"memory": 5}), ("requests", "1"), ("constraints", {"a": "b"}), ("secrets", {"a": "b"}),
    ("readOnlyRootFilesystem", "yes"),
    ("labels", {keys.OPENFAAS_SCALE_MIN_LABEL: "²"}), ("labels", {keys.OPENFAAS_SCALE_MAX_LABEL: "1" * 5000}),
    ("limits", {"memory": "lots of it"}), ("requests", {"cpu": "1e999999"}),
])
def test_wrong_types_and_values_are_named(field: str, value: Any) -> None:
    problems = fields_of(openfaas.to_fastfunc, {**GOOD, field: value}, NS)
    assert any(name == field or name.startswith(field + "[") for name in problems), problems


@pytest.mark.parametrize(("body", "field"), [
    ({"serviceName": "hello", "replicas": "3"}, "replicas"), ({"serviceName": "hello", "replicas": 2.5}, "replicas"),
    ({"serviceName": "hello", "replicas": True}, "replicas"), ({"serviceName": ["x"], "replicas": 1}, "serviceName"),
    ({"serviceName": "hello", "replicas": 1, "namespace": ["x"]}, "namespace"),
    ({"serviceName": "hello", "replicas": 1, "namespace": {"a": 1}}, "namespace"),
])
def test_scale_bodies_of_the_wrong_type_are_named(body: dict[str, Any], field: str) -> None:
    assert field in fields_of(parse_scale_request, body, "hello")


@pytest.mark.parametrize(("body", "field"), [
    ({"functionName": {"a": 1}}, "functionName"), ([1, 2], "functionName"),
    ({"functionName": "hello", "namespace": [1]}, "namespace"),
])
def test_delete_bodies_of_the_wrong_type_are_named(body: Any, field: str) -> None:
    assert field in fields_of(parse_delete_request, body, NS)


def test_replicas_past_the_limit_name_the_label_and_the_limit() -> None:
    policy = DeployPolicy(max_replicas=10)
    fastfunc = openfaas.to_fastfunc({**GOOD, "labels": {keys.OPENFAAS_SCALE_MIN_LABEL: "11",
                                                         keys.OPENFAAS_SCALE_MAX_LABEL: "10000"}}, NS)
    problems = {p.field: p.message for p in policy.fastfunc_problems(fastfunc)}
    assert set(problems) == {f"labels[{keys.OPENFAAS_SCALE_MIN_LABEL}]", f"labels[{keys.OPENFAAS_SCALE_MAX_LABEL}]"}
    assert all("10" in message and "--max-replicas" in message for message in problems.values())
    assert policy.fastfunc_problems(openfaas.to_fastfunc(GOOD, NS)) == []
    problem = policy.replicas_problem(11)
    assert problem is not None
    assert problem.field == "replicas"
    assert "--max-replicas" in problem.message
    assert policy.replicas_problem(10) is None


def test_images_outside_the_allowed_prefixes_are_refused_naming_them() -> None:
    policy = DeployPolicy(image_prefixes=("registry.example/team/", "ghcr.io/fastgshare/"))
    assert policy.fastfunc_problems(openfaas.to_fastfunc(GOOD, NS)) == []
    evil = openfaas.to_fastfunc({**GOOD, "image": "registry.example/teamevil/miner:1"}, NS)
    [problem] = policy.fastfunc_problems(evil)
    assert problem.field == "image"
    assert "registry.example/team/" in problem.message
    assert "ghcr.io/fastgshare/" in problem.message
    assert DeployPolicy().fastfunc_problems(evil) == []  # no prefixes: any image
