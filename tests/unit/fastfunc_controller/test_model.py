"""Model sharing in the function controller: ``spec.model`` validated with the core's messages, written
as ``fastgshare/model`` on every child FaSTPod (so on every pod, part of its revision: a changed model
rolls the pods), and counted once per GPU by the autoscaler's planner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fastfunc_controller import names
from fastfunc_controller.autoscale import ProfileUnusable, usable_configs
from fastfunc_controller.plan import CreateFaSTPod, PatchFaSTPod, desired_fastpod, desired_service, plan
from fastfunc_controller.spec import REASON_FIELD, InvalidFunction, model_ref, parse_function
from fastgshare import keys
from fastgshare.model import ModelSpec, model_annotation, parse_model_annotation
from fastpod_crd_controller.spec import parse_fastpod
from tests.unit.fastfunc_controller.test_plan import existing, fastfunc, only_child

MODEL = {"name": "resnet50", "bytes": "1Gi", "source": {"path": "resnet50/weights.bin"}}
GiB = 2**30


def test_a_valid_model_is_parsed_and_becomes_the_childrens_annotation() -> None:
    spec = parse_function(fastfunc(model=MODEL))
    assert spec.model == ModelSpec(name="resnet50", bytes=GiB, path="resnet50/weights.bin")
    child = only_child(fastfunc(model=MODEL))
    text = child["metadata"]["annotations"][keys.MODEL_ANNOTATION]
    assert text == model_annotation("resnet", spec.model)
    ref = parse_model_annotation(text, "fn")
    assert (ref.key, ref.bytes) == ("fn/resnet/resnet50", GiB)
    assert child["metadata"]["annotations"][keys.GPU_MEM] == "2Gi"  # the pod's own memory, unchanged


def test_without_a_model_the_children_carry_none() -> None:
    assert parse_function(fastfunc()).model is None
    assert keys.MODEL_ANNOTATION not in only_child(fastfunc())["metadata"]["annotations"]


def test_a_model_annotation_written_on_the_fastfunc_itself_is_not_handed_down() -> None:
    obj = fastfunc()
    obj["metadata"]["annotations"] = {keys.MODEL_ANNOTATION: '{"function": "other"}'}
    assert keys.MODEL_ANNOTATION not in only_child(obj)["metadata"]["annotations"]


@pytest.mark.parametrize(("model", "problem"), [
    ({**MODEL, "name": "ResNet"}, "spec.model.name: 'ResNet'; allowed: a lower-case name"),
    ({**MODEL, "bytes": "huge"}, "spec.model.bytes: 'huge'; allowed: a positive whole number of bytes"),
    ({**MODEL, "source": {"path": "../etc"}}, "spec.model.source.path: '../etc'; allowed: a relative path"),
    ({"name": "m", "bytes": 1}, "spec.model.source: must be an object with path"),
])
def test_a_malformed_model_is_an_invalid_spec_naming_the_field_value_and_what_is_allowed(
        model: dict[str, Any], problem: str) -> None:
    with pytest.raises(InvalidFunction) as caught:
        parse_function(fastfunc(model=model))
    assert caught.value.reason == REASON_FIELD
    [found] = caught.value.problems
    assert found.startswith(problem)
    assert "\n" not in found


def test_model_problems_join_the_specs_other_problems() -> None:
    with pytest.raises(InvalidFunction) as caught:
        parse_function(fastfunc(model={**MODEL, "name": "Bad"}, scaling={"policy": "magic"}))
    assert [p.split(":")[0] for p in caught.value.problems] == ["spec.scaling.policy", "spec.model.name"]


def test_a_changed_model_patches_the_childs_annotation_and_rolls_its_pods() -> None:
    old = existing(only_child(fastfunc(model=MODEL)))
    changed = {**MODEL, "bytes": "2Gi"}
    spec = parse_function(fastfunc(model=changed))
    assert spec.model is not None
    [patch] = plan(spec, [old], existing(desired_service(spec)))
    assert isinstance(patch, PatchFaSTPod)
    assert patch.operations[1:] == ({"op": "add", "path": "/metadata/annotations/fastgshare~1model",
                                     "value": model_annotation("resnet", spec.model)},)
    # the FaSTPod controller's revision covers the annotations its pods inherit: a new model, new pods
    new = only_child(fastfunc(model=changed))
    assert parse_fastpod(existing(new)).revision != parse_fastpod(old).revision
    assert parse_fastpod(existing(new)).annotations[keys.MODEL_ANNOTATION] == model_annotation("resnet", spec.model)


def test_a_model_added_or_removed_is_patched_in_or_out() -> None:
    bare = existing(only_child(fastfunc()))
    spec = parse_function(fastfunc(model=MODEL))
    [added] = plan(spec, [bare], existing(desired_service(spec)))
    assert isinstance(added, PatchFaSTPod)
    assert [op["op"] for op in added.operations[1:]] == ["add"]
    with_model = existing(only_child(fastfunc(model=MODEL)))
    spec = parse_function(fastfunc())
    [removed] = plan(spec, [with_model], existing(desired_service(spec)))
    assert isinstance(removed, PatchFaSTPod)
    assert removed.operations[1:] == ({"op": "remove", "path": "/metadata/annotations/fastgshare~1model"},)


def test_a_new_function_with_a_model_creates_its_child_with_the_annotation() -> None:
    spec = parse_function(fastfunc(model=MODEL))
    create = plan(spec, [], None)[0]
    assert isinstance(create, CreateFaSTPod)
    assert keys.MODEL_ANNOTATION in create.body["metadata"]["annotations"]


# --- the autoscaler's planner ---------------------------------------------------------------------
PROFILE = {"version": 1, "function": "resnet", "gpuModel": "V100-16GB",
           "slo": {"percentile": 95, "latencyMs": 100},
           "points": [{"quotaRequest": q, "quotaLimit": q, "smPartition": 50, "memoryBytes": 2 * GiB, "maxRps": 40 * q,
                       "p95Ms": 20} for q in (0.5, 1)]}


def autoscaled(model: dict[str, Any] | None) -> dict[str, Any]:
    extra: dict[str, Any] = {"scaling": {"policy": names.POLICY_RPR}, "profile": {"configMapRef": {"name": "p"}}}
    if model is not None:
        extra["model"] = model
    return fastfunc(**extra)


def configmap() -> dict[str, Any]:
    return {"data": {"profile.json": json.dumps(PROFILE)}}


def test_the_planner_counts_the_weights_once_per_gpu() -> None:
    """A 2 GiB pod is 1/8 of a 16 GiB GPU alone (its time x SM area, 1/4 or 1/2, dominates); next
    to 12 GiB of weights it is 1/2 of the 4 GiB left."""
    alone = usable_configs(parse_function(autoscaled(None)), configmap())
    assert {c.key: c.option.cost for c in alone.choices} == pytest.approx({"q50-s50": 0.25, "q100-s50": 0.5})
    small = usable_configs(parse_function(autoscaled({**MODEL, "bytes": "12Gi"})), configmap())
    assert {c.key: c.option.cost for c in small.choices} == pytest.approx({"q50-s50": 0.5, "q100-s50": 0.5})
    # the pods' gpu_mem stays spec.memory: their own memory
    assert {c.share.memory_bytes for c in small.choices} == {2 * GiB}


def test_a_model_that_leaves_no_room_for_a_pod_is_profile_unusable_and_says_why() -> None:
    with pytest.raises(ProfileUnusable) as caught:
        usable_configs(parse_function(autoscaled({**MODEL, "bytes": "15Gi"})), configmap())
    assert "fits the GPU's memory next to the model's 16106127360 bytes (spec.model.bytes)" in str(caught.value)


def test_the_example_function_with_a_model_is_valid_and_the_one_the_docs_show() -> None:
    repo = Path(__file__).resolve().parents[3]
    example = yaml.safe_load((repo / "examples" / "functions" / "fake-fn-model.yaml").read_text())
    docs = (repo / "docs" / "functions.md").read_text()
    section = docs[docs.index("## Model sharing"):docs.index("## Autoscaling")]
    assert yaml.safe_load(section.split("```yaml\n")[-1].split("```")[0]) == example
    spec = parse_function(example)
    assert spec.model is not None
    assert spec.model.name == "fake-fn-weights"
    env = {e["name"]: e["value"] for e in spec.pod_spec["containers"][0]["env"]}
    assert env["FAKE_FN_MODEL"] == spec.model.name  # fake-fn opens the model the annotation names
    assert keys.MODEL_ANNOTATION in desired_fastpod(spec, spec.configs[0])["metadata"]["annotations"]


def test_the_model_the_fit_check_charges_is_the_one_the_pods_declare() -> None:
    """The same identity: a scale-up's new pods and the function's bound pods share one copy per GPU."""
    spec = parse_function(fastfunc(model=MODEL))
    ref = model_ref(spec)
    assert ref is not None
    annotations = only_child(fastfunc(model=MODEL))["metadata"]["annotations"]
    declared = parse_model_annotation(annotations[keys.MODEL_ANNOTATION], "fn")
    assert ref.identity == declared.identity
    assert model_ref(parse_function(fastfunc())) is None
