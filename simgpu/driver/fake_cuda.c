/*
 * fake_cuda.c: the fake libcuda.so.1's init, driver version, the one device and contexts.
 * Modules, streams, memory and error strings live in fake_resources.c, launches and graphs in
 * fake_launch.c, cuGetProcAddress in proc_address.c, the shared device in gpu_state.c.
 *
 * Deviations from the real driver, on purpose: one device (ordinal 0) with 100 SMs; a context
 * is current per thread (no push/pop stack); a child forked after cuInit cannot use CUDA.
 */
#include "fake_internal.h"

#include "gpu_state.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_DEVICE_NAME "FastGShare Fake GPU"

/* --- init -------------------------------------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static CUresult init_result = CUDA_ERROR_NOT_INITIALIZED; /* written once, inside init_once */
static int initialised;                                   /* atomic: cuInit succeeded here */
static int forked_child;                                  /* atomic: this is a fork()ed child */

static void after_fork_child(void)
{
    __atomic_store_n(&initialised, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&forked_child, 1, __ATOMIC_RELEASE);
    fgpu_forget_after_fork();
}

static void do_init(void)
{
    char err[512];
    enum fgpu_status status = fgpu_attach(err, sizeof err);
    if (status != FGPU_OK) {
        fprintf(stderr, "fake libcuda: %s\n", err);
        init_result = status == FGPU_BAD_CONFIG ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_NO_DEVICE;
        return;
    }
    pthread_atfork(NULL, NULL, after_fork_child);
    init_result = CUDA_SUCCESS;
    __atomic_store_n(&initialised, 1, __ATOMIC_RELEASE);
}

CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (__atomic_load_n(&forked_child, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED; /* like the real driver: no CUDA after fork */
    pthread_once(&init_once, do_init);
    return init_result;
}

CUresult fake_ready(void)
{
    return __atomic_load_n(&initialised, __ATOMIC_ACQUIRE) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuDriverGetVersion(int *driverVersion)
{
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = FAKE_DRIVER_VERSION;
    return CUDA_SUCCESS;
}

/* --- the device -------------------------------------------------------------------------- */

static CUresult check_device(CUdevice dev)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && dev != 0)
        r = CUDA_ERROR_INVALID_DEVICE;
    return r;
}

CUresult cuDeviceGetCount(int *count)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && count == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *count = 1;
    return r;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && (name == NULL || len <= 0))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        snprintf(name, (size_t)len, "%s", FAKE_DEVICE_NAME);
    return r;
}

static CUresult device_uuid(CUuuid *uuid, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && uuid == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        uint8_t bytes[16];
        fgpu_uuid(bytes);
        memcpy(uuid->bytes, bytes, sizeof bytes);
    }
    return r;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(uuid, dev);
}

CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return device_uuid(uuid, dev);
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r == CUDA_SUCCESS && bytes == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS) {
        uint64_t free_bytes, total;
        fgpu_mem_info(&free_bytes, &total);
        *bytes = (size_t)total;
    }
    return r;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    size_t total = 0;
    CUresult r = bytes != NULL ? cuDeviceTotalMem_v2(&total, dev) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *bytes = total > 0xffffffffu ? 0xffffffffu : (unsigned int)total; /* the v1 ABI's 32 bits */
    return r;
}

/* An H100-like device with 100 SMs (the fake's SM units); other attributes are invalid. */
static int attribute_value(CUdevice_attribute attrib, int *value)
{
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 100; return 0;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; return 0;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *value = 1024; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *value = 1024; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *value = 64; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *value = 2147483647; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *value = 65535; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *value = 65535; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *value = 49152; return 0;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *value = 65536; return 0;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *value = 65536; return 0;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *value = 1980000; return 0;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *value = 2619000; return 0;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *value = 5120; return 0;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = 52428800; return 0;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *value = 2048; return 0;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: *value = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *value = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *value = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: *value = 1; return 0;
    case CU_DEVICE_ATTRIBUTE_INTEGRATED: *value = 0; return 0;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *value = CU_COMPUTEMODE_DEFAULT; return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *value = 0; return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *value = 0; return 0;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *value = 0; return 0;
    default: return -1;
    }
}

CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (pi == NULL || attribute_value(attrib, pi) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

/* --- contexts (a per-thread current context, no stack) ------------------------------------ */

static __thread CUcontext current_ctx;

CUresult fake_ready_with_context(void)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && (current_ctx == NULL || current_ctx->magic != FAKE_CTX_MAGIC))
        r = CUDA_ERROR_INVALID_CONTEXT;
    return r;
}

static CUresult context_create(CUcontext *pctx, CUdevice dev)
{
    CUresult r = check_device(dev);
    if (r != CUDA_SUCCESS)
        return r;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUcontext ctx = calloc(1, sizeof *ctx);
    if (ctx == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    ctx->magic = FAKE_CTX_MAGIC;
    ctx->device = dev;
    current_ctx = ctx;
    *pctx = ctx;
    return CUDA_SUCCESS;
}

CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    return context_create(pctx, dev);
}

CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams,
                        unsigned int flags, CUdevice dev)
{
    (void)paramsArray;
    (void)numParams;
    (void)flags;
    return context_create(pctx, dev);
}

CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags,
                        CUdevice dev)
{
    (void)ctxCreateParams;
    (void)flags;
    return context_create(pctx, dev);
}

CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (ctx == NULL || ctx->magic != FAKE_CTX_MAGIC)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (current_ctx == ctx)
        current_ctx = NULL;
    ctx->magic = 0;
    free(ctx);
    return CUDA_SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && pctx == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pctx = current_ctx;
    return r;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && ctx != NULL && ctx->magic != FAKE_CTX_MAGIC)
        r = CUDA_ERROR_INVALID_CONTEXT;
    if (r == CUDA_SUCCESS)
        current_ctx = ctx;
    return r;
}
