/*
 * memory_hooks.c: the exported memory wrappers. Allocations reserve in the pod's ledger
 * (memory.h) BEFORE the driver call, so the pod never holds more than its limit (except a pitched
 * allocation whose real pitch beats the guess below, between the driver call and the extra
 * reservation); a refused reservation returns CUDA_ERROR_OUT_OF_MEMORY and the process goes on. A
 * driver call that fails gives its reservation back. Frees release exactly what their
 * allocation reserved, found in a per-process table (alloc_table.h; O(1) average, under
 * `table_lock`, never held across a driver call or an arbiter round trip). No time token: an
 * allocation is not GPU time. The launch path (launch_hooks.c, gate.c) is untouched by this file.
 *
 * What is charged (sizes: mem_sizes.h):
 *   cuMemAlloc(_v2), cuMemAllocManaged, cuMemAllocAsync(_ptsz), cuMemAllocFromPoolAsync(_ptsz):
 *       the byte count asked for.
 *   cuMemAllocPitch(_v2): round_up(width, 512) x height before the call, corrected to the
 *       driver's pitch x height after it (a larger real pitch reserves the rest, and if that is
 *       refused the allocation is freed again and the refusal returned).
 *   cuMemCreate: the size rounded up to cuMemGetAllocationGranularity(MINIMUM) of its prop;
 *       nothing for host locations (CU_MEM_LOCATION_TYPE_HOST*: not device memory). The memory
 *       stays charged while a handle reference (cuMemCreate, cuMemRetainAllocationHandle minus
 *       cuMemRelease) or a mapping (cuMemMap minus cuMemUnmap) lives: the driver's own rule, so
 *       the common create / map / release-the-handle idiom stays charged until the unmap.
 *   cuArrayCreate(_v2), cuArray3DCreate(_v2), cuMipmappedArrayCreate: the descriptor's texel
 *       data, levels summed; nothing for CUDA_ARRAY3D_SPARSE or _DEFERRED_MAPPING arrays (their
 *       memory comes from cuMemCreate allocations mapped into them, charged there).
 * Frees: cuMemFree(_v2) and cuMemFreeAsync(_ptsz) for device pointers (any of the allocators
 * above), cuMemRelease / cuMemUnmap for VMM, cuArrayDestroy, cuMipmappedArrayDestroy. A
 * stream-ordered free releases when it is enqueued: the application can no longer use the
 * pointer, and the next allocation that reuses the memory reserves it again. A free of a
 * pointer the table does not know (imported from another process, or freed twice) is passed to
 * the driver and releases nothing.
 *
 * Views: cuMemGetInfo(_v2) reports total = min(limit, physical total) and free =
 * min(limit - pod used, physical free); cuDeviceTotalMem(_v2) reports min(limit, physical).
 * They read the ledger live (a 0-byte reservation), so a limit changed by the arbiter shows.
 *
 * Races: a free is untracked BEFORE the driver call (and put back if the call fails), because
 * once the driver has freed a pointer another thread may be handed the same value. Unmaps are
 * untracked after the call: mapped addresses belong to the application's own reservation.
 *
 * Every call of an allocation or free that reaches the driver goes through FGS_FORWARD (counts.h).
 */
#include "entry.h"

#include "alloc_table.h"
#include "counts.h"
#include "log.h"
#include "mem_sizes.h"
#include "memory.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

/* One cuMemCreate allocation: charged while a handle reference or a mapping of it lives. */
struct fgs_phys {
    uint64_t bytes;       /* what its reservation holds */
    uint32_t handle_refs; /* cuMemCreate + cuMemRetainAllocationHandle - cuMemRelease */
    uint32_t mappings;    /* cuMemMap - cuMemUnmap */
};

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct fgs_alloc_table table = FGS_ALLOC_TABLE_INIT;

/* Loads the driver; a wrapper whose real function is missing returns CUDA_ERROR_NOT_FOUND. */
#define REAL_OR_RETURN(symbol)                                                                     \
    do {                                                                                           \
        fgs_init();                                                                                \
        if (fgs_load_real() != 0)                                                                  \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
        if (fgs_real.symbol == NULL)                                                               \
            return CUDA_ERROR_NOT_FOUND;                                                           \
    } while (0)

/* --- the table, under table_lock ----------------------------------------------------------- */

static int claim(void)
{
    pthread_mutex_lock(&table_lock);
    int r = fgs_alloc_table_claim(&table);
    pthread_mutex_unlock(&table_lock);
    return r;
}

