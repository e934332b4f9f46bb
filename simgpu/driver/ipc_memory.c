/*
 * ipc_memory.c: CUDA IPC memory across processes and containers: cuIpcGetMemHandle,
 * cuIpcOpenMemHandle (v1 and _v2) and cuIpcCloseMemHandle, and the GPU's IPC table.
 *
 * An allocation's bytes are the allocating process's own memory (fake_memory.c) until it is
 * exported: then they move into the simulated GPU's lock file (<dir>/fake_gpu.lock, the one file
 * besides the state file that every process of the GPU opens read-write, containers included; its
 * layout is in fake_gpu_state.h), and the file's range is mapped MAP_SHARED at the allocation's
 * address, so the device pointer does not change. An importer maps the same file range, so both
 * see and change the same bytes. The IPC table in that file (guarded by the state lock) names each
 * export's range and generation; the handle names the GPU (its UUID), the entry and the
 * generation, so a handle whose allocation was freed, or whose entry was reused since, is refused.
 *
 * Liveness, as for process slots (gpu_state.c), through POSIX record locks the kernel drops when a
 * process dies: the exporter holds a write lock on its entry's exporter byte while the allocation
 * lives, and each importer a shared read lock on the entry's importer byte while it has the handle
 * open. An entry is reusable when it is free, or when nobody holds either byte (F_GETLK); its range
 * is then punched out of the file. F_GETLK does not see the asking process's own locks, so each
 * process keeps its own exports and imports in the tables below and never asks about those.
 *
 * Accounting: the allocation stays counted once, in the exporter's slot and the pool, as cuMemAlloc
 * counted it; an import counts nothing (the bytes are the exporter's). Once the exporter has freed
 * the allocation (or died), importers that still map it hold bytes the pool no longer counts, until
 * they close (NVIDIA calls freeing before the importers close undefined behaviour).
 */
#define _GNU_SOURCE /* fallocate's FALLOC_FL_PUNCH_HOLE */
#include "fake_internal.h"

#include "fake_gpu_state.h"
#include "fake_memory.h"
#include "gpu_state.h"
#include "ipc_memory.h"
#include "raw_syscalls.h"
#include "stream_queue.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define HANDLE_MAGIC UINT64_C(0x314d435049534746) /* "FGSIPCM1" in little-endian bytes */
#define SPAN_GRANULARITY (UINT64_C(2) << 20)

/* The handle's 64 bytes (CU_IPC_HANDLE_SIZE). */
struct handle_bytes {
    uint64_t magic;
    uint8_t uuid[16]; /* the simulated GPU's */
    uint32_t entry, generation;
    uint64_t size;   /* the allocation's bytes */
    uint64_t offset; /* where they lie in the lock file */
    uint8_t reserved[16];
};
_Static_assert(sizeof(struct handle_bytes) == CU_IPC_HANDLE_SIZE, "handle size");

struct export {
    uint64_t dptr;
    uint32_t entry, generation;
    uint64_t size, offset;
};

struct import {
    uint64_t ptr;
    uint32_t entry, generation;
    uint64_t size, span;
    uint32_t refs;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* guards everything below */
static struct fake_gpu_ipc_entry *table;                 /* the lock file's table, mapped once */
static struct export *exports;
static size_t export_count, export_capacity;
static struct import *imports;
static size_t import_count, import_capacity;

static uint64_t round_up(uint64_t value, uint64_t align)
{
    return (value + align - 1) / align * align;
}

/* --- lock bytes (the caller holds the state lock where it matters) ------------------------- */

static int byte_lock(int fd, uint32_t byte, short type)
{
    struct flock l = {.l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)byte, .l_len = 1};
    while (fcntl(fd, F_SETLK, &l) != 0)
        if (errno != EINTR)
            return -1;
    return 0;
}

/* Does another process hold any lock on byte? (Our own locks never show.) */
static int byte_held(int fd, uint32_t byte)
{
    struct flock l = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = (off_t)byte, .l_len = 1};
    if (fcntl(fd, F_GETLK, &l) != 0)
        return 1; /* cannot tell: keep it */
    return l.l_type != F_UNLCK;
}

/* --- the shared table (state lock held) ---------------------------------------------------- */

