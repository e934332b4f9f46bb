/*
 * memcheck.c: the memory half of the coverage matrix, an ordinary driver-API program built
 * against cuda.h (and nvml_subset.h) and linked to libcuda and libnvidia-ml. It reaches every
 * memory entry point the way a chosen kind of real program does, so a test can show that each
 * path is enforced by the hook:
 *
 *   memcheck run --case CASE --way WAY --size BYTES
 *     ways:  linked          the link-time symbol (a program linked with -lcuda / -lnvidia-ml)
 *            dlsym           dlopen("libcuda.so.1" / "libnvidia-ml.so.1") + dlsym(handle, name)
 *            dlvsym          the same with dlvsym(handle, name, version): the version node of the
 *                            fake libraries, FASTGSHARE_FAKE_1, or $MEMCHECK_SYMBOL_VERSION
 *            libc-dlvsym     dlsym(libc handle, "dlvsym"), then that (RTLD_DEFAULT, name, version)
 *            gpa-legacy      cuGetProcAddress (11.3 ABI, re-resolved through itself) by base name
 *                            at the version the ABI appeared in, as cudart 11 asks
 *            gpa-v2          cuGetProcAddress_v2 (re-resolved) by base name at that version,
 *                            as cudart 12/13 asks
 *            gpa-runtime     cuGetProcAddress_v2 at CUDA_VERSION of the headers, as
 *                            cudaGetDriverEntryPoint does by default (newest ABI)
 *            The _ptsz cases use the per-thread names and the per-thread-default-stream flag.
 *     allocation cases (each: allocate BYTES-ish, allocate again [the test's limit refuses it],
 *     free the first, allocate again, free; the program always carries on):
 *            alloc alloc-v1 pitch pitch-v1 managed async async-ptsz pool pool-ptsz
 *            array array-v1 array3d array3d-v1 mipmap
 *            vmm   cuMemCreate, cuMemMap, cuMemRetainAllocationHandle, cuMemRelease of both
 *                  handles while mapped (still charged), a create that must be refused, then
 *                  cuMemUnmap (now freed), create again and release
 *     view cases (hold BYTES through cuMemAlloc_v2, then ask): meminfo meminfo-v1 totalmem
 *            totalmem-v1 nvml nvml-v2
 *     Prints one JSON line: case, way, resolved, steps [{op, result}], bytes (one object as the
 *     driver sized it, where the program can see it), desc (array descriptors), view. Exit 0
 *     when it ran, 3 when a symbol could not be resolved, 1 when setup failed, 64 on bad usage.
 *
 *   memcheck resolve     lines on stdin: "cuda SYMBOL BASE SINCE PER_THREAD" or "nvml SYMBOL";
 *                        one JSON line each: is SYMBOL what dlsym(RTLD_DEFAULT) finds, what
 *                        dlsym on the library's handle returns, and what both cuGetProcAddress
 *                        ABIs return for (BASE, SINCE, flag)?
 *   memcheck shell       commands on stdin, one JSON reply line each: "alloc BYTES", "free ID",
 *                        "double-free ID" (cuMemFree twice), "info" (cuMemGetInfo), "total"
 *                        (cuDeviceTotalMem), "quit"
 *   memcheck stress --threads T --iterations N --size BYTES
 *                        T threads, each N rounds of: two allocations then two frees, cycling
 *                        through cuMemAlloc_v2, cuMemAllocAsync, cuMemAllocManaged and
 *                        cuMemCreate+cuMemMap (released while mapped, then unmapped). Prints
 *                        {"ok", "oom", "errors"}; any other error than OOM counts in errors.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nvml_subset.h"

/* The 32-bit v1 ABIs, under the names the driver exports them by (cuda.h maps the plain names
 * to _v2 for programs, so they are declared here with assembler labels). */
typedef struct {
    unsigned int Width, Height;
    CUarray_format Format;
    unsigned int NumChannels;
} array_desc_v1;
typedef struct {
    unsigned int Width, Height, Depth;
    CUarray_format Format;
    unsigned int NumChannels, Flags;
} array3d_desc_v1;
typedef CUresult (*pfn_mem_alloc_v1)(unsigned int *dptr, unsigned int bytesize);
typedef CUresult (*pfn_mem_free_v1)(unsigned int dptr);
typedef CUresult (*pfn_mem_alloc_pitch_v1)(unsigned int *dptr, unsigned int *pitch, unsigned int width,
                                           unsigned int height, unsigned int element_size);
typedef CUresult (*pfn_array_create_v1)(CUarray *handle, const array_desc_v1 *desc);
typedef CUresult (*pfn_array3d_create_v1)(CUarray *handle, const array3d_desc_v1 *desc);
typedef CUresult (*pfn_mem_get_info_v1)(unsigned int *free, unsigned int *total);
typedef CUresult (*pfn_device_total_mem_v1)(unsigned int *bytes, CUdevice dev);
CUresult v1_cuMemAlloc(unsigned int *dptr, unsigned int bytesize) __asm__("cuMemAlloc");
CUresult v1_cuMemFree(unsigned int dptr) __asm__("cuMemFree");
CUresult v1_cuMemAllocPitch(unsigned int *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                            unsigned int element_size) __asm__("cuMemAllocPitch");
CUresult v1_cuArrayCreate(CUarray *handle, const array_desc_v1 *desc) __asm__("cuArrayCreate");
CUresult v1_cuArray3DCreate(CUarray *handle, const array3d_desc_v1 *desc) __asm__("cuArray3DCreate");
CUresult v1_cuMemGetInfo(unsigned int *free, unsigned int *total) __asm__("cuMemGetInfo");
CUresult v1_cuDeviceTotalMem(unsigned int *bytes, CUdevice dev) __asm__("cuDeviceTotalMem");

