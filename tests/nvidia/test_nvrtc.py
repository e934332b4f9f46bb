"""NVRTC and cuda-bindings under the hook on the simulated GPU: a real kernel compiled to PTX, loaded
with cuModuleLoadData and launched in loops by two programs under ``fastgshare run`` at once, at
different shares of one GPU; each gets its share, and the hook forwarded every call the driver
served."""

from __future__ import annotations

from tests.nvidia.harness import RunFlags, run_tier

TOLERANCE = 0.02
SECONDS = "4"
KERNEL_MS = 1.0  # the kernel's run time on the simulated GPU, set by its name; anything else runs 10 us
KERNEL_TIME = f"default=10us,scale={KERNEL_MS * 1000:.0f}us"
LOW = RunFlags(name="nvrtc-low", request=0.2, limit=0.3, memory="256Mi")
HIGH = RunFlags(name="nvrtc-high", request=0.5, limit=0.6, memory="256Mi")


def test_two_nvrtc_programs_under_fastgshare_run_each_get_their_share(nvidia_stack: None) -> None:
    with run_tier(kernel_time=KERNEL_TIME) as gpu:
        running = [gpu.start(flags, "nvrtc_loop.py", "--seconds", SECONDS) for flags in (LOW, HIGH)]
        outcomes = [gpu.wait(each) for each in running]
        shares = {}
        for flags, outcome in zip((LOW, HIGH), outcomes, strict=True):
            result = outcome.check()
            assert result["entry"], "the PTX NVRTC made has no entry for the kernel"
            assert result["global_bytes"] == 4  # the module's float
            assert result["elapsed_ms"] > 0
            assert set(result["frees"]) == {"CUDA_SUCCESS"}
            assert outcome.refused_calls() == {}  # no driver call answered not-supported
            assert outcome.record is not None
            assert outcome.record.kernels == result["launches"] > 0  # every launch ran, once
            mean_ms = outcome.record.busy_ns / outcome.record.kernels / 1e6
            assert KERNEL_MS <= mean_ms < 2 * KERNEL_MS, f"kernels ran {mean_ms:.3f} ms, not the {KERNEL_MS} ms set"
            assert outcome.summary is not None
            assert (outcome.summary["exitCode"], outcome.summary["kernels"]) == (0, result["launches"])
            shares[flags.name] = outcome.share
        for flags in (LOW, HIGH):
            assert flags.request - TOLERANCE <= shares[flags.name] <= flags.limit + TOLERANCE, shares
        gpu.counts(*outcomes)