/* Grows the lock file to at least bytes (never shrinks it). 0 or -1. */
static int ensure_file_size(int fd, uint64_t bytes)
{
    struct stat st;
    if (fgpu_fstat(fd, &st) != 0)
        return -1;
    if ((uint64_t)st.st_size >= bytes)
        return 0;
    return ftruncate(fd, (off_t)bytes);
}

static int map_table_locked(int fd)
{
    if (table != NULL)
        return 0;
    uint64_t bytes = (uint64_t)FAKE_GPU_IPC_ENTRIES * sizeof *table;
    if (ensure_file_size(fd, FAKE_GPU_IPC_TABLE + bytes) != 0)
        return -1;
    void *p = mmap(NULL, (size_t)bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, FAKE_GPU_IPC_TABLE);
    if (p == MAP_FAILED)
        return -1;
    table = p;
    return 0;
}

/* Is entry i this process's own export or import? (Both under `lock`.) */
static int mine_locked(uint32_t i)
{
    for (size_t k = 0; k < export_count; k++)
        if (exports[k].entry == i)
            return 1;
    for (size_t k = 0; k < import_count; k++)
        if (imports[k].entry == i)
            return 1;
    return 0;
}

/* Is entry i in use: exported by a live process, or mapped by one? Not asked about our own. */
static int in_use_locked(int fd, uint32_t i)
{
    const struct fake_gpu_ipc_entry *e = &table[i];
    if (e->state == FAKE_GPU_IPC_FREE)
        return 0;
    if (mine_locked(i))
        return 1;
    return byte_held(fd, FAKE_GPU_IPC_EXPORTER_LOCKS + i) || byte_held(fd, FAKE_GPU_IPC_IMPORTER_LOCKS + i);
}

/* Gives a no longer used entry's range back to the file system and marks it free. */
static void release_entry_locked(int fd, uint32_t i)
{
    struct fake_gpu_ipc_entry *e = &table[i];
    if (e->state != FAKE_GPU_IPC_FREE && e->span > 0)
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)e->offset, (off_t)e->span);
    e->state = FAKE_GPU_IPC_FREE;
    e->offset = 0;
    e->span = 0;
}

/* A free entry and a free file range of span bytes for a new export: 0 with *entry and *offset
 * (entries no process uses any more are released on the way), or -1 when every entry is in use. */
static int claim_locked(int fd, uint64_t span, uint32_t *entry, uint64_t *offset)
{
    static unsigned char used[FAKE_GPU_IPC_ENTRIES];
    uint32_t chosen = FAKE_GPU_IPC_ENTRIES;
    for (uint32_t i = 0; i < FAKE_GPU_IPC_ENTRIES; i++) {
        used[i] = (unsigned char)in_use_locked(fd, i);
        if (!used[i]) {
            if (table[i].state != FAKE_GPU_IPC_FREE)
                release_entry_locked(fd, i);
            if (chosen == FAKE_GPU_IPC_ENTRIES)
                chosen = i;
        }
    }
    if (chosen == FAKE_GPU_IPC_ENTRIES)
        return -1;
    /* First fit: the lowest of the data base and the ends of the ranges in use that overlaps none. */
    uint64_t best = UINT64_MAX;
    for (uint32_t c = 0; c <= FAKE_GPU_IPC_ENTRIES; c++) {
        uint64_t at = c == FAKE_GPU_IPC_ENTRIES ? FAKE_GPU_IPC_DATA : (used[c] ? table[c].offset + table[c].span : 0);
        if (at == 0 || at >= best)
            continue;
        int fits = 1;
        for (uint32_t i = 0; fits && i < FAKE_GPU_IPC_ENTRIES; i++)
            fits = !used[i] || at + span <= table[i].offset || table[i].offset + table[i].span <= at;
        if (fits)
            best = at;
    }
    *entry = chosen;
    *offset = best;
    return 0;
}

/* --- this process's exports and imports (`lock` held) ------------------------------------- */

static int grow(void **array, size_t *capacity, size_t count, size_t item)
{
    if (count < *capacity)
        return 0;
    size_t more = *capacity ? *capacity * 2 : 16;
    void *grown = realloc(*array, more * item);
    if (grown == NULL)
        return -1;
    *array = grown;
    *capacity = more;
    return 0;
}

