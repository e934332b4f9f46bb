/*
 * fake_memory.c: every allocation of the fake libcuda.so.1 and the memory behind it, device
 * allocations accounted against the pool shared by all processes of the fake GPU (gpu_state.c):
 * linear memory (cuMemAlloc v1 and v2, pitched, managed and its hints), stream-ordered memory and
 * pools (cuMemAllocAsync, cuMemAllocFromPoolAsync and their _ptsz variants, cuMemFreeAsync,
 * cuMemPoolCreate/Destroy, attributes, access, the default and current pools), virtual memory
 * management (cuMemCreate/Release, cuMemGetAllocationGranularity, cuMemAddressReserve/Free,
 * cuMemMap/Unmap, cuMemSetAccess/GetAccess, cuMemRetainAllocationHandle, the handle's properties),
 * CUDA arrays (cuArrayCreate, cuArray3DCreate, v1 and v2, their descriptors, cuArrayDestroy),
 * mipmapped arrays, page-locked host memory (cuMemAllocHost, cuMemHostAlloc, cuMemFreeHost,
 * cuMemHostRegister/Unregister, cuMemHostGetDevicePointer, cuMemHostGetFlags) and the memory views
 * (cuMemGetInfo v1 and v2). fake_memory.h is what it tells the copies and the pointer queries.
 *
 * Every allocation is real memory of the process, mmap'd with MAP_NORESERVE (a 16 GiB pool costs
 * nothing until touched), and a device pointer is its address (unified addressing): data written
 * by a copy is there to be read back. The v1 ABIs' pointers lie below 4 GiB. An allocation exported
 * with cuIpcGetMemHandle (ipc_memory.c) has its bytes moved into the GPU's shared lock file, mapped
 * MAP_SHARED at the same address (fake_mem_share); an imported one is an OBJ_IMPORT mapping. A VMM allocation is a
 * shared mapping that cuMemMap maps again into the reserved range (mremap), so every mapping of one
 * handle shows the same bytes; a reserved range is PROT_NONE until mapped.
 *
 * Semantics follow the driver where tests can see them: a VMM allocation's memory is freed when
 * its last handle reference AND its last mapping are gone; cuMemFree frees any device pointer,
 * stream-ordered ones included. Deviations, on purpose:
 *   - stream-ordered calls complete at once, and a pool keeps nothing cached: a free returns its
 *     bytes to the shared pool immediately (so a pool's reserved and used memory are equal);
 *   - the pitch is round_up(width, FASTGSHARE_FAKE_GPU_PITCH_ALIGN) (default 256 bytes);
 *     allocation granularity is 2 MiB; an array is charged width x height x depth x channels x
 *     channel size, for the eight classic formats only (others: CUDA_ERROR_NOT_SUPPORTED), and
 *     a mipmapped array the sum of its levels;
 *   - host memory is not locked (mlock) and no allocation belongs to a context;
 *   - one table, searched linearly: fine for tests, not for millions of allocations.
 */
#define _GNU_SOURCE /* mremap's MREMAP_FIXED */
#include "fake_memory.h"

#include "gpu_state.h"
#include "ipc_memory.h"
#include "served.h"
#include "stream_queue.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000 /* Linux 4.17; older kernels take it as a hint, checked below */
#endif

#define PTR_V1_BASE UINT64_C(0x10000000) /* v1 (32-bit) device pointers */
#define PTR_V1_END UINT64_C(0xf0000000)
#define PTR_V1_STEP (UINT64_C(16) << 20) /* how far a taken v1 address moves the search on */
#define GRANULARITY (UINT64_C(2) << 20)
#define DEFAULT_PITCH_ALIGN 256u
#define ENV_PITCH_ALIGN "FASTGSHARE_FAKE_GPU_PITCH_ALIGN"
#define HOST_ALLOC_FLAGS (CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED)
#define HOST_REGISTER_FLAGS                                                                        \
    (CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_IOMEMORY |    \
     CU_MEMHOSTREGISTER_READ_ONLY)

#define FAKE_ARRAY_MAGIC 0x41525231u
#define FAKE_MIPMAP_MAGIC 0x4d495031u
#define FAKE_POOL_MAGIC 0x504f4c31u

struct CUarray_st {
    uint32_t magic;
    uint64_t bytes;
    unsigned char *data; /* bytes of backing, NULL when bytes is 0 */
    CUDA_ARRAY3D_DESCRIPTOR desc;
};

struct CUmipmappedArray_st {
    uint32_t magic;
    uint64_t bytes;
};

struct CUmemPoolHandle_st {
    uint32_t magic;
    int is_default;
    int reuse[3]; /* CU_MEMPOOL_ATTR_REUSE_* (1 .. 3) */
    cuuint64_t release_threshold;
    uint64_t used, used_high; /* bytes of its live allocations; reserved = used (nothing cached) */
};

/* OBJ_IMPORT: another process's allocation mapped here by cuIpcOpenMemHandle (ipc_memory.c). */
enum object_kind { OBJ_DEVPTR, OBJ_VA, OBJ_HANDLE, OBJ_MAPPING, OBJ_HOST, OBJ_REGISTERED, OBJ_IMPORT };

