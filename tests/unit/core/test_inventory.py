"""GPU inventory values, GPU spec strings, the model catalog and byte quantities."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastgshare.errors import InvalidInventory
from fastgshare.gpu_models import gpu_model_spec
from fastgshare.inventory import GpuDevice, NodeInventory, gpu_spec_from_label, parse_gpu_spec
from fastgshare.quantity import format_bytes, parse_bytes
from tests.builders import GiB, make_gpu


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"uuid": ""}, "uuid must not be empty", id="empty-uuid"),
        pytest.param({"index": -1}, "index must be >= 0", id="negative-index"),
        pytest.param({"memory_bytes": 0}, "memory_bytes must be > 0", id="no-memory"),
        pytest.param({"sm_count": 0}, "sm_count must be > 0", id="no-sms"),
    ],
)
def test_gpu_device_validates(kwargs: dict[str, object], message: str) -> None:
    base: dict[str, object] = {"uuid": "GPU-1", "index": 0, "model": "m", "memory_bytes": 1, "sm_count": 1}
    with pytest.raises(InvalidInventory, match=message):
        GpuDevice(**{**base, **kwargs})  # type: ignore[arg-type]


def test_node_inventory_rules_and_queries() -> None:
    inventory = NodeInventory(node_name="n", gpus=[make_gpu(0), make_gpu(1, healthy=False)], slots_per_gpu=4)
    assert inventory.gpus == (make_gpu(0), make_gpu(1, healthy=False))
    assert inventory.advertised_slots == 4
    assert inventory.gpu("GPU-0001") == make_gpu(1, healthy=False)
    assert inventory.gpu("nope") is None
    with pytest.raises(InvalidInventory, match="duplicate GPU uuid"):
        NodeInventory(node_name="n", gpus=(make_gpu(0), make_gpu(1, uuid="GPU-0000")))
    with pytest.raises(InvalidInventory, match="duplicate GPU index"):
        NodeInventory(node_name="n", gpus=(make_gpu(0), make_gpu(0, uuid="GPU-x")))
    with pytest.raises(InvalidInventory, match="slots_per_gpu must be >= 1"):
        NodeInventory(node_name="n", gpus=(), slots_per_gpu=0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2x80GiB:132sm", (2, 80 * GiB, 132, True, "simulated-80Gi")),
        ("1x16Gi:80sm:nomps", (1, 16 * GiB, 80, False, "simulated-16Gi")),
        ("V100=4x16GiB:80sm:mps", (4, 16 * GiB, 80, True, "V100")),
        ("1x1000000:10sm", (1, 1_000_000, 10, True, "simulated-1000000")),
    ],
)
def test_gpu_spec_parses(text: str, expected: tuple[int, int, int, bool, str]) -> None:
    spec = parse_gpu_spec(text)
    assert (spec.count, spec.memory_bytes, spec.sm_count, spec.mps_enabled, spec.model) == expected


@pytest.mark.parametrize("text", ["", "80GiB", "2x80GiB", "0x80GiB:10sm", "2x80GiB:0sm", "2x0:10sm", "2xlots:10sm",
                                  "2x80GiB:10sm:maybe"])
def test_bad_gpu_spec_names_the_format(text: str) -> None:
    with pytest.raises(InvalidInventory, match=r"allowed: \[MODEL=\]COUNTxMEMORY:SMsm"):
        parse_gpu_spec(text)


def test_gpu_spec_devices_are_deterministic() -> None:
    devices = parse_gpu_spec("2x80GiB:132sm").devices(uuid_prefix="GPU-sim")
    assert [(d.uuid, d.index) for d in devices] == [("GPU-sim-0", 0), ("GPU-sim-1", 1)]


def test_gpu_models() -> None:
    v100 = gpu_model_spec("v100-16gb")
    assert (v100.model, v100.memory_bytes, v100.sm_count, v100.count) == ("V100-16GB", 16 * GiB, 80, 1)
    assert gpu_model_spec("24GiB:58sm").memory_bytes == 24 * GiB
    with pytest.raises(InvalidInventory, match="GPU model \"K80\" is unknown; allowed: one of T4, V100-16GB"):
        gpu_model_spec("K80")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", 1), ("1024", 1024), ("1Ki", 1024), ("1.5Gi", 3 * 2**29), ("2G", 2 * 10**9), ("0.5Ki", 512),
     ("3T", 3 * 10**12), ("1Ti", 2**40), ("0", None), ("0.3", None), ("1.0001Ki", None), ("Gi", None),
     ("-1", None), ("1 Gi", None), ("1gi", None)],
)
def test_parse_bytes(text: str, expected: int | None) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize(("count", "text"), [(100, "100 B"), (2048, "2 KiB"), (3 * 2**29, "1.5 GiB"),
                                             (2**40, "1 TiB")])
def test_format_bytes(count: int, text: str) -> None:
    assert format_bytes(count) == text


@given(st.text(max_size=40))
def test_fuzzed_quantities_never_raise(text: str) -> None:
    value = parse_bytes(text)
    assert value is None or value > 0


@given(st.text(max_size=40))
def test_fuzzed_gpu_specs_raise_only_the_domain_error(text: str) -> None:
    try:
        spec = parse_gpu_spec(text)
    except InvalidInventory:
        return
    assert spec.count >= 1


@pytest.mark.parametrize(("label", "spec"), [("2x16GiB_80sm", "2x16GiB:80sm"),
                                             ("1x80Gi_132sm_nomps", "1x80Gi:132sm:nomps"),
                                             ("4x1.5GiB_10sm_mps", "4x1.5GiB:10sm:mps")])
def test_a_simulated_gpus_label_value_is_a_spec_with_underscores(label: str, spec: str) -> None:
    assert gpu_spec_from_label(label) == spec
    assert parse_gpu_spec(gpu_spec_from_label(label)).count == int(label.split("x", 1)[0])


@pytest.mark.parametrize("label", ["", "2x16GiB:80sm", "V100=1x16Gi_80sm", "2x16GiB", "two_GPUs", "2x16GiB_80"])
def test_a_label_value_that_is_no_spec_is_refused_naming_the_form(label: str) -> None:
    with pytest.raises(InvalidInventory, match=r'is not a GPU spec label value; allowed: COUNTxMEMORY_SMsm'):
        gpu_spec_from_label(label)
