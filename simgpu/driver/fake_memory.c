/*
 * fake_memory.c: every memory entry point of the fake libcuda.so.1, accounted against the pool
 * shared by all processes of the fake GPU (gpu_state.c): linear memory (cuMemAlloc v1 and v2,
 * pitched, managed), stream-ordered memory and pools (cuMemAllocAsync, cuMemAllocFromPoolAsync
 * and their _ptsz variants, cuMemFreeAsync, cuMemPoolCreate/Destroy, the default pool),
 * virtual memory management (cuMemCreate/Release, cuMemGetAllocationGranularity,
 * cuMemAddressReserve/Free, cuMemMap/Unmap, cuMemSetAccess, cuMemRetainAllocationHandle),
 * CUDA arrays (cuArrayCreate, cuArray3DCreate, v1 and v2, cuArrayDestroy), mipmapped arrays and
 * the memory views (cuMemGetInfo v1 and v2).
 *
 * Semantics follow the driver where tests can see them: a VMM allocation's memory is freed when
 * its last handle reference AND its last mapping are gone; cuMemFree frees any device pointer,
 * stream-ordered ones included; the v1 ABIs hand out pointers below 4 GiB. Deviations, on
 * purpose:
 *   - device pointers, VA ranges and handles are process-local numbers, not addresses;
 *   - stream-ordered calls complete at once (launches are synchronous too), and a pool keeps
 *     nothing cached: a free returns its bytes to the shared pool immediately;
 *   - the pitch is round_up(width, FASTGSHARE_FAKE_GPU_PITCH_ALIGN) (default 256 bytes);
 *     allocation granularity is 2 MiB; an array is charged width x height x depth x channels x
 *     channel size, for the eight classic formats only (others: CUDA_ERROR_NOT_SUPPORTED), and
 *     a mipmapped array the sum of its levels;
 *   - one table, searched linearly: fine for tests, not for millions of allocations.
 */
#include "fake_internal.h"

#include "gpu_state.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PTR_BASE UINT64_C(0x7f0000000000)    /* 64-bit device pointers */
#define PTR_V1_BASE UINT64_C(0x10000000)     /* v1 (32-bit) device pointers */
#define PTR_V1_END UINT64_C(0xf0000000)
#define VA_BASE UINT64_C(0x7e0000000000)     /* cuMemAddressReserve ranges */
#define PTR_ALIGN UINT64_C(256)
#define GRANULARITY (UINT64_C(2) << 20)
#define DEFAULT_PITCH_ALIGN 256u
#define ENV_PITCH_ALIGN "FASTGSHARE_FAKE_GPU_PITCH_ALIGN"

#define FAKE_ARRAY_MAGIC 0x41525231u
#define FAKE_MIPMAP_MAGIC 0x4d495031u
#define FAKE_POOL_MAGIC 0x504f4c31u

struct CUarray_st {
    uint32_t magic;
    uint64_t bytes;
};

struct CUmipmappedArray_st {
    uint32_t magic;
    uint64_t bytes;
};

struct CUmemPoolHandle_st {
    uint32_t magic;
    int is_default;
};

enum object_kind { OBJ_DEVPTR, OBJ_VA, OBJ_HANDLE, OBJ_MAPPING };

