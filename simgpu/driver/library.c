/*
 * library.c: the CUDA 12 library API and the linker of the simulated driver, on the modules of
 * fake_resources.c.
 *
 * Libraries: cuLibraryLoadData, cuLibraryLoadFromFile (options accepted, logs empty),
 * cuLibraryUnload, cuLibraryGetModule, cuLibraryGetKernel, cuLibraryGetKernelCount,
 * cuLibraryEnumerateKernels, cuLibraryGetGlobal, cuLibraryGetManaged (the variable's memory),
 * cuKernelGetFunction, cuKernelGetLibrary, cuKernelGetName, cuKernelGetAttribute,
 * cuKernelSetAttribute, cuKernelSetCacheConfig, cuKernelGetParamInfo. A library holds one module
 * (one device, contexts share it); a CUkernel is its module's CUfunction, so a launch accepts
 * either, as the real driver's does.
 *
 * Linker: cuLinkCreate, cuLinkAddData, cuLinkAddFile (v1 and _v2 ABIs), cuLinkComplete,
 * cuLinkDestroy. The output is an ELF cubin (module_image.c writes it) whose kernels and variables
 * are the union of the inputs'; a static library input (`!<arch>`) adds its members' images,
 * an NVVM (LTO) input cannot be read and makes every kernel name resolve.
 */
#include "modules.h"

#include <stdlib.h>
#include <string.h>

#define FAKE_LIBRARY_MAGIC 0x4c494231u
#define FAKE_LINK_MAGIC 0x4c4e4b31u
#define AR_MAGIC "!<arch>\n"
#define AR_HEADER 60u

struct CUlib_st {
    uint32_t magic;
    struct fake_module *module;
};

struct CUlinkState_st {
    uint32_t magic;
    struct image_info merged;
    unsigned int inputs;
    void *cubin; /* cuLinkComplete's output, owned until cuLinkDestroy */
};

/* --- libraries ------------------------------------------------------------------------------ */

static int library_valid(CUlibrary library)
{
    return library != NULL && library->magic == FAKE_LIBRARY_MAGIC;
}

static CUresult library_from_image(CUlibrary *library, const void *code, size_t size)
{
    CUlibrary lib = calloc(1, sizeof *lib);
    if (lib == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = fake_module_from_image(&lib->module, code, size);
    if (r != CUDA_SUCCESS) {
        free(lib);
        return r;
    }
    lib->magic = FAKE_LIBRARY_MAGIC;
    lib->module->library = lib;
    *library = lib;
    return CUDA_SUCCESS;
}

CUresult cuLibraryLoadData(CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,
                           unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                           void **libraryOptionValues, unsigned int numLibraryOptions)
{
    (void)libraryOptions;
    (void)libraryOptionValues;
    (void)numLibraryOptions;
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (library == NULL || code == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    r = library_from_image(library, code, 0);
    fake_jit_options_done(numJitOptions, jitOptions, jitOptionsValues);
    return r;
}

CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *fileName, CUjit_option *jitOptions,
                               void **jitOptionsValues, unsigned int numJitOptions, CUlibraryOption *libraryOptions,
                               void **libraryOptionValues, unsigned int numLibraryOptions)
{
    (void)libraryOptions;
    (void)libraryOptionValues;
    (void)numLibraryOptions;
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (library == NULL || fileName == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    void *data;
    size_t size;
    if ((r = fake_read_file(fileName, &data, &size)) != CUDA_SUCCESS)
        return r;
    r = library_from_image(library, data, size);
    free(data);
    fake_jit_options_done(numJitOptions, jitOptions, jitOptionsValues);
    return r;
}

CUresult cuLibraryUnload(CUlibrary library)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!library_valid(library))
        return CUDA_ERROR_INVALID_HANDLE;
    library->magic = 0;
    fake_module_free(library->module);
    free(library);
    return CUDA_SUCCESS;
}

static CUresult check_library(CUlibrary library)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && !library_valid(library))
        r = CUDA_ERROR_INVALID_HANDLE;
    return r;
}

CUresult cuLibraryGetModule(CUmodule *pMod, CUlibrary library)
{
    CUresult r = check_library(library);
    if (r == CUDA_SUCCESS && pMod == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pMod = &library->module->handle;
    return r;
}

CUresult cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name)
{
    CUresult r = check_library(library);
    if (r == CUDA_SUCCESS && (pKernel == NULL || name == NULL || name[0] == '\0'))
        r = CUDA_ERROR_INVALID_VALUE;
    struct fake_function *f;
    if (r == CUDA_SUCCESS && (r = fake_module_function(library->module, name, &f)) == CUDA_SUCCESS)
        *pKernel = (CUkernel)&f->handle; /* a CUkernel is its CUfunction */
    return r;
}

