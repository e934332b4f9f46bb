"""The admission webhook refuses a malformed model (model sharing): a FaSTFunc's ``spec.model``, a
FaSTPod's or a pod's ``fastgshare/model`` annotation, one line per problem naming the field, the value
and what is allowed."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from fastgshare import keys
from fastgshare.model import ModelSpec, model_annotation
from scheduler_extender.admission import review
from tests.unit.scheduler_extender.test_admission import FASTPOD, POD

MODEL = {"name": "resnet50", "bytes": "1Gi", "source": {"path": "resnet50/weights.bin"}}
FASTFUNC: dict[str, Any] = {
    "apiVersion": keys.FASTFUNC_API_VERSION, "kind": keys.FASTFUNC_KIND,
    "metadata": {"name": "resnet", "namespace": "team-a"},
    "spec": {"podSpec": {"containers": [{"name": "fn", "image": "i"}]}, "memory": "1Gi",
             "fixed": {"quotaRequest": "0.4"}, "model": MODEL},
}
ANNOTATION = model_annotation("resnet", ModelSpec(name="resnet50", bytes=2**30, path="resnet50/weights.bin"))


def admission_review(obj: dict[str, Any], operation: str = "CREATE",
                     old: dict[str, Any] | None = None) -> dict[str, Any]:
    group = "" if obj["kind"] == "Pod" else keys.FASTFUNC_GROUP
    request: dict[str, Any] = {"uid": "u1", "kind": {"group": group, "version": "v1", "kind": obj["kind"]},
                               "operation": operation, "namespace": "team-a", "name": obj["metadata"]["name"],
                               "object": obj, "userInfo": {"username": "alice"}}
    if old is not None:
        request["oldObject"] = old
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def with_model(model: object) -> dict[str, Any]:
    fastfunc = copy.deepcopy(FASTFUNC)
    fastfunc["spec"]["model"] = model
    return fastfunc


def with_annotation(obj: dict[str, Any], value: str) -> dict[str, Any]:
    result = copy.deepcopy(obj)
    result["metadata"]["annotations"][keys.MODEL_ANNOTATION] = value
    return result


def denial(obj: dict[str, Any], operation: str = "CREATE", old: dict[str, Any] | None = None) -> str | None:
    response = review(admission_review(obj, operation, old))["response"]
    if response["allowed"]:
        return None
    assert response["status"]["code"] == 403
    assert "\n" not in response["status"]["message"]
    return str(response["status"]["message"])


def test_a_fastfunc_with_a_valid_model_or_none_is_allowed() -> None:
    assert denial(FASTFUNC) is None
    without = copy.deepcopy(FASTFUNC)
    del without["spec"]["model"]
    assert denial(without) is None
    assert denial(with_model({**MODEL, "bytes": 123456789})) is None


@pytest.mark.parametrize(("model", "message"), [
    pytest.param({**MODEL, "name": "ResNet"}, "spec.model.name: 'ResNet'; allowed: a lower-case name", id="name"),
    pytest.param({**MODEL, "bytes": "lots"}, "spec.model.bytes: 'lots'; allowed:", id="bytes-text"),
    pytest.param({**MODEL, "bytes": 0}, "spec.model.bytes: 0; allowed:", id="bytes-zero"),
    pytest.param({**MODEL, "source": {"path": "/etc/shadow"}}, "spec.model.source.path: '/etc/shadow'; allowed: a "
                 "relative path under the node's model directory", id="absolute-path"),
    pytest.param({**MODEL, "source": {"path": "a/../../b"}}, "spec.model.source.path: 'a/../../b'; allowed:",
                 id="dot-dot"),
    pytest.param({**MODEL, "extra": 1}, "spec.model.extra: unknown field; allowed: name, bytes, source", id="unknown"),
    pytest.param("resnet50", "spec.model: must be an object with name, bytes and source.path", id="not-an-object"),
])
def test_a_fastfunc_with_a_malformed_model_is_refused_naming_the_field_value_and_what_is_allowed(
        model: object, message: str) -> None:
    found = denial(with_model(model))
    assert found is not None
    assert found.startswith(f"fastgshare: FaSTFunc/resnet: {message}")


def test_every_problem_of_the_model_is_named() -> None:
    found = denial(with_model({"name": "", "bytes": -1, "source": {}}))
    assert found is not None
    for field in ("spec.model.name", "spec.model.bytes", "spec.model.source.path"):
        assert f"{field}: " in found


def test_a_fastfunc_update_is_refused_only_for_the_problems_it_brings() -> None:
    bad = with_model({**MODEL, "name": "Bad"})
    assert denial(bad, "UPDATE", old=FASTFUNC) is not None  # the update breaks the model
    relabelled = copy.deepcopy(bad)
    relabelled["metadata"]["labels"] = {"team": "a"}
    # admitted while the webhook was down: it can still be relabelled, deleted (finalizers) or fixed
    assert denial(relabelled, "UPDATE", old=bad) is None
    assert denial(FASTFUNC, "UPDATE", old=bad) is None
    assert denial(bad, "DELETE", old=bad) is None


@pytest.mark.parametrize("obj", [FASTPOD, POD], ids=["fastpod", "pod"])
def test_a_fastpod_or_pod_with_the_controllers_model_annotation_is_allowed(obj: dict[str, Any]) -> None:
    assert denial(with_annotation(obj, ANNOTATION)) is None


@pytest.mark.parametrize("obj", [FASTPOD, POD], ids=["fastpod", "pod"])
def test_a_malformed_model_annotation_is_refused(obj: dict[str, Any]) -> None:
    forged = json.loads(ANNOTATION)
    forged["path"] = "../../etc/shadow"
    found = denial(with_annotation(obj, json.dumps(forged)))
    assert found is not None
    assert found.startswith(f"fastgshare: {obj['kind']}/{obj['metadata']['name']}: "
                            "annotation fastgshare/model.path: '../../etc/shadow'; allowed: a relative path")
    found = denial(with_annotation(obj, "resnet50"))
    assert found is not None
    assert "annotation fastgshare/model: must be JSON" in found