struct object {
    enum object_kind kind;
    uint64_t key;  /* the address; HANDLE: the handle's number */
    uint64_t size; /* bytes (DEVPTR, HANDLE, HOST, REGISTERED), range length (VA, MAPPING) */
    uint64_t handle;                /* MAPPING: its allocation handle */
    uint32_t handle_refs, mappings; /* HANDLE */
    int on_device;                  /* HANDLE: counted in the fake GPU's pool */
    void *home;                     /* HANDLE: its memory, a shared mapping remapped into each range */
    uint64_t id;                    /* buffer id (DEVPTR, HANDLE, HOST, REGISTERED) */
    CUcontext ctx;                  /* current when it was made */
    CUmemoryPool pool;              /* DEVPTR from a stream-ordered allocation */
    unsigned int flags;             /* HOST, REGISTERED: the host memory flags */
    unsigned char managed, legacy_ipc, sync_memops;
    unsigned char exported;         /* DEVPTR: its bytes live in the IPC memory file (ipc_memory.c) */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards everything below */
static struct object *objects;
static size_t object_count, object_capacity;
static uint64_t next_ptr_v1 = PTR_V1_BASE, next_handle = 0x1000, next_id = 1;
static struct CUmemPoolHandle_st default_pool = {.magic = FAKE_POOL_MAGIC, .is_default = 1, .reuse = {1, 1, 1}};
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

/* The allocation whose memory contains address: device, host or a VMM mapping. */
static struct object *memory_at_locked(uint64_t address)
{
    for (size_t i = 0; i < object_count; i++) {
        const struct object *o = &objects[i];
        int memory = o->kind == OBJ_DEVPTR || o->kind == OBJ_MAPPING || o->kind == OBJ_HOST || o->kind == OBJ_REGISTERED ||
                     o->kind == OBJ_IMPORT;
        if (memory && o->key <= address && address - o->key < o->size)
            return &objects[i];
    }
    return NULL;
}

/* Does [start, start + size) overlap any allocation's memory? */
static int overlaps_memory_locked(uint64_t start, uint64_t size)
{
    for (size_t i = 0; i < object_count; i++) {
        const struct object *o = &objects[i];
        int memory = o->kind == OBJ_DEVPTR || o->kind == OBJ_MAPPING || o->kind == OBJ_HOST || o->kind == OBJ_REGISTERED ||
                     o->kind == OBJ_IMPORT;
        if (memory && o->key < start + size && start < o->key + o->size)
            return 1;
    }
    return 0;
}

/* Adds o with a new buffer id and the calling thread's context. */
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
    o.id = next_id++;
    o.ctx = fake_current_context();
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

/* --- backing memory ------------------------------------------------------------------------ */

static uint64_t page_size(void)
{
    long size = sysconf(_SC_PAGESIZE);
    return size > 0 ? (uint64_t)size : 4096;
}

static void *map_anywhere(uint64_t bytes, int shared)
{
    int flags = (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS | MAP_NORESERVE;
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, flags, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* One try at exactly `at`: the mapping, or NULL (*taken when something else is there). */
static void *map_exactly(uint64_t at, uint64_t span, int *taken)
{
    void *want = (void *)(uintptr_t)at;
    void *p = mmap(want, (size_t)span, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    *taken = p == MAP_FAILED ? errno == EEXIST : p != want;
    if (p != MAP_FAILED && p != want)
        munmap(p, (size_t)span); /* a kernel older than MAP_FIXED_NOREPLACE put it elsewhere */
    return p == want ? p : NULL;
}

/* The v1 ABI's memory: in [PTR_V1_BASE, PTR_V1_END), searched from where the last one ended and
 * then once from the start. Lock held. */
static void *map_below_4g(uint64_t bytes)
{
    uint64_t span = round_up(bytes, page_size());
    if (span > PTR_V1_END - PTR_V1_BASE)
        return NULL;
    for (int pass = 0; pass < 2; pass++) {
        for (uint64_t at = pass ? PTR_V1_BASE : next_ptr_v1; at <= PTR_V1_END - span; at += PTR_V1_STEP) {
            int taken = 0;
            void *p = map_exactly(at, span, &taken);
            if (p != NULL) {
                next_ptr_v1 = at + span;
                return p;
            }
            if (!taken)
                return NULL; /* out of memory, not out of addresses */
        }
    }
    return NULL;
}

/* A PROT_NONE range of size bytes aligned to align (a power of two), at addr when that is free. */
static void *reserve_range(uint64_t size, uint64_t align, uint64_t addr)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    if (addr != 0 && addr % align == 0) {
        void *p = mmap((void *)(uintptr_t)addr, (size_t)size, PROT_NONE, flags | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == (void *)(uintptr_t)addr)
            return p;
        if (p != MAP_FAILED)
            munmap(p, (size_t)size);
    }
    if (size > UINT64_MAX - align)
        return NULL;
    void *p = mmap(NULL, (size_t)(size + align), PROT_NONE, flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uint64_t raw = (uint64_t)(uintptr_t)p, start = round_up(raw, align);
    if (start > raw)
        munmap(p, (size_t)(start - raw));
    munmap((void *)(uintptr_t)(start + size), (size_t)(raw + align - start));
    return (void *)(uintptr_t)start;
}

/* Puts a PROT_NONE reservation back over [start, start + size) (an unmapped VMM range). */
static void re_reserve(uint64_t start, uint64_t size)
{
    mmap((void *)(uintptr_t)start, (size_t)size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
}

/* --- linear memory ------------------------------------------------------------------------ */

static void pool_account_locked(CUmemoryPool pool, uint64_t bytes, int add)
{
    if (pool == NULL)
        return;
    pool->used = add ? pool->used + bytes : pool->used - bytes;
    if (pool->used > pool->used_high)
        pool->used_high = pool->used;
}

static CUresult alloc_linear(uint64_t *dptr, uint64_t bytes, int v1, int managed, CUmemoryPool pool)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (dptr == NULL || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (v1 && bytes > PTR_V1_END - PTR_V1_BASE)
        return CUDA_ERROR_OUT_OF_MEMORY; /* the 32-bit address space cannot hold it */
    pthread_mutex_lock(&lock);
    void *p = NULL;
    if (fgpu_mem_reserve(bytes) != FGPU_OK) {
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if ((p = v1 ? map_below_4g(bytes) : map_anywhere(bytes, 0)) == NULL) {
        fgpu_mem_release(bytes);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (add_locked((struct object){.kind = OBJ_DEVPTR, .key = (uint64_t)(uintptr_t)p, .size = bytes,
                                          .pool = pool, .managed = (unsigned char)managed,
                                          .legacy_ipc = (unsigned char)(!managed && pool == NULL)}) == NULL) {
        munmap(p, (size_t)bytes);
        fgpu_mem_release(bytes);
        r = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        pool_account_locked(pool, bytes, 1);
        *dptr = (uint64_t)(uintptr_t)p;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* Frees a linear allocation. Its memory goes back to the system, so work still queued on a stream
 * must not touch it any more: the caller has waited for that (cuMemFree waits for every stream, as
 * the driver's does; cuMemFreeAsync for its stream). */
static CUresult free_linear(uint64_t dptr)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t bytes = 0;
    int exported = 0;
    pthread_mutex_lock(&lock);
    struct object *o = find_locked(OBJ_DEVPTR, dptr);
    if (o != NULL) {
        bytes = o->size;
        exported = o->exported;
        pool_account_locked(o->pool, bytes, 0);
        remove_locked(o);
    }
    pthread_mutex_unlock(&lock);
    if (o == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    munmap((void *)(uintptr_t)dptr, (size_t)bytes);
    if (exported)
        fake_ipc_allocation_freed(dptr); /* its handles are refused from now on */
    fgpu_mem_release(bytes);
    return CUDA_SUCCESS;
}

CUresult fake_device_alloc(uint64_t bytes, int v1, uint64_t *dptr)
{
    return alloc_linear(dptr, bytes, v1, 0, NULL);
}

CUresult fake_device_free(uint64_t dptr)
{
    fake_all_streams_wait_idle();
    return free_linear(dptr);
}

static CUresult alloc_v2(CUdeviceptr *dptr, size_t bytesize, int managed, CUmemoryPool pool)
{
    uint64_t ptr = 0;
    CUresult r = alloc_linear(dptr != NULL ? &ptr : NULL, bytesize, 0, managed, pool);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)ptr;
    return r;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    FAKE_SERVED();
    return alloc_v2(dptr, bytesize, 0, NULL);
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    FAKE_SERVED();
    uint64_t ptr = 0;
    CUresult r = alloc_linear(dptr != NULL ? &ptr : NULL, bytesize, 1, 0, NULL);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)ptr;
    return r;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    FAKE_SERVED();
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_v2(dptr, bytesize, 1, NULL);
}

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    FAKE_SERVED();
    fake_all_streams_wait_idle();
    return free_linear((uint64_t)dptr);
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    FAKE_SERVED();
    fake_all_streams_wait_idle();
    return free_linear((uint64_t)dptr);
}

/* --- managed memory hints (nothing migrates: there is one memory) ---------------------------- */

static CUresult managed_range(CUdeviceptr devPtr, size_t count)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    const struct object *o = count != 0 ? memory_at_locked((uint64_t)devPtr) : NULL;
    int ok = o != NULL && o->kind == OBJ_DEVPTR && o->managed && count <= o->size - ((uint64_t)devPtr - o->key);
    pthread_mutex_unlock(&lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

static int location_ok(CUmemLocation location)
{
    switch (location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE: return location.id == 0;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: return 1;
    default: return 0;
    }
}

static CUresult prefetch(CUdeviceptr devPtr, size_t count, int target_ok, CUstream hStream)
{
    CUresult r = managed_range(devPtr, count);
    if (r == CUDA_SUCCESS && !target_ok)
        r = CUDA_ERROR_INVALID_DEVICE;
    if (r == CUDA_SUCCESS && !fake_stream_valid(hStream))
        r = CUDA_ERROR_INVALID_HANDLE;
    return r;
}

CUresult cuMemPrefetchAsync(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream)
{
    return prefetch(devPtr, count, dstDevice == 0 || dstDevice == CU_DEVICE_CPU, hStream);
}

CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr devPtr, size_t count, CUdevice dstDevice, CUstream hStream)
{
    return prefetch(devPtr, count, dstDevice == 0 || dstDevice == CU_DEVICE_CPU, hStream);
}

CUresult cuMemPrefetchAsync_v2(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                               CUstream hStream)
{
    return flags != 0 ? CUDA_ERROR_INVALID_VALUE : prefetch(devPtr, count, location_ok(location), hStream);
}

CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr devPtr, size_t count, CUmemLocation location, unsigned int flags,
                                    CUstream hStream)
{
    return flags != 0 ? CUDA_ERROR_INVALID_VALUE : prefetch(devPtr, count, location_ok(location), hStream);
}

static CUresult advise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, int target_ok)
{
    CUresult r = managed_range(devPtr, count);
    if (r == CUDA_SUCCESS && (advice < CU_MEM_ADVISE_SET_READ_MOSTLY || advice > CU_MEM_ADVISE_UNSET_ACCESSED_BY))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && !target_ok)
        r = CUDA_ERROR_INVALID_DEVICE;
    return r;
}

CUresult cuMemAdvise(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUdevice device)
{
    return advise(devPtr, count, advice, device == 0 || device == CU_DEVICE_CPU);
}

CUresult cuMemAdvise_v2(CUdeviceptr devPtr, size_t count, CUmem_advise advice, CUmemLocation location)
{
    return advise(devPtr, count, advice, location_ok(location));
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
    r = alloc_linear(dptr, row * height, v1, 0, NULL);
    if (r == CUDA_SUCCESS)
        *pitch = row;
    return r;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                            unsigned int ElementSizeBytes)
{
    FAKE_SERVED();
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
    FAKE_SERVED();
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
    return alloc_v2(dptr, bytesize, 0, pool); /* completes at once */
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!fake_stream_valid(hStream))
        return CUDA_ERROR_INVALID_HANDLE;
    r = fake_stream_wait_idle(hStream); /* in stream order: after the work queued before it */
    return r == CUDA_SUCCESS ? free_linear((uint64_t)dptr) : r;
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
    FAKE_SERVED();
    return alloc_async(dptr, bytesize, pool_now(), hStream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    FAKE_SERVED();
    return alloc_async(dptr, bytesize, pool_now(), hStream);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    FAKE_SERVED();
    return alloc_async(dptr, bytesize, pool, hStream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream)
{
    FAKE_SERVED();
    return alloc_async(dptr, bytesize, pool, hStream);
}

CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    FAKE_SERVED();
    return free_async(dptr, hStream);
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    FAKE_SERVED();
    return free_async(dptr, hStream == NULL ? CU_STREAM_PER_THREAD : hStream);
}

static int device_location(const CUmemLocation *location)
{
    return location != NULL && location->type == CU_MEM_LOCATION_TYPE_DEVICE && location->id == 0;
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

static CUresult set_current_pool(CUmemoryPool pool)
{
    if (!pool_valid(pool))
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    current_pool = pool;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (dev != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    return set_current_pool(pool);
}

/* The CUDA 13 forms name a location and an allocation type: device 0's pinned memory only. */
static CUresult pool_location(CUmemLocation *location, CUmemAllocationType type)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && (location == NULL || type != CU_MEM_ALLOCATION_TYPE_PINNED))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && location->type != CU_MEM_LOCATION_TYPE_DEVICE)
        r = CUDA_ERROR_NOT_SUPPORTED; /* no host memory pools */
    if (r == CUDA_SUCCESS && location->id != 0)
        r = CUDA_ERROR_INVALID_DEVICE;
    return r;
}

CUresult cuMemGetDefaultMemPool(CUmemoryPool *pool_out, CUmemLocation *location, CUmemAllocationType type)
{
    CUresult r = pool_location(location, type);
    if (r == CUDA_SUCCESS && pool_out == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pool_out = &default_pool;
    return r;
}

CUresult cuMemGetMemPool(CUmemoryPool *pool, CUmemLocation *location, CUmemAllocationType type)
{
    CUresult r = pool_location(location, type);
    if (r == CUDA_SUCCESS && pool == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pool = pool_now();
    return r;
}

CUresult cuMemSetMemPool(CUmemLocation *location, CUmemAllocationType type, CUmemoryPool pool)
{
    CUresult r = pool_location(location, type);
    return r == CUDA_SUCCESS ? set_current_pool(pool) : r;
}

CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (pool == NULL || poolProps == NULL || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        !device_location(&poolProps->location))
        return CUDA_ERROR_INVALID_VALUE;
    if (poolProps->handleTypes != CU_MEM_HANDLE_TYPE_NONE)
        return CUDA_ERROR_NOT_SUPPORTED; /* no IPC */
    CUmemoryPool created = calloc(1, sizeof *created);
    if (created == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *created = (struct CUmemPoolHandle_st){.magic = FAKE_POOL_MAGIC, .reuse = {1, 1, 1}};
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
    for (size_t i = 0; i < object_count; i++) /* its live allocations stay valid, poolless */
        if (objects[i].pool == pool)
            objects[i].pool = NULL;
    pthread_mutex_unlock(&lock);
    free(pool);
    return CUDA_SUCCESS;
}

CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && (!pool_valid(pool) || value == NULL))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: pool->reuse[attr - 1] = *(int *)value != 0; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: pool->release_threshold = *(cuuint64_t *)value; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: /* only a reset to 0 (to the current use) is allowed */
        if (*(cuuint64_t *)value != 0)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            pool->used_high = pool->used;
        break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && (!pool_valid(pool) || value == NULL))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES: *(int *)value = pool->reuse[attr - 1]; break;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *(cuuint64_t *)value = pool->release_threshold; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *(cuuint64_t *)value = pool->used; break;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *(cuuint64_t *)value = pool->used_high; break;
    default: r = CUDA_ERROR_INVALID_VALUE; break;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    (void)minBytesToKeep; /* nothing is cached */
    CUresult r = fake_ready();
    return r == CUDA_SUCCESS && !pool_valid(pool) ? CUDA_ERROR_INVALID_VALUE : r;
}

CUresult cuMemPoolSetAccess(CUmemoryPool pool, const CUmemAccessDesc *map, size_t count)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && (!pool_valid(pool) || (map == NULL && count != 0)))
        r = CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; r == CUDA_SUCCESS && i < count; i++)
        if (!device_location(&map[i].location))
            r = CUDA_ERROR_INVALID_DEVICE; /* one device: access is its own, always read-write */
    return r;
}

