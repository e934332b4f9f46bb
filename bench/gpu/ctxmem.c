/*
 * ctxmem.c: the GPU memory one CUDA context costs, the number GPU packing needs (the hook does not
 * charge it to the pod). Run in a fresh process, with no hook:
 *
 *   ctxmem [--ptx FILE]
 *
 * It reads the device's used memory from NVML (which needs no context) before the process has a
 * context, after cuInit, after making the primary context current (cudrv_context: what cudart
 * does), after loading kernels.cu's PTX and running one spin kernel (lazily reserved memory shows
 * at the first launch), and after creating a second context; from the first context on it also
 * reads cuMemGetInfo's free and total. The deltas are computed by the caller.
 *
 * Output, one JSON line: {"context": "primary"|"created", "driver_version" (cuDriverGetVersion, -1
 * when unknown), "nvml": "ok"|<why not>,
 * "steps": [{"step", "nvml_used", "nvml_total", "free", "total"}...]} (null where not read), or
 * {"error", "stage"}. Exit 0, or 1 when something failed.
 */
#define _GNU_SOURCE
#include "cudrv.h"
#include "nvml_subset.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef nvmlReturn_t (*PFN_nvmlInit)(void);
typedef nvmlReturn_t (*PFN_nvmlGetHandle)(unsigned int, nvmlDevice_t *);

struct nvml {
    PFN_nvmlDeviceGetMemoryInfo memory_info;
    nvmlDevice_t device;
    char why[160]; /* empty when NVML works */
};

struct reading {
    const char *step;
    int have_nvml, have_cuda;
    unsigned long long nvml_used, nvml_total;
    size_t free, total;
};

#define MAX_STEPS 8

static struct reading readings[MAX_STEPS];
static int n_readings;

static void nvml_open(struct nvml *n)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    PFN_nvmlInit init = lib ? (PFN_nvmlInit)dlsym(lib, "nvmlInit_v2") : NULL;
    PFN_nvmlGetHandle get = lib ? (PFN_nvmlGetHandle)dlsym(lib, "nvmlDeviceGetHandleByIndex_v2") : NULL;
    n->memory_info = lib ? (PFN_nvmlDeviceGetMemoryInfo)dlsym(lib, "nvmlDeviceGetMemoryInfo") : NULL;
    if (!init || !get || !n->memory_info)
        snprintf(n->why, sizeof n->why, "libnvidia-ml.so.1 or its memory functions not found");
    else if (init() != NVML_SUCCESS || get(0, &n->device) != NVML_SUCCESS)
        snprintf(n->why, sizeof n->why, "nvmlInit_v2 or nvmlDeviceGetHandleByIndex_v2 failed");
    if (n->why[0])
        n->memory_info = NULL;
}

static void read_memory(const struct nvml *n, const struct cudrv *drv, int have_context, const char *step)
{
    struct reading *r = &readings[n_readings++];
    nvmlMemory_t memory;
    r->step = step;
    if (n->memory_info && n->memory_info(n->device, &memory) == NVML_SUCCESS) {
        r->have_nvml = 1;
        r->nvml_used = memory.used;
        r->nvml_total = memory.total;
    }
    r->have_cuda = have_context && drv->mem_get_info(&r->free, &r->total) == CUDA_SUCCESS;
}

static void print_number(const char *key, int have, unsigned long long value, const char *tail)
{
    if (have)
        printf("\"%s\": %llu%s", key, value, tail);
    else
        printf("\"%s\": null%s", key, tail);
}

static void print_result(const struct nvml *n, const char *context, int driver_version)
{
    printf("{\"context\": \"%s\", \"driver_version\": %d, \"nvml\": \"%s\", \"steps\": [", context,
           driver_version, n->why[0] ? n->why : "ok");
    for (int i = 0; i < n_readings; i++) {
        const struct reading *r = &readings[i];
        printf("%s{\"step\": \"%s\", ", i ? ", " : "", r->step);
        print_number("nvml_used", r->have_nvml, r->nvml_used, ", ");
        print_number("nvml_total", r->have_nvml, r->nvml_total, ", ");
        print_number("free", r->have_cuda, r->free, ", ");
        print_number("total", r->have_cuda, r->total, "}");
    }
    printf("]}\n");
}