/* The _ptsz entry points, as a program built with --default-stream per-thread links them. */
CUresult CUDAAPI cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream);
CUresult CUDAAPI cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                              CUstream hStream);
CUresult CUDAAPI cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream);

/* --- symbols and ways ----------------------------------------------------------------------- */

struct sym {
    const char *name; /* the exported (versioned) name */
    const char *base; /* the cuGetProcAddress name; NULL for NVML */
    int version;      /* the CUDA version this ABI appeared in */
    int ptsz;
    int v1; /* a 32-bit v1 ABI: a lookup at the runtime's version would return another ABI */
    void *linked;
};

#define CU_SYM(name, base, version, ptsz) {#name, #base, version, ptsz, 0, (void *)(name)}
#define V1_SYM(name, version) {#name, #name, version, 0, 1, (void *)(v1_##name)}
#define NVML_SYM(name) {#name, NULL, 0, 0, 0, (void *)(name)}

enum way { WAY_LINKED, WAY_DLSYM, WAY_DLVSYM, WAY_LIBC_DLVSYM, WAY_GPA_LEGACY, WAY_GPA_V2, WAY_GPA_RUNTIME, WAY_COUNT };
static const char *const way_names[WAY_COUNT] = {"linked", "dlsym", "dlvsym", "libc-dlvsym", "gpa-legacy", "gpa-v2",
                                                 "gpa-runtime"};

/* The symbol version dlvsym asks for: the fake libraries' version node (their .map files), or
 * MEMCHECK_SYMBOL_VERSION. A library whose symbols carry no version answers NULL (n/a). */
static const char *symbol_version(void)
{
    const char *version = getenv("MEMCHECK_SYMBOL_VERSION");
    return version != NULL && version[0] != '\0' ? version : "FASTGSHARE_FAKE_1";
}

static void *library(const char *soname)
{
    void *handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL)
        fprintf(stderr, "memcheck: dlopen(%s): %s\n", soname, dlerror());
    return handle;
}

/* The C library's dlvsym, asked of its own handle by name, then asked for the name in the
 * global scope (RTLD_DEFAULT): what a tenant tries when dlvsym itself is intercepted. */
static void *libc_dlvsym(const char *name)
{
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (libc == NULL)
        return NULL;
    void *(*lookup)(void *, const char *, const char *) =
        (void *(*)(void *, const char *, const char *))dlsym(libc, "dlvsym");
    return lookup != NULL ? lookup(RTLD_DEFAULT, name, symbol_version()) : NULL;
}

/* cuGetProcAddress of either ABI, re-resolved through itself first (what cudart does). */
static void *proc_address(int v2, const char *base, int version, int ptsz)
{
    void *driver = library("libcuda.so.1");
    if (driver == NULL)
        return NULL;
    cuuint64_t flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
    void *fn = NULL, *again = NULL;
    if (v2) {
        PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(driver, "cuGetProcAddress_v2");
        CUdriverProcAddressQueryResult status;
        if (gpa == NULL || gpa("cuGetProcAddress", &again, 12000, 0, &status) != CUDA_SUCCESS || again == NULL)
            return NULL;
        gpa = (PFN_cuGetProcAddress_v12000)again;
        if (gpa(base, &fn, version, flags, &status) != CUDA_SUCCESS)
            return NULL;
    } else {
        PFN_cuGetProcAddress_v11030 gpa = (PFN_cuGetProcAddress_v11030)dlsym(driver, "cuGetProcAddress");
        if (gpa == NULL || gpa("cuGetProcAddress", &again, 11030, 0) != CUDA_SUCCESS || again == NULL)
            return NULL;
        gpa = (PFN_cuGetProcAddress_v11030)again;
        if (gpa(base, &fn, version, flags) != CUDA_SUCCESS)
            return NULL;
    }
    return fn;
}

