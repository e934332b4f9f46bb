// bench/gpu/kernels.cu: the device code of the GPU-day programs, compiled by nvcc to PTX at run
// time (run.py: nvcc -ptx) and loaded by tenant.c and ctxmem.c with cuModuleLoadData, so one
// host program serves the real GPU and the simulated one (which loads real PTX and takes each
// kernel's run time from FASTGSHARE_FAKE_GPU_KERNEL_TIME by the kernel's name).
//
// extern "C" keeps the names unmangled: "spin" and "empty".
//
// spin: a fixed amount of work per thread (two dependent FMA chains of `iters` steps), so a
// kernel's work is the same whatever else the GPU runs: time-slicing with another process or an
// MPS partition makes it take longer, never do less. (A kernel spinning on a clock would end at
// the same wall time however little it ran.) The result feeds a trap that never fires, so the
// compiler cannot drop the loop.
//
// empty: nothing, for the launch overhead (its parameter only keeps the launch's shape).

extern "C" __global__ void spin(unsigned long long iters)
{
    float x = threadIdx.x * 1e-3f, y = 1.0f;
    for (unsigned long long i = 0; i < iters; ++i) {
        x = fmaf(x, 0.9999f, 1e-4f);
        y = fmaf(y, 0.9998f, 2e-4f);
    }
    if (x + y == -1.0f)
        asm volatile("trap;");
}

extern "C" __global__ void empty(unsigned long long unused)
{
    (void)unused;
}