CUresult cuMemPoolGetAccess(CUmemAccess_flags *flags, CUmemoryPool memPool, CUmemLocation *location)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && (flags == NULL || !pool_valid(memPool) || location == NULL))
        r = CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *flags = device_location(location) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return r;
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
    FAKE_SERVED();
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    int on_device = 0;
    if (handle == NULL || size == 0 || size % GRANULARITY != 0 || flags != 0 || !prop_location_ok(prop, &on_device))
        return CUDA_ERROR_INVALID_VALUE;
    if (on_device && fgpu_mem_reserve(size) != FGPU_OK)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *home = map_anywhere(size, 1);
    pthread_mutex_lock(&lock);
    uint64_t h = next_handle++;
    struct object *o = home == NULL ? NULL
                                    : add_locked((struct object){.kind = OBJ_HANDLE, .key = h, .size = size,
                                                                 .handle_refs = 1, .on_device = on_device,
                                                                 .home = home});
    pthread_mutex_unlock(&lock);
    if (o == NULL) {
        if (home != NULL)
            munmap(home, size);
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
    munmap(h->home, (size_t)h->size);
    remove_locked(h);
    return bytes;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FAKE_SERVED();
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

CUresult cuMemGetAllocationPropertiesFromHandle(CUmemAllocationProp *prop, CUmemGenericAllocationHandle handle)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (prop == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    const struct object *h = find_locked(OBJ_HANDLE, handle);
    int on_device = h != NULL && h->on_device;
    pthread_mutex_unlock(&lock);
    if (h == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->location.type = on_device ? CU_MEM_LOCATION_TYPE_DEVICE : CU_MEM_LOCATION_TYPE_HOST;
    return CUDA_SUCCESS;
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
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (ptr == NULL || size == 0 || size % GRANULARITY != 0 || flags != 0 || (alignment & (alignment - 1)) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t align = alignment > GRANULARITY ? alignment : GRANULARITY;
    void *start = reserve_range(size, align, (uint64_t)addr);
    if (start == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    struct object *o = add_locked((struct object){.kind = OBJ_VA, .key = (uint64_t)(uintptr_t)start, .size = size});
    pthread_mutex_unlock(&lock);
    if (o == NULL) {
        munmap(start, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *ptr = (CUdeviceptr)(uintptr_t)start;
    return CUDA_SUCCESS;
}

CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&lock);
    struct object *va = find_locked(OBJ_VA, (uint64_t)ptr);
    if (va == NULL || va->size != size || !range_unmapped_locked((uint64_t)ptr, size)) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        remove_locked(va);
        munmap((void *)(uintptr_t)ptr, size);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                  unsigned long long flags)
{
    FAKE_SERVED();
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
    } else if (mremap(h->home, 0, size, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)(uintptr_t)start) == MAP_FAILED) {
        r = CUDA_ERROR_OUT_OF_MEMORY; /* the same pages, mapped again over the reservation */
    } else {
        h->mappings++;
        uint64_t key = handle;
        if (add_locked((struct object){.kind = OBJ_MAPPING, .key = start, .size = size, .handle = key}) == NULL) {
            h = find_locked(OBJ_HANDLE, key); /* add_locked may have moved the table */
            h->mappings--;
            re_reserve(start, size);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        }
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    FAKE_SERVED();
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t at = (uint64_t)ptr, end = (uint64_t)ptr + size, freed = 0;
    if (size == 0 || end < at)
        return CUDA_ERROR_INVALID_VALUE;
    fake_all_streams_wait_idle(); /* no queued copy may touch the range once it is unmapped */
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
        uint64_t handle = m->handle, length = m->size;
        re_reserve(at, length);
        at += length;
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

CUresult cuMemGetAccess(unsigned long long *flags, const CUmemLocation *location, CUdeviceptr ptr)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (flags == NULL || location == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    int mapped = containing_locked(OBJ_MAPPING, (uint64_t)ptr) != NULL;
    pthread_mutex_unlock(&lock);
    if (!mapped)
        return CUDA_ERROR_INVALID_VALUE;
    *flags = device_location(location) ? CU_MEM_ACCESS_FLAGS_PROT_READWRITE : CU_MEM_ACCESS_FLAGS_PROT_NONE;
    return CUDA_SUCCESS;
}

CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    FAKE_SERVED();
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

static CUresult create_array(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t bytes = array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels,
                                 desc->Flags, &r);
    if (r != CUDA_SUCCESS)
        return r;
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUarray array = charged_object(sizeof *array, bytes);
    unsigned char *data = array != NULL && bytes != 0 ? map_anywhere(bytes, 0) : NULL;
    if (array == NULL || (bytes != 0 && data == NULL)) {
        if (array != NULL) {
            fgpu_mem_release(bytes);
            free(array);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *array = (struct CUarray_st){.magic = FAKE_ARRAY_MAGIC, .bytes = bytes, .data = data, .desc = *desc};
    *pHandle = array;
    return CUDA_SUCCESS;
}

CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    FAKE_SERVED();
    if (pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY_DESCRIPTOR *a = pAllocateArray;
    CUDA_ARRAY3D_DESCRIPTOR desc = {a->Width, a->Height, 0, a->Format, a->NumChannels, 0};
    return create_array(pHandle, &desc);
}

CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray)
{
    FAKE_SERVED();
    if (pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY_DESCRIPTOR_v1 *a = pAllocateArray;
    CUDA_ARRAY3D_DESCRIPTOR desc = {a->Width, a->Height, 0, a->Format, a->NumChannels, 0};
    return create_array(pHandle, &desc);
}

CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    FAKE_SERVED();
    if (pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return create_array(pHandle, pAllocateArray);
}

CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray)
{
    FAKE_SERVED();
    if (pAllocateArray == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR_v1 *a = pAllocateArray;
    CUDA_ARRAY3D_DESCRIPTOR desc = {a->Width, a->Height, a->Depth, a->Format, a->NumChannels, a->Flags};
    return create_array(pHandle, &desc);
}

static int array_valid(CUarray array)
{
    return array != NULL && array->magic == FAKE_ARRAY_MAGIC;
}

CUresult cuArrayDestroy(CUarray hArray)
{
    FAKE_SERVED();
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (!array_valid(hArray))
        return CUDA_ERROR_INVALID_HANDLE;
    fake_all_streams_wait_idle();
    hArray->magic = 0;
    if (hArray->data != NULL)
        munmap(hArray->data, (size_t)hArray->bytes);
    fgpu_mem_release(hArray->bytes);
    free(hArray);
    return CUDA_SUCCESS;
}

int fake_array_layout(CUarray array, struct fake_array_layout *layout)
{
    if (!array_valid(array))
        return -1;
    const CUDA_ARRAY3D_DESCRIPTOR *d = &array->desc;
    *layout = (struct fake_array_layout){
        .data = array->data,
        .bytes = array->bytes,
        .pitch = (uint64_t)d->Width * channel_bytes(d->Format) * d->NumChannels,
        .height = d->Height ? d->Height : 1,
        .depth = d->Depth ? d->Depth : 1,
    };
    return 0;
}

static CUresult array_descriptor(CUarray hArray, CUDA_ARRAY3D_DESCRIPTOR *out)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && !array_valid(hArray))
        r = CUDA_ERROR_INVALID_HANDLE;
    if (r == CUDA_SUCCESS)
        *out = hArray->desc;
    return r;
}

CUresult cuArrayGetDescriptor_v2(CUDA_ARRAY_DESCRIPTOR *pArrayDescriptor, CUarray hArray)
{
    CUDA_ARRAY3D_DESCRIPTOR d;
    CUresult r = pArrayDescriptor != NULL ? array_descriptor(hArray, &d) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pArrayDescriptor = (CUDA_ARRAY_DESCRIPTOR){d.Width, d.Height, d.Format, d.NumChannels};
    return r;
}

CUresult cuArrayGetDescriptor(CUDA_ARRAY_DESCRIPTOR_v1 *pArrayDescriptor, CUarray hArray)
{
    CUDA_ARRAY3D_DESCRIPTOR d;
    CUresult r = pArrayDescriptor != NULL ? array_descriptor(hArray, &d) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pArrayDescriptor = (CUDA_ARRAY_DESCRIPTOR_v1){(unsigned int)d.Width, (unsigned int)d.Height, d.Format,
                                                       d.NumChannels};
    return r;
}

CUresult cuArray3DGetDescriptor_v2(CUDA_ARRAY3D_DESCRIPTOR *pArrayDescriptor, CUarray hArray)
{
    return pArrayDescriptor != NULL ? array_descriptor(hArray, pArrayDescriptor) : CUDA_ERROR_INVALID_VALUE;
}

CUresult cuArray3DGetDescriptor(CUDA_ARRAY3D_DESCRIPTOR_v1 *pArrayDescriptor, CUarray hArray)
{
    CUDA_ARRAY3D_DESCRIPTOR d;
    CUresult r = pArrayDescriptor != NULL ? array_descriptor(hArray, &d) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS)
        *pArrayDescriptor = (CUDA_ARRAY3D_DESCRIPTOR_v1){(unsigned int)d.Width, (unsigned int)d.Height,
                                                         (unsigned int)d.Depth, d.Format, d.NumChannels, d.Flags};
    return r;
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
    FAKE_SERVED();
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
    FAKE_SERVED();
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

/* --- page-locked host memory (not counted in the GPU's pool) --------------------------------- */

static CUresult host_alloc(void **pp, uint64_t bytes, unsigned int flags)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (pp == NULL || bytes == 0 || (flags & ~(unsigned int)HOST_ALLOC_FLAGS) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *p = map_anywhere(bytes, 0);
    if (p == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&lock);
    struct object *o =
        add_locked((struct object){.kind = OBJ_HOST, .key = (uint64_t)(uintptr_t)p, .size = bytes, .flags = flags});
    pthread_mutex_unlock(&lock);
    if (o == NULL) {
        munmap(p, (size_t)bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult cuMemAllocHost_v2(void **pp, size_t bytesize)
{
    FAKE_SERVED();
    return host_alloc(pp, bytesize, 0);
}

CUresult cuMemAllocHost(void **pp, unsigned int bytesize)
{
    FAKE_SERVED();
    return host_alloc(pp, bytesize, 0);
}

CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    FAKE_SERVED();
    return host_alloc(pp, bytesize, Flags);
}

CUresult cuMemFreeHost(void *p)
{
    FAKE_SERVED();
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    fake_all_streams_wait_idle();
    uint64_t bytes = 0;
    pthread_mutex_lock(&lock);
    struct object *o = find_locked(OBJ_HOST, (uint64_t)(uintptr_t)p);
    if (o != NULL) {
        bytes = o->size;
        remove_locked(o);
    }
    pthread_mutex_unlock(&lock);
    if (o == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    munmap(p, (size_t)bytes);
    return CUDA_SUCCESS;
}

static CUresult host_register(void *p, size_t bytesize, unsigned int flags)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t start = (uint64_t)(uintptr_t)p;
    if (p == NULL || bytesize == 0 || start + bytesize < start || (flags & ~(unsigned int)HOST_REGISTER_FLAGS) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (flags & CU_MEMHOSTREGISTER_IOMEMORY)
        return CUDA_ERROR_NOT_SUPPORTED; /* no I/O memory to map */
    pthread_mutex_lock(&lock);
    if (overlaps_memory_locked(start, bytesize))
        r = CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    else if (add_locked((struct object){.kind = OBJ_REGISTERED, .key = start, .size = bytesize, .flags = flags}) ==
             NULL)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(p, bytesize, Flags);
}

CUresult cuMemHostRegister(void *p, size_t bytesize, unsigned int Flags)
{
    return host_register(p, bytesize, Flags);
}

CUresult cuMemHostUnregister(void *p)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    fake_all_streams_wait_idle(); /* the caller may free the memory once this returns */
    pthread_mutex_lock(&lock);
    struct object *o = find_locked(OBJ_REGISTERED, (uint64_t)(uintptr_t)p);
    if (o == NULL)
        r = CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    else
        remove_locked(o);
    pthread_mutex_unlock(&lock);
    return r;
}

/* The page-locked allocation (allocated or registered) containing p, copied out. */
static int host_memory_at(void *p, struct object *out)
{
    pthread_mutex_lock(&lock);
    struct object *o = memory_at_locked((uint64_t)(uintptr_t)p);
    int found = o != NULL && (o->kind == OBJ_HOST || o->kind == OBJ_REGISTERED);
    if (found)
        *out = *o;
    pthread_mutex_unlock(&lock);
    return found;
}

CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    struct object o;
    if (pdptr == NULL || Flags != 0 || !host_memory_at(p, &o))
        return CUDA_ERROR_INVALID_VALUE;
    *pdptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return CUDA_SUCCESS;
}

CUresult cuMemHostGetDevicePointer(CUdeviceptr_v1 *pdptr, void *p, unsigned int Flags)
{
    CUdeviceptr wide = 0;
    CUresult r = pdptr != NULL ? cuMemHostGetDevicePointer_v2(&wide, p, Flags) : CUDA_ERROR_INVALID_VALUE;
    if (r == CUDA_SUCCESS && wide > UINT_MAX)
        r = CUDA_ERROR_INVALID_VALUE; /* not addressable through the 32-bit ABI */
    if (r == CUDA_SUCCESS)
        *pdptr = (CUdeviceptr_v1)wide;
    return r;
}

CUresult cuMemHostGetFlags(unsigned int *pFlags, void *p)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    struct object o;
    if (pFlags == NULL || !host_memory_at(p, &o))
        return CUDA_ERROR_INVALID_VALUE;
    *pFlags = o.flags;
    return CUDA_SUCCESS;
}

/* --- IPC memory (ipc_memory.c) -------------------------------------------------------------- */

int fake_mem_exportable(uint64_t dptr, uint64_t *size)
{
    pthread_mutex_lock(&lock);
    const struct object *o = find_locked(OBJ_DEVPTR, dptr);
    int ok = o != NULL && o->legacy_ipc;
    if (ok)
        *size = o->size;
    pthread_mutex_unlock(&lock);
    return ok ? 0 : -1;
}

/* Copies the pages of [from, from + bytes) that may hold data into to: the resident ones that are
 * not all zeros (a page never written reads as zeros, and the file's hole already does). Without
 * mincore's answer, every page is read. */
static void copy_written_pages(unsigned char *to, const unsigned char *from, uint64_t bytes)
{
    uint64_t page = page_size(), pages = (bytes + page - 1) / page;
    unsigned char *resident = malloc((size_t)pages);
    if (resident != NULL && mincore((void *)from, (size_t)bytes, resident) != 0) {
        free(resident);
        resident = NULL;
    }
    static const unsigned char zeros[65536];
    for (uint64_t i = 0; i < pages; i++) {
        if (resident != NULL && !(resident[i] & 1))
            continue;
        uint64_t at = i * page, len = bytes - at < page ? bytes - at : page;
        int zero = 1;
        for (uint64_t z = 0; zero && z < len; z += sizeof zeros)
            zero = memcmp(from + at + z, zeros, (size_t)(len - z < sizeof zeros ? len - z : sizeof zeros)) == 0;
        if (!zero)
            memcpy(to + at, from + at, (size_t)len);
    }
    free(resident);
}

int fake_mem_share(uint64_t dptr, int fd, uint64_t offset, uint64_t span)
{
    pthread_mutex_lock(&lock);
    struct object *o = find_locked(OBJ_DEVPTR, dptr);
    int rc = -1;
    uint64_t bytes = o != NULL ? round_up(o->size, page_size()) : 0;
    if (o != NULL && o->exported) {
        rc = 0;
    } else if (o != NULL && bytes <= span) {
        void *file = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)offset);
        if (file != MAP_FAILED) {
            copy_written_pages(file, (const unsigned char *)(uintptr_t)dptr, o->size);
            munmap(file, (size_t)bytes);
            void *at = mmap((void *)(uintptr_t)dptr, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
                            fd, (off_t)offset);
            if (at == (void *)(uintptr_t)dptr) {
                o->exported = 1;
                rc = 0;
            }
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

int fake_mem_add_import(uint64_t ptr, uint64_t size)
{
    pthread_mutex_lock(&lock);
    struct object *o = add_locked((struct object){.kind = OBJ_IMPORT, .key = ptr, .size = size});
    pthread_mutex_unlock(&lock);
    return o != NULL ? 0 : -1;
}

void fake_mem_remove_import(uint64_t ptr)
{
    pthread_mutex_lock(&lock);
    struct object *o = find_locked(OBJ_IMPORT, ptr);
    if (o != NULL)
        remove_locked(o);
    pthread_mutex_unlock(&lock);
}

/* --- what the copies and the pointer queries learn (fake_memory.h) ---------------------------- */

static void describe_locked(const struct object *o, struct fake_mem_info *info)
{
    *info = (struct fake_mem_info){
        .kind = o->kind == OBJ_HOST || o->kind == OBJ_REGISTERED ? FAKE_MEM_HOST : FAKE_MEM_DEVICE,
        .start = o->key,
        .size = o->size,
        .mapping_start = o->key,
        .mapping_size = o->size,
        .id = o->id,
        .ctx = o->ctx,
        .pool = o->pool,
        .host_flags = o->flags,
        .managed = o->managed,
        .registered = o->kind == OBJ_REGISTERED,
        .legacy_ipc = o->legacy_ipc,
        .sync_memops = o->sync_memops,
        .vmm = o->kind == OBJ_MAPPING,
    };
    if (o->kind == OBJ_MAPPING) {
        const struct object *h = find_locked(OBJ_HANDLE, o->handle);
        info->id = h != NULL ? h->id : o->id;
        info->kind = h != NULL && !h->on_device ? FAKE_MEM_HOST : FAKE_MEM_DEVICE;
    }
}

int fake_mem_query(uint64_t ptr, struct fake_mem_info *info)
{
    pthread_mutex_lock(&lock);
    const struct object *o = memory_at_locked(ptr);
    if (o != NULL)
        describe_locked(o, info);
    pthread_mutex_unlock(&lock);
    return o != NULL ? 0 : -1;
}

int fake_mem_range(uint64_t ptr, uint64_t len)
{
    pthread_mutex_lock(&lock);
    const struct object *o = memory_at_locked(ptr);
    int kind = FAKE_MEM_NONE;
    if (o != NULL) {
        struct fake_mem_info info;
        describe_locked(o, &info);
        kind = (int)info.kind;
        uint64_t end = o->key + o->size; /* back-to-back VMM mappings continue the range */
        while (o != NULL && o->kind == OBJ_MAPPING && len > end - ptr &&
               (o = find_locked(OBJ_MAPPING, end)) != NULL)
            end = o->key + o->size;
        if (len > end - ptr)
            kind = -1;
    }
    pthread_mutex_unlock(&lock);
    return kind;
}

int fake_mem_set_sync_memops(uint64_t ptr, int value)
{
    pthread_mutex_lock(&lock);
    struct object *o = memory_at_locked(ptr);
    if (o != NULL)
        o->sync_memops = value != 0;
    pthread_mutex_unlock(&lock);
    return o != NULL ? 0 : -1;
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
