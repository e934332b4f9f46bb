"""fastgshare.model: spec.model's one-line validation, the pod annotation, identity, charged once."""

from __future__ import annotations

import pytest

from fastgshare import keys
from fastgshare.model import (
    HeldModel,
    InvalidModelSpec,
    ModelRef,
    ModelSpec,
    charged_model_bytes,
    model_annotation,
    parse_model_annotation,
    parse_model_spec,
    pod_model,
)

SPEC = {"name": "vit-huge", "bytes": "1.5Gi", "source": {"path": "vit/weights.bin"}}


def test_a_spec_with_a_quantity_parses_to_bytes() -> None:
    assert parse_model_spec(SPEC) == ModelSpec(name="vit-huge", bytes=3 << 29, path="vit/weights.bin")


@pytest.mark.parametrize(("document", "field", "value"), [
    ({**SPEC, "name": "ViT"}, "spec.model.name", "'ViT'"),
    ({**SPEC, "name": "-vit"}, "spec.model.name", "'-vit'"),
    ({**SPEC, "bytes": 0}, "spec.model.bytes", "0"),
    ({**SPEC, "bytes": True}, "spec.model.bytes", "True"),
    ({**SPEC, "bytes": "2Ti"}, "spec.model.bytes", "'2Ti'"),
    ({**SPEC, "source": {"path": "/etc/shadow"}}, "spec.model.source.path", "'/etc/shadow'"),
    ({**SPEC, "source": {"path": "vit/../../etc"}}, "spec.model.source.path", "'vit/../../etc'"),
    ({**SPEC, "source": {"path": "vit//w"}}, "spec.model.source.path", "'vit//w'"),
    ({**SPEC, "source": {"path": "a b"}}, "spec.model.source.path", "'a b'"),
])
def test_each_bad_field_is_one_problem_naming_the_field_the_value_and_what_is_allowed(
        document: dict[str, object], field: str, value: str) -> None:
    with pytest.raises(InvalidModelSpec) as caught:
        parse_model_spec(document)
    [problem] = caught.value.problems
    assert problem.field == field
    assert str(problem).startswith(f"{field}: {value}; allowed: ")
    assert "\n" not in str(caught.value)


def test_unknown_fields_and_a_missing_source_are_named_together() -> None:
    with pytest.raises(InvalidModelSpec) as caught:
        parse_model_spec({"name": "m", "bytes": 1, "sauce": {}})
    assert [problem.field for problem in caught.value.problems] == ["spec.model.sauce", "spec.model.source"]


def test_the_annotation_round_trips_and_equal_specs_give_equal_text() -> None:
    spec = parse_model_spec(SPEC)
    text = model_annotation("fn", spec)
    assert text == model_annotation("fn", parse_model_spec(dict(reversed(list(SPEC.items())))))
    assert parse_model_annotation(text, "team-a") == ModelRef(namespace="team-a", function="fn", spec=spec)
    assert parse_model_annotation(text, "team-a").key == "team-a/fn/vit-huge"


def test_a_pods_model_is_none_without_the_annotation_or_with_a_malformed_one() -> None:
    assert pod_model({}, "ns") is None
    assert pod_model({keys.MODEL_ANNOTATION: "{"}, "ns") is None
    escaping = '{"function": "f", "name": "m", "bytes": 1, "path": "../x"}'
    assert pod_model({keys.MODEL_ANNOTATION: escaping}, "ns") is None
    with pytest.raises(InvalidModelSpec, match="path"):
        parse_model_annotation(escaping, "ns")


def test_identity_tells_apart_namespaces_functions_sizes_and_sources() -> None:
    spec = parse_model_spec(SPEC)
    base = ModelRef(namespace="a", function="f", spec=spec)
    others = [ModelRef(namespace="b", function="f", spec=spec), ModelRef(namespace="a", function="g", spec=spec),
              ModelRef(namespace="a", function="f",
                       spec=ModelSpec(name=spec.name, bytes=spec.bytes + 1, path=spec.path)),
              ModelRef(namespace="a", function="f", spec=ModelSpec(name=spec.name, bytes=spec.bytes, path="other"))]
    assert len({base.identity, *(other.identity for other in others)}) == 5


def test_a_gpus_models_are_charged_once_each_pods_and_held_alike() -> None:
    one = ModelRef(namespace="a", function="f", spec=ModelSpec(name="m", bytes=100, path="m"))
    two = ModelRef(namespace="a", function="g", spec=ModelSpec(name="m", bytes=7, path="m"))
    held_one = HeldModel(identity=one.identity, key=one.key, bytes=100)
    held_other = HeldModel(identity="x", key="a/h/m", bytes=5)
    assert charged_model_bytes([one, one, None, one]) == 100
    assert charged_model_bytes([one, two], [held_one, held_other]) == 112
    assert charged_model_bytes([], [held_one]) == 100
