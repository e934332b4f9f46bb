/*
 * What the fake driver's files share: the driver-internal view of cuda.h (every ABI of every
 * entry point declared, as when NVIDIA builds the real driver), the handle types behind the
 * opaque CUDA handles, and the init/context checks every entry point starts with.
 */
#ifndef FASTGSHARE_FAKE_INTERNAL_H
#define FASTGSHARE_FAKE_INTERNAL_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <stdint.h>

#define FAKE_DRIVER_VERSION 13000 /* what cuDriverGetVersion reports */

/* Each handle starts with a magic so a stale or foreign pointer is rejected, not trusted. */
#define FAKE_CTX_MAGIC 0x43545831u
#define FAKE_MODULE_MAGIC 0x4d4f4431u
#define FAKE_FUNC_MAGIC 0x46554e31u
#define FAKE_STREAM_MAGIC 0x53545231u
#define FAKE_GRAPH_MAGIC 0x47525031u
#define FAKE_NODE_MAGIC 0x4e4f4431u
#define FAKE_EXEC_MAGIC 0x45584531u

struct CUctx_st {
    uint32_t magic;
    CUdevice device;
};

struct CUfunc_st {
    uint32_t magic;
    struct CUfunc_st *next; /* the module's list */
    char name[128];
};

struct CUmod_st {
    uint32_t magic;
    struct CUfunc_st *functions;
};

struct CUstream_st {
    uint32_t magic;
    unsigned int flags;
};

/* CUDA_SUCCESS once cuInit succeeded in this process, else CUDA_ERROR_NOT_INITIALIZED. */
CUresult fake_ready(void);

/* fake_ready(), and a valid context current on the calling thread (CUDA_ERROR_INVALID_CONTEXT). */
CUresult fake_ready_with_context(void);

/* A function handle from cuModuleGetFunction that has not been unloaded. */
int fake_function_valid(CUfunction f);

/* NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD or a stream from cuStreamCreate. */
int fake_stream_valid(CUstream stream);

/* entry points, devices, contexts, memory */

/* The context current on the calling thread (the top of its stack), NULL when none. */
CUcontext fake_current_context(void);

/* A context that exists now: one from cuCtxCreate not yet destroyed, or the primary context. */
int fake_context_valid(CUcontext ctx);

/* Reads FASTGSHARE_FAKE_GPU_SMS (cuInit): 0, or -1 with one line in err naming the bad value. */
int fake_device_configure(char *err, size_t err_len);

/* The modelled GPU's value of a CUdevice_attribute: 0, or -1 when attrib is no attribute. */
int fake_device_attribute(int attrib, int *value);

/* modules, streams, events, launches */

/* The modelled GPU's stream priorities (cuCtxGetStreamPriorityRange): cuStreamCreateWithPriority
 * clamps to [greatest, least]. */
#define FAKE_STREAM_GREATEST_PRIORITY (-5)
#define FAKE_STREAM_LEAST_PRIORITY 0

/* cuFuncGetAttribute's value for a function handle (or a CUkernel) that fake_function_valid
 * accepts: CUDA_SUCCESS, or CUDA_ERROR_INVALID_VALUE for an attribute it has not (for occupancy
 * answers: MAX_THREADS_PER_BLOCK, SHARED_SIZE_BYTES, NUM_REGS, MAX_DYNAMIC_SHARED_SIZE_BYTES...). */
CUresult fake_function_attribute(CUfunction f, CUfunction_attribute attrib, int *value);

#endif