/* The entry point reached the given way; NULL when it cannot be (or the way does not apply). */
static void *resolve(enum way way, const struct sym *s)
{
    void *handle;
    if (s->base == NULL) { /* NVML: linked or dlsym only */
        if (way == WAY_LINKED)
            return s->linked;
        if (way == WAY_LIBC_DLVSYM)
            return libc_dlvsym(s->name);
        if ((way != WAY_DLSYM && way != WAY_DLVSYM) || (handle = library("libnvidia-ml.so.1")) == NULL)
            return NULL;
        return way == WAY_DLSYM ? dlsym(handle, s->name) : dlvsym(handle, s->name, symbol_version());
    }
    switch (way) {
    case WAY_LINKED: return s->linked;
    case WAY_DLSYM: return (handle = library("libcuda.so.1")) != NULL ? dlsym(handle, s->name) : NULL;
    case WAY_DLVSYM:
        return (handle = library("libcuda.so.1")) != NULL ? dlvsym(handle, s->name, symbol_version()) : NULL;
    case WAY_LIBC_DLVSYM: return libc_dlvsym(s->name);
    case WAY_GPA_LEGACY: return proc_address(0, s->base, s->version, s->ptsz);
    case WAY_GPA_V2: return proc_address(1, s->base, s->version, s->ptsz);
    case WAY_GPA_RUNTIME: return s->v1 ? NULL : proc_address(1, s->base, CUDA_VERSION, s->ptsz);
    default: return NULL;
    }
}

/* --- output --------------------------------------------------------------------------------- */

struct report {
    char steps[4096];
    size_t len;
    char extra[1024];
};

static void step(struct report *rep, const char *op, CUresult r)
{
    int n = snprintf(rep->steps + rep->len, sizeof rep->steps - rep->len, "%s{\"op\": \"%s\", \"result\": %d}",
                     rep->len ? ", " : "", op, (int)r);
    if (n > 0 && (size_t)n < sizeof rep->steps - rep->len)
        rep->len += (size_t)n;
}

