"""Annotation payload codecs: exact wire form, round trips, and refusal of bad payloads."""

from __future__ import annotations

import contextlib
import json

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastgshare.codec import (
    ASSIGNMENT_VERSION,
    INVENTORY_VERSION,
    PodAssignment,
    decode_assignment,
    decode_node_inventory,
    encode_assignment,
    encode_node_inventory,
)
from fastgshare.errors import CodecError
from fastgshare.inventory import GpuDevice, NodeInventory
from fastgshare.model import HeldModel
from fastgshare.share import ShareSpec
from tests.builders import GiB, make_gpu, make_share

INVENTORY = NodeInventory(node_name="gpu-node-1", gpus=(make_gpu(0), make_gpu(1, healthy=False, mps=False)),
                          slots_per_gpu=8)
ASSIGNMENT = PodAssignment(node_name="gpu-node-1", gpu_uuid="GPU-0001", gpu_index=1,
                           share=make_share(request=400, limit=800, sm=12, mem=3 * GiB // 2),
                           assigned_at_ms=1_764_000_000_000)


def test_inventory_wire_form_is_stable() -> None:
    assert json.loads(encode_node_inventory(INVENTORY)) == {
        "version": 1, "node": "gpu-node-1", "slotsPerGpu": 8,
        "gpus": [
            {"uuid": "GPU-0000", "index": 0, "model": "Tesla V100", "memoryBytes": 16 * GiB, "smCount": 80,
             "healthy": True, "mps": True, "contextReserveBytes": 0},
            {"uuid": "GPU-0001", "index": 1, "model": "Tesla V100", "memoryBytes": 16 * GiB, "smCount": 80,
             "healthy": False, "mps": False, "contextReserveBytes": 0},
        ],
    }


def test_assignment_wire_form_is_stable() -> None:
    assert json.loads(encode_assignment(ASSIGNMENT)) == {
        "version": 1, "node": "gpu-node-1", "gpuUuid": "GPU-0001", "gpuIndex": 1, "assignedAtMs": 1_764_000_000_000,
        "share": {"requestPermille": 400, "limitPermille": 800, "smPercent": 12, "memoryBytes": 1610612736},
    }


def test_round_trips() -> None:
    assert decode_node_inventory(encode_node_inventory(INVENTORY)) == INVENTORY
    assert decode_assignment(encode_assignment(ASSIGNMENT)) == ASSIGNMENT


def _inventory_with(**changes: object) -> str:
    payload = json.loads(encode_node_inventory(INVENTORY))
    payload.update(changes)
    return json.dumps(payload)


def _gpu_with(**changes: object) -> str:
    payload = json.loads(encode_node_inventory(INVENTORY))
    payload["gpus"][0].update(changes)
    return json.dumps(payload)


def _assignment_with(share: dict[str, object] | None = None, **changes: object) -> str:
    payload = json.loads(encode_assignment(ASSIGNMENT))
    payload.update(changes)
    payload["share"].update(share or {})
    return json.dumps(payload)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "node inventory: not valid JSON", id="empty"),
        pytest.param("{not json", "node inventory: not valid JSON", id="garbage"),
        pytest.param("[]", "node inventory: expected a JSON object, got list", id="not-object"),
        pytest.param("{}", "node inventory: field 'version' is missing", id="no-version"),
        pytest.param(_inventory_with(version=2), "version 2 is newer than this release understands (1); upgrade",
                     id="future-version"),
        pytest.param(_inventory_with(version=0), "version 0 is invalid; allowed: 1..1", id="zero-version"),
        pytest.param(_inventory_with(version="1"), "field 'version' must be int, got str", id="version-string"),
        pytest.param(_inventory_with(version=True), "field 'version' must be int, got bool", id="version-bool"),
        pytest.param(_inventory_with(gpus={}), "field 'gpus' must be list, got dict", id="gpus-not-list"),
        pytest.param(_inventory_with(gpus=[1]), "node inventory gpus[0]: expected an object, got int",
                     id="gpu-not-object"),
        pytest.param(_gpu_with(memoryBytes=-1), "node inventory gpus[0]: GPU GPU-0000: memory_bytes must be > 0",
                     id="negative-memory"),
        pytest.param(_gpu_with(uuid=""), "uuid must not be empty", id="empty-uuid"),
        pytest.param(_gpu_with(healthy="yes"), "field 'healthy' must be bool, got str", id="healthy-string"),
        pytest.param(_gpu_with(index=1), "duplicate GPU index", id="duplicate-index"),
        pytest.param(_inventory_with(slotsPerGpu=0), "slots_per_gpu must be >= 1", id="zero-slots"),
        pytest.param(_inventory_with(node=""), "node_name must not be empty", id="empty-node"),
        pytest.param("1" * 300_000, "exceeds", id="oversized"),
    ],
)
def test_bad_inventory_payloads_are_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(CodecError) as caught:
        decode_node_inventory(text)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(_assignment_with(version=ASSIGNMENT_VERSION + 1), "pod assignment: version 2 is newer",
                     id="future-version"),
        pytest.param(_assignment_with(share={"requestPermille": 900}),
                     "pod assignment share: request_permille must be <= limit_permille", id="request-above-limit"),
        pytest.param(_assignment_with(share={"smPercent": 0}), "sm_percent must be in 1..100", id="sm-zero"),
        pytest.param(_assignment_with(share={"memoryBytes": 1.5}), "field 'memoryBytes' must be int, got float",
                     id="memory-float"),
        pytest.param(_assignment_with(gpuUuid=""), "field 'gpuUuid' must not be empty", id="empty-uuid"),
        pytest.param(_assignment_with(share=None, node=None), "field 'node' must be str, got NoneType",
                     id="null-node"),
        pytest.param(json.dumps({"version": 1}), "field 'share' is missing", id="no-share"),
    ],
)
def test_bad_assignment_payloads_are_refused_clearly(text: str, message: str) -> None:
    with pytest.raises(CodecError) as caught:
        decode_assignment(text)
    assert message in str(caught.value)


