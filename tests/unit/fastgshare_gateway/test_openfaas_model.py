"""A FunctionDeployment's model (model sharing): the annotation ``com.openfaas.fastgshare.model``, JSON
of the FaSTFunc's ``spec.model``, becomes ``spec.model``; a malformed one is refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fastgshare import keys
from fastgshare.model import ModelSpec
from fastgshare_gateway.openfaas import MODEL_ANNOTATION, InvalidDeployment, to_fastfunc

NS = keys.DEFAULT_FUNCTION_NAMESPACE
MODEL = {"name": "resnet50", "bytes": "100Mi", "source": {"path": "resnet50/weights.bin"}}


def deployment(model: object) -> dict[str, Any]:
    text = model if isinstance(model, str) else json.dumps(model)
    return {"service": "resnet50", "image": "example/resnet50", "namespace": NS,
            "annotations": {keys.GPU_MEM: "1Gi", MODEL_ANNOTATION: text}}


def test_the_model_annotation_becomes_spec_model() -> None:
    fastfunc = to_fastfunc(deployment(MODEL), NS)
    assert fastfunc["spec"]["model"] == ModelSpec(name="resnet50", bytes=100 * 2**20,
                                                  path="resnet50/weights.bin").to_spec()
    assert fastfunc["spec"]["memory"] == "1Gi"
    without = deployment(MODEL)
    del without["annotations"][MODEL_ANNOTATION]
    assert "model" not in to_fastfunc(without, NS)["spec"]


@pytest.mark.parametrize(("model", "field", "words"), [
    ("resnet50", f"annotations[{MODEL_ANNOTATION}]", "must be JSON of the FaSTFunc's spec.model"),
    ({**MODEL, "name": "Bad"}, f"annotations[{MODEL_ANNOTATION}].name", "allowed: a lower-case name"),
    ({**MODEL, "source": {"path": "/abs"}}, f"annotations[{MODEL_ANNOTATION}].source.path",
     "allowed: a relative path"),
])
def test_a_malformed_model_annotation_is_refused_naming_the_field(model: object, field: str, words: str) -> None:
    with pytest.raises(InvalidDeployment) as caught:
        to_fastfunc(deployment(model), NS)
    found = {p.field: p.message for p in caught.value.problems}
    assert words in found[field]
