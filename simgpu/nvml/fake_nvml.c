/*
 * fake_nvml.c: the simulated libnvidia-ml.so.1's initialisation and memory queries: nvmlInit_v2,
 * nvmlInitWithFlags, nvmlShutdown, nvmlErrorString, nvmlDeviceGetCount_v2,
 * nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetMemoryInfo and nvmlDeviceGetMemoryInfo_v2. The
 * device's identity and MIG mode are nvml_device.c, the event sets nvml_events.c.
 *
 * It reads the same state file as the fake libcuda.so.1 (FASTGSHARE_FAKE_GPU_DIR, layout in
 * fake_gpu_state.h), so NVML sees the memory every process of the fake GPU has allocated:
 * total = mem_total, used = mem_used, free = total - used (v2: reserved 0). It never takes a
 * process slot and never locks: it copies the two numbers under the file's seqlock. Like the
 * real library it counts nvmlInit/nvmlShutdown pairs and refuses queries when not initialised.
 */
#define _GNU_SOURCE
#include "nvml_internal.h"

#include "device_identity.h"
#include "fake_gpu_state.h"
#include "gpu_state.h"
#include "state_file.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct nvmlDevice_st {
    unsigned int index;
};

static struct nvmlDevice_st the_device = {0};
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;                   /* guarded by lock */
static struct fake_gpu_state *state;     /* mapped on the first successful init; never unmapped */
static char device_name[FGPU_NAME_MAX + 1]; /* read with state, fixed afterwards */
static int mig_mode = FNVML_NO_MIG;         /* read with state, fixed afterwards */

/* state_file.c needs it; the fake libcuda.so.1 has its own copy in gpu_state.c. */
uint64_t fgpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

/* FASTGSHARE_FAKE_GPU_MIG: unset or empty, a GPU without MIG; "0" MIG off; "1" MIG on. */
static int read_mig_mode(int *mode, char *err, size_t err_len)
{
    const char *text = getenv(FNVML_ENV_MIG);
    if (text == NULL || *text == '\0')
        *mode = FNVML_NO_MIG;
    else if (strcmp(text, "0") == 0)
        *mode = (int)NVML_DEVICE_MIG_DISABLE;
    else if (strcmp(text, "1") == 0)
        *mode = (int)NVML_DEVICE_MIG_ENABLE;
    else {
        snprintf(err, err_len, FNVML_ENV_MIG "=%.200s is not a MIG mode: 0 (MIG off) or 1 (MIG on), "
                 "unset for a GPU without MIG", text);
        return -1;
    }
    return 0;
}

/* The settings and the state file, on the first successful init (the caller holds lock). */
static nvmlReturn_t open_simulated_gpu(void)
{
    char err[512];
    const char *dir = getenv(FGPU_ENV_DIR);
    uint64_t mem_total;
    if (dir == NULL || *dir == '\0') {
        fprintf(stderr, "fake libnvidia-ml: " FGPU_ENV_DIR " is not set: it names the fake GPU's directory\n");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (fgpu_parse_bytes(getenv(FGPU_ENV_MEMORY), &mem_total) != 0) {
        fprintf(stderr, "fake libnvidia-ml: " FGPU_ENV_MEMORY "=%s is not a byte count (e.g. 17179869184 or 16G)\n",
                getenv(FGPU_ENV_MEMORY));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    if (fgpu_read_name(device_name, err, sizeof err) != 0 || read_mig_mode(&mig_mode, err, sizeof err) != 0 ||
        (state = fgpu_open_state(dir, mem_total, err, sizeof err)) == NULL) {
        fprintf(stderr, "fake libnvidia-ml: %s\n", err);
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (state == NULL)
        r = open_simulated_gpu();
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
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_TIMEOUT: return "Timeout";
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

nvmlReturn_t fnvml_check_initialised(void)
{
    return initialised() ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

nvmlReturn_t fnvml_check_device(nvmlDevice_t device)
{
    if (!initialised())
        return NVML_ERROR_UNINITIALIZED;
    return device == &the_device ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

const char *fnvml_name(void)
{
    return device_name;
}

void fnvml_uuid(uint8_t out[16])
{
    memcpy(out, state->uuid, sizeof state->uuid); /* immutable after the file's creation */
}

int fnvml_mig_mode(void)
{
    return mig_mode;
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
    nvmlReturn_t r = fnvml_check_device(device);
    if (r != NVML_SUCCESS)
        return r;
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
