/*
 * fake_nvml.c: a fake libnvidia-ml.so.1 for the fake GPU, just enough for memory queries:
 * nvmlInit_v2, nvmlInitWithFlags, nvmlShutdown, nvmlErrorString, nvmlDeviceGetCount_v2,
 * nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetMemoryInfo and nvmlDeviceGetMemoryInfo_v2.
 *
 * It reads the same state file as the fake libcuda.so.1 (FASTGSHARE_FAKE_GPU_DIR, layout in
 * fake_gpu_state.h), so NVML sees the memory every process of the fake GPU has allocated:
 * total = mem_total, used = mem_used, free = total - used (v2: reserved 0). It never takes a
 * process slot and never locks: it copies the two numbers under the file's seqlock. Like the
 * real library it counts nvmlInit/nvmlShutdown pairs and refuses queries when not initialised.
 */
#define _GNU_SOURCE
#include "nvml_subset.h"

#include "fake_gpu_state.h"
#include "gpu_state.h"
#include "state_file.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define NVML_EXPORT __attribute__((visibility("default")))

struct nvmlDevice_st {
    unsigned int index;
};

static struct nvmlDevice_st the_device = {0};
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;                   /* guarded by lock */
static struct fake_gpu_state *state;     /* mapped on the first successful init; never unmapped */

/* state_file.c needs it; the fake libcuda.so.1 has its own copy in gpu_state.c. */
uint64_t fgpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (state == NULL) {
        char err[512];
        const char *dir = getenv(FGPU_ENV_DIR);
        uint64_t mem_total;
        if (dir == NULL || *dir == '\0') {
            fprintf(stderr, "fake libnvidia-ml: " FGPU_ENV_DIR " is not set: it names the fake GPU's directory\n");
            r = NVML_ERROR_DRIVER_NOT_LOADED;
        } else if (fgpu_parse_bytes(getenv(FGPU_ENV_MEMORY), &mem_total) != 0) {
            fprintf(stderr, "fake libnvidia-ml: " FGPU_ENV_MEMORY " is not a byte count\n");
            r = NVML_ERROR_DRIVER_NOT_LOADED;
        } else if ((state = fgpu_open_state(dir, mem_total, err, sizeof err)) == NULL) {
            fprintf(stderr, "fake libnvidia-ml: %s\n", err);
            r = NVML_ERROR_DRIVER_NOT_LOADED;
        }
    }
    if (r == NVML_SUCCESS)
        init_count++;
    pthread_mutex_unlock(&lock);
    return r;
}

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void)
{
    return nvmlInitWithFlags(0);
}

NVML_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    pthread_mutex_lock(&lock);
    nvmlReturn_t r = init_count > 0 ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (init_count > 0)
        init_count--;
    pthread_mutex_unlock(&lock);
    return r;
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

static int initialised(void)
{
    pthread_mutex_lock(&lock);
    int yes = init_count > 0;
    pthread_mutex_unlock(&lock);
    return yes;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (deviceCount == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = 1;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index != 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &the_device;
    return NVML_SUCCESS;
}

#define SEQLOCK_TRIES 100000

/* (total, used) of the fake GPU, copied under its seqlock (bounded: a writer that died inside
 * its write section leaves the sequence odd until the next libcuda user recovers the lock). */
static nvmlReturn_t read_memory(nvmlDevice_t device, uint64_t *total, uint64_t *used)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    if (device != &the_device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int attempt = 0; attempt < SEQLOCK_TRIES; attempt++) {
        uint64_t before = __atomic_load_n(&state->seq, __ATOMIC_ACQUIRE);
        if ((before & 1) == 0) {
            *total = __atomic_load_n(&state->mem_total, __ATOMIC_RELAXED);
            *used = __atomic_load_n(&state->mem_used, __ATOMIC_RELAXED);
            __atomic_thread_fence(__ATOMIC_ACQUIRE);
            if (__atomic_load_n(&state->seq, __ATOMIC_RELAXED) == before) {
                if (*used > *total)
                    *used = *total;
                return NVML_SUCCESS;
            }
        }
        sched_yield();
    }
    return NVML_ERROR_UNKNOWN;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    uint64_t total, used;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t r = read_memory(device, &total, &used);
    if (r == NVML_SUCCESS)
        *memory = (nvmlMemory_t){.total = total, .free = total - used, .used = used};
    return r;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    uint64_t total, used;
    if (memory == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (memory->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t r = read_memory(device, &total, &used);
    if (r == NVML_SUCCESS)
        *memory = (nvmlMemory_v2_t){.version = nvmlMemory_v2, .total = total, .reserved = 0,
                                    .free = total - used, .used = used};
    return r;
}