static void unclaim(void)
{
    pthread_mutex_lock(&table_lock);
    fgs_alloc_table_unclaim(&table);
    pthread_mutex_unlock(&table_lock);
}

/* A VMM allocation lost a reference: the bytes to release when it is gone (and frees it). Lock held. */
static uint64_t phys_unref_locked(struct fgs_phys *phys)
{
    if (phys->handle_refs != 0 || phys->mappings != 0)
        return 0;
    uint64_t bytes = phys->bytes;
    free(phys);
    return bytes;
}

/* The entry a put overwrote was stale (the driver handed out its key again, so the old object
 * is gone without our seeing its free): what to release for it. Lock held. */
static uint64_t drop_stale_locked(const struct fgs_alloc_entry *stale)
{
    struct fgs_phys *phys = stale->aux;
    switch (stale->kind) {
    case FGS_ALLOC_DEVPTR:
    case FGS_ALLOC_ARRAY:
    case FGS_ALLOC_MIPMAP: return stale->size;
    case FGS_ALLOC_HANDLE: phys->handle_refs = 0; return phys_unref_locked(phys);
    case FGS_ALLOC_MAPPING: phys->mappings--; return phys_unref_locked(phys);
    default: return 0;
    }
}

/* Records a new object (consuming the caller's claim). */
static void track(enum fgs_alloc_kind kind, uint64_t key, uint64_t bytes, void *aux, const char *what)
{
    struct fgs_alloc_entry stale;
    pthread_mutex_lock(&table_lock);
    uint64_t release = 0;
    if (fgs_alloc_table_put(&table, kind, key, bytes, aux, &stale) == 1)
        release = drop_stale_locked(&stale);
    pthread_mutex_unlock(&table_lock);
    if (release != 0) {
        FGS_DEBUG("%s returned 0x%llx, which the hook still had as live: releasing that stale entry", what,
                  (unsigned long long)key);
        fgs_memory_release(release, what);
    }
}

/* Before an allocation: room in the table and the bytes in the ledger. */
static CUresult begin_alloc(uint64_t bytes, const char *what)
{
    if (claim() != 0) {
        FGS_ERROR("%s: no host memory for the hook's allocation table", what);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = fgs_memory_reserve(bytes, what);
    if (r != CUDA_SUCCESS)
        unclaim();
    return r;
}

/* After the driver call of begin_alloc: track the object, or give everything back. */
static CUresult end_alloc(CUresult driver_result, enum fgs_alloc_kind kind, uint64_t key, uint64_t bytes,
                          void *aux, const char *what)
{
    if (driver_result != CUDA_SUCCESS) {
        unclaim();
        fgs_memory_release(bytes, what);
        return driver_result;
    }
    track(kind, key, bytes, aux, what);
    return CUDA_SUCCESS;
}

/* Before a free: take the object out of the table. 0: unknown; 1: taken, with a claim to put
 * it back; -1: taken without one (cannot happen: the take itself made room). */
static int begin_free(enum fgs_alloc_kind kind, uint64_t key, struct fgs_alloc_entry *entry)
{
    pthread_mutex_lock(&table_lock);
    int known = fgs_alloc_table_take(&table, kind, key, entry);
    if (known && fgs_alloc_table_claim(&table) != 0)
        known = -1;
    pthread_mutex_unlock(&table_lock);
    return known;
}

/* After the driver's free: release, or put the object back if the free failed. */
static CUresult end_free(CUresult driver_result, int known, const struct fgs_alloc_entry *entry, const char *what)
{
    if (known == 0) {
        if (driver_result == CUDA_SUCCESS)
            FGS_DEBUG("%s of 0x%llx: not an allocation the hook tracks; nothing released", what,
                      (unsigned long long)entry->key);
        return driver_result;
    }
    if (driver_result == CUDA_SUCCESS) {
        if (known == 1)
            unclaim();
        fgs_memory_release(entry->size, what);
        return driver_result;
    }
    /* The driver did not free it: it is still live (put claims for itself when known == -1). */
    pthread_mutex_lock(&table_lock);
    fgs_alloc_table_put(&table, (enum fgs_alloc_kind)entry->kind, entry->key, entry->size, entry->aux, NULL);
    pthread_mutex_unlock(&table_lock);
    return driver_result;
}

/* Untrack, call the driver's free, then release or put back. */
#define FREE_TRACKED(kind_, key_, what_, call_)                                                    \
    do {                                                                                           \
        struct fgs_alloc_entry entry_ = {.key = (key_)};                                           \
        int known_ = begin_free((kind_), (key_), &entry_);                                         \
        return end_free((call_), known_, &entry_, (what_));                                        \
    } while (0)

/* --- linear memory ------------------------------------------------------------------------ */

/* Reserve, call the driver's allocation, then track the new pointer or undo. */
#define ALLOC_TRACKED(what_, bytes_in_, call_, out_key_)                                           \
    do {                                                                                           \
        uint64_t bytes_ = (bytes_in_);                                                             \
        CUresult r_ = begin_alloc(bytes_, (what_));                                                \
        if (r_ != CUDA_SUCCESS)                                                                    \
            return r_;                                                                             \
        r_ = (call_);                                                                              \
        return end_alloc(r_, FGS_ALLOC_DEVPTR, r_ == CUDA_SUCCESS ? (uint64_t)(out_key_) : 0, bytes_, NULL, \
                         (what_));                                                                 \
    } while (0)

FGS_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    REAL_OR_RETURN(cuMemAlloc_v2);
    ALLOC_TRACKED("cuMemAlloc_v2", bytesize, FGS_FORWARD(cuMemAlloc_v2, dptr, bytesize), *dptr);
}