def test_decoders_reject_non_strings() -> None:
    with pytest.raises(CodecError, match="expected a JSON string, got bytes"):
        decode_assignment(b"{}")  # type: ignore[arg-type]


def test_versions_are_one() -> None:
    assert INVENTORY_VERSION == ASSIGNMENT_VERSION == 1


gpus = st.builds(GpuDevice, uuid=st.text(min_size=1, max_size=20), index=st.integers(0, 64),
                 model=st.text(max_size=20), memory_bytes=st.integers(1, 2**48), sm_count=st.integers(1, 256),
                 healthy=st.booleans(), mps_enabled=st.booleans())


@given(node=st.text(min_size=1, max_size=30), gpus=st.lists(gpus, max_size=8, unique_by=(lambda g: g.uuid,
                                                                                        lambda g: g.index)),
       slots=st.integers(1, 64))
def test_inventory_round_trips(node: str, gpus: list[GpuDevice], slots: int) -> None:
    inventory = NodeInventory(node_name=node, gpus=tuple(gpus), slots_per_gpu=slots)
    assert decode_node_inventory(encode_node_inventory(inventory)) == inventory


@given(request=st.integers(0, 1000), sm=st.integers(1, 100), mem=st.integers(1, 2**48),
       index=st.integers(0, 64), at=st.integers(0, 2**53))
def test_assignment_round_trips(request: int, sm: int, mem: int, index: int, at: int) -> None:
    share = ShareSpec(request_permille=request, limit_permille=max(request, 1), sm_percent=sm, memory_bytes=mem)
    assignment = PodAssignment(node_name="n", gpu_uuid="GPU-x", gpu_index=index, share=share, assigned_at_ms=at)
    assert decode_assignment(encode_assignment(assignment)) == assignment


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=20,
)
inventory_like = st.fixed_dictionaries(
    {"version": st.sampled_from([1, 2, 0, "1"]), "node": json_values, "slotsPerGpu": json_values,
     "gpus": st.lists(st.dictionaries(st.sampled_from(["uuid", "index", "model", "memoryBytes", "smCount",
                                                       "healthy", "mps"]), json_values), max_size=3)})


@given(st.one_of(st.text(max_size=200), json_values.map(json.dumps), inventory_like.map(json.dumps)))
def test_fuzzed_inventory_raises_only_codec_errors(text: str) -> None:
    with contextlib.suppress(CodecError):
        decode_node_inventory(text)


@given(st.one_of(st.text(max_size=200), json_values.map(json.dumps),
                 st.dictionaries(st.sampled_from(["version", "node", "gpuUuid", "gpuIndex", "share", "assignedAtMs"]),
                                 json_values).map(json.dumps)))
def test_fuzzed_assignment_raises_only_codec_errors(text: str) -> None:
    with contextlib.suppress(CodecError):
        decode_assignment(text)


def test_deeply_nested_json_is_a_codec_error() -> None:
    with pytest.raises(CodecError, match="not valid JSON"):
        decode_assignment("[" * 100_000 + "]" * 100_000)


def test_held_models_round_trip_and_are_left_out_when_none() -> None:
    held = HeldModel(identity='{"name":"m"}', key="ns/fn/m", bytes=256 << 20)
    inventory = NodeInventory(node_name="n", gpus=[attrs.evolve(make_gpu(0), held_models=(held,)), make_gpu(1)],
                              slots_per_gpu=4)
    text = encode_node_inventory(inventory)
    assert decode_node_inventory(text) == inventory
    gpus = json.loads(text)["gpus"]
    assert gpus[0]["heldModels"] == [{"identity": '{"name":"m"}', "key": "ns/fn/m", "bytes": 256 << 20}]
    assert "heldModels" not in gpus[1]  # an agent without models writes what older extenders read


@pytest.mark.parametrize(("entry", "message"), [
    ("x", r"heldModels\[0\]: expected an object"),
    ({"identity": "i", "key": "k", "bytes": 0}, r"heldModels\[0\]: bytes must be > 0"),
    ({"identity": "i", "bytes": 1}, "key"),
])
def test_a_bad_held_model_is_refused_naming_it(entry: object, message: str) -> None:
    payload = json.loads(encode_node_inventory(NodeInventory(node_name="n", gpus=[make_gpu(0)], slots_per_gpu=4)))
    payload["gpus"][0]["heldModels"] = [entry]
    with pytest.raises(CodecError, match=message):
        decode_node_inventory(json.dumps(payload))