static void extra(struct report *rep, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void extra(struct report *rep, const char *fmt, ...)
{
    size_t used = strlen(rep->extra);
    va_list args;
    va_start(args, fmt);
    vsnprintf(rep->extra + used, sizeof rep->extra - used, fmt, args);
    va_end(args);
}

/* --- setup ---------------------------------------------------------------------------------- */

static CUcontext context;
static CUstream stream;

static int setup(void)
{
    CUdevice dev;
    CUresult r;
    if ((r = cuInit(0)) != CUDA_SUCCESS || (r = cuDeviceGet(&dev, 0)) != CUDA_SUCCESS)
        goto fail;
#if CUDA_VERSION >= 13000
    r = cuCtxCreate(&context, NULL, 0, dev);
#else
    r = cuCtxCreate(&context, 0, dev);
#endif
    if (r != CUDA_SUCCESS || (r = cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "memcheck: setup failed with CUDA error %d\n", (int)r);
    return -1;
}

/* --- allocation cases ------------------------------------------------------------------------ */

/* One live object of a case: a pointer, an array, or a VMM allocation and its mapping. */
struct object {
    CUdeviceptr ptr;
    unsigned int ptr_v1;
    CUarray array;
    CUmipmappedArray mipmap;
    CUmemGenericAllocationHandle handle;
};

struct run {
    const struct case_info *info;
    enum way way;
    size_t size;
    void *alloc_fn, *free_fn;
    CUmemoryPool pool;
    size_t pitch;
    unsigned long long bytes; /* one object, as the driver sized it (0: not visible) */
    /* derived shapes */
    size_t width, height, depth;
    unsigned int levels;
};

struct case_info {
    const char *name;
    struct sym alloc, free;
    CUresult (*alloc_one)(struct run *, struct object *);
    CUresult (*free_one)(struct run *, struct object *);
};

static CUresult alloc_plain(struct run *r, struct object *o)
{
    return ((PFN_cuMemAlloc_v3020)r->alloc_fn)(&o->ptr, r->size);
}

static CUresult alloc_plain_v1(struct run *r, struct object *o)
{
    return ((pfn_mem_alloc_v1)r->alloc_fn)(&o->ptr_v1, (unsigned int)r->size);
}

static CUresult alloc_pitch(struct run *r, struct object *o)
{
    size_t pitch = 0;
    CUresult res = ((PFN_cuMemAllocPitch_v3020)r->alloc_fn)(&o->ptr, &pitch, r->width, r->height, 4);
    if (res == CUDA_SUCCESS) {
        r->pitch = pitch;
        r->bytes = (unsigned long long)pitch * r->height;
    }
    return res;
}

static CUresult alloc_pitch_v1(struct run *r, struct object *o)
{
    unsigned int pitch = 0;
    CUresult res = ((pfn_mem_alloc_pitch_v1)r->alloc_fn)(&o->ptr_v1, &pitch, (unsigned int)r->width,
                                                         (unsigned int)r->height, 4);
    if (res == CUDA_SUCCESS) {
        r->pitch = pitch;
        r->bytes = (unsigned long long)pitch * r->height;
    }
    return res;
}

static CUresult alloc_managed(struct run *r, struct object *o)
{
    return ((PFN_cuMemAllocManaged_v6000)r->alloc_fn)(&o->ptr, r->size, CU_MEM_ATTACH_GLOBAL);
}

static CUresult alloc_async(struct run *r, struct object *o)
{
    return ((PFN_cuMemAllocAsync_v11020)r->alloc_fn)(&o->ptr, r->size, stream);
}

static CUresult alloc_async_ptsz(struct run *r, struct object *o)
{
    return ((PFN_cuMemAllocAsync_v11020_ptsz)r->alloc_fn)(&o->ptr, r->size, NULL);
}

static CUresult alloc_pool(struct run *r, struct object *o)
{
    return ((PFN_cuMemAllocFromPoolAsync_v11020)r->alloc_fn)(&o->ptr, r->size, r->pool, stream);
}

static CUresult alloc_pool_ptsz(struct run *r, struct object *o)
{
    return ((PFN_cuMemAllocFromPoolAsync_v11020_ptsz)r->alloc_fn)(&o->ptr, r->size, r->pool, NULL);
}

static CUresult free_plain(struct run *r, struct object *o)
{
    return ((PFN_cuMemFree_v3020)r->free_fn)(o->ptr);
}

static CUresult free_plain_v1(struct run *r, struct object *o)
{
    return ((pfn_mem_free_v1)r->free_fn)(o->ptr_v1);
}

static CUresult free_async(struct run *r, struct object *o)
{
    return ((PFN_cuMemFreeAsync_v11020)r->free_fn)(o->ptr, stream);
}

static CUresult free_async_ptsz(struct run *r, struct object *o)
{
    return ((PFN_cuMemFreeAsync_v11020_ptsz)r->free_fn)(o->ptr, NULL);
}

#define FLOAT4_BYTES 16u /* CU_AD_FORMAT_FLOAT x 4 channels */

static CUresult alloc_array(struct run *r, struct object *o)
{
    CUDA_ARRAY_DESCRIPTOR d = {.Width = r->width, .Height = r->height, .Format = CU_AD_FORMAT_FLOAT,
                               .NumChannels = 4};
    return ((PFN_cuArrayCreate_v3020)r->alloc_fn)(&o->array, &d);
}

static CUresult alloc_array_v1(struct run *r, struct object *o)
{
    array_desc_v1 d = {(unsigned int)r->width, (unsigned int)r->height, CU_AD_FORMAT_FLOAT, 4};
    return ((pfn_array_create_v1)r->alloc_fn)(&o->array, &d);
}

static CUresult alloc_array3d(struct run *r, struct object *o)
{
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = r->width, .Height = r->height, .Depth = r->depth,
                                 .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    return ((PFN_cuArray3DCreate_v3020)r->alloc_fn)(&o->array, &d);
}

static CUresult alloc_array3d_v1(struct run *r, struct object *o)
{
    array3d_desc_v1 d = {(unsigned int)r->width, (unsigned int)r->height, (unsigned int)r->depth,
                         CU_AD_FORMAT_FLOAT, 4, 0};
    return ((pfn_array3d_create_v1)r->alloc_fn)(&o->array, &d);
}

static CUresult free_array(struct run *r, struct object *o)
{
    return ((PFN_cuArrayDestroy_v2000)r->free_fn)(o->array);
}

static CUresult alloc_mipmap(struct run *r, struct object *o)
{
    CUDA_ARRAY3D_DESCRIPTOR d = {.Width = r->width, .Height = r->height, .Depth = 0,
                                 .Format = CU_AD_FORMAT_FLOAT, .NumChannels = 4};
    return ((PFN_cuMipmappedArrayCreate_v5000)r->alloc_fn)(&o->mipmap, &d, r->levels);
}

static CUresult free_mipmap(struct run *r, struct object *o)
{
    return ((PFN_cuMipmappedArrayDestroy_v5000)r->free_fn)(o->mipmap);
}

static const struct case_info cases[] = {
    {"alloc", CU_SYM(cuMemAlloc_v2, cuMemAlloc, 3020, 0), CU_SYM(cuMemFree_v2, cuMemFree, 3020, 0), alloc_plain,
     free_plain},
    {"alloc-v1", V1_SYM(cuMemAlloc, 2000), V1_SYM(cuMemFree, 2000), alloc_plain_v1, free_plain_v1},
    {"pitch", CU_SYM(cuMemAllocPitch_v2, cuMemAllocPitch, 3020, 0), CU_SYM(cuMemFree_v2, cuMemFree, 3020, 0),
     alloc_pitch, free_plain},
    {"pitch-v1", V1_SYM(cuMemAllocPitch, 2000), V1_SYM(cuMemFree, 2000), alloc_pitch_v1, free_plain_v1},
    {"managed", CU_SYM(cuMemAllocManaged, cuMemAllocManaged, 6000, 0), CU_SYM(cuMemFree_v2, cuMemFree, 3020, 0),
     alloc_managed, free_plain},
    {"async", CU_SYM(cuMemAllocAsync, cuMemAllocAsync, 11020, 0), CU_SYM(cuMemFreeAsync, cuMemFreeAsync, 11020, 0),
     alloc_async, free_async},
    {"async-ptsz", CU_SYM(cuMemAllocAsync_ptsz, cuMemAllocAsync, 11020, 1),
     CU_SYM(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1), alloc_async_ptsz, free_async_ptsz},
    {"pool", CU_SYM(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020, 0),
     CU_SYM(cuMemFreeAsync, cuMemFreeAsync, 11020, 0), alloc_pool, free_async},
    {"pool-ptsz", CU_SYM(cuMemAllocFromPoolAsync_ptsz, cuMemAllocFromPoolAsync, 11020, 1),
     CU_SYM(cuMemFreeAsync_ptsz, cuMemFreeAsync, 11020, 1), alloc_pool_ptsz, free_async_ptsz},
    {"array", CU_SYM(cuArrayCreate_v2, cuArrayCreate, 3020, 0), CU_SYM(cuArrayDestroy, cuArrayDestroy, 2000, 0),
     alloc_array, free_array},
    {"array-v1", V1_SYM(cuArrayCreate, 2000), CU_SYM(cuArrayDestroy, cuArrayDestroy, 2000, 0), alloc_array_v1,
     free_array},
    {"array3d", CU_SYM(cuArray3DCreate_v2, cuArray3DCreate, 3020, 0), CU_SYM(cuArrayDestroy, cuArrayDestroy, 2000, 0),
     alloc_array3d, free_array},
    {"array3d-v1", V1_SYM(cuArray3DCreate, 2000), CU_SYM(cuArrayDestroy, cuArrayDestroy, 2000, 0), alloc_array3d_v1,
     free_array},
    {"mipmap", CU_SYM(cuMipmappedArrayCreate, cuMipmappedArrayCreate, 5000, 0),
     CU_SYM(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, 5000, 0), alloc_mipmap, free_mipmap},
};

/* Shapes from --size: each object is about `size` bytes. */
static void shape(struct run *r)
{
    const char *n = r->info->name;
    if (strncmp(n, "pitch", 5) == 0) {
        r->width = 1100; /* no power of two: the driver's pitch is wider than the row */
        r->height = r->size / 1280;
    } else if (strncmp(n, "array3d", 7) == 0) {
        r->width = 256;
        r->height = 64;
        r->depth = r->size / (256 * 64 * FLOAT4_BYTES);
    } else if (strncmp(n, "array", 5) == 0) {
        r->width = 1024;
        r->height = r->size / (1024 * FLOAT4_BYTES);
    } else if (strcmp(n, "mipmap") == 0) {
        r->width = 2048;
        r->height = r->size / (2048 * FLOAT4_BYTES);
        r->levels = 3;
    } else {
        r->bytes = r->size;
    }
}

static const struct case_info *find_case(const char *name)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (strcmp(cases[i].name, name) == 0)
            return &cases[i];
    return NULL;
}

/* allocate, allocate again (over the limit), free the first, allocate again, free: go on
 * whatever each step returns. */
static void standard_sequence(struct run *r, struct report *rep)
{
    struct object a = {0}, b = {0};
    CUresult res = r->info->alloc_one(r, &a);
    step(rep, "alloc", res);
    int have_a = res == CUDA_SUCCESS;
    res = r->info->alloc_one(r, &b);
    step(rep, "alloc-over-limit", res);
    if (res == CUDA_SUCCESS) /* escaped: tidy up so the rest still runs */
        r->info->free_one(r, &b);
    step(rep, "free", have_a ? r->info->free_one(r, &a) : CUDA_ERROR_INVALID_VALUE);
    res = r->info->alloc_one(r, &b);
    step(rep, "alloc-after-free", res);
    step(rep, "free", res == CUDA_SUCCESS ? r->info->free_one(r, &b) : CUDA_ERROR_INVALID_VALUE);
}

/* --- virtual memory management --------------------------------------------------------------- */

static const struct sym vmm_syms[] = {
    CU_SYM(cuMemCreate, cuMemCreate, 10020, 0),
    CU_SYM(cuMemMap, cuMemMap, 10020, 0),
    CU_SYM(cuMemRetainAllocationHandle, cuMemRetainAllocationHandle, 11000, 0),
    CU_SYM(cuMemRelease, cuMemRelease, 10020, 0),
    CU_SYM(cuMemUnmap, cuMemUnmap, 10020, 0),
};

static int vmm_sequence(struct run *r, struct report *rep)
{
    void *fn[5];
    for (int i = 0; i < 5; i++)
        if ((fn[i] = resolve(r->way, &vmm_syms[i])) == NULL)
            return -1;
    PFN_cuMemCreate_v10020 create = (PFN_cuMemCreate_v10020)fn[0];
    PFN_cuMemMap_v10020 map = (PFN_cuMemMap_v10020)fn[1];
    PFN_cuMemRetainAllocationHandle_v11000 retain = (PFN_cuMemRetainAllocationHandle_v11000)fn[2];
    PFN_cuMemRelease_v10020 release = (PFN_cuMemRelease_v10020)fn[3];
    PFN_cuMemUnmap_v10020 unmap = (PFN_cuMemUnmap_v10020)fn[4];

    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    size_t granularity = 0;
    if (cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
        granularity == 0)
        return -1;
    size_t size = (r->size + granularity - 1) / granularity * granularity;
    r->bytes = size;
    CUdeviceptr va = 0;
    if (cuMemAddressReserve(&va, size, 0, 0, 0) != CUDA_SUCCESS)
        return -1;
    CUmemAccessDesc access = {.location = prop.location, .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};

    CUmemGenericAllocationHandle a = 0, again = 0, b = 0;
    CUresult res = create(&a, size, &prop, 0);
    step(rep, "create", res);
    step(rep, "map", res == CUDA_SUCCESS ? map(va, size, 0, a, 0) : res);
    step(rep, "set-access", cuMemSetAccess(va, size, &access, 1));
    step(rep, "retain", retain(&again, (void *)(uintptr_t)va));
    step(rep, "release", release(a));
    step(rep, "release-retained", release(again));           /* still mapped: still charged */
    res = create(&b, size, &prop, 0);
    step(rep, "create-over-limit", res);
    if (res == CUDA_SUCCESS)
        release(b);
    step(rep, "unmap", unmap(va, size));                      /* the last reference: now freed */
    res = create(&b, size, &prop, 0);
    step(rep, "create-after-unmap", res);
    step(rep, "release", res == CUDA_SUCCESS ? release(b) : CUDA_ERROR_INVALID_VALUE);
    cuMemAddressFree(va, size);
    return 0;
}

/* --- views ----------------------------------------------------------------------------------- */

static const struct sym view_syms[] = {
    CU_SYM(cuMemGetInfo_v2, cuMemGetInfo, 3020, 0), V1_SYM(cuMemGetInfo, 2000),
    CU_SYM(cuDeviceTotalMem_v2, cuDeviceTotalMem, 3020, 0), V1_SYM(cuDeviceTotalMem, 2000),
    NVML_SYM(nvmlDeviceGetMemoryInfo), NVML_SYM(nvmlDeviceGetMemoryInfo_v2),
};
static const char *const view_cases[] = {"meminfo", "meminfo-v1", "totalmem", "totalmem-v1", "nvml", "nvml-v2"};

static int view_sequence(int which, struct run *r, struct report *rep)
{
    void *fn = resolve(r->way, &view_syms[which]);
    if (fn == NULL)
        return -1;
    CUdeviceptr held = 0;
    step(rep, "hold", cuMemAlloc_v2(&held, r->size));
    unsigned long long total = 0, free_bytes = 0, used = 0;
    CUresult res = CUDA_ERROR_UNKNOWN;
    switch (which) {
    case 0: {
        size_t f = 0, t = 0;
        res = ((PFN_cuMemGetInfo_v3020)fn)(&f, &t);
        free_bytes = f, total = t;
        break;
    }
    case 1: {
        unsigned int f = 0, t = 0;
        res = ((pfn_mem_get_info_v1)fn)(&f, &t);
        free_bytes = f, total = t;
        break;
    }
    case 2: {
        size_t t = 0;
        res = ((PFN_cuDeviceTotalMem_v3020)fn)(&t, 0);
        total = t;
        break;
    }
    case 3: {
        unsigned int t = 0;
        res = ((pfn_device_total_mem_v1)fn)(&t, 0);
        total = t;
        break;
    }
    case 4:
    case 5: {
        nvmlDevice_t device;
        if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetHandleByIndex_v2(0, &device) != NVML_SUCCESS)
            return -1;
        if (which == 4) {
            nvmlMemory_t m;
            res = (CUresult)((PFN_nvmlDeviceGetMemoryInfo)fn)(device, &m);
            total = m.total, free_bytes = m.free, used = m.used;
        } else {
            nvmlMemory_v2_t m = {.version = nvmlMemory_v2};
            res = (CUresult)((PFN_nvmlDeviceGetMemoryInfo_v2)fn)(device, &m);
            total = m.total, free_bytes = m.free, used = m.used;
        }
        nvmlShutdown();
        break;
    }
    default: break;
    }
    step(rep, "query", res);
    extra(rep, ", \"view\": {\"total\": %llu, \"free\": %llu, \"used\": %llu}", total, free_bytes, used);
    if (held != 0)
        cuMemFree_v2(held);
    return 0;
}