FGS_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    REAL_OR_RETURN(cuMemAlloc);
    ALLOC_TRACKED("cuMemAlloc", bytesize, FGS_FORWARD(cuMemAlloc, dptr, bytesize), *dptr);
}

FGS_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    REAL_OR_RETURN(cuMemAllocManaged);
    ALLOC_TRACKED("cuMemAllocManaged", bytesize, FGS_FORWARD(cuMemAllocManaged, dptr, bytesize, flags), *dptr);
}

FGS_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    REAL_OR_RETURN(cuMemAllocAsync);
    ALLOC_TRACKED("cuMemAllocAsync", bytesize, FGS_FORWARD(cuMemAllocAsync, dptr, bytesize, hStream), *dptr);
}

FGS_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    REAL_OR_RETURN(cuMemAllocAsync_ptsz);
    ALLOC_TRACKED("cuMemAllocAsync_ptsz", bytesize, FGS_FORWARD(cuMemAllocAsync_ptsz, dptr, bytesize, hStream),
                  *dptr);
}

FGS_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                            CUstream hStream)
{
    REAL_OR_RETURN(cuMemAllocFromPoolAsync);
    ALLOC_TRACKED("cuMemAllocFromPoolAsync", bytesize,
                  FGS_FORWARD(cuMemAllocFromPoolAsync, dptr, bytesize, pool, hStream), *dptr);
}

FGS_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                                 CUstream hStream)
{
    REAL_OR_RETURN(cuMemAllocFromPoolAsync_ptsz);
    ALLOC_TRACKED("cuMemAllocFromPoolAsync_ptsz", bytesize,
                  FGS_FORWARD(cuMemAllocFromPoolAsync_ptsz, dptr, bytesize, pool, hStream), *dptr);
}

FGS_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    REAL_OR_RETURN(cuMemFree_v2);
    FREE_TRACKED(FGS_ALLOC_DEVPTR, (uint64_t)dptr, "cuMemFree_v2", FGS_FORWARD(cuMemFree_v2, dptr));
}

FGS_EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    REAL_OR_RETURN(cuMemFree);
    FREE_TRACKED(FGS_ALLOC_DEVPTR, (uint64_t)dptr, "cuMemFree", FGS_FORWARD(cuMemFree, dptr));
}

FGS_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    REAL_OR_RETURN(cuMemFreeAsync);
    FREE_TRACKED(FGS_ALLOC_DEVPTR, (uint64_t)dptr, "cuMemFreeAsync", FGS_FORWARD(cuMemFreeAsync, dptr, hStream));
}

FGS_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    REAL_OR_RETURN(cuMemFreeAsync_ptsz);
    FREE_TRACKED(FGS_ALLOC_DEVPTR, (uint64_t)dptr, "cuMemFreeAsync_ptsz",
                 FGS_FORWARD(cuMemFreeAsync_ptsz, dptr, hStream));
}

/* --- pitched memory ----------------------------------------------------------------------- */

/* The driver chose its pitch: make the reservation `guess` into `actual`. CUDA_SUCCESS, or the
 * refusal of the extra bytes (the reservation is then still `guess`). */