CUresult cuLibraryGetKernelCount(unsigned int *count, CUlibrary lib)
{
    CUresult r = check_library(lib);
    if (r == CUDA_SUCCESS && count == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *count = (unsigned int)lib->module->image.kernel_count;
    return r;
}

CUresult cuLibraryEnumerateKernels(CUkernel *kernels, unsigned int numKernels, CUlibrary lib)
{
    CUresult r = check_library(lib);
    if (r == CUDA_SUCCESS && kernels == NULL && numKernels > 0)
        r = CUDA_ERROR_INVALID_VALUE;
    const struct image_info *image = r == CUDA_SUCCESS ? &lib->module->image : NULL;
    for (unsigned int i = 0; r == CUDA_SUCCESS && i < numKernels && i < image->kernel_count; i++) {
        struct fake_function *f;
        if ((r = fake_module_function(lib->module, image->kernels[i].name, &f)) == CUDA_SUCCESS)
            kernels[i] = (CUkernel)&f->handle;
    }
    return r;
}

CUresult cuLibraryGetGlobal(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)
{
    CUresult r = check_library(library);
    if (r == CUDA_SUCCESS && name == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        r = fake_ready_with_context(); /* the memory is the current context's */
    return r == CUDA_SUCCESS ? fake_module_global(library->module, name, dptr, bytes) : r;
}

CUresult cuLibraryGetManaged(CUdeviceptr *dptr, size_t *bytes, CUlibrary library, const char *name)
{
    return cuLibraryGetGlobal(dptr, bytes, library, name);
}

/* --- kernels -------------------------------------------------------------------------------- */

static CUresult check_kernel(CUkernel kernel)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && !fake_function_valid((CUfunction)kernel))
        r = CUDA_ERROR_INVALID_HANDLE;
    return r;
}

CUresult cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    CUresult r = check_kernel(kernel);
    if (r == CUDA_SUCCESS && pFunc == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        r = fake_ready_with_context();
    if (r == CUDA_SUCCESS)
        *pFunc = (CUfunction)kernel;
    return r;
}

CUresult cuKernelGetLibrary(CUlibrary *pLib, CUkernel kernel)
{
    CUresult r = check_kernel(kernel);
    if (r == CUDA_SUCCESS && pLib == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    CUlibrary lib = r == CUDA_SUCCESS ? fake_function_of((CUfunction)kernel)->module->library : NULL;
    if (r == CUDA_SUCCESS && lib == NULL)
        r = CUDA_ERROR_INVALID_HANDLE; /* a module's function, not a library's kernel */
    if (r == CUDA_SUCCESS)
        *pLib = lib;
    return r;
}

CUresult cuKernelGetName(const char **name, CUkernel hfunc)
{
    CUresult r = check_kernel(hfunc);
    if (r == CUDA_SUCCESS && name == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *name = fake_function_of((CUfunction)hfunc)->name;
    return r;
}

CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)
{
    CUresult r = check_kernel(kernel);
    if (r == CUDA_SUCCESS && (pi == NULL || dev != 0))
        r = dev != 0 ? CUDA_ERROR_INVALID_DEVICE : CUDA_ERROR_INVALID_VALUE;
    return r == CUDA_SUCCESS ? fake_function_get_attribute(fake_function_of((CUfunction)kernel), attrib, pi) : r;
}

CUresult cuKernelSetAttribute(CUfunction_attribute attrib, int val, CUkernel kernel, CUdevice dev)
{
    CUresult r = check_kernel(kernel);
    if (r == CUDA_SUCCESS && dev != 0)
        r = CUDA_ERROR_INVALID_DEVICE;
    return r == CUDA_SUCCESS ? fake_function_set_attribute(fake_function_of((CUfunction)kernel), attrib, val) : r;
}

CUresult cuKernelSetCacheConfig(CUkernel kernel, CUfunc_cache config, CUdevice dev)
{
    CUresult r = check_kernel(kernel);
    if (r == CUDA_SUCCESS && dev != 0)
        r = CUDA_ERROR_INVALID_DEVICE;
    return r == CUDA_SUCCESS ? cuFuncSetCacheConfig((CUfunction)kernel, config) : r;
}

CUresult cuKernelGetParamInfo(CUkernel kernel, size_t paramIndex, size_t *paramOffset, size_t *paramSize)
{
    return cuFuncGetParamInfo((CUfunction)kernel, paramIndex, paramOffset, paramSize);
}

/* --- the linker ----------------------------------------------------------------------------- */

static int link_valid(CUlinkState state)
{
    return state != NULL && state->magic == FAKE_LINK_MAGIC;
}

CUresult cuLinkCreate_v2(unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (stateOut == NULL || (numOptions > 0 && (options == NULL || optionValues == NULL)))
        return CUDA_ERROR_INVALID_VALUE;
    CUlinkState state = calloc(1, sizeof *state);
    if (state == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    state->magic = FAKE_LINK_MAGIC;
    fake_jit_options_done(numOptions, options, optionValues);
    *stateOut = state;
    return CUDA_SUCCESS;
}

CUresult cuLinkCreate(unsigned int numOptions, CUjit_option *options, void **optionValues, CUlinkState *stateOut)
{
    return cuLinkCreate_v2(numOptions, options, optionValues, stateOut);
}

static CUresult merge_image(CUlinkState state, const void *data, size_t size)
{
    struct image_info info;
    enum image_status status = image_parse(data, size, &info);
    if (status == IMAGE_OK) {
        status = image_merge(&state->merged, &info);
        image_free(&info);
    }
    return status == IMAGE_OK ? CUDA_SUCCESS : status == IMAGE_NO_MEMORY ? CUDA_ERROR_OUT_OF_MEMORY
                                                                         : CUDA_ERROR_INVALID_IMAGE;
}

/* A static library: every member that is an image adds its names (the others, e.g. its symbol
 * index, add nothing). */
static CUresult merge_archive(CUlinkState state, const unsigned char *data, size_t size)
{
    size_t at = strlen(AR_MAGIC);
    while (at + AR_HEADER <= size) {
        char digits[11] = {0};
        memcpy(digits, data + at + 48, 10);
        size_t member = (size_t)strtoull(digits, NULL, 10);
        if (member > size - at - AR_HEADER)
            return CUDA_ERROR_INVALID_IMAGE;
        if (merge_image(state, data + at + AR_HEADER, member) == CUDA_ERROR_OUT_OF_MEMORY)
            return CUDA_ERROR_OUT_OF_MEMORY;
        at += AR_HEADER + member + (member & 1);
    }
    return CUDA_SUCCESS;
}

static CUresult add_input(CUlinkState state, CUjitInputType type, const void *data, size_t size)
{
    CUresult r;
    if (type == CU_JIT_INPUT_NVVM) {
        state->merged.any_name = 1; /* LTO IR cannot be read: any kernel name resolves */
        r = CUDA_SUCCESS;
    } else if (type == CU_JIT_INPUT_LIBRARY && size >= strlen(AR_MAGIC) &&
               memcmp(data, AR_MAGIC, strlen(AR_MAGIC)) == 0) {
        r = merge_archive(state, data, size);
    } else {
        r = merge_image(state, data, size);
    }
    state->inputs += r == CUDA_SUCCESS;
    return r;
}

static CUresult check_input(CUlinkState state, CUjitInputType type, unsigned int numOptions, CUjit_option *options,
                            void **optionValues)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && !link_valid(state))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS && ((unsigned int)type >= CU_JIT_NUM_INPUT_TYPES ||
                              (numOptions > 0 && (options == NULL || optionValues == NULL))))
        r = CUDA_ERROR_INVALID_VALUE;
    return r;
}