/* --- run ------------------------------------------------------------------------------------- */

static int run_case(const char *name, enum way way, size_t size)
{
    struct run r = {.way = way, .size = size};
    struct report rep = {.len = 0};
    int resolved = 1;
    if (setup() != 0)
        return 1;
    int view = -1;
    for (int i = 0; i < (int)(sizeof view_cases / sizeof view_cases[0]); i++)
        if (strcmp(view_cases[i], name) == 0)
            view = i;
    if (view >= 0) {
        resolved = view_sequence(view, &r, &rep) == 0;
    } else if (strcmp(name, "vmm") == 0) {
        resolved = vmm_sequence(&r, &rep) == 0;
    } else {
        r.info = find_case(name);
        if (r.info == NULL) {
            fprintf(stderr, "memcheck: unknown case %s\n", name);
            return 64;
        }
        shape(&r);
        if (strncmp(name, "pool", 4) == 0) {
            CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
            if (cuMemPoolCreate(&r.pool, &props) != CUDA_SUCCESS)
                return 1;
        }
        r.alloc_fn = resolve(way, &r.info->alloc);
        r.free_fn = resolve(way, &r.info->free);
        resolved = r.alloc_fn != NULL && r.free_fn != NULL;
        if (resolved)
            standard_sequence(&r, &rep);
        if (r.pool != NULL)
            cuMemPoolDestroy(r.pool);
    }
    printf("{\"pid\": %d, \"case\": \"%s\", \"way\": \"%s\", \"resolved\": %s, \"steps\": [%s], "
           "\"bytes\": %llu, \"desc\": {\"width\": %zu, \"height\": %zu, \"depth\": %zu, \"levels\": %u, "
           "\"pitch\": %zu}%s}\n",
           (int)getpid(), name, way_names[way], resolved ? "true" : "false", rep.steps, r.bytes, r.width, r.height,
           r.depth, r.levels, r.pitch, rep.extra);
    fflush(stdout);
    return resolved ? 0 : 3;
}

