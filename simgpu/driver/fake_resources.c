/*
 * fake_resources.c: the fake libcuda.so.1's modules, streams and error strings (memory is in
 * fake_memory.c).
 *
 * Deviations from the real driver, on purpose:
 *   - a module image is any NUL-terminated string starting "FAKECUBIN"; cuModuleGetFunction
 *     accepts any name (a fake kernel's run time is its first parameter, see fake_launch.c);
 *   - launches are synchronous, so stream synchronisation has nothing to wait for.
 */
#include "fake_internal.h"

#include "gpu_state.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_IMAGE_PREFIX "FAKECUBIN"

/* --- modules and functions ---------------------------------------------------------------- */

static pthread_mutex_t objects_lock = PTHREAD_MUTEX_INITIALIZER; /* module function lists */

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (strncmp(image, FAKE_IMAGE_PREFIX, strlen(FAKE_IMAGE_PREFIX)) != 0)
        return CUDA_ERROR_INVALID_IMAGE;
    CUmodule mod = calloc(1, sizeof *mod);
    if (mod == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    mod->magic = FAKE_MODULE_MAGIC;
    *module = mod;
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (hmod == NULL || hmod->magic != FAKE_MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    if (hfunc == NULL || name == NULL || name[0] == '\0' || strlen(name) >= sizeof hmod->functions->name)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&objects_lock);
    CUfunction f = hmod->functions;
    while (f != NULL && strcmp(f->name, name) != 0)
        f = f->next;
    if (f == NULL && (f = calloc(1, sizeof *f)) != NULL) {
        f->magic = FAKE_FUNC_MAGIC;
        snprintf(f->name, sizeof f->name, "%s", name);
        f->next = hmod->functions;
        hmod->functions = f;
    }
    pthread_mutex_unlock(&objects_lock);
    if (f == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *hfunc = f;
    return CUDA_SUCCESS;
}

CUresult cuModuleUnload(CUmodule hmod)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hmod == NULL || hmod->magic != FAKE_MODULE_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&objects_lock);
    CUfunction f = hmod->functions;
    while (f != NULL) {
        CUfunction next = f->next;
        f->magic = 0;
        free(f);
        f = next;
    }
    hmod->magic = 0;
    pthread_mutex_unlock(&objects_lock);
    free(hmod);
    return CUDA_SUCCESS;
}

int fake_function_valid(CUfunction f)
{
    return f != NULL && f->magic == FAKE_FUNC_MAGIC;
}

/* --- streams ------------------------------------------------------------------------------ */

int fake_stream_valid(CUstream stream)
{
    return stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD ||
           stream->magic == FAKE_STREAM_MAGIC;
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (phStream == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUstream stream = calloc(1, sizeof *stream);
    if (stream == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    stream->magic = FAKE_STREAM_MAGIC;
    stream->flags = Flags;
    *phStream = stream;
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD ||
        hStream->magic != FAKE_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    hStream->magic = 0;
    free(hStream);
    return CUDA_SUCCESS;
}

static CUresult stream_synchronize(CUstream hStream)
{
    CUresult r = fake_ready_with_context();
    if (r == CUDA_SUCCESS && !fake_stream_valid(hStream))
        r = CUDA_ERROR_INVALID_HANDLE;
    return r; /* launches are synchronous: nothing is ever pending */
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    return stream_synchronize(hStream);
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    return stream_synchronize(hStream);
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
