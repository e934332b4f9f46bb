/*
 * cudrv.h: the CUDA driver entry points the GPU-day programs (tenant.c, ctxmem.c) call, found at
 * run time the way cudart finds them: dlopen("libcuda.so.1"), dlsym("cuGetProcAddress_v2"), then
 * every base name through it at the ABI version of the typedef it is called through. One binary
 * thus runs on the machine's NVIDIA driver and on the simulated GPU (LD_LIBRARY_PATH=simgpu/build),
 * needs no libcuda.so to link against, and under the hook every lookup goes through the hook's
 * cuGetProcAddress wrapper, the path cudart takes. Also: reading a PTX file, making a context.
 */
#ifndef FASTGSHARE_BENCH_CUDRV_H
#define FASTGSHARE_BENCH_CUDRV_H

#include <cuda.h>
#include <cudaTypedefs.h>
#include <stddef.h>

struct cudrv {
    PFN_cuInit_v2000 init;
    PFN_cuDriverGetVersion_v2020 driver_version;          /* optional */
    PFN_cuGetErrorName_v6000 error_name;                  /* optional */
    PFN_cuDeviceGet_v2000 device_get;
    PFN_cuDeviceGetAttribute_v2000 device_attribute;
    PFN_cuDevicePrimaryCtxRetain_v7000 primary_retain;    /* optional */
    PFN_cuDevicePrimaryCtxRelease_v11000 primary_release; /* optional */
    PFN_cuCtxCreate_v3020 ctx_create;                     /* optional (the v2 ABI) */
    PFN_cuCtxDestroy_v4000 ctx_destroy;                   /* optional */
    PFN_cuCtxSetCurrent_v4000 ctx_set_current;
    PFN_cuCtxSynchronize_v2000 ctx_synchronize;
    PFN_cuMemGetInfo_v3020 mem_get_info;
    PFN_cuModuleLoadData_v2000 module_load_data;
    PFN_cuModuleGetFunction_v2000 module_get_function;
    PFN_cuLaunchKernel_v4000 launch_kernel;
    PFN_cuEventCreate_v2000 event_create;             /* optional, with the four below */
    PFN_cuEventRecord_v2000 event_record;             /* optional */
    PFN_cuEventSynchronize_v2000 event_synchronize;   /* optional */
    PFN_cuEventElapsedTime_v2000 event_elapsed;       /* optional (the v2 ABI has the same signature) */
    PFN_cuEventDestroy_v4000 event_destroy;           /* optional */
};

/* Load the driver and resolve every entry point. 0 on success; else -1 with `why` filled. */
int cudrv_load(struct cudrv *drv, char *why, size_t why_len);

/* True when all five event entry points resolved. */
int cudrv_has_events(const struct cudrv *drv);

/* The driver's name for a result ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUDA_ERROR_<n>". */
const char *cudrv_error_name(const struct cudrv *drv, CUresult result);

/* Make a context current on `device`: the primary context when the driver has it (what cudart
 * uses), else a new one (cuCtxCreate's v2 ABI). `*kind` says which ("primary" or "created"). */
CUresult cudrv_context(const struct cudrv *drv, CUdevice device, CUcontext *ctx, const char **kind);

/* The whole file, NUL-terminated (cuModuleLoadData takes PTX as a C string); NULL with `why`. */
char *cudrv_read_file(const char *path, char *why, size_t why_len);

#endif
