/*
 * cudrv.c: finds the driver's entry points through cuGetProcAddress_v2 (see cudrv.h), reads PTX
 * files, and makes a context current.
 */
#define _GNU_SOURCE
#include "cudrv.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct entry {
    const char *name; /* the base name, as cudart asks */
    int version;      /* the ABI of the typedef the program calls it through */
    size_t offset;    /* where in struct cudrv */
    int required;
};

#define ENTRY(field, name, version, required) {name, version, offsetof(struct cudrv, field), required}

static const struct entry entries[] = {
    ENTRY(init, "cuInit", 2000, 1),
    ENTRY(driver_version, "cuDriverGetVersion", 2020, 0),
    ENTRY(error_name, "cuGetErrorName", 6000, 0),
    ENTRY(device_get, "cuDeviceGet", 2000, 1),
    ENTRY(device_attribute, "cuDeviceGetAttribute", 2000, 1),
    ENTRY(primary_retain, "cuDevicePrimaryCtxRetain", 7000, 0),
    ENTRY(primary_release, "cuDevicePrimaryCtxRelease", 11000, 0),
    ENTRY(ctx_create, "cuCtxCreate", 3020, 0),
    ENTRY(ctx_destroy, "cuCtxDestroy", 4000, 0),
    ENTRY(ctx_set_current, "cuCtxSetCurrent", 4000, 1),
    ENTRY(ctx_synchronize, "cuCtxSynchronize", 2000, 1),
    ENTRY(mem_get_info, "cuMemGetInfo", 3020, 1),
    ENTRY(module_load_data, "cuModuleLoadData", 2000, 1),
    ENTRY(module_get_function, "cuModuleGetFunction", 2000, 1),
    ENTRY(launch_kernel, "cuLaunchKernel", 4000, 1),
    ENTRY(event_create, "cuEventCreate", 2000, 0),
    ENTRY(event_record, "cuEventRecord", 2000, 0),
    ENTRY(event_synchronize, "cuEventSynchronize", 2000, 0),
    ENTRY(event_elapsed, "cuEventElapsedTime", 12080, 0),
    ENTRY(event_destroy, "cuEventDestroy", 4000, 0),
};

static int resolve(PFN_cuGetProcAddress_v12000 gpa, const struct entry *e, struct cudrv *drv, char *why,
                   size_t why_len)
{
    void *fn = NULL;
    CUdriverProcAddressQueryResult found = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult status = gpa(e->name, &fn, e->version, CU_GET_PROC_ADDRESS_DEFAULT, &found);
    if (status == CUDA_SUCCESS && found == CU_GET_PROC_ADDRESS_SUCCESS && fn != NULL) {
        memcpy((char *)drv + e->offset, &fn, sizeof fn);
        return 0;
    }
    if (!e->required)
        return 0;
    snprintf(why, why_len, "cuGetProcAddress_v2(\"%s\", %d) failed: status %d, found %d", e->name, e->version,
             (int)status, (int)found);
    return -1;
}

int cudrv_load(struct cudrv *drv, char *why, size_t why_len)
{
    memset(drv, 0, sizeof *drv);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (lib == NULL) {
        snprintf(why, why_len, "dlopen(libcuda.so.1): %s", dlerror());
        return -1;
    }
    PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(lib, "cuGetProcAddress_v2");
    if (gpa == NULL) {
        snprintf(why, why_len, "libcuda.so.1 has no cuGetProcAddress_v2 (a driver older than CUDA 12)");
        return -1;
    }
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++)
        if (resolve(gpa, &entries[i], drv, why, why_len) != 0)
            return -1;
    return 0;
}

int cudrv_has_events(const struct cudrv *drv)
{
    return drv->event_create && drv->event_record && drv->event_synchronize && drv->event_elapsed &&
           drv->event_destroy;
}

const char *cudrv_error_name(const struct cudrv *drv, CUresult result)
{
    static char fallback[32];
    const char *name = NULL;
    if (drv->error_name != NULL && drv->error_name(result, &name) == CUDA_SUCCESS && name != NULL)
        return name;
    snprintf(fallback, sizeof fallback, "CUDA_ERROR_%d", (int)result);
    return fallback;
}

CUresult cudrv_context(const struct cudrv *drv, CUdevice device, CUcontext *ctx, const char **kind)
{
    if (drv->primary_retain != NULL) {
        CUresult status = drv->primary_retain(ctx, device);
        if (status == CUDA_SUCCESS) {
            *kind = "primary";
            return drv->ctx_set_current(*ctx);
        }
        if (status != CUDA_ERROR_NOT_SUPPORTED)
            return status;
    }
    *kind = "created";
    return drv->ctx_create != NULL ? drv->ctx_create(ctx, 0, device) : CUDA_ERROR_NOT_SUPPORTED;
}

char *cudrv_read_file(const char *path, char *why, size_t why_len)
{
    FILE *file = fopen(path, "rb");
    if (file == NULL) {
        snprintf(why, why_len, "cannot open %s", path);
        return NULL;
    }
    char *text = NULL;
    long size = -1;
    if (fseek(file, 0, SEEK_END) == 0)
        size = ftell(file);
    if (size >= 0 && fseek(file, 0, SEEK_SET) == 0)
        text = malloc((size_t)size + 1);
    if (text != NULL && fread(text, 1, (size_t)size, file) == (size_t)size) {
        text[size] = '\0';
    } else {
        free(text);
        text = NULL;
        snprintf(why, why_len, "cannot read %s", path);
    }
    fclose(file);
    return text;
}
