"""The node agent's ``--context-reserve``: parsed, defaulted per GPU generation, published in the
inventory and shown as ``fastgshare_gpu_context_reserve_bytes``."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from device_plugin import main as agent_main
from device_plugin.arbiter.server import ArbiterUsage
from device_plugin.discovery import SimulatedGpus
from device_plugin.metrics import NodeMetrics
from fastgshare.context_reserve import (
    UNKNOWN_MODEL_RESERVE,
    ContextReserve,
    InvalidContextReserve,
    generation_of,
    parse_context_reserve,
    with_context_reserve,
)
from fastgshare.inventory import NodeInventory, parse_gpu_spec
from fastgshare.usage import UsageSnapshot
from tests.builders import GiB, make_gpu

MiB = 2**20
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(("text", "expected"), [
    ("auto", None), ("AUTO", None), ("0", 0), ("300Mi", 300 * MiB), ("1Gi", GiB), ("314572800", 300 * MiB),
])
def test_the_flag_takes_auto_zero_or_a_quantity(text: str, expected: int | None) -> None:
    assert parse_context_reserve(text) == ContextReserve(expected)


@pytest.mark.parametrize("text", ["", "lots", "-300Mi", "1.5.Gi"])
def test_a_bad_value_names_the_flag_the_value_and_what_is_allowed(text: str) -> None:
    with pytest.raises(InvalidContextReserve) as raised:
        parse_context_reserve(text)
    assert str(raised.value) == (f"--context-reserve {text!r} is not allowed: expected a byte quantity such as "
                                 '300Mi (0: none), or "auto": a default per GPU generation on real GPUs, 0 on '
                                 "simulated ones")


# NVML's names of the GPUs (as nvidia-smi and NVML's nvmlDeviceGetName print them).
@pytest.mark.parametrize(("model", "generation"), [
    ("Tesla V100-SXM2-16GB", "Volta"), ("Tesla V100-PCIE-32GB", "Volta"), ("Quadro GV100", "Volta"),
    ("Tesla T4", "Turing"), ("Quadro RTX 6000", "Turing"), ("NVIDIA GeForce RTX 2080 Ti", "Turing"),
    ("NVIDIA A100-SXM4-80GB", "Ampere"), ("NVIDIA A100 80GB PCIe", "Ampere"), ("NVIDIA A10", "Ampere"),
    ("NVIDIA A10G", "Ampere"), ("NVIDIA A30", "Ampere"), ("NVIDIA RTX A6000", "Ampere"),
    ("NVIDIA GeForce RTX 3090", "Ampere"),
    ("NVIDIA L4", "Ada"), ("NVIDIA L40S", "Ada"), ("NVIDIA GeForce RTX 4090", "Ada"),
    ("NVIDIA RTX 6000 Ada Generation", "Ada"),
    ("NVIDIA H100 80GB HBM3", "Hopper"), ("NVIDIA H100 PCIe", "Hopper"), ("NVIDIA H100 NVL", "Hopper"),
    ("NVIDIA H200", "Hopper"), ("NVIDIA GH200 480GB", "Hopper"),
])
def test_each_model_belongs_to_its_generation(model: str, generation: str) -> None:
    found = generation_of(model)
    assert found is not None
    assert found.name == generation


def test_a_model_no_pattern_knows_gets_the_largest_figure() -> None:
    assert generation_of("NVIDIA B200") is None
    gpu = attrs.evolve(make_gpu(), model="NVIDIA B200", memory_bytes=180 * GiB)
    assert ContextReserve(None).for_gpu(gpu, simulated=False) == UNKNOWN_MODEL_RESERVE == 544 * MiB


def test_auto_charges_real_gpus_by_generation_and_simulated_ones_nothing() -> None:
    v100, h100 = make_gpu(0), attrs.evolve(make_gpu(1), model="NVIDIA H100 80GB HBM3", memory_bytes=80 * GiB)
    real = with_context_reserve((v100, h100), ContextReserve(None), simulated=False)
    assert [gpu.context_reserve_bytes for gpu in real] == [320 * MiB, 544 * MiB]
    simulated = with_context_reserve((v100, h100), ContextReserve(None), simulated=True)
    assert [gpu.context_reserve_bytes for gpu in simulated] == [0, 0]


def test_a_given_quantity_applies_to_every_gpu_simulated_too() -> None:
    gpus = SimulatedGpus(parse_gpu_spec("2x16GiB:80sm"), "node-a").devices()
    published = with_context_reserve(gpus, ContextReserve(300 * MiB), simulated=True)
    assert [gpu.context_reserve_bytes for gpu in published] == [300 * MiB, 300 * MiB]


def test_a_reserve_a_gpu_cannot_hold_is_refused_naming_the_flag() -> None:
    with pytest.raises(InvalidContextReserve, match=r"^--context-reserve 16 GiB is not allowed for GPU 0 "
                                                    r"\(Tesla V100, 16 GiB\): the reserve must be less than"):
        with_context_reserve((make_gpu(),), ContextReserve(16 * GiB), simulated=False)


def agent_args(tmp_path: Path, *extra: str) -> object:
    return agent_main.build_parser().parse_args(["--node-name", "n", "--state-dir", str(tmp_path), *extra])


def test_the_agent_refuses_a_bad_flag_before_it_starts_anything(tmp_path: Path) -> None:
    with pytest.raises(agent_main.StartupError) as raised:
        agent_main.start_arbiter(agent_args(tmp_path, "--fake-gpus", "1x16GiB:80sm", "--context-reserve", "much"))
    assert raised.value.code == 2
    assert str(raised.value).startswith("--context-reserve 'much' is not allowed")
    assert not (tmp_path / "run").exists()


def test_the_agent_refuses_a_reserve_larger_than_its_gpus(tmp_path: Path) -> None:
    with pytest.raises(agent_main.StartupError, match=r"^--context-reserve 32 GiB is not allowed for GPU 0") as raised:
        agent_main.start_arbiter(agent_args(tmp_path, "--fake-gpus", "1x16GiB:80sm", "--context-reserve", "32Gi"))
    assert raised.value.code == 2


def test_the_flag_defaults_to_auto() -> None:
    assert agent_main.build_parser().parse_args(["--node-name", "n"]).context_reserve == "auto"


@pytest.mark.parametrize(("flag", "expected"), [([], 0), (["--context-reserve", "300Mi"], 300 * MiB)])
def test_the_agent_publishes_the_reserve_of_its_simulated_gpus(tmp_path: Path, flag: list[str],
                                                               expected: int) -> None:
    early = agent_main.start_arbiter(agent_args(tmp_path, "--fake-gpus", "2x16GiB:80sm", *flag))
    try:
        assert [gpu.context_reserve_bytes for gpu in early.gpus] == [expected, expected]
    finally:
        early.thread.stop()
        early.backend.close()


class _NoPods:
    def snapshot(self) -> tuple[int, list[object]]:
        return 1, []


def test_the_metrics_show_each_gpus_reserve() -> None:
    gpus = (attrs.evolve(make_gpu(0), context_reserve_bytes=300 * MiB), make_gpu(1))
    inventory = NodeInventory(node_name="n", gpus=gpus)
    usage = ArbiterUsage(usage=UsageSnapshot(window_s=10.0, pods=(), gpus=()), memory_bytes={})
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeMetrics(_NoPods(), lambda: usage, lambda: inventory))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    assert 'fastgshare_gpu_context_reserve_bytes{gpu="GPU-0000"} 3.145728e+08' in text
    assert 'fastgshare_gpu_context_reserve_bytes{gpu="GPU-0001"} 0.0' in text


def test_the_daemonset_asks_for_the_generation_defaults_with_flags_the_agent_takes() -> None:
    manifest = yaml.safe_load((REPO / "deploy" / "node-agent" / "daemonset.yaml").read_text())
    containers = manifest["spec"]["template"]["spec"]["containers"]
    (agent,) = [c for c in containers if c["command"] == ["fastgshare-node-agent"]]
    args = agent_main.build_parser().parse_args(["--node-name", "n", *agent["args"]])
    assert "--context-reserve=auto" in agent["args"]
    assert parse_context_reserve(args.context_reserve) == ContextReserve(None)
