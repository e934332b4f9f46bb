/*
 * fake_resources.c: the simulated driver's modules and functions, and its error strings.
 *
 * Modules load from real images (module_image.c: PTX, ELF cubins, fatbins, the fatbin wrapper)
 * and from the simulated GPU's own "FAKECUBIN" images: cuModuleLoad (a file), cuModuleLoadData,
 * cuModuleLoadDataEx (JIT options accepted; log buffers come back empty), cuModuleLoadFatBinary,
 * cuModuleUnload, cuModuleGetFunction (CUDA_ERROR_NOT_FOUND for a name the image lacks; a
 * FAKECUBIN or unreadable fatbin accepts any), cuModuleGetFunctionCount / EnumerateFunctions,
 * cuModuleGetGlobal (v1 and _v2: `.global`/`.const` variables get device memory of their size on
 * first use, zeroed: initialisers are not applied), cuModuleGetLoadingMode. Functions:
 * cuFuncGetAttribute / SetAttribute (the modelled GPU's plausible values; the settable ones are
 * kept), cuFuncSetCacheConfig, cuFuncSetSharedMemConfig, cuFuncGetName, cuFuncGetModule,
 * cuFuncGetParamInfo (from the PTX `.param` list or the cubin's .nv.info), cuFuncIsLoaded,
 * cuFuncLoad. A function's run time is FASTGSHARE_FAKE_GPU_KERNEL_TIME's (kernel_time.h), except a
 * FAKECUBIN kernel's: the simulated GPU's spin kernel runs its first parameter in microseconds.
 */
#include "modules.h"

#include "fake_memory.h"
#include "kernel_time.h"
#include "raw_syscalls.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_FILE_BYTES (UINT64_C(1) << 30)
#define MAX_NAME_BYTES 4096u
#define DEFAULT_DYNAMIC_SHARED 49152 /* 48 KiB less the kernel's static shared memory (none) */
#define MAX_DYNAMIC_SHARED 232448    /* CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN */

static pthread_mutex_t objects_lock = PTHREAD_MUTEX_INITIALIZER; /* function lists, globals */

/* --- modules -------------------------------------------------------------------------------- */

int fake_module_valid(CUmodule mod)
{
    return mod != NULL && mod->magic == FAKE_MODULE_MAGIC;
}

CUresult fake_module_from_image(struct fake_module **out, const void *image, size_t size)
{
    struct fake_module *mod = calloc(1, sizeof *mod);
    if (mod == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    enum image_status status = image_parse(image, size, &mod->image);
    if (status == IMAGE_OK && mod->image.global_count > 0 &&
        (mod->globals = calloc(mod->image.global_count, sizeof *mod->globals)) == NULL)
        status = IMAGE_NO_MEMORY;
    if (status != IMAGE_OK) {
        image_free(&mod->image);
        free(mod);
        return status == IMAGE_NO_MEMORY ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_IMAGE;
    }
    for (size_t i = 0; i < mod->image.global_count; i++)
        mod->globals[i].image = &mod->image.globals[i];
    mod->handle.magic = FAKE_MODULE_MAGIC;
    *out = mod;
    return CUDA_SUCCESS;
}

void fake_module_free(struct fake_module *mod)
{
    pthread_mutex_lock(&objects_lock);
    struct CUfunc_st *f = mod->handle.functions;
    while (f != NULL) {
        struct CUfunc_st *next = f->next;
        f->magic = 0;
        free(fake_function_of(f)->name);
        free(f);
        f = next;
    }
    mod->handle.magic = 0;
    pthread_mutex_unlock(&objects_lock);
    for (size_t i = 0; i < mod->image.global_count; i++)
        if (mod->globals[i].dptr != 0)
            fake_device_free((uint64_t)mod->globals[i].dptr);
    free(mod->globals);
    image_free(&mod->image);
    free(mod);
}

CUresult fake_read_file(const char *path, void **data, size_t *size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fgpu_fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > MAX_FILE_BYTES) {
        if (fd >= 0)
            close(fd);
        return CUDA_ERROR_FILE_NOT_FOUND;
    }
    size_t len = (size_t)st.st_size;
    char *buffer = malloc(len + 1);
    size_t got = 0;
    while (buffer != NULL && got < len) {
        ssize_t n = read(fd, buffer + got, len - got);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    if (buffer == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (got != len) {
        free(buffer);
        return CUDA_ERROR_FILE_NOT_FOUND;
    }
    buffer[len] = '\0'; /* PTX text read from a file need not end in a NUL */
    *data = buffer;
    *size = len + 1;
    return CUDA_SUCCESS;
}

void fake_jit_options_done(unsigned int count, const CUjit_option *options, void **values)
{
    if (options == NULL || values == NULL)
        return;
    for (unsigned int i = 0; i < count; i++) {
        if (options[i] == CU_JIT_INFO_LOG_BUFFER || options[i] == CU_JIT_ERROR_LOG_BUFFER) {
            for (unsigned int j = 0; j < count; j++) {
                CUjit_option size_option = options[i] == CU_JIT_INFO_LOG_BUFFER ? CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES
                                                                                 : CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES;
                if (options[j] == size_option && (uintptr_t)values[j] > 0 && values[i] != NULL)
                    ((char *)values[i])[0] = '\0';
            }
        }
    }
    for (unsigned int i = 0; i < count; i++) {
        if (options[i] == CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES || options[i] == CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES)
            values[i] = (void *)(uintptr_t)0;
        else if (options[i] == CU_JIT_WALL_TIME) {
            float zero = 0.0f;
            memcpy(&values[i], &zero, sizeof zero);
        }
    }
}

static CUresult load(CUmodule *module, const void *image, size_t size)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_module *mod;
    if ((r = fake_module_from_image(&mod, image, size)) == CUDA_SUCCESS)
        *module = &mod->handle;
    return r;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    return load(module, image, 0);
}

CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,
                            void **optionValues)
{
    if (numOptions > 0 && (options == NULL || optionValues == NULL))
        return fake_ready() != CUDA_SUCCESS ? fake_ready() : CUDA_ERROR_INVALID_VALUE;
    CUresult r = load(module, image, 0);
    fake_jit_options_done(numOptions, options, optionValues);
    return r;
}