/* --- resolve: the symbol-consistency check ---------------------------------------------------- */

static const char *yes(int value)
{
    return value ? "true" : "false";
}

static int resolve_lines(void)
{
    char line[512];
    void *driver = library("libcuda.so.1"), *nvml = library("libnvidia-ml.so.1");
    while (fgets(line, sizeof line, stdin) != NULL) {
        char kind[8], symbol[128], base[128];
        int since = 0, per_thread = 0;
        int fields = sscanf(line, "%7s %127s %127s %d %d", kind, symbol, base, &since, &per_thread);
        if (fields < 2)
            continue;
        void *exported = dlsym(RTLD_DEFAULT, symbol); /* with the hook preloaded: its wrapper */
        if (strcmp(kind, "nvml") == 0) {
            void *by_handle = nvml != NULL ? dlsym(nvml, symbol) : NULL;
            printf("{\"symbol\": \"%s\", \"exported\": %s, \"dlsym\": %s}\n", symbol, yes(exported != NULL),
                   yes(exported != NULL && by_handle == exported));
            continue;
        }
        if (fields != 5)
            continue;
        void *by_handle = driver != NULL ? dlsym(driver, symbol) : NULL;
        void *legacy = proc_address(0, base, since, per_thread);
        void *v2 = proc_address(1, base, since, per_thread);
        printf("{\"symbol\": \"%s\", \"exported\": %s, \"dlsym\": %s, \"gpa_legacy\": %s, \"gpa_v2\": %s}\n", symbol,
               yes(exported != NULL), yes(exported != NULL && by_handle == exported),
               yes(exported != NULL && legacy == exported), yes(exported != NULL && v2 == exported));
    }
    fflush(stdout);
    return 0;
}