static struct export *export_of_locked(uint64_t dptr)
{
    for (size_t k = 0; k < export_count; k++)
        if (exports[k].dptr == dptr)
            return &exports[k];
    return NULL;
}

static void fill_handle(CUipcMemHandle *out, const struct export *x)
{
    struct handle_bytes h = {.magic = HANDLE_MAGIC, .entry = x->entry, .generation = x->generation,
                             .size = x->size, .offset = x->offset};
    fgpu_uuid(h.uuid);
    memset(out, 0, sizeof *out);
    memcpy(out->reserved, &h, sizeof h);
}

/* --- the entry points ------------------------------------------------------------------------ */

CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    uint64_t size;
    if (pHandle == NULL || fake_mem_exportable((uint64_t)dptr, &size) != 0)
        return CUDA_ERROR_INVALID_VALUE; /* not the base of a cuMemAlloc allocation */
    int fd = fgpu_lock_file();
    if (fd < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    fake_all_streams_wait_idle(); /* no queued copy may touch the bytes while they move */
    pthread_mutex_lock(&lock);
    struct export *x = export_of_locked((uint64_t)dptr);
    if (x != NULL) { /* exported before: the same handle */
        fill_handle(pHandle, x);
        pthread_mutex_unlock(&lock);
        return CUDA_SUCCESS;
    }
    if (grow((void **)&exports, &export_capacity, export_count, sizeof *exports) != 0) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t span = round_up(size, SPAN_GRANULARITY), offset = 0;
    uint32_t entry = 0, generation = 0;
    r = CUDA_ERROR_OUT_OF_MEMORY;
    fgpu_state_lock();
    if (map_table_locked(fd) == 0 && claim_locked(fd, span, &entry, &offset) == 0 &&
        ensure_file_size(fd, offset + span) == 0 && byte_lock(fd, FAKE_GPU_IPC_EXPORTER_LOCKS + entry, F_WRLCK) == 0) {
        struct fake_gpu_ipc_entry *e = &table[entry];
        generation = e->generation + 1 != 0 ? e->generation + 1 : 1;
        *e = (struct fake_gpu_ipc_entry){.state = FAKE_GPU_IPC_EXPORTED, .generation = generation,
                                         .offset = offset, .span = span};
        r = CUDA_SUCCESS;
    }
    fgpu_state_unlock();
    if (r == CUDA_SUCCESS && fake_mem_share((uint64_t)dptr, fd, offset, span) != 0) {
        fgpu_state_lock(); /* give the entry back: nobody has its handle yet */
        byte_lock(fd, FAKE_GPU_IPC_EXPORTER_LOCKS + entry, F_UNLCK);
        release_entry_locked(fd, entry);
        fgpu_state_unlock();
        r = CUDA_ERROR_MAP_FAILED;
    }
    if (r == CUDA_SUCCESS) {
        x = &exports[export_count++];
        *x = (struct export){.dptr = (uint64_t)dptr, .entry = entry, .generation = generation, .size = size,
                             .offset = offset};
        fill_handle(pHandle, x);
    }
    pthread_mutex_unlock(&lock);
    return r;
}

void fake_ipc_allocation_freed(uint64_t dptr)
{
    int fd = fgpu_lock_file();
    pthread_mutex_lock(&lock);
    struct export *x = export_of_locked(dptr);
    if (x != NULL && fd >= 0) {
        uint32_t i = x->entry;
        *x = exports[--export_count];
        fgpu_state_lock();
        if (table[i].state == FAKE_GPU_IPC_EXPORTED)
            table[i].state = FAKE_GPU_IPC_RETIRED;
        byte_lock(fd, FAKE_GPU_IPC_EXPORTER_LOCKS + i, F_UNLCK);
        if (!in_use_locked(fd, i))
            release_entry_locked(fd, i);
        fgpu_state_unlock();
    }
    pthread_mutex_unlock(&lock);
}

