/*
 * proc_address.c: cuGetProcAddress of the fake driver, both ABIs (legacy 4-argument
 * cuGetProcAddress from CUDA 11.3, and cuGetProcAddress_v2 from 12.0).
 *
 * Like the real driver it resolves BASE names ("cuMemAlloc", not "cuMemAlloc_v2"): among the
 * table rows for the base name it picks the newest ABI whose `since` is <= the caller's
 * cudaVersion; with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM it prefers the per-thread
 * (_ptsz) rows and falls back to the others. The pointers are this library's own functions
 * (it is linked with -Bsymbolic), never whatever the global scope binds the names to, so an
 * LD_PRELOAD hook cannot hide here: it must wrap cuGetProcAddress itself.
 *
 * Every ABI the fake implements has a row, the 32-bit v1 memory calls included (cuMemAlloc
 * @2000 is the v1 ABI, @3020 the _v2 one). Asking with a cudaVersion older than every row of a
 * base name yields CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT.
 */
#include "fake_internal.h"

#include <string.h>

struct proc_entry {
    const char *base;
    int since;      /* first CUDA version (1000 * major + 10 * minor) with this ABI */
    int per_thread; /* 1: the _ptsz/_ptds variant chosen by the per-thread flag */
    void *fn;
};

#define ROW(base, since, per_thread, fn) {#base, since, per_thread, (void *)(fn)}