CUresult cuModuleLoadFatBinary(CUmodule *module, const void *fatCubin)
{
    return load(module, fatCubin, 0);
}

CUresult cuModuleLoad(CUmodule *module, const char *fname)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (module == NULL || fname == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    void *data;
    size_t size;
    if ((r = fake_read_file(fname, &data, &size)) != CUDA_SUCCESS)
        return r;
    r = load(module, data, size);
    free(data);
    return r;
}

CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!fake_module_valid(hmod))
        return CUDA_ERROR_INVALID_HANDLE;
    struct fake_module *mod = (struct fake_module *)hmod;
    if (mod->library != NULL)
        return CUDA_ERROR_NOT_PERMITTED; /* a library's module goes with cuLibraryUnload */
    fake_module_free(mod);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetLoadingMode(CUmoduleLoadingMode *mode)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && mode == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *mode = CU_MODULE_EAGER_LOADING;
    return r;
}

/* --- functions ------------------------------------------------------------------------------ */

int fake_function_valid(CUfunction f)
{
    return f != NULL && f->magic == FAKE_FUNC_MAGIC;
}

static struct fake_function *new_function_locked(struct fake_module *mod, const char *name,
                                                 const struct image_kernel *kernel)
{
    struct fake_function *f = calloc(1, sizeof *f);
    if (f == NULL || (f->name = strdup(name)) == NULL) {
        free(f);
        return NULL;
    }
    f->handle.magic = FAKE_FUNC_MAGIC;
    snprintf(f->handle.name, sizeof f->handle.name, "%s", name);
    f->module = mod;
    f->kernel = kernel;
    f->spin = mod->image.spin;
    f->base_ns = fake_kernel_base_ns(name);
    f->max_dynamic_shared = DEFAULT_DYNAMIC_SHARED;
    f->carveout = -1;
    f->handle.next = mod->handle.functions;
    mod->handle.functions = &f->handle;
    return f;
}

static struct fake_function *find_function_locked(struct fake_module *mod, const char *name)
{
    for (struct CUfunc_st *f = mod->handle.functions; f != NULL; f = f->next)
        if (strcmp(fake_function_of(f)->name, name) == 0)
            return fake_function_of(f);
    return NULL;
}

CUresult fake_module_function(struct fake_module *mod, const char *name, struct fake_function **out)
{
    if (strnlen(name, MAX_NAME_BYTES) >= MAX_NAME_BYTES)
        return CUDA_ERROR_NOT_FOUND;
    const struct image_kernel *kernel = image_find_kernel(&mod->image, name);
    if (kernel == NULL && !mod->image.any_name)
        return CUDA_ERROR_NOT_FOUND;
    pthread_mutex_lock(&objects_lock);
    struct fake_function *f = find_function_locked(mod, name);
    if (f == NULL)
        f = new_function_locked(mod, name, kernel);
    pthread_mutex_unlock(&objects_lock);
    if (f == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = f;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!fake_module_valid(hmod))
        return CUDA_ERROR_INVALID_HANDLE;
    if (hfunc == NULL || name == NULL || name[0] == '\0')
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_function *f;
    if ((r = fake_module_function((struct fake_module *)hmod, name, &f)) == CUDA_SUCCESS)
        *hfunc = &f->handle;
    return r;
}