static CUresult open_handle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (pdptr == NULL || Flags != CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)
        return CUDA_ERROR_INVALID_VALUE; /* cuda.h: "Must be specified as" it; a real driver refuses 0 */
    struct handle_bytes h;
    memcpy(&h, handle.reserved, sizeof h);
    uint8_t uuid[16];
    fgpu_uuid(uuid);
    if (h.magic != HANDLE_MAGIC || memcmp(h.uuid, uuid, sizeof uuid) != 0 || h.entry >= FAKE_GPU_IPC_ENTRIES ||
        h.generation == 0 || h.size == 0)
        return CUDA_ERROR_INVALID_VALUE; /* not a handle of this GPU */
    int fd = fgpu_lock_file();
    if (fd < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    pthread_mutex_lock(&lock);
    for (size_t k = 0; k < export_count; k++)
        if (exports[k].entry == h.entry && exports[k].generation == h.generation) {
            pthread_mutex_unlock(&lock);
            return CUDA_ERROR_INVALID_CONTEXT; /* the exporting process cannot open its own handle */
        }
    for (size_t k = 0; k < import_count; k++)
        if (imports[k].entry == h.entry && imports[k].generation == h.generation) {
            imports[k].refs++; /* opened before: the same pointer, one more reference */
            *pdptr = (CUdeviceptr)imports[k].ptr;
            pthread_mutex_unlock(&lock);
            return CUDA_SUCCESS;
        }
    if (grow((void **)&imports, &import_capacity, import_count, sizeof *imports) != 0) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    uint64_t span = 0;
    r = CUDA_ERROR_INVALID_VALUE;
    fgpu_state_lock();
    if (map_table_locked(fd) == 0) {
        const struct fake_gpu_ipc_entry *e = &table[h.entry];
        int live = e->state == FAKE_GPU_IPC_EXPORTED && e->generation == h.generation && e->offset == h.offset &&
                   h.size <= e->span && byte_held(fd, FAKE_GPU_IPC_EXPORTER_LOCKS + h.entry);
        /* an entry another of our imports holds was matched above, so the read lock is new */
        if (live && byte_lock(fd, FAKE_GPU_IPC_IMPORTER_LOCKS + h.entry, F_RDLCK) == 0) {
            span = e->span;
            r = CUDA_SUCCESS;
        } else if (live) {
            r = CUDA_ERROR_MAP_FAILED;
        }
    }
    fgpu_state_unlock();
    void *p = MAP_FAILED;
    if (r == CUDA_SUCCESS) {
        p = mmap(NULL, (size_t)h.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, (off_t)h.offset);
        if (p == MAP_FAILED || fake_mem_add_import((uint64_t)(uintptr_t)p, h.size) != 0) {
            if (p != MAP_FAILED)
                munmap(p, (size_t)h.size);
            byte_lock(fd, FAKE_GPU_IPC_IMPORTER_LOCKS + h.entry, F_UNLCK);
            r = CUDA_ERROR_MAP_FAILED;
        }
    }
    if (r == CUDA_SUCCESS) {
        imports[import_count++] = (struct import){.ptr = (uint64_t)(uintptr_t)p, .entry = h.entry,
                                                  .generation = h.generation, .size = h.size, .span = span,
                                                  .refs = 1};
        *pdptr = (CUdeviceptr)(uintptr_t)p;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return open_handle(pdptr, handle, Flags);
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    return open_handle(pdptr, handle, Flags);
}

CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    int fd = fgpu_lock_file();
    pthread_mutex_lock(&lock);
    struct import *m = NULL;
    for (size_t k = 0; k < import_count && m == NULL; k++)
        if (imports[k].ptr == (uint64_t)dptr)
            m = &imports[k];
    if (m == NULL || fd < 0) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_INVALID_VALUE; /* not a pointer cuIpcOpenMemHandle returned */
    }
    if (--m->refs > 0) {
        pthread_mutex_unlock(&lock);
        return CUDA_SUCCESS;
    }
    struct import gone = *m;
    *m = imports[--import_count];
    fake_all_streams_wait_idle(); /* queued copies may still read or write the mapping */
    fake_mem_remove_import(gone.ptr);
    munmap((void *)(uintptr_t)gone.ptr, (size_t)gone.size);
    fgpu_state_lock();
    byte_lock(fd, FAKE_GPU_IPC_IMPORTER_LOCKS + gone.entry, F_UNLCK);
    if (table != NULL && table[gone.entry].generation == gone.generation && !in_use_locked(fd, gone.entry))
        release_entry_locked(fd, gone.entry); /* the exporter freed it and we were its last importer */
    fgpu_state_unlock();
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}
