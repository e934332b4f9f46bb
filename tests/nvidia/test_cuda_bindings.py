"""cuda-bindings (NVIDIA's Python driver-API bindings) under the hook on the simulated GPU: the pod's
memory limit as the bindings see it, every device attribute, nothing left behind at exit, and the
hook's and the driver's call counts equal. Each with cuda-bindings 13 (the virtualenv's, setup.cfg)
and 12.9 (``make install`` puts it in ``.venv/cuda-bindings-12.9``, on the program's PYTHONPATH)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import attrs
import pytest

from fastgshare_cli.sandbox import HookBuild, TenantSpec
from tests.nvidia.conftest import unavailable
from tests.nvidia.harness import Outcome, tier

MIB = 1 << 20
LIMIT = 1 << 30  # the pod's fastgshare/gpu_mem
CHUNK_MIB = 100  # ten fit in the limit, the eleventh does not
SPEC = TenantSpec(name="bindings", request=0.5, limit=1.0, memory="1Gi")
BINDINGS_12 = Path(sys.prefix) / "cuda-bindings-12.9"  # Makefile, target install


@attrs.frozen
class AfterExit:
    """One bindings_memory.py run and what the GPU and the arbiter held once it had exited."""

    outcome: Outcome
    result: dict[str, Any]
    device_memory_used: int
    ledger_used: int
    counts_problem: str | None


def bindings_env(version: str) -> dict[str, str]:
    """The environment that makes a program import cuda-bindings ``version`` ("13" or "12.9")."""
    if version == "13":
        return {}
    if not (BINDINGS_12 / "cuda" / "bindings").is_dir():
        unavailable(f"cuda-bindings 12.9 is not installed in {BINDINGS_12} (make install puts it there)")
    return {"PYTHONPATH": str(BINDINGS_12)}


def run_bindings(hook_build: HookBuild, version: str, *args: str) -> AfterExit:
    with tier(hook_build, [SPEC]) as gpu:
        outcome = gpu.run(SPEC, "bindings_memory.py", "--chunk-mib", str(CHUNK_MIB), *args, env=bindings_env(version))
        result = outcome.check()
        assert result["bindings"].split(".")[:len(version.split("."))] == version.split("."), result["bindings"]
        try:
            gpu.counts(outcome)
            problem = None
        except AssertionError as error:
            problem = str(error)
        return AfterExit(outcome, result, gpu.device_memory_used(), gpu.ledger_used(SPEC), problem)


@pytest.fixture(scope="module", params=["13", "12.9"], ids=lambda version: f"cuda-bindings-{version}")
def bindings_run(request: pytest.FixtureRequest, nvidia_stack: None, hook_build: HookBuild) -> AfterExit:
    return run_bindings(hook_build, request.param)


def test_cumemgetinfo_shows_the_limit_and_the_first_allocation_past_it_is_out_of_memory(
        bindings_run: AfterExit) -> None:
    result = bindings_run.result
    assert result["info"] == [LIMIT, LIMIT]  # (free, total) before allocating: the pod's slice
    assert result["total_mem"] == LIMIT
    assert (result["allocated"], result["refusal"]) == (LIMIT // (CHUNK_MIB * MIB), "CUDA_ERROR_OUT_OF_MEMORY")
    assert result["info_full"] == [LIMIT - result["allocated"] * CHUNK_MIB * MIB, LIMIT]
    assert set(result["frees"]) == {"CUDA_SUCCESS"}
    assert result["info_after"] == [LIMIT, LIMIT]


def test_every_device_attribute_answers(bindings_run: AfterExit) -> None:
    attributes = bindings_run.result["attributes"]
    assert len(attributes) > 100  # the whole CUdevice_attribute table, not a handful
    failing = {name: code for name, code in attributes.items() if not isinstance(code, int)}
    assert not failing, f"{len(failing)} of {len(attributes)} attributes fail: {failing}"


def test_nothing_is_left_on_the_gpu_or_in_the_ledger_after_exit(bindings_run: AfterExit) -> None:
    record = bindings_run.outcome.record
    assert record is not None
    assert record.mem_used == 0
    assert bindings_run.device_memory_used == 0
    assert bindings_run.ledger_used == 0


def test_memory_still_held_at_exit_is_given_back(nvidia_stack: None, hook_build: HookBuild) -> None:
    after = run_bindings(hook_build, "13", "--leave", "3")
    assert after.result["left"] == 3
    assert after.result["info_after"][0] == LIMIT - 3 * CHUNK_MIB * MIB  # still held when it exited
    record = after.outcome.record
    assert record is not None
    assert record.mem_used == 0
    assert after.device_memory_used == 0
    assert after.ledger_used == 0  # the arbiter freed what the closed connection held


def test_the_driver_serves_every_call_the_program_made(bindings_run: AfterExit) -> None:
    assert bindings_run.outcome.refused_calls() == {}


def test_the_hook_forwarded_every_call_the_driver_served(bindings_run: AfterExit) -> None:
    assert bindings_run.counts_problem is None, bindings_run.counts_problem