static CUresult settle_pitch(uint64_t guess, uint64_t actual, const char *what)
{
    if (actual < guess) {
        fgs_memory_release(guess - actual, what);
        return CUDA_SUCCESS;
    }
    return fgs_memory_reserve(actual - guess, what);
}

static uint64_t pitch_guess(uint64_t width, uint64_t height)
{
    return fgs_mul_sat(fgs_round_up(width, FGS_PITCH_GUESS_ALIGN), height);
}

FGS_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,
                                       unsigned int ElementSizeBytes)
{
    static const char what[] = "cuMemAllocPitch_v2";
    REAL_OR_RETURN(cuMemAllocPitch_v2);
    uint64_t guess = pitch_guess(WidthInBytes, Height);
    CUresult r = begin_alloc(guess, what);
    if (r != CUDA_SUCCESS)
        return r;
    r = FGS_FORWARD(cuMemAllocPitch_v2, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS)
        return end_alloc(r, FGS_ALLOC_DEVPTR, 0, guess, NULL, what);
    uint64_t actual = fgs_mul_sat(*pPitch, Height);
    r = settle_pitch(guess, actual, what);
    if (r != CUDA_SUCCESS) { /* the driver's pitch needs more than the pod has left */
        if (fgs_real.cuMemFree_v2 != NULL)
            FGS_FORWARD(cuMemFree_v2, *dptr);
        *dptr = 0;
        return end_alloc(r, FGS_ALLOC_DEVPTR, 0, guess, NULL, what);
    }
    return end_alloc(CUDA_SUCCESS, FGS_ALLOC_DEVPTR, (uint64_t)*dptr, actual, NULL, what);
}

FGS_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pPitch, unsigned int WidthInBytes,
                                    unsigned int Height, unsigned int ElementSizeBytes)
{
    static const char what[] = "cuMemAllocPitch";
    REAL_OR_RETURN(cuMemAllocPitch);
    uint64_t guess = pitch_guess(WidthInBytes, Height);
    CUresult r = begin_alloc(guess, what);
    if (r != CUDA_SUCCESS)
        return r;
    r = FGS_FORWARD(cuMemAllocPitch, dptr, pPitch, WidthInBytes, Height, ElementSizeBytes);
    if (r != CUDA_SUCCESS)
        return end_alloc(r, FGS_ALLOC_DEVPTR, 0, guess, NULL, what);
    uint64_t actual = fgs_mul_sat(*pPitch, Height);
    r = settle_pitch(guess, actual, what);
    if (r != CUDA_SUCCESS) {
        if (fgs_real.cuMemFree != NULL)
            FGS_FORWARD(cuMemFree, *dptr);
        *dptr = 0;
        return end_alloc(r, FGS_ALLOC_DEVPTR, 0, guess, NULL, what);
    }
    return end_alloc(CUDA_SUCCESS, FGS_ALLOC_DEVPTR, (uint64_t)*dptr, actual, NULL, what);
}

/* --- virtual memory management ------------------------------------------------------------ */

static int is_device_memory(const CUmemAllocationProp *prop)
{
    if (prop == NULL)
        return 1;
    switch (prop->location.type) {
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: return 0;
    default: return 1;
    }
}

/* The bytes the driver really backs: size rounded up to the minimum granularity of prop. */
static uint64_t granular_size(size_t size, const CUmemAllocationProp *prop)
{
    size_t granularity = 0;
    if (prop != NULL && fgs_real.cuMemGetAllocationGranularity != NULL &&
        fgs_real.cuMemGetAllocationGranularity(&granularity, prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) ==
            CUDA_SUCCESS)
        return fgs_round_up(size, granularity);
    return size;
}