CUresult cuLinkAddData_v2(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                          unsigned int numOptions, CUjit_option *options, void **optionValues)
{
    (void)name;
    CUresult r = check_input(state, type, numOptions, options, optionValues);
    if (r == CUDA_SUCCESS && (data == NULL || size == 0))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        r = add_input(state, type, data, size);
    fake_jit_options_done(numOptions, options, optionValues);
    return r;
}

CUresult cuLinkAddData(CUlinkState state, CUjitInputType type, void *data, size_t size, const char *name,
                       unsigned int numOptions, CUjit_option *options, void **optionValues)
{
    return cuLinkAddData_v2(state, type, data, size, name, numOptions, options, optionValues);
}

CUresult cuLinkAddFile_v2(CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions,
                          CUjit_option *options, void **optionValues)
{
    CUresult r = check_input(state, type, numOptions, options, optionValues);
    if (r == CUDA_SUCCESS && path == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    void *data = NULL;
    size_t size = 0;
    if (r == CUDA_SUCCESS)
        r = fake_read_file(path, &data, &size);
    if (r == CUDA_SUCCESS)
        r = add_input(state, type, data, size);
    free(data);
    fake_jit_options_done(numOptions, options, optionValues);
    return r;
}

CUresult cuLinkAddFile(CUlinkState state, CUjitInputType type, const char *path, unsigned int numOptions,
                       CUjit_option *options, void **optionValues)
{
    return cuLinkAddFile_v2(state, type, path, numOptions, options, optionValues);
}

CUresult cuLinkComplete(CUlinkState state, void **cubinOut, size_t *sizeOut)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!link_valid(state))
        return CUDA_ERROR_INVALID_HANDLE;
    if (cubinOut == NULL || sizeOut == NULL || state->inputs == 0)
        return CUDA_ERROR_INVALID_VALUE;
    size_t size;
    void *cubin = image_write_cubin(&state->merged, &size);
    if (cubin == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    free(state->cubin);
    state->cubin = cubin;
    *cubinOut = cubin;
    *sizeOut = size;
    return CUDA_SUCCESS;
}

CUresult cuLinkDestroy(CUlinkState state)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!link_valid(state))
        return CUDA_ERROR_INVALID_HANDLE;
    state->magic = 0;
    image_free(&state->merged);
    free(state->cubin);
    free(state);
    return CUDA_SUCCESS;
}