/* --- shell: an interactive tenant for the end-to-end tests ----------------------------------- */

#define MAX_HELD 256

static int shell(void)
{
    CUdeviceptr held[MAX_HELD] = {0};
    if (setup() != 0)
        return 1;
    printf("{\"op\": \"ready\", \"pid\": %d}\n", (int)getpid());
    fflush(stdout);
    char line[256];
    while (fgets(line, sizeof line, stdin) != NULL) {
        unsigned long long arg = 0;
        CUresult r;
        if (sscanf(line, "alloc %llu", &arg) == 1) {
            int id = 0;
            while (id < MAX_HELD && held[id] != 0)
                id++;
            CUdeviceptr ptr = 0;
            r = id < MAX_HELD ? cuMemAlloc_v2(&ptr, (size_t)arg) : CUDA_ERROR_INVALID_VALUE;
            if (r == CUDA_SUCCESS)
                held[id] = ptr;
            printf("{\"op\": \"alloc\", \"result\": %d, \"id\": %d}\n", (int)r, r == CUDA_SUCCESS ? id : -1);
        } else if (sscanf(line, "free %llu", &arg) == 1) {
            r = arg < MAX_HELD && held[arg] != 0 ? cuMemFree_v2(held[arg]) : CUDA_ERROR_INVALID_VALUE;
            if (r == CUDA_SUCCESS)
                held[arg] = 0;
            printf("{\"op\": \"free\", \"result\": %d}\n", (int)r);
        } else if (sscanf(line, "double-free %llu", &arg) == 1) {
            CUresult first = CUDA_ERROR_INVALID_VALUE, second = CUDA_ERROR_INVALID_VALUE;
            if (arg < MAX_HELD && held[arg] != 0) {
                first = cuMemFree_v2(held[arg]);
                second = cuMemFree_v2(held[arg]);
                held[arg] = 0;
            }
            printf("{\"op\": \"double-free\", \"result\": %d, \"second\": %d}\n", (int)first, (int)second);
        } else if (strncmp(line, "info", 4) == 0) {
            size_t free_bytes = 0, total = 0;
            r = cuMemGetInfo_v2(&free_bytes, &total);
            printf("{\"op\": \"info\", \"result\": %d, \"free\": %zu, \"total\": %zu}\n", (int)r, free_bytes, total);
        } else if (strncmp(line, "total", 5) == 0) {
            size_t total = 0;
            r = cuDeviceTotalMem_v2(&total, 0);
            printf("{\"op\": \"total\", \"result\": %d, \"total\": %zu}\n", (int)r, total);
        } else if (strncmp(line, "quit", 4) == 0) {
            break;
        } else {
            printf("{\"op\": \"error\", \"result\": -1}\n");
        }
        fflush(stdout);
    }
    return 0;
}

/* --- stress: many threads allocating and freeing through several paths at once ----------------- */

struct stress {
    int iterations;
    size_t size;
    long ok, oom, errors; /* atomic */
};

struct vmm_slot {
    CUdeviceptr va;
    CUmemGenericAllocationHandle handle;
};