struct object {
    enum object_kind kind;
    uint64_t key;  /* pointer, VA start, handle, mapping start */
    uint64_t size; /* bytes (DEVPTR, HANDLE), range length (VA, MAPPING) */
    uint64_t handle;                   /* MAPPING: its allocation handle */
    uint32_t handle_refs, mappings;    /* HANDLE */
    int on_device;                     /* HANDLE: counted in the fake GPU's pool */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards everything below */
static struct object *objects;
static size_t object_count, object_capacity;
static uint64_t next_ptr = PTR_BASE, next_ptr_v1 = PTR_V1_BASE, next_va = VA_BASE, next_handle = 0x1000;
static struct CUmemPoolHandle_st default_pool = {FAKE_POOL_MAGIC, 1};
static CUmemoryPool current_pool = &default_pool;

/* --- the object table (lock held) ---------------------------------------------------------- */

static struct object *find_locked(enum object_kind kind, uint64_t key)
{
    for (size_t i = 0; i < object_count; i++)
        if (objects[i].kind == kind && objects[i].key == key)
            return &objects[i];
    return NULL;
}

/* The VA range or mapping that contains address. */
static struct object *containing_locked(enum object_kind kind, uint64_t address)
{
    for (size_t i = 0; i < object_count; i++)
        if (objects[i].kind == kind && objects[i].key <= address && address - objects[i].key < objects[i].size)
            return &objects[i];
    return NULL;
}

static struct object *add_locked(struct object o)
{
    if (object_count == object_capacity) {
        size_t capacity = object_capacity ? object_capacity * 2 : 64;
        struct object *grown = realloc(objects, capacity * sizeof *grown);
        if (grown == NULL)
            return NULL;
        objects = grown;
        object_capacity = capacity;
    }
    objects[object_count] = o;
    return &objects[object_count++];
}

static void remove_locked(struct object *o)
{
    *o = objects[--object_count];
}

static uint64_t round_up(uint64_t value, uint64_t align)
{
    return (value + align - 1) / align * align;
}

/* --- linear memory ------------------------------------------------------------------------ */

static CUresult alloc_linear(uint64_t *dptr, uint64_t bytes, int v1)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == NULL || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    uint64_t *cursor = v1 ? &next_ptr_v1 : &next_ptr;
    uint64_t span = round_up(bytes, PTR_ALIGN);
    if (v1 && (span > PTR_V1_END || *cursor > PTR_V1_END - span)) {
        r = CUDA_ERROR_OUT_OF_MEMORY; /* the 32-bit address space is used up */
    } else if (fgpu_mem_reserve(bytes) != FGPU_OK) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (add_locked((struct object){.kind = OBJ_DEVPTR, .key = *cursor, .size = bytes}) == NULL) {
        fgpu_mem_release(bytes);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        *dptr = *cursor;
        *cursor += span;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

static CUresult free_linear(uint64_t dptr)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t bytes = 0;
    pthread_mutex_lock(&lock);
    struct object *o = find_locked(OBJ_DEVPTR, dptr);
    if (o != NULL) {
        bytes = o->size;
        remove_locked(o);
    }
    pthread_mutex_unlock(&lock);
    if (o == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fgpu_mem_release(bytes);
    return CUDA_SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    uint64_t ptr = 0;
    CUresult r = alloc_linear(dptr != NULL ? &ptr : NULL, bytesize, 0);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)ptr;
    return r;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    uint64_t ptr = 0;
    CUresult r = alloc_linear(dptr != NULL ? &ptr : NULL, bytesize, 1);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)ptr;
    return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return cuMemAlloc_v2(dptr, bytesize);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return free_linear((uint64_t)dptr);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    return free_linear((uint64_t)dptr);
}

/* --- pitched memory ----------------------------------------------------------------------- */

static pthread_once_t pitch_once = PTHREAD_ONCE_INIT;
static uint64_t pitch_align = DEFAULT_PITCH_ALIGN;

static void read_pitch_align(void)
{
    const char *text = getenv(ENV_PITCH_ALIGN);
    if (text == NULL || *text == '\0')
        return;
    char *end;
    unsigned long value = strtoul(text, &end, 10);
    if (*end != '\0' || value == 0 || value > (1ul << 20) || (value & (value - 1)) != 0) {
        fprintf(stderr, "fake libcuda: " ENV_PITCH_ALIGN "=%s is not a power of two up to 1 MiB; using %u\n", text,
                DEFAULT_PITCH_ALIGN);
        return;
    }
    pitch_align = value;
}

static CUresult alloc_pitch(uint64_t *dptr, uint64_t *pitch, uint64_t width, uint64_t height,
                            unsigned int element_size, int v1)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == NULL || pitch == NULL || width == 0 || height == 0 ||
        (element_size != 4 && element_size != 8 && element_size != 16))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&pitch_once, read_pitch_align);
    uint64_t row = round_up(width, pitch_align);
    if (height > UINT64_MAX / row)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r = alloc_linear(dptr, row * height, v1);
    if (r == CUDA_SUCCESS)
        *pitch = row;
    return r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    uint64_t ptr = 0, pitch = 0;
    CUresult r = alloc_pitch(dptr != NULL ? &ptr : NULL, pPitch != NULL ? &pitch : NULL, WidthInBytes, Height,
                             ElementSizeBytes, 0);
    if (r == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr)ptr;
        *pPitch = (size_t)pitch;
    }
    return r;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes, unsigned int Height,
                         unsigned int ElementSizeBytes)
{
    uint64_t ptr = 0, pitch = 0;
    CUresult r = alloc_pitch(dptr != NULL ? &ptr : NULL, pPitch != NULL ? &pitch : NULL, WidthInBytes, Height,
                             ElementSizeBytes, 1);
    if (r == CUDA_SUCCESS && pitch > UINT_MAX) {
        free_linear(ptr);
        r = CUDA_ERROR_INVALID_VALUE;
    }
    if (r == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)ptr;
        *pPitch = (unsigned int)pitch;
    }
    return r;
}