CUresult cuModuleGetFunctionCount(unsigned int *count, CUmodule mod)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fake_module_valid(mod))
        return CUDA_ERROR_INVALID_HANDLE;
    *count = (unsigned int)((struct fake_module *)mod)->image.kernel_count;
    return CUDA_SUCCESS;
}

CUresult cuModuleEnumerateFunctions(CUfunction *functions, unsigned int numFunctions, CUmodule mod)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (functions == NULL && numFunctions > 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fake_module_valid(mod))
        return CUDA_ERROR_INVALID_HANDLE;
    struct fake_module *m = (struct fake_module *)mod;
    for (unsigned int i = 0; i < numFunctions && i < m->image.kernel_count; i++) {
        struct fake_function *f;
        if ((r = fake_module_function(m, m->image.kernels[i].name, &f)) != CUDA_SUCCESS)
            return r;
        functions[i] = &f->handle;
    }
    return CUDA_SUCCESS;
}

/* --- module-scope variables ----------------------------------------------------------------- */

CUresult fake_module_global(struct fake_module *mod, const char *name, CUdeviceptr *dptr, size_t *bytes)
{
    struct fake_module_global *g = NULL;
    for (size_t i = 0; i < mod->image.global_count && g == NULL; i++)
        if (strcmp(mod->globals[i].image->name, name) == 0)
            g = &mod->globals[i];
    if (g == NULL)
        return CUDA_ERROR_NOT_FOUND;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&objects_lock);
    if (g->dptr == 0) {
        /* In the v1 ABI's range, so both cuModuleGetGlobal ABIs can answer; through the internal
         * allocator, not cuMemAlloc: the application did not allocate it (served counts). The
         * pointer is the backing's address (fake_memory.h), zeroed: initialisers are not applied. */
        uint64_t p = 0;
        r = fake_device_alloc(g->image->size, 1, &p);
        if (r == CUDA_SUCCESS)
            memset((void *)(uintptr_t)p, 0, (size_t)g->image->size);
        g->dptr = (CUdeviceptr)p;
    }
    pthread_mutex_unlock(&objects_lock);
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr != NULL)
        *dptr = g->dptr;
    if (bytes != NULL)
        *bytes = (size_t)g->image->size;
    return CUDA_SUCCESS;
}

static CUresult module_global(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!fake_module_valid(hmod))
        return CUDA_ERROR_INVALID_HANDLE;
    if (name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return fake_module_global((struct fake_module *)hmod, name, dptr, bytes);
}

CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name)
{
    return module_global(dptr, bytes, hmod, name);
}

CUresult cuModuleGetGlobal(CUdeviceptr_v1 *dptr, unsigned int *bytes, CUmodule hmod, const char *name)
{
    CUdeviceptr p = 0;
    size_t size = 0;
    CUresult r = module_global(&p, &size, hmod, name);
    if (r == CUDA_SUCCESS && dptr != NULL)
        *dptr = (CUdeviceptr_v1)p;
    if (r == CUDA_SUCCESS && bytes != NULL)
        *bytes = (unsigned int)size;
    return r;
}

/* --- function attributes -------------------------------------------------------------------- */