static void fail(const struct cudrv *drv, const char *stage, CUresult status)
{
    const char *why = drv->error_name ? cudrv_error_name(drv, status) : "the driver could not be loaded";
    fprintf(stderr, "ctxmem: %s: %s\n", stage, why);
    printf("{\"error\": \"%s\", \"stage\": \"%s\"}\n", why, stage);
    exit(1);
}

/* Load the PTX and run one spin kernel of one iteration to completion. */
static void first_launch(const struct cudrv *drv, const char *ptx)
{
    char why[256];
    char *image = cudrv_read_file(ptx, why, sizeof why);
    if (image == NULL) {
        fprintf(stderr, "ctxmem: %s\n", why);
        exit(1);
    }
    CUmodule module;
    CUfunction function;
    unsigned long long iters = 1;
    void *params[] = {&iters};
    CUresult status = drv->module_load_data(&module, image);
    free(image);
    if (status != CUDA_SUCCESS)
        fail(drv, "cuModuleLoadData", status);
    if ((status = drv->module_get_function(&function, module, "spin")) != CUDA_SUCCESS)
        fail(drv, "cuModuleGetFunction", status);
    if ((status = drv->launch_kernel(function, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL)) != CUDA_SUCCESS)
        fail(drv, "cuLaunchKernel", status);
    if ((status = drv->ctx_synchronize()) != CUDA_SUCCESS)
        fail(drv, "cuCtxSynchronize", status);
}

int main(int argc, char **argv)
{
    const char *ptx = NULL;
    if (argc == 3 && strcmp(argv[1], "--ptx") == 0)
        ptx = argv[2];
    else if (argc != 1) {
        fprintf(stderr, "usage: ctxmem [--ptx FILE]\n");
        return 64;
    }
    struct nvml n = {0};
    struct cudrv drv;
    char why[256];
    nvml_open(&n);
    read_memory(&n, &drv, 0, "before");
    if (cudrv_load(&drv, why, sizeof why) != 0) {
        fprintf(stderr, "ctxmem: %s\n", why);
        printf("{\"error\": \"the driver could not be loaded\", \"stage\": \"load\"}\n");
        return 1;
    }
    CUdevice device;
    CUcontext first, second;
    const char *kind = "none";
    CUresult status;
    if ((status = drv.init(0)) != CUDA_SUCCESS || (status = drv.device_get(&device, 0)) != CUDA_SUCCESS)
        fail(&drv, "cuInit/cuDeviceGet", status);
    read_memory(&n, &drv, 0, "after_cuInit");
    if ((status = cudrv_context(&drv, device, &first, &kind)) != CUDA_SUCCESS)
        fail(&drv, "make the first context", status);
    read_memory(&n, &drv, 1, "after_first_context");
    if (ptx != NULL) {
        first_launch(&drv, ptx);
        read_memory(&n, &drv, 1, "after_module_and_first_launch");
    }
    if (drv.ctx_create == NULL) {
        fprintf(stderr, "ctxmem: the driver has no cuCtxCreate (v2 ABI): no second context\n");
    } else {
        if ((status = drv.ctx_create(&second, 0, device)) != CUDA_SUCCESS)
            fail(&drv, "cuCtxCreate (the second context)", status);
        read_memory(&n, &drv, 1, "after_second_context");
        if (drv.ctx_destroy != NULL)
            drv.ctx_destroy(second);
    }
    int driver_version = -1;
    if (drv.driver_version == NULL || drv.driver_version(&driver_version) != CUDA_SUCCESS)
        driver_version = -1;
    print_result(&n, kind, driver_version);
    return 0;
}