FGS_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                unsigned long long flags)
{
    static const char what[] = "cuMemCreate";
    REAL_OR_RETURN(cuMemCreate);
    struct fgs_phys *phys = malloc(sizeof *phys);
    if (phys == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uint64_t bytes = is_device_memory(prop) ? granular_size(size, prop) : 0;
    CUresult r = begin_alloc(bytes, what);
    if (r != CUDA_SUCCESS) {
        free(phys);
        return r;
    }
    r = FGS_FORWARD(cuMemCreate, handle, size, prop, flags);
    if (r != CUDA_SUCCESS) {
        free(phys);
        return end_alloc(r, FGS_ALLOC_HANDLE, 0, bytes, NULL, what);
    }
    *phys = (struct fgs_phys){.bytes = bytes, .handle_refs = 1, .mappings = 0};
    return end_alloc(CUDA_SUCCESS, FGS_ALLOC_HANDLE, (uint64_t)*handle, bytes, phys, what);
}

FGS_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    REAL_OR_RETURN(cuMemRelease);
    /* The handle's last reference leaves the table before the driver call (the driver may hand
     * the value out again at once); its memory stays charged while mappings remain. */
    struct fgs_phys *phys = NULL;
    int last = 0;
    pthread_mutex_lock(&table_lock);
    struct fgs_alloc_entry *entry = fgs_alloc_table_find(&table, FGS_ALLOC_HANDLE, (uint64_t)handle);
    if (entry != NULL) {
        phys = entry->aux;
        if (phys->handle_refs <= 1) {
            last = 1;
            fgs_alloc_table_take(&table, FGS_ALLOC_HANDLE, (uint64_t)handle, NULL);
            if (fgs_alloc_table_claim(&table) != 0) /* cannot fail: the take made room */
                last = 2;
        } else {
            phys->handle_refs--;
        }
    }
    pthread_mutex_unlock(&table_lock);

    CUresult r = FGS_FORWARD(cuMemRelease, handle);

    uint64_t release = 0;
    pthread_mutex_lock(&table_lock);
    if (phys != NULL && r == CUDA_SUCCESS && last) {
        if (last == 1)
            fgs_alloc_table_unclaim(&table);
        phys->handle_refs = 0;
        release = phys_unref_locked(phys);
    } else if (phys != NULL && r != CUDA_SUCCESS) { /* still referenced: undo */
        if (!last)
            phys->handle_refs++;
        else
            fgs_alloc_table_put(&table, FGS_ALLOC_HANDLE, (uint64_t)handle, phys->bytes, phys, NULL);
    }
    pthread_mutex_unlock(&table_lock);
    fgs_memory_release(release, "cuMemRelease");
    return r;
}

FGS_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                             unsigned long long flags)
{
    REAL_OR_RETURN(cuMemMap);
    if (claim() != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = FGS_FORWARD(cuMemMap, ptr, size, offset, handle, flags);
    uint64_t release = 0;
    pthread_mutex_lock(&table_lock);
    struct fgs_alloc_entry *entry =
        r == CUDA_SUCCESS ? fgs_alloc_table_find(&table, FGS_ALLOC_HANDLE, (uint64_t)handle) : NULL;
    if (entry != NULL) {
        struct fgs_phys *phys = entry->aux;
        struct fgs_alloc_entry stale;
        phys->mappings++;
        if (fgs_alloc_table_put(&table, FGS_ALLOC_MAPPING, (uint64_t)ptr, size, phys, &stale) == 1)
            release = drop_stale_locked(&stale);
    } else {
        fgs_alloc_table_unclaim(&table); /* failed, or a handle the hook does not know (imported) */
    }
    pthread_mutex_unlock(&table_lock);
    fgs_memory_release(release, "cuMemMap");
    return r;
}

FGS_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    REAL_OR_RETURN(cuMemUnmap);
    CUresult r = FGS_FORWARD(cuMemUnmap, ptr, size);
    if (r != CUDA_SUCCESS)
        return r;
    /* The range covers whole mappings, back to back from ptr. */
    uint64_t release = 0, at = (uint64_t)ptr, end = fgs_add_sat((uint64_t)ptr, size);
    struct fgs_alloc_entry mapping;
    pthread_mutex_lock(&table_lock);
    while (at < end && fgs_alloc_table_take(&table, FGS_ALLOC_MAPPING, at, &mapping)) {
        struct fgs_phys *phys = mapping.aux;
        phys->mappings--;
        release = fgs_add_sat(release, phys_unref_locked(phys));
        if (mapping.size == 0)
            break;
        at = fgs_add_sat(at, mapping.size);
    }
    pthread_mutex_unlock(&table_lock);
    fgs_memory_release(release, "cuMemUnmap");
    return r;
}