static const struct proc_entry table[] = {
    ROW(cuInit, 2000, 0, cuInit),
    ROW(cuDriverGetVersion, 2020, 0, cuDriverGetVersion),
    ROW(cuGetErrorName, 6000, 0, cuGetErrorName),
    ROW(cuGetErrorString, 6000, 0, cuGetErrorString),
    ROW(cuGetProcAddress, 11030, 0, cuGetProcAddress),
    ROW(cuGetProcAddress, 12000, 0, cuGetProcAddress_v2),
    ROW(cuDeviceGet, 2000, 0, cuDeviceGet),
    ROW(cuDeviceGetCount, 2000, 0, cuDeviceGetCount),
    ROW(cuDeviceGetName, 2000, 0, cuDeviceGetName),
    ROW(cuDeviceGetUuid, 9020, 0, cuDeviceGetUuid),
    ROW(cuDeviceGetUuid, 11040, 0, cuDeviceGetUuid_v2),
    ROW(cuDeviceTotalMem, 2000, 0, cuDeviceTotalMem),
    ROW(cuDeviceTotalMem, 3020, 0, cuDeviceTotalMem_v2),
    ROW(cuDeviceGetAttribute, 2000, 0, cuDeviceGetAttribute),
    ROW(cuCtxCreate, 3020, 0, cuCtxCreate_v2),
    ROW(cuCtxCreate, 11040, 0, cuCtxCreate_v3),
    ROW(cuCtxCreate, 12050, 0, cuCtxCreate_v4),
    ROW(cuCtxDestroy, 4000, 0, cuCtxDestroy_v2),
    ROW(cuCtxGetCurrent, 4000, 0, cuCtxGetCurrent),
    ROW(cuCtxSetCurrent, 4000, 0, cuCtxSetCurrent),
    ROW(cuCtxSynchronize, 2000, 0, cuCtxSynchronize),
#if CUDA_VERSION >= 13000
    ROW(cuCtxSynchronize, 13000, 0, cuCtxSynchronize_v2),
#endif
    ROW(cuModuleLoadData, 2000, 0, cuModuleLoadData),
    ROW(cuModuleGetFunction, 2000, 0, cuModuleGetFunction),
    ROW(cuModuleUnload, 2000, 0, cuModuleUnload),
    ROW(cuStreamCreate, 2000, 0, cuStreamCreate),
    ROW(cuStreamDestroy, 4000, 0, cuStreamDestroy_v2),
    ROW(cuStreamSynchronize, 2000, 0, cuStreamSynchronize),
    ROW(cuStreamSynchronize, 7000, 1, cuStreamSynchronize_ptsz),
    ROW(cuMemAlloc, 2000, 0, cuMemAlloc),
    ROW(cuMemAlloc, 3020, 0, cuMemAlloc_v2),
    ROW(cuMemAllocPitch, 2000, 0, cuMemAllocPitch),
    ROW(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2),
    ROW(cuMemAllocManaged, 6000, 0, cuMemAllocManaged),
    ROW(cuMemFree, 2000, 0, cuMemFree),
    ROW(cuMemFree, 3020, 0, cuMemFree_v2),
    ROW(cuMemGetInfo, 2000, 0, cuMemGetInfo),
    ROW(cuMemGetInfo, 3020, 0, cuMemGetInfo_v2),
    ROW(cuMemAllocAsync, 11020, 0, cuMemAllocAsync),
    ROW(cuMemAllocAsync, 11020, 1, cuMemAllocAsync_ptsz),
    ROW(cuMemAllocFromPoolAsync, 11020, 0, cuMemAllocFromPoolAsync),
    ROW(cuMemAllocFromPoolAsync, 11020, 1, cuMemAllocFromPoolAsync_ptsz),
    ROW(cuMemFreeAsync, 11020, 0, cuMemFreeAsync),
    ROW(cuMemFreeAsync, 11020, 1, cuMemFreeAsync_ptsz),
    ROW(cuDeviceGetDefaultMemPool, 11020, 0, cuDeviceGetDefaultMemPool),
    ROW(cuDeviceGetMemPool, 11020, 0, cuDeviceGetMemPool),
    ROW(cuDeviceSetMemPool, 11020, 0, cuDeviceSetMemPool),
    ROW(cuMemPoolCreate, 11020, 0, cuMemPoolCreate),
    ROW(cuMemPoolDestroy, 11020, 0, cuMemPoolDestroy),
    ROW(cuMemGetAllocationGranularity, 10020, 0, cuMemGetAllocationGranularity),
    ROW(cuMemCreate, 10020, 0, cuMemCreate),
    ROW(cuMemRelease, 10020, 0, cuMemRelease),
    ROW(cuMemAddressReserve, 10020, 0, cuMemAddressReserve),
    ROW(cuMemAddressFree, 10020, 0, cuMemAddressFree),
    ROW(cuMemMap, 10020, 0, cuMemMap),
    ROW(cuMemUnmap, 10020, 0, cuMemUnmap),
    ROW(cuMemSetAccess, 10020, 0, cuMemSetAccess),
    ROW(cuMemRetainAllocationHandle, 11000, 0, cuMemRetainAllocationHandle),
    ROW(cuArrayCreate, 2000, 0, cuArrayCreate),
    ROW(cuArrayCreate, 3020, 0, cuArrayCreate_v2),
    ROW(cuArray3DCreate, 2000, 0, cuArray3DCreate),
    ROW(cuArray3DCreate, 3020, 0, cuArray3DCreate_v2),
    ROW(cuArrayDestroy, 2000, 0, cuArrayDestroy),
    ROW(cuMipmappedArrayCreate, 5000, 0, cuMipmappedArrayCreate),
    ROW(cuMipmappedArrayDestroy, 5000, 0, cuMipmappedArrayDestroy),
    ROW(cuLaunchKernel, 4000, 0, cuLaunchKernel),
    ROW(cuLaunchKernel, 7000, 1, cuLaunchKernel_ptsz),
    ROW(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx),
    ROW(cuLaunchKernelEx, 11060, 1, cuLaunchKernelEx_ptsz),
    ROW(cuLaunchCooperativeKernel, 9000, 0, cuLaunchCooperativeKernel),
    ROW(cuLaunchCooperativeKernel, 9000, 1, cuLaunchCooperativeKernel_ptsz),
    ROW(cuGraphCreate, 10000, 0, cuGraphCreate),
    ROW(cuGraphAddKernelNode, 10000, 0, cuGraphAddKernelNode),
    ROW(cuGraphAddKernelNode, 12000, 0, cuGraphAddKernelNode_v2),
    ROW(cuGraphInstantiate, 10000, 0, cuGraphInstantiate),
    ROW(cuGraphInstantiate, 11000, 0, cuGraphInstantiate_v2),
    ROW(cuGraphInstantiateWithFlags, 11040, 0, cuGraphInstantiateWithFlags),
    ROW(cuGraphExecDestroy, 10000, 0, cuGraphExecDestroy),
    ROW(cuGraphDestroy, 10000, 0, cuGraphDestroy),
    ROW(cuGraphLaunch, 10000, 0, cuGraphLaunch),
    ROW(cuGraphLaunch, 10000, 1, cuGraphLaunch_ptsz),
};

/* The newest row for base with since <= version and the given per_thread; sets *known when the
 * base name exists at all. */
static const struct proc_entry *newest(const char *base, int version, int per_thread, int *known)
{
    const struct proc_entry *best = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const struct proc_entry *e = &table[i];
        if (strcmp(e->base, base) != 0)
            continue;
        *known = 1;
        if (e->per_thread == per_thread && e->since <= version && (best == NULL || e->since > best->since))
            best = e;
    }
    return best;
}

static CUresult resolve(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    const cuuint64_t known_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (symbol == NULL || pfn == NULL || (flags & ~known_flags) != 0 || flags == known_flags)
        return CUDA_ERROR_INVALID_VALUE;
    int known = 0;
    const struct proc_entry *e = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        e = newest(symbol, cudaVersion, 1, &known);
    if (e == NULL)
        e = newest(symbol, cudaVersion, 0, &known);
    *pfn = e != NULL ? e->fn : NULL;
    if (status != NULL)
        *status = e != NULL ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known   ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return e != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return resolve(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return resolve(symbol, pfn, cudaVersion, flags, NULL);
}