/* --- stream-ordered memory and pools ------------------------------------------------------ */

static int pool_valid(CUmemoryPool pool)
{
    return pool != NULL && pool->magic == FAKE_POOL_MAGIC;
}

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (!fake_stream_valid(hStream) || !pool_valid(pool))
        return CUDA_ERROR_INVALID_HANDLE;
    return cuMemAlloc_v2(dptr, bytesize); /* completes at once: launches are synchronous too */
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!fake_stream_valid(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    return free_linear((uint64_t)dptr);
}

static CUmemoryPool pool_now(void)
{
    pthread_mutex_lock(&lock);
    CUmemoryPool pool = current_pool;
    pthread_mutex_unlock(&lock);
    return pool;
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, pool_now(), hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, pool_now(), hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return alloc_async(dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    return alloc_async(dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream);
}

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (pool_out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *pool_out = &default_pool;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (pool == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *pool = pool_now();
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    if (!pool_valid(pool))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    current_pool = pool;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

static int device_location(const CUmemLocation *location)
{
    return location->type == CU_MEM_LOCATION_TYPE_DEVICE && location->id == 0;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (pool == NULL || poolProps == NULL || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        !device_location(&poolProps->location))
        return CUDA_ERROR_INVALID_VALUE;
    CUmemoryPool created = calloc(1, sizeof *created);
    if (created == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    created->magic = FAKE_POOL_MAGIC;
    *pool = created;
    return CUDA_SUCCESS;
}

CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!pool_valid(pool) || pool->is_default)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (current_pool == pool)
        current_pool = &default_pool;
    pool->magic = 0;
    pthread_mutex_unlock(&lock);
    /* Its live allocations stay valid (the real driver defers the destruction until they are
     * freed); they are plain pointers here, so the pool object can go now. */
    free(pool);
    return CUDA_SUCCESS;
}

/* --- virtual memory management ------------------------------------------------------------ */

static int prop_location_ok(const CUmemAllocationProp *prop, int *on_device)
{
    if (prop == NULL || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED)
        return 0;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: *on_device = 1; return prop->location.id == 0;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: *on_device = 0; return 1;
    default: return 0;
    }
}

CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop,
                                       CUmemAllocationGranularity_flags option)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    int on_device;
    if (granularity == NULL || !prop_location_ok(prop, &on_device) ||
        (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM && option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = (size_t)GRANULARITY;
    return CUDA_SUCCESS;
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    int on_device = 0;
    if (handle == NULL || size == 0 || size % GRANULARITY != 0 || flags != 0 || !prop_location_ok(prop, &on_device))
        return CUDA_ERROR_INVALID_VALUE;
    if (on_device && fgpu_mem_reserve(size) != FGPU_OK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    uint64_t h = next_handle++;
    struct object *o = add_locked((struct object){.kind = OBJ_HANDLE, .key = h, .size = size, .handle_refs = 1,
                                                  .on_device = on_device});
    pthread_mutex_unlock(&lock);
    if (o == NULL) {
        if (on_device)
            fgpu_mem_release(size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = h;
    return CUDA_SUCCESS;
}

/* A handle lost a reference or a mapping: free its memory when both are gone. Lock held;
 * returns the device bytes to give back to the pool (after unlocking). */
static uint64_t maybe_free_handle_locked(struct object *h)
{
    if (h->handle_refs != 0 || h->mappings != 0)
        return 0;
    uint64_t bytes = h->on_device ? h->size : 0;
    remove_locked(h);
    return bytes;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t freed = 0;
    pthread_mutex_lock(&lock);
    struct object *h = find_locked(OBJ_HANDLE, handle);
    if (h == NULL || h->handle_refs == 0) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        h->handle_refs--;
        freed = maybe_free_handle_locked(h);
    }
    pthread_mutex_unlock(&lock);
    if (freed != 0)
        fgpu_mem_release(freed);
    return r;
}

/* Is [start, start + size) free of mappings? Lock held. */
static int range_unmapped_locked(uint64_t start, uint64_t size)
{
    for (size_t i = 0; i < object_count; i++) {
        const struct object *m = &objects[i];
        if (m->kind == OBJ_MAPPING && m->key < start + size && start < m->key + m->size)
            return 0;
    }
    return 1;
}

CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                             unsigned long long flags)
{
    (void)addr; /* a hint only */
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (ptr == NULL || size == 0 || size % GRANULARITY != 0 || flags != 0 || (alignment & (alignment - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t align = alignment > GRANULARITY ? alignment : GRANULARITY;
    pthread_mutex_lock(&lock);
    uint64_t start = round_up(next_va, align);
    struct object *o = add_locked((struct object){.kind = OBJ_VA, .key = start, .size = size});
    if (o != NULL)
        next_va = start + size;
    pthread_mutex_unlock(&lock);
    if (o == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *ptr = (CUdeviceptr)start;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    struct object *va = find_locked(OBJ_VA, (uint64_t)ptr);
    if (va == NULL || va->size != size || !range_unmapped_locked((uint64_t)ptr, size))
        r = CUDA_ERROR_INVALID_VALUE;
    else
        remove_locked(va);
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t start = (uint64_t)ptr;
    if (size == 0 || size % GRANULARITY != 0 || flags != 0 || offset != 0)
        return CUDA_ERROR_INVALID_VALUE; /* the real driver also requires offset 0 */
    pthread_mutex_lock(&lock);
    struct object *va = containing_locked(OBJ_VA, start);
    struct object *h = find_locked(OBJ_HANDLE, handle);
    if (va == NULL || start + size > va->key + va->size || !range_unmapped_locked(start, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else if (h == NULL || size > h->size) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        h->mappings++;
        uint64_t key = handle;
        if (add_locked((struct object){.kind = OBJ_MAPPING, .key = start, .size = size, .handle = key}) == NULL) {
            h = find_locked(OBJ_HANDLE, key); /* add_locked may have moved the table */
            h->mappings--;
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t at = (uint64_t)ptr, end = (uint64_t)ptr + size, freed = 0;
    if (size == 0 || end < at)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    /* The range must be whole mappings, back to back from ptr. */
    for (uint64_t probe = at; probe < end;) {
        struct object *m = find_locked(OBJ_MAPPING, probe);
        if (m == NULL || probe + m->size > end) {
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
        probe += m->size;
    }
    while (r == CUDA_SUCCESS && at < end) {
        struct object *m = find_locked(OBJ_MAPPING, at);
        if (m == NULL) /* cannot happen: the loop above checked the whole range */
            break;
        uint64_t handle = m->handle;
        at += m->size;
        remove_locked(m);
        struct object *h = find_locked(OBJ_HANDLE, handle);
        if (h != NULL) {
            h->mappings--;
            freed += maybe_free_handle_locked(h);
        }
    }
    pthread_mutex_unlock(&lock);
    if (freed != 0)
        fgpu_mem_release(freed);
    return r;
}

CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (desc == NULL || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (find_locked(OBJ_MAPPING, (uint64_t)ptr) == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&lock);
    return r; /* every mapping of the fake is accessible */
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct object *m = containing_locked(OBJ_MAPPING, (uint64_t)(uintptr_t)addr);
    struct object *h = m != NULL ? find_locked(OBJ_HANDLE, m->handle) : NULL;
    if (h == NULL) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        h->handle_refs++;
        *handle = h->key;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* --- arrays ------------------------------------------------------------------------------- */

static unsigned int channel_bytes(CUarray_format format)
{
    switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 0;
    }
}

#define KNOWN_ARRAY3D_FLAGS                                                                        \
    (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_SURFACE_LDST | CUDA_ARRAY3D_CUBEMAP | CUDA_ARRAY3D_TEXTURE_GATHER | \
     CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)

/* Bytes of one array level; 0 with *r set when the descriptor is invalid. */
static uint64_t array_bytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format format, unsigned int channels,
                            unsigned int flags, CUresult *r)
{
    unsigned int size = channel_bytes(format);
    *r = CUDA_SUCCESS;
    if (w == 0 || (channels != 1 && channels != 2 && channels != 4) || (flags & ~KNOWN_ARRAY3D_FLAGS) != 0)
        *r = CUDA_ERROR_INVALID_VALUE;
    else if (size == 0)
        *r = CUDA_ERROR_NOT_SUPPORTED;
    else if ((flags & CUDA_ARRAY3D_CUBEMAP) && (w != h || d % 6 != 0 || d == 0))
        *r = CUDA_ERROR_INVALID_VALUE;
    if (*r != CUDA_SUCCESS)
        return 0;
    if (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING))
        return 0; /* backed later by mapped cuMemCreate allocations */
    uint64_t bytes;
    if (__builtin_mul_overflow(w, h ? h : 1, &bytes) || __builtin_mul_overflow(bytes, d ? d : 1, &bytes) ||
        __builtin_mul_overflow(bytes, (uint64_t)size * channels, &bytes)) {
        *r = CUDA_ERROR_OUT_OF_MEMORY;
        return 0;
    }
    return bytes;
}

/* A zeroed handle object of object_size bytes whose bytes of device memory come from the pool;
 * NULL (nothing charged) when either the pool or the host allocation runs out. */
static void *charged_object(size_t object_size, uint64_t bytes)
{
    if (bytes != 0 && fgpu_mem_reserve(bytes) != FGPU_OK)
        return NULL;
    void *object = calloc(1, object_size);
    if (object == NULL)
        fgpu_mem_release(bytes);
    return object;
}

static CUresult create_array(CUarray *pHandle, uint64_t bytes)
{
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUarray array = charged_object(sizeof *array, bytes);
    if (array == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    array->magic = FAKE_ARRAY_MAGIC;
    array->bytes = bytes;
    *pHandle = array;
    return CUDA_SUCCESS;
}

#define ARRAY_CREATE(pHandle, w, h, d, format, channels, flags)                                    \
    do {                                                                                           \
        CUresult r_ = fake_ready_with_context();                                                   \
        if (r_ != CUDA_SUCCESS)                                                                    \
            return r_;                                                                             \
        uint64_t bytes_ = array_bytes((w), (h), (d), (format), (channels), (flags), &r_);          \
        return r_ != CUDA_SUCCESS ? r_ : create_array((pHandle), bytes_);                          \
    } while (0)

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    if (pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY_DESCRIPTOR *a = pAllocateArray;
    ARRAY_CREATE(pHandle, a->Width, a->Height, 0, a->Format, a->NumChannels, 0);
}

CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray)
{
    if (pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY_DESCRIPTOR_v1 *a = pAllocateArray;
    ARRAY_CREATE(pHandle, a->Width, a->Height, 0, a->Format, a->NumChannels, 0);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    if (pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *a = pAllocateArray;
    ARRAY_CREATE(pHandle, a->Width, a->Height, a->Depth, a->Format, a->NumChannels, a->Flags);
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray)
{
    if (pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR_v1 *a = pAllocateArray;
    ARRAY_CREATE(pHandle, a->Width, a->Height, a->Depth, a->Format, a->NumChannels, a->Flags);
}

CUresult cuArrayDestroy(CUarray hArray)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hArray == NULL || hArray->magic != FAKE_ARRAY_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    hArray->magic = 0;
    fgpu_mem_release(hArray->bytes);
    free(hArray);
    return CUDA_SUCCESS;
}

static uint64_t level_dim(uint64_t dim, unsigned int level)
{
    if (dim == 0)
        return 0;
    uint64_t v = dim >> level;
    return v ? v : 1;
}

CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                unsigned int numMipmapLevels)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    const CUDA_ARRAY3D_DESCRIPTOR *a = pMipmappedArrayDesc;
    if (pHandle == NULL || a == NULL || numMipmapLevels == 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t largest = a->Width > a->Height ? a->Width : a->Height;
    int fixed_depth = (a->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
    if (!fixed_depth && a->Depth > largest)
        largest = a->Depth;
    unsigned int max_levels = 1;
    while (max_levels < 64 && (largest >> max_levels) != 0)
        max_levels++;
    if (numMipmapLevels > max_levels)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t bytes = 0;
    for (unsigned int l = 0; l < numMipmapLevels && r == CUDA_SUCCESS; l++)
        bytes += array_bytes(level_dim(a->Width, l), level_dim(a->Height, l),
                             fixed_depth ? a->Depth : level_dim(a->Depth, l), a->Format, a->NumChannels, a->Flags,
                             &r);
    if (r != CUDA_SUCCESS)
        return r;
    CUmipmappedArray mipmap = charged_object(sizeof *mipmap, bytes);
    if (mipmap == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    mipmap->magic = FAKE_MIPMAP_MAGIC;
    mipmap->bytes = bytes;
    *pHandle = mipmap;
    return CUDA_SUCCESS;
}

CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hMipmappedArray == NULL || hMipmappedArray->magic != FAKE_MIPMAP_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    hMipmappedArray->magic = 0;
    fgpu_mem_release(hMipmappedArray->bytes);
    free(hMipmappedArray);
    return CUDA_SUCCESS;
}

/* --- views -------------------------------------------------------------------------------- */

CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (free == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t free_bytes, total_bytes;
    fgpu_mem_info(&free_bytes, &total_bytes);
    *free = (size_t)free_bytes;
    *total = (size_t)total_bytes;
    return CUDA_SUCCESS;
}

static unsigned int clamp32(uint64_t v)
{
    return v > UINT_MAX ? UINT_MAX : (unsigned int)v;
}

CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (free == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t free_bytes, total_bytes;
    fgpu_mem_info(&free_bytes, &total_bytes);
    *free = clamp32(free_bytes);
    *total = clamp32(total_bytes);
    return CUDA_SUCCESS;
}