static void count(struct stress *st, CUresult r)
{
    long *counter = r == CUDA_SUCCESS ? &st->ok : r == CUDA_ERROR_OUT_OF_MEMORY ? &st->oom : &st->errors;
    __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED);
}

/* Allocates one object through path kind (0..3); CUDA_SUCCESS or the error. */
static CUresult stress_alloc(int kind, size_t size, CUdeviceptr *ptr, struct vmm_slot *vmm)
{
    switch (kind) {
    case 0: return cuMemAlloc_v2(ptr, size);
    case 1: return cuMemAllocAsync(ptr, size, stream);
    case 2: return cuMemAllocManaged(ptr, size, CU_MEM_ATTACH_GLOBAL);
    default: {
        CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                    .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
        CUresult r = cuMemCreate(&vmm->handle, size, &prop, 0);
        if (r != CUDA_SUCCESS)
            return r;
        if ((r = cuMemMap(vmm->va, size, 0, vmm->handle, 0)) != CUDA_SUCCESS) {
            cuMemRelease(vmm->handle);
            return r;
        }
        return cuMemRelease(vmm->handle); /* the mapping keeps it alive */
    }
    }
}

static CUresult stress_free(int kind, size_t size, CUdeviceptr ptr, struct vmm_slot *vmm)
{
    switch (kind) {
    case 1: return cuMemFreeAsync(ptr, stream);
    case 3: return cuMemUnmap(vmm->va, size);
    default: return cuMemFree_v2(ptr);
    }
}

static void *stress_worker(void *arg)
{
    struct stress *st = arg;
    if (cuCtxSetCurrent(context) != CUDA_SUCCESS) {
        __atomic_fetch_add(&st->errors, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    struct vmm_slot vmm[2] = {{0}, {0}};
    for (int i = 0; i < 2; i++)
        if (cuMemAddressReserve(&vmm[i].va, st->size, 0, 0, 0) != CUDA_SUCCESS)
            __atomic_fetch_add(&st->errors, 1, __ATOMIC_RELAXED);
    for (int round = 0; round < st->iterations; round++) {
        CUdeviceptr ptr[2] = {0, 0};
        CUresult got[2];
        int kind[2] = {round % 4, (round + 1) % 4};
        for (int i = 0; i < 2; i++)
            count(st, got[i] = stress_alloc(kind[i], st->size, &ptr[i], &vmm[i]));
        for (int i = 0; i < 2; i++)
            if (got[i] == CUDA_SUCCESS)
                count(st, stress_free(kind[i], st->size, ptr[i], &vmm[i]));
    }
    for (int i = 0; i < 2; i++)
        cuMemAddressFree(vmm[i].va, st->size);
    return NULL;
}

static int stress_run(int threads, int iterations, size_t size)
{
    if (setup() != 0)
        return 1;
    struct stress st = {.iterations = iterations, .size = size};
    pthread_t ids[64];
    int started = 0;
    for (; started < threads && started < 64; started++)
        if (pthread_create(&ids[started], NULL, stress_worker, &st) != 0)
            break;
    for (int i = 0; i < started; i++)
        pthread_join(ids[i], NULL);
    printf("{\"pid\": %d, \"threads\": %d, \"ok\": %ld, \"oom\": %ld, \"errors\": %ld}\n", (int)getpid(), started,
           st.ok, st.oom, st.errors);
    fflush(stdout);
    return st.errors == 0 ? 0 : 2;
}

/* --- main ------------------------------------------------------------------------------------ */

static void usage(void)
{
    fprintf(stderr, "usage: memcheck run --case CASE --way linked|dlsym|dlvsym|libc-dlvsym|gpa-legacy|gpa-v2|gpa-runtime "
                    "--size BYTES\n       memcheck resolve < rows\n       memcheck shell\n"
                    "       memcheck stress --threads T --iterations N --size BYTES\n");
    exit(64);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    if (strcmp(argv[1], "resolve") == 0)
        return resolve_lines();
    if (strcmp(argv[1], "shell") == 0)
        return shell();
    if (strcmp(argv[1], "stress") == 0 && argc == 8 && strcmp(argv[2], "--threads") == 0 &&
        strcmp(argv[4], "--iterations") == 0 && strcmp(argv[6], "--size") == 0)
        return stress_run(atoi(argv[3]), atoi(argv[5]), (size_t)strtoull(argv[7], NULL, 10));
    if (strcmp(argv[1], "run") != 0)
        usage();
    const char *name = NULL;
    int way = -1;
    size_t size = 40u << 20;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--case") == 0) {
            name = argv[i + 1];
        } else if (strcmp(argv[i], "--way") == 0) {
            for (int w = 0; w < WAY_COUNT; w++)
                if (strcmp(argv[i + 1], way_names[w]) == 0)
                    way = w;
        } else if (strcmp(argv[i], "--size") == 0) {
            char *end;
            errno = 0;
            size = (size_t)strtoull(argv[i + 1], &end, 10);
            if (errno != 0 || *end != '\0' || size == 0)
                usage();
        } else {
            usage();
        }
    }
    if (name == NULL || way < 0 || argc % 2 != 0)
        usage();
    return run_case(name, (enum way)way, size);
}