FGS_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr)
{
    REAL_OR_RETURN(cuMemRetainAllocationHandle);
    if (claim() != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = FGS_FORWARD(cuMemRetainAllocationHandle, handle, addr);
    pthread_mutex_lock(&table_lock);
    int used_claim = 0;
    if (r == CUDA_SUCCESS && handle != NULL) {
        struct fgs_alloc_entry *known = fgs_alloc_table_find(&table, FGS_ALLOC_HANDLE, (uint64_t)*handle);
        struct fgs_alloc_entry *mapping =
            known == NULL ? fgs_alloc_table_find(&table, FGS_ALLOC_MAPPING, (uint64_t)(uintptr_t)addr) : NULL;
        if (known != NULL) {
            ((struct fgs_phys *)known->aux)->handle_refs++;
        } else if (mapping != NULL) { /* the handle was released while mapped: it lives again */
            struct fgs_phys *phys = mapping->aux;
            phys->handle_refs++;
            fgs_alloc_table_put(&table, FGS_ALLOC_HANDLE, (uint64_t)*handle, phys->bytes, phys, NULL);
            used_claim = 1;
        }
    }
    if (!used_claim)
        fgs_alloc_table_unclaim(&table);
    pthread_mutex_unlock(&table_lock);
    return r;
}

/* --- arrays ------------------------------------------------------------------------------- */

/* Sparse and deferred-mapping arrays get their memory from cuMemCreate allocations, charged there. */
static int backed_later(unsigned int flags)
{
    return (flags & (CUDA_ARRAY3D_SPARSE | CUDA_ARRAY3D_DEFERRED_MAPPING)) != 0;
}

#define ARRAY_TRACKED(what_, kind_, bytes_in_, call_, out_handle_)                                 \
    do {                                                                                           \
        uint64_t bytes_ = (bytes_in_);                                                             \
        CUresult r_ = begin_alloc(bytes_, (what_));                                                \
        if (r_ != CUDA_SUCCESS)                                                                    \
            return r_;                                                                             \
        r_ = (call_);                                                                              \
        return end_alloc(r_, (kind_), r_ == CUDA_SUCCESS ? (uint64_t)(uintptr_t)(out_handle_) : 0, bytes_, \
                         NULL, (what_));                                                           \
    } while (0)

FGS_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    REAL_OR_RETURN(cuArrayCreate_v2);
    const CUDA_ARRAY_DESCRIPTOR *d = pAllocateArray;
    uint64_t bytes = d != NULL ? fgs_array_bytes((unsigned int)d->Format, d->NumChannels, d->Width, d->Height, 1) : 0;
    ARRAY_TRACKED("cuArrayCreate_v2", FGS_ALLOC_ARRAY, bytes, FGS_FORWARD(cuArrayCreate_v2, pHandle, pAllocateArray),
                  *pHandle);
}

FGS_EXPORT CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR_v1 *pAllocateArray)
{
    REAL_OR_RETURN(cuArrayCreate);
    const CUDA_ARRAY_DESCRIPTOR_v1 *d = pAllocateArray;
    uint64_t bytes = d != NULL ? fgs_array_bytes((unsigned int)d->Format, d->NumChannels, d->Width, d->Height, 1) : 0;
    ARRAY_TRACKED("cuArrayCreate", FGS_ALLOC_ARRAY, bytes, FGS_FORWARD(cuArrayCreate, pHandle, pAllocateArray),
                  *pHandle);
}

FGS_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    REAL_OR_RETURN(cuArray3DCreate_v2);
    const CUDA_ARRAY3D_DESCRIPTOR *d = pAllocateArray;
    uint64_t bytes = d != NULL && !backed_later(d->Flags)
                         ? fgs_array_bytes((unsigned int)d->Format, d->NumChannels, d->Width, d->Height, d->Depth)
                         : 0;
    ARRAY_TRACKED("cuArray3DCreate_v2", FGS_ALLOC_ARRAY, bytes,
                  FGS_FORWARD(cuArray3DCreate_v2, pHandle, pAllocateArray), *pHandle);
}

FGS_EXPORT CUresult cuArray3DCreate(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR_v1 *pAllocateArray)
{
    REAL_OR_RETURN(cuArray3DCreate);
    const CUDA_ARRAY3D_DESCRIPTOR_v1 *d = pAllocateArray;
    uint64_t bytes = d != NULL && !backed_later(d->Flags)
                         ? fgs_array_bytes((unsigned int)d->Format, d->NumChannels, d->Width, d->Height, d->Depth)
                         : 0;
    ARRAY_TRACKED("cuArray3DCreate", FGS_ALLOC_ARRAY, bytes, FGS_FORWARD(cuArray3DCreate, pHandle, pAllocateArray),
                  *pHandle);
}

