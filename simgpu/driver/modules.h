/*
 * modules.h: the simulated driver's modules and functions as its own files see them
 * (fake_resources.c owns them; library.c builds libraries and the linker on them; fake_launch.c
 * reads a function's run time). Handles start with the CUmod_st / CUfunc_st headers of
 * fake_internal.h, so its checks keep working on them.
 */
#ifndef SIMGPU_MODULES_H
#define SIMGPU_MODULES_H

#include "fake_internal.h"
#include "module_image.h"

#include <stdint.h>

struct fake_module_global {
    const struct image_global *image;
    CUdeviceptr dptr; /* 0 until first asked for */
};

struct fake_module {
    struct CUmod_st handle; /* magic, the functions made so far (struct fake_function, via .next) */
    struct image_info image;
    struct fake_module_global *globals; /* one per image global */
    CUlibrary library;                  /* the library that owns it, or NULL */
};

struct fake_function {
    struct CUfunc_st handle; /* magic, next in the module's list, the name (truncated) */
    struct fake_module *module;
    const struct image_kernel *kernel; /* NULL for a name an any-name module accepted */
    char *name;
    int spin;          /* FAKECUBIN: the run time is kernelParams[0] microseconds */
    uint64_t base_ns;  /* FASTGSHARE_FAKE_GPU_KERNEL_TIME for this name */
    int max_dynamic_shared, carveout, cluster_width, cluster_height, cluster_depth, non_portable_cluster,
        cluster_policy;
    CUfunc_cache cache_config;
};

static inline struct fake_function *fake_function_of(CUfunction f)
{
    return (struct fake_function *)f;
}

/* A module made from an image in memory (size 0: unknown; see module_image.h). */
CUresult fake_module_from_image(struct fake_module **out, const void *image, size_t size);

/* Reads a whole file (at most 1 GiB): CUDA_ERROR_FILE_NOT_FOUND when it cannot be read. */
CUresult fake_read_file(const char *path, void **data, size_t *size);

/* The module's function `name` (made on first use): CUDA_ERROR_NOT_FOUND when the image has none. */
CUresult fake_module_function(struct fake_module *mod, const char *name, struct fake_function **out);

/* The device memory of a module-scope variable (allocated on first use). */
CUresult fake_module_global(struct fake_module *mod, const char *name, CUdeviceptr *dptr, size_t *bytes);

void fake_module_free(struct fake_module *mod);

int fake_module_valid(CUmodule mod);

/* cuFuncGetAttribute's answer for a valid function. */
CUresult fake_function_get_attribute(struct fake_function *f, CUfunction_attribute attrib, int *value);
CUresult fake_function_set_attribute(struct fake_function *f, CUfunction_attribute attrib, int value);
CUresult fake_function_param_info(struct fake_function *f, size_t index, size_t *offset, size_t *size);

/* After a JIT call: empty the log buffers the options name, zero their sizes and the wall time. */
void fake_jit_options_done(unsigned int count, const CUjit_option *options, void **values);

#endif