CUresult fake_function_get_attribute(struct fake_function *f, CUfunction_attribute attrib, int *value)
{
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;
    case CU_FUNC_ATTRIBUTE_PTX_VERSION: *value = 90; break;
    case CU_FUNC_ATTRIBUTE_BINARY_VERSION: *value = 90; break;
    case CU_FUNC_ATTRIBUTE_CACHE_MODE_CA: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = f->max_dynamic_shared; break;
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: *value = f->carveout; break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SIZE_MUST_BE_SET: *value = 0; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: *value = f->cluster_width; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: *value = f->cluster_height; break;
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: *value = f->cluster_depth; break;
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED: *value = f->non_portable_cluster; break;
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: *value = f->cluster_policy; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

static CUresult set_in_range(int *field, int value, int low, int high)
{
    if (value < low || value > high)
        return CUDA_ERROR_INVALID_VALUE;
    *field = value;
    return CUDA_SUCCESS;
}

CUresult fake_function_set_attribute(struct fake_function *f, CUfunction_attribute attrib, int value)
{
    switch (attrib) {
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        return set_in_range(&f->max_dynamic_shared, value, 0, MAX_DYNAMIC_SHARED);
    case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT: return set_in_range(&f->carveout, value, -1, 100);
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH: return set_in_range(&f->cluster_width, value, 0, 16);
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT: return set_in_range(&f->cluster_height, value, 0, 16);
    case CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH: return set_in_range(&f->cluster_depth, value, 0, 16);
    case CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED:
        return set_in_range(&f->non_portable_cluster, value, 0, 1);
    case CU_FUNC_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE: return set_in_range(&f->cluster_policy, value, 0, 2);
    default: return CUDA_ERROR_INVALID_VALUE;
    }
}

CUresult fake_function_param_info(struct fake_function *f, size_t index, size_t *offset, size_t *size)
{
    if (f->kernel == NULL || !f->kernel->params_known) {
        if (!f->spin)
            return CUDA_ERROR_NOT_SUPPORTED; /* an image that does not state the layout */
        if (index > 0)                       /* the spin kernel: one unsigned long long */
            return CUDA_ERROR_INVALID_VALUE;
        *offset = 0;
        *size = sizeof(unsigned long long);
        return CUDA_SUCCESS;
    }
    if (index >= f->kernel->param_count)
        return CUDA_ERROR_INVALID_VALUE;
    *offset = f->kernel->params[index].offset;
    *size = f->kernel->params[index].size;
    return CUDA_SUCCESS;
}

CUresult fake_function_attribute(CUfunction f, CUfunction_attribute attrib, int *value)
{
    return fake_function_get_attribute(fake_function_of(f), attrib, value);
}

static CUresult check_function(CUfunction hfunc)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && !fake_function_valid(hfunc))
        r = CUDA_ERROR_INVALID_HANDLE;
    return r;
}

CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc)
{
    CUresult r = check_function(hfunc);
    if (r == CUDA_SUCCESS && pi == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    return r == CUDA_SUCCESS ? fake_function_get_attribute(fake_function_of(hfunc), attrib, pi) : r;
}

CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value)
{
    CUresult r = check_function(hfunc);
    return r == CUDA_SUCCESS ? fake_function_set_attribute(fake_function_of(hfunc), attrib, value) : r;
}

CUresult cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config)
{
    CUresult r = check_function(hfunc);
    if (r == CUDA_SUCCESS && (config < CU_FUNC_CACHE_PREFER_NONE || config > CU_FUNC_CACHE_PREFER_EQUAL))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        fake_function_of(hfunc)->cache_config = config;
    return r;
}

CUresult cuFuncSetSharedMemConfig(CUfunction hfunc, CUsharedconfig config)
{
    CUresult r = check_function(hfunc);
    if (r == CUDA_SUCCESS &&
        (config < CU_SHARED_MEM_CONFIG_DEFAULT_BANK_SIZE || config > CU_SHARED_MEM_CONFIG_EIGHT_BYTE_BANK_SIZE))
        r = CUDA_ERROR_INVALID_VALUE;
    return r;
}

CUresult cuFuncGetName(const char **name, CUfunction hfunc)
{
    CUresult r = check_function(hfunc);
    if (r == CUDA_SUCCESS && name == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *name = fake_function_of(hfunc)->name;
    return r;
}

CUresult cuFuncGetModule(CUmodule *hmod, CUfunction hfunc)
{
    CUresult r = check_function(hfunc);
    if (r == CUDA_SUCCESS && hmod == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *hmod = &fake_function_of(hfunc)->module->handle;
    return r;
}

CUresult cuFuncGetParamInfo(CUfunction func, size_t paramIndex, size_t *paramOffset, size_t *paramSize)
{
    CUresult r = check_function(func);
    if (r == CUDA_SUCCESS && (paramOffset == NULL || paramSize == NULL))
        r = CUDA_ERROR_INVALID_VALUE;
    return r == CUDA_SUCCESS ? fake_function_param_info(fake_function_of(func), paramIndex, paramOffset, paramSize) : r;
}

CUresult cuFuncIsLoaded(CUfunctionLoadingState *state, CUfunction function)
{
    CUresult r = check_function(function);
    if (r == CUDA_SUCCESS && state == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *state = CU_FUNCTION_LOADING_STATE_LOADED;
    return r;
}

CUresult cuFuncLoad(CUfunction function)
{
    return check_function(function);
}

/* --- error strings ------------------------------------------------------------------------ */

static const struct {
    CUresult code;
    const char *name;
    const char *text;
} error_table[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX", "a PTX JIT compilation failed"},
    {CUDA_ERROR_FILE_NOT_FOUND, "CUDA_ERROR_FILE_NOT_FOUND", "file not found"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_PERMITTED, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult error, const char **pStr, int want_name)
{
    if (pStr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof error_table / sizeof error_table[0]; i++) {
        if (error_table[i].code == error) {
            *pStr = want_name ? error_table[i].name : error_table[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 1);
}

CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    return error_lookup(error, pStr, 0);
}