FGS_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                           unsigned int numMipmapLevels)
{
    REAL_OR_RETURN(cuMipmappedArrayCreate);
    const CUDA_ARRAY3D_DESCRIPTOR *d = pMipmappedArrayDesc;
    uint64_t bytes = d != NULL && !backed_later(d->Flags)
                         ? fgs_mipmap_bytes((unsigned int)d->Format, d->NumChannels, d->Width, d->Height, d->Depth,
                                            d->Flags, numMipmapLevels)
                         : 0;
    ARRAY_TRACKED("cuMipmappedArrayCreate", FGS_ALLOC_MIPMAP, bytes,
                  FGS_FORWARD(cuMipmappedArrayCreate, pHandle, pMipmappedArrayDesc, numMipmapLevels), *pHandle);
}

FGS_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    REAL_OR_RETURN(cuArrayDestroy);
    FREE_TRACKED(FGS_ALLOC_ARRAY, (uint64_t)(uintptr_t)hArray, "cuArrayDestroy", FGS_FORWARD(cuArrayDestroy, hArray));
}

FGS_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    REAL_OR_RETURN(cuMipmappedArrayDestroy);
    FREE_TRACKED(FGS_ALLOC_MIPMAP, (uint64_t)(uintptr_t)hMipmappedArray, "cuMipmappedArrayDestroy",
                 FGS_FORWARD(cuMipmappedArrayDestroy, hMipmappedArray));
}

/* --- views -------------------------------------------------------------------------------- */

/* The pod's slice of a device the driver reported as (free, total). CUDA_SUCCESS or the refusal. */
static CUresult slice(uint64_t *free_bytes, uint64_t *total_bytes)
{
    uint64_t used, limit;
    CUresult r = fgs_memory_ledger(&used, &limit);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t total = limit < *total_bytes ? limit : *total_bytes;
    uint64_t room = limit > used ? limit - used : 0;
    uint64_t free_now = *free_bytes < room ? *free_bytes : room;
    *total_bytes = total;
    *free_bytes = free_now < total ? free_now : total;
    return CUDA_SUCCESS;
}

FGS_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    REAL_OR_RETURN(cuMemGetInfo_v2);
    CUresult r = fgs_real.cuMemGetInfo_v2(free, total);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t f = *free, t = *total;
    if ((r = slice(&f, &t)) != CUDA_SUCCESS)
        return r;
    *free = (size_t)f;
    *total = (size_t)t;
    return CUDA_SUCCESS;
}

FGS_EXPORT CUresult cuMemGetInfo(unsigned int *free, unsigned int *total)
{
    REAL_OR_RETURN(cuMemGetInfo);
    CUresult r = fgs_real.cuMemGetInfo(free, total);
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t f = *free, t = *total;
    if ((r = slice(&f, &t)) != CUDA_SUCCESS)
        return r;
    *free = (unsigned int)f; /* no larger than what the driver reported */
    *total = (unsigned int)t;
    return CUDA_SUCCESS;
}

/* The pod's limit, never above what the driver reported. */
static CUresult limited_total(uint64_t *bytes)
{
    uint64_t used, limit;
    CUresult r = fgs_memory_ledger(&used, &limit);
    if (r == CUDA_SUCCESS && limit < *bytes)
        *bytes = limit;
    return r;
}

FGS_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    REAL_OR_RETURN(cuDeviceTotalMem_v2);
    CUresult r = fgs_real.cuDeviceTotalMem_v2(bytes, dev);
    uint64_t total = r == CUDA_SUCCESS ? *bytes : 0;
    if (r == CUDA_SUCCESS && (r = limited_total(&total)) == CUDA_SUCCESS)
        *bytes = (size_t)total;
    return r;
}

FGS_EXPORT CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    REAL_OR_RETURN(cuDeviceTotalMem);
    CUresult r = fgs_real.cuDeviceTotalMem(bytes, dev);
    uint64_t total = r == CUDA_SUCCESS ? *bytes : 0;
    if (r == CUDA_SUCCESS && (r = limited_total(&total)) == CUDA_SUCCESS)
        *bytes = (unsigned int)total;
    return r;
}

/* --- fork --------------------------------------------------------------------------------- */

void fgs_memory_hooks_after_fork_child(void)
{
    /* The child cannot use the parent's CUDA objects (no CUDA after fork); forget them. */
    pthread_mutex_init(&table_lock, NULL);
    fgs_alloc_table_forget(&table);
}
