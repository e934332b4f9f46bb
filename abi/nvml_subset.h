/*
 * nvml_subset.h: the few NVML declarations the hook and the fake libnvidia-ml.so.1 use, with the
 * exact ABI of NVIDIA's nvml.h (which no PyPI wheel ships). Names are nvml.h's own, so code
 * written against this header also compiles against the real one; the PFN_ typedefs are ours
 * (nvml.h has none) and name exactly one ABI each, like cudaTypedefs.h does for the driver.
 */
#ifndef FASTGSHARE_NVML_SUBSET_H
#define FASTGSHARE_NVML_SUBSET_H

typedef int nvmlReturn_t; /* an enum in nvml.h: int-sized */

#define NVML_SUCCESS 0
#define NVML_ERROR_UNINITIALIZED 1
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_NOT_SUPPORTED 3
#define NVML_ERROR_NO_PERMISSION 4
#define NVML_ERROR_NOT_FOUND 6
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_LIBRARY_NOT_FOUND 12
#define NVML_ERROR_FUNCTION_NOT_FOUND 13
#define NVML_ERROR_ARGUMENT_VERSION_MISMATCH 25
#define NVML_ERROR_UNKNOWN 999

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct nvmlMemory_st {
    unsigned long long total; /* physical device memory, bytes */
    unsigned long long free;  /* unallocated */
    unsigned long long used;  /* reserved + allocated */
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
    unsigned int version; /* must be nvmlMemory_v2 */
    unsigned long long total;
    unsigned long long reserved; /* for the driver and firmware */
    unsigned long long free;
    unsigned long long used; /* allocated */
} nvmlMemory_v2_t;

/* NVML_STRUCT_VERSION(Memory, 2): the struct size with the version in the top byte. */
#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlInitWithFlags(unsigned int flags);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory);

typedef nvmlReturn_t (*PFN_nvmlDeviceGetMemoryInfo)(nvmlDevice_t device, nvmlMemory_t *memory);
typedef nvmlReturn_t (*PFN_nvmlDeviceGetMemoryInfo_v2)(nvmlDevice_t device, nvmlMemory_v2_t *memory);

#endif
