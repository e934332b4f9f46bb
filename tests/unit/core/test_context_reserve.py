"""The CUDA context reserve (issue 36 item 3): each pod on a GPU is charged its ``gpu_mem`` plus the
GPU's context reserve, published in the node inventory; old inventories without it read as 0."""

from __future__ import annotations

import json

import attrs
import pytest

from fastgshare.codec import decode_node_inventory, encode_node_inventory
from fastgshare.errors import CodecError, InvalidInventory
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.ledger import GpuLedger, NodeState, Rejection
from fastgshare.placement import evaluate_node
from tests.builders import GiB, make_gpu, make_share

MiB = 2**20
RESERVE = 300 * MiB


def reserving_gpu(index: int = 0, reserve: int = RESERVE, mem: int = 16 * GiB) -> GpuDevice:
    return attrs.evolve(make_gpu(index, mem=mem), context_reserve_bytes=reserve)


def test_sixteen_one_gib_pods_do_not_all_land_on_one_16_gib_gpu_with_a_300_mib_reserve() -> None:
    node = NodeState(NodeInventory(node_name="a", gpus=(reserving_gpu(),), slots_per_gpu=16))
    ledger = node.ledgers["GPU-0000"]
    placed = 0
    reason = ""
    for i in range(16):  # 16 x 0.05 of the time on all SMs fits the time x SM bin: memory decides
        verdict = evaluate_node(node, make_share(request=50, sm=100, mem=GiB))
        if verdict.choice is None:
            reason = verdict.reason
            break
        ledger.add(f"ns/p{i}", make_share(request=50, sm=100, mem=GiB))
        placed += 1
    # 16 GiB / (1 GiB + 300 MiB) = 12.4: twelve fit, and 16384 - 12 * 1324 = 496 MiB stay free.
    assert placed == 12
    assert reason == "needs 1 GiB of GPU memory + 300 MiB context reserve, largest free 496 MiB"
    assert ledger.free_memory == 496 * MiB
    assert ledger.used_memory == 12 * GiB  # what the pods asked for
    assert ledger.reserved_memory == 12 * RESERVE


def test_without_a_reserve_all_sixteen_land() -> None:
    ledger = GpuLedger(make_gpu(), slots=16)
    for i in range(16):
        ledger.add(f"ns/p{i}", make_share(request=50, sm=100, mem=GiB))
    assert ledger.free_memory == 0


def test_the_gpu_refusal_names_need_reserve_and_free() -> None:
    ledger = GpuLedger(reserving_gpu(mem=2 * GiB))
    ledger.add("ns/a", make_share(request=100, sm=10, mem=GiB))
    fit = ledger.check(make_share(request=100, sm=10, mem=512 * MiB))
    assert fit.rejection is Rejection.MEMORY
    assert fit.message == "needs 512 MiB + 300 MiB context reserve, GPU 0 has 724 MiB free"


def test_best_effort_pods_pay_the_reserve_too() -> None:
    ledger = GpuLedger(reserving_gpu(mem=GiB))
    ledger.add("ns/a", make_share(request=0, limit=1000, mem=724 * MiB))
    assert ledger.free_memory == 0
    assert not ledger.fits(make_share(request=0, limit=1000, mem=1))


def test_removing_a_pod_frees_its_reserve() -> None:
    ledger = GpuLedger(reserving_gpu())
    ledger.add("ns/a", make_share(mem=GiB))
    ledger.remove("ns/a")
    assert ledger.free_memory == 16 * GiB


def test_gpus_differing_only_in_reserve_have_different_summaries() -> None:
    plain, reserving = GpuLedger(make_gpu()), GpuLedger(reserving_gpu())
    assert plain.summary_id != reserving.summary_id


def test_node_reason_shows_each_reserve_when_gpus_differ() -> None:
    gpus = (reserving_gpu(0, 300 * MiB, mem=GiB), reserving_gpu(1, 500 * MiB, mem=GiB))
    node = NodeState(NodeInventory(node_name="a", gpus=gpus))
    verdict = evaluate_node(node, make_share(mem=800 * MiB))
    assert verdict.reason == ("needs 800 MiB of GPU memory + 300 MiB to 500 MiB context reserve, "
                              "largest free 1 GiB")


def test_reserve_must_be_below_the_gpu_memory() -> None:
    with pytest.raises(InvalidInventory, match=r"context_reserve_bytes must be >= 0 and less than memory_bytes"):
        reserving_gpu(reserve=16 * GiB)
    with pytest.raises(InvalidInventory, match=r"context_reserve_bytes"):
        reserving_gpu(reserve=-1)


def test_inventory_round_trips_the_reserve() -> None:
    inventory = NodeInventory(node_name="a", gpus=(reserving_gpu(),))
    text = encode_node_inventory(inventory)
    assert json.loads(text)["gpus"][0]["contextReserveBytes"] == RESERVE
    assert decode_node_inventory(text) == inventory


def test_an_inventory_without_the_field_reads_as_no_reserve() -> None:
    """Inventories published before the reserve existed stay readable: no context memory charged."""
    payload = json.loads(encode_node_inventory(NodeInventory(node_name="a", gpus=(reserving_gpu(),))))
    del payload["gpus"][0]["contextReserveBytes"]
    assert decode_node_inventory(json.dumps(payload)).gpus[0].context_reserve_bytes == 0


@pytest.mark.parametrize(("value", "message"), [
    ("300", "field 'contextReserveBytes' must be int, got str"),
    (-1, "context_reserve_bytes must be >= 0"),
])
def test_a_bad_reserve_in_an_inventory_is_refused_naming_the_field(value: object, message: str) -> None:
    payload = json.loads(encode_node_inventory(NodeInventory(node_name="a", gpus=(reserving_gpu(),))))
    payload["gpus"][0]["contextReserveBytes"] = value
    with pytest.raises(CodecError, match=message):
        decode_node_inventory(json.dumps(payload))
