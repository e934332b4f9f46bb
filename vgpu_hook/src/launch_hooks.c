/*
 * launch_hooks.c: the exported launch wrappers. Each passes the time-token gate (gate.h),
 * forwards (FGS_FORWARD: counted, counts.h) to the real driver function of exactly the same ABI
 * and tells the gate when the call returned (the token's used time); nothing else. Their prototypes
 * are cuda.h's own (see entry.h), so a wrapper that drifted from its ABI would not compile.
 * Rows of hooked_symbols.def: cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel and
 * cuGraphLaunch, each also as the per-thread-default-stream _ptsz variant.
 */
#include "counts.h"
#include "entry.h"
#include "gate.h"

/* Gate, forward, note when the call returned; a driver without this entry point gets
 * CUDA_ERROR_NOT_FOUND. */
#define GATE_THEN_FORWARD(symbol, ...)                                                             \
    do {                                                                                           \
        CUresult gate_result = fgs_gate_enter();                                                   \
        if (gate_result != CUDA_SUCCESS)                                                           \
            return gate_result;                                                                    \
        if (fgs_real.symbol == NULL) {                                                             \
            fgs_gate_leave();                                                                      \
            return CUDA_ERROR_NOT_FOUND;                                                           \
        }                                                                                          \
        CUresult launch_result = FGS_FORWARD(symbol, __VA_ARGS__);                                 \
        fgs_gate_leave();                                                                          \
        return launch_result;                                                                      \
    } while (0)

FGS_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                   unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                   unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                   void **kernelParams, void **extra)
{
    GATE_THEN_FORWARD(cuLaunchKernel, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                      sharedMemBytes, hStream, kernelParams, extra);
}

FGS_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                        unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                                        unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                                        void **kernelParams, void **extra)
{
    GATE_THEN_FORWARD(cuLaunchKernel_ptsz, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                      sharedMemBytes, hStream, kernelParams, extra);
}

FGS_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                     void **extra)
{
    GATE_THEN_FORWARD(cuLaunchKernelEx, config, f, kernelParams, extra);
}

FGS_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                          void **extra)
{
    GATE_THEN_FORWARD(cuLaunchKernelEx_ptsz, config, f, kernelParams, extra);
}

FGS_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                              unsigned int gridDimZ, unsigned int blockDimX,
                                              unsigned int blockDimY, unsigned int blockDimZ,
                                              unsigned int sharedMemBytes, CUstream hStream,
                                              void **kernelParams)
{
    GATE_THEN_FORWARD(cuLaunchCooperativeKernel, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                      blockDimZ, sharedMemBytes, hStream, kernelParams);
}

FGS_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                   unsigned int gridDimZ, unsigned int blockDimX,
                                                   unsigned int blockDimY, unsigned int blockDimZ,
                                                   unsigned int sharedMemBytes, CUstream hStream,
                                                   void **kernelParams)
{
    GATE_THEN_FORWARD(cuLaunchCooperativeKernel_ptsz, f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,
                      blockDimZ, sharedMemBytes, hStream, kernelParams);
}

FGS_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    GATE_THEN_FORWARD(cuGraphLaunch, hGraphExec, hStream);
}

FGS_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    GATE_THEN_FORWARD(cuGraphLaunch_ptsz, hGraphExec, hStream);
}
