"""numba-cuda on NVIDIA's binding under ``fastgshare run`` on the simulated GPU: a @cuda.jit kernel
loop and a device array round trip at limit 0.3, numba's own out-of-memory error past the memory
limit, and the hook forwarded every call the driver served."""

from __future__ import annotations

from tests.nvidia.harness import RunFlags, run_tier

MIB = 1 << 20
CHUNK_MIB = 64
LIMIT_MIB = 512
FLAGS = RunFlags(name="numba", request=0.2, limit=0.3, memory=f"{LIMIT_MIB}Mi")
# 5 ms kernels, waiting for the device every 10: numba's own launch cost (a Python dispatch per
# launch, the device idle meanwhile) stays small beside the kernels, so the program keeps the GPU
# busy for all of its share (with 1 ms kernels it reaches ~0.28 of its 0.3).
KERNEL_MS = 5.0


def test_numba_cuda_runs_at_its_limit_and_gets_numbas_out_of_memory_error(nvidia_stack: None) -> None:
    with run_tier(kernel_time=f"default={KERNEL_MS * 1000:.0f}us") as gpu:
        outcome = gpu.run(FLAGS, "numba_loop.py", "--seconds", "4", "--sync-every", "10", "--chunk-mib", str(CHUNK_MIB))
        result = outcome.check()
        assert result["binding"] == "cuda.bindings.driver"  # NVIDIA's binding
        assert result["roundtrip"] is True
        assert outcome.refused_calls() == {}  # no driver call (of those numba makes through the module) unsupported
        assert outcome.record is not None
        assert outcome.record.kernels == result["launches"] > 0  # every launch ran, once
        mean_ms = outcome.record.busy_ns / outcome.record.kernels / 1e6
        assert KERNEL_MS <= mean_ms < 2 * KERNEL_MS, f"kernels ran {mean_ms:.3f} ms, not the {KERNEL_MS} ms set"
        assert abs(outcome.share - FLAGS.limit) <= 0.02, outcome.share
        refusal = result["refusal"]
        assert refusal is not None, "no allocation was refused"
        assert (refusal["type"], refusal["code"]) == ("numba.cuda.cudadrv.driver.CudaAPIError",
                                                      "CUDA_ERROR_OUT_OF_MEMORY"), refusal
        # The arrays numba still held (the loop's) were pending frees: numba flushes them on the first
        # refusal and tries again, so the whole limit is there for the chunks, and not one more.
        assert result["allocated"] == LIMIT_MIB // CHUNK_MIB
        assert outcome.summary is not None
        assert outcome.summary["exitCode"] == 0
        assert (LIMIT_MIB - CHUNK_MIB) * MIB < outcome.summary["peakMemoryBytes"] <= LIMIT_MIB * MIB
        gpu.counts(outcome)
