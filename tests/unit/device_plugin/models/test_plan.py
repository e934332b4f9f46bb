"""Which models each GPU needs (a pure function of the pod records) and the grace period."""

from __future__ import annotations

import attrs
import pytest

from device_plugin.models.plan import Retention, models_needed, needed_slots
from fastgshare import keys
from fastgshare.model import ModelSpec
from tests.unit.device_plugin.models.helpers import GPU_A, GPU_B, NODE, SPEC, model_pod


def test_live_assigned_pods_that_declare_a_model_need_it_on_their_gpu() -> None:
    pods = [model_pod("a"), model_pod("b"), model_pod("c", GPU_B)]
    needs = models_needed(pods, NODE)
    assert set(needs) == {GPU_A, GPU_B}
    [need] = needs[GPU_A].values()
    assert need.pods == {"uid-a", "uid-b"}
    assert need.model.key == "team-a/fn/resnet"
    assert [n.pods for n in needs[GPU_B].values()] == [{"uid-c"}]


@pytest.mark.parametrize("pod", [
    model_pod("gone", deleting=True),
    model_pod("done", phase="Succeeded"),
    model_pod("failed", phase="Failed"),
    model_pod("waiting", gpu=None),
    model_pod("elsewhere", node="other-node"),
    model_pod("plain", spec=None),
], ids=["deleting", "succeeded", "failed", "unassigned", "other-node", "no-model"])
def test_pods_that_are_not_live_here_or_declare_nothing_need_nothing(pod: object) -> None:
    assert models_needed([pod], NODE) == {}  # type: ignore[list-item]


def test_a_malformed_annotation_needs_nothing() -> None:
    pod = model_pod("bad")
    pod = attrs.evolve(pod, annotations={**pod.annotations, keys.MODEL_ANNOTATION: "{not json"})
    assert models_needed([pod], NODE) == {}


def test_two_functions_or_two_declarations_are_two_models() -> None:
    other_size = ModelSpec(name=SPEC.name, bytes=SPEC.bytes + 1, path=SPEC.path)
    pods = [model_pod("a"), model_pod("b", function="other"), model_pod("c", spec=other_size),
            model_pod("d", namespace="team-b")]
    assert len(models_needed(pods, NODE)[GPU_A]) == 4


def test_an_unneeded_model_is_due_after_the_grace_period_only() -> None:
    retention = Retention(grace_s=300)
    slot = (GPU_A, "m")
    assert retention.due([slot], {slot}, now=0) == []
    assert retention.due([slot], set(), now=10) == [], "unneeded from now on"
    assert retention.unneeded_since(slot) == 10
    assert retention.due([slot], set(), now=309) == []
    assert retention.due([slot], set(), now=310) == [slot]


def test_needed_again_or_asked_for_starts_the_grace_period_over() -> None:
    retention = Retention(grace_s=300)
    slot = (GPU_A, "m")
    retention.due([slot], set(), now=0)
    assert retention.due([slot], {slot}, now=200) == [], "a pod came back"
    assert retention.due([slot], set(), now=250) == []
    assert retention.due([slot], set(), now=549) == []
    retention.touch(slot)  # a pod asked for it (its record may lag)
    assert retention.due([slot], set(), now=560) == []
    assert retention.due([slot], set(), now=860) == [slot]


def test_a_model_no_longer_held_is_forgotten_and_zero_grace_frees_at_once() -> None:
    retention = Retention(grace_s=0)
    slot = (GPU_A, "m")
    assert retention.due([slot], set(), now=5) == [slot]
    assert retention.due([], set(), now=6) == []
    assert retention.unneeded_since(slot) is None
    with pytest.raises(ValueError, match="--model-grace-seconds"):
        Retention(grace_s=-1)


def test_needed_slots_flattens_the_needs() -> None:
    needs = models_needed([model_pod("a"), model_pod("c", GPU_B)], NODE)
    assert {gpu for gpu, _ in needed_slots(needs)} == {GPU_A, GPU_B}
