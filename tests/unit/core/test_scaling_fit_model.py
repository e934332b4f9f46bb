"""The autoscaler's fit check with model sharing: a function's model is charged once per GPU, as the
extender charges it: a new pod needs the model's bytes only on a GPU that does not hold it yet
(declared by a bound pod there, or held by the node's store)."""

from __future__ import annotations

import attrs

from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.model import HeldModel, ModelRef, ModelSpec
from fastgshare.scaling_fit import FreeSpace, can_raise_in_place, fit_additions
from tests.unit.core.test_scaling_fit import BY_KEY, USABLE, GiB, node, on, share_of

MODEL = ModelRef(namespace="fn", function="resnet", spec=ModelSpec(name="resnet50", bytes=8 * GiB, path="r/w.bin"))
OTHER = ModelRef(namespace="fn", function="vit", spec=ModelSpec(name="vit", bytes=8 * GiB, path="v/w.bin"))
SMALL = share_of(BY_KEY["q20-s24"])  # 2 GiB


def held(model: ModelRef) -> NodeInventory:
    gpu = GpuDevice(uuid="a-gpu0", index=0, model="V100-16GB", memory_bytes=16 * GiB, sm_count=80, mps_enabled=True)
    holding = attrs.evolve(gpu, held_models=(HeldModel(identity=model.identity, key=model.key, bytes=model.bytes),))
    return NodeInventory(node_name="a", gpus=(holding,))


def test_the_first_pod_on_a_gpu_brings_the_model_the_next_ones_only_their_own_memory() -> None:
    empty = FreeSpace.of([node("a", 1)], [])
    assert fit_additions({"q20-s24": 6}, USABLE, empty, share_of).unplaced == 0  # 6 x 2 GiB
    fitted = fit_additions({"q20-s24": 6}, USABLE, empty, share_of, MODEL)
    assert fitted.unplaced == 2  # 8 GiB of weights once, then 4 x 2 GiB
    assert dict(fitted.additions) == {"q20-s24": 6}  # created anyway: they wait with the scheduler's reason


def test_bound_pods_of_the_model_already_brought_it() -> None:
    bound = [("fn/p1", on("a-gpu0", SMALL)), ("fn/p2", on("a-gpu0", SMALL))]
    space = FreeSpace.of([node("a", 1)], bound, {"fn/p1": MODEL, "fn/p2": MODEL})
    assert fit_additions({"q20-s24": 2}, USABLE, space, share_of, MODEL).unplaced == 0  # 8 + 4 x 2 GiB
    assert fit_additions({"q20-s24": 3}, USABLE, space, share_of, MODEL).unplaced == 1
    # another function's model is another copy: 8 + 2 x 2 + 8 GiB leaves no room for its pod
    assert fit_additions({"q20-s24": 1}, USABLE, space, share_of, OTHER).unplaced == 1


def test_a_model_the_store_holds_is_charged_once_and_counts_for_the_functions_pods() -> None:
    mine = FreeSpace.of([held(MODEL)], [])
    assert fit_additions({"q20-s24": 4}, USABLE, mine, share_of, MODEL).unplaced == 0
    assert fit_additions({"q20-s24": 5}, USABLE, mine, share_of, MODEL).unplaced == 1
    theirs = FreeSpace.of([held(OTHER)], [])  # held in its grace period: charged, but not this function's
    assert fit_additions({"q20-s24": 1}, USABLE, theirs, share_of, MODEL).unplaced == 1


def test_a_vertical_step_keeps_the_pods_model_charged_once() -> None:
    bound = [("fn/p1", on("a-gpu0", SMALL)), ("fn/p2", on("a-gpu0", SMALL))]
    space = FreeSpace.of([node("a", 1)], bound, {"fn/p1": MODEL, "fn/p2": MODEL})
    raised = attrs.evolve(SMALL, request_permille=400, limit_permille=400)
    assert can_raise_in_place(["fn/p1", "fn/p2"], raised, space, MODEL)
