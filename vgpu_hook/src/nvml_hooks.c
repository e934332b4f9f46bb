/*
 * nvml_hooks.c: NVML's memory queries show the pod's slice, not the card, so nvidia-smi-style
 * tools and frameworks that size themselves by NVML (pynvml, vLLM's profiler) see the limit.
 * Reached by linking (LD_PRELOAD interposition) or by dlsym on a libnvidia-ml handle (entry.c's
 * dlsym override; what pynvml and other dlopen users do).
 *
 * nvmlDeviceGetMemoryInfo(_v2): the real call first (its errors pass through unchanged), then
 * total = min(limit, physical total), free = min(limit - pod used, physical free, total),
 * used = total - free; v2's reserved is reported as 0 (the slice has no driver reservation).
 * The same slice for every device handle: a pod has one GPU. If the arbiter cannot be reached
 * the query fails closed with NVML_ERROR_NO_PERMISSION (memory.h prints the one line).
 */
#include "entry.h"

#include "memory.h"

#include <stdint.h>

#define NVML_REAL_OR_RETURN(symbol)                                                                \
    do {                                                                                           \
        fgs_init();                                                                                \
        if (fgs_load_nvml() != 0)                                                                  \
            return NVML_ERROR_LIBRARY_NOT_FOUND;                                                   \
        if (fgs_real.symbol == NULL)                                                               \
            return NVML_ERROR_FUNCTION_NOT_FOUND;                                                  \
    } while (0)

/* Rewrites (total, free) into the pod's slice; NVML_SUCCESS or NVML_ERROR_NO_PERMISSION. */
static nvmlReturn_t nvml_slice(unsigned long long *total, unsigned long long *free_bytes)
{
    uint64_t used, limit;
    if (fgs_memory_ledger(&used, &limit) != CUDA_SUCCESS)
        return NVML_ERROR_NO_PERMISSION;
    uint64_t t = limit < *total ? limit : *total;
    uint64_t room = limit > used ? limit - used : 0;
    uint64_t f = *free_bytes < room ? *free_bytes : room;
    *total = t;
    *free_bytes = f < t ? f : t;
    return NVML_SUCCESS;
}

FGS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    NVML_REAL_OR_RETURN(nvmlDeviceGetMemoryInfo);
    nvmlReturn_t r = fgs_real.nvmlDeviceGetMemoryInfo(device, memory);
    if (r != NVML_SUCCESS)
        return r;
    nvmlMemory_t m = *memory;
    if ((r = nvml_slice(&m.total, &m.free)) != NVML_SUCCESS)
        return r;
    m.used = m.total - m.free;
    *memory = m;
    return NVML_SUCCESS;
}

FGS_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    NVML_REAL_OR_RETURN(nvmlDeviceGetMemoryInfo_v2);
    nvmlReturn_t r = fgs_real.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (r != NVML_SUCCESS)
        return r;
    nvmlMemory_v2_t m = *memory;
    if ((r = nvml_slice(&m.total, &m.free)) != NVML_SUCCESS)
        return r;
    m.reserved = 0;
    m.used = m.total - m.free;
    *memory = m;
    return NVML_SUCCESS;
}
