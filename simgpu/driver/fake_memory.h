/*
 * fake_memory.h: what fake_memory.c, the owner of every allocation's address range and backing
 * memory, tells the copies and memsets (fake_copy.c) and the pointer queries (fake_pointer.c).
 *
 * Every allocation is host memory of this process: a device pointer IS the address of its backing
 * (mmap'd MAP_NORESERVE, so untouched memory costs nothing), as with unified addressing, where
 * host and device share one address space. The driver's tables say which ranges are whose.
 */
#ifndef SIMGPU_FAKE_MEMORY_H
#define SIMGPU_FAKE_MEMORY_H

#include "fake_internal.h"

enum fake_mem_kind {
    FAKE_MEM_NONE = 0, /* not the driver's: pageable host memory, or nothing */
    FAKE_MEM_DEVICE,   /* device memory: linear, pitched, managed, stream-ordered or VMM-mapped */
    FAKE_MEM_HOST,     /* page-locked host memory: cuMemAllocHost/HostAlloc or cuMemHostRegister */
};

/* One allocation, as the pointer attributes describe it. */
struct fake_mem_info {
    enum fake_mem_kind kind;
    uint64_t start, size;                 /* the allocation (or the VMM mapping) */
    uint64_t mapping_start, mapping_size; /* the mapping the pointer lies in (the allocation's own) */
    uint64_t id;                          /* buffer id, never reused in the process */
    CUcontext ctx;                        /* the context current when it was made */
    CUmemoryPool pool;                    /* stream-ordered allocations: their pool, else NULL */
    unsigned int host_flags;              /* cuMemHostAlloc or cuMemHostRegister flags */
    int managed, registered, legacy_ipc, sync_memops, vmm;
};

/* The allocation containing ptr: 0 with *info filled, or -1 when ptr lies in none. */
int fake_mem_query(uint64_t ptr, struct fake_mem_info *info);

/* Where [ptr, ptr + len) lies (len >= 1): FAKE_MEM_DEVICE or FAKE_MEM_HOST when all of it lies in
 * one allocation (or in back-to-back VMM mappings), FAKE_MEM_NONE when it starts in none, -1 when it
 * starts in one and runs past its end. */
int fake_mem_range(uint64_t ptr, uint64_t len);

/* CU_POINTER_ATTRIBUTE_SYNC_MEMOPS of the allocation containing ptr: 0, or -1 when none. */
int fake_mem_set_sync_memops(uint64_t ptr, int value);

/* Device memory the driver itself needs (a module's variables): allocated as cuMemAlloc allocates
 * (v1: below 4 GiB) and charged to the pool, but not counted as served (no program asked for it). */
CUresult fake_device_alloc(uint64_t bytes, int v1, uint64_t *dptr);
CUresult fake_device_free(uint64_t dptr);

/* IPC memory (ipc_memory.c). */

/* The size of the allocation whose base is dptr, when it may be exported with cuIpcGetMemHandle
 * (cuMemAlloc and cuMemAllocPitch memory: not managed, stream-ordered, VMM or host memory): 0 with
 * *size, else -1. */
int fake_mem_exportable(uint64_t dptr, uint64_t *size);

/* Moves the bytes of the allocation at dptr into [offset, offset + span) of the file fd (span: at
 * least its size in pages) and maps that file range at the same address, MAP_SHARED, so that other
 * processes mapping the range see and change the same bytes; the allocation is marked exported, and
 * its cuMemFree tells ipc_memory.c. 0 (also when it already was), or -1 when it could not. The caller
 * has waited for every stream (no queued copy may touch the allocation meanwhile). */
int fake_mem_share(uint64_t dptr, int fd, uint64_t offset, uint64_t span);

/* An imported mapping at [ptr, ptr + size): device memory to the copies and pointer queries, not
 * counted in the pool, and not freed by cuMemFree. 0, or -1 when the table cannot grow. */
int fake_mem_add_import(uint64_t ptr, uint64_t size);
void fake_mem_remove_import(uint64_t ptr);

/* A CUDA array's storage, row-major: rows of `pitch` bytes, `height` rows a slice, `depth` slices. */
struct fake_array_layout {
    unsigned char *data; /* NULL when it has none (sparse or deferred-mapping arrays) */
    uint64_t bytes, pitch, height, depth;
};

/* 0 with *layout, or -1 when array is not a live array. */
int fake_array_layout(CUarray array, struct fake_array_layout *layout);

#endif
