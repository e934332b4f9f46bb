/*
 * alloc_table.h: the hook's per-process table of live allocations, keyed by (kind, 64-bit key):
 * a device pointer, an array handle, a VMM allocation handle, a VMM mapping's start address.
 * It lets every free release exactly what its allocation reserved with the arbiter.
 *
 * Open addressing with linear probing and backward-shift deletion (no tombstones): O(1) average
 * for put, find and take, at most 5/8 full. Pure bookkeeping: no CUDA, no I/O, NO LOCK; the
 * caller serialises (memory_hooks.c holds its table lock around every call).
 *
 * Claims make the insert after a successful driver call infallible: before calling the driver
 * the caller claims room for one entry (fgs_alloc_table_claim, the only call that allocates
 * memory and so the only one that can fail); fgs_alloc_table_put then consumes the claim, and
 * fgs_alloc_table_unclaim gives it back when nothing is inserted. The table keeps
 * count + claims <= 5/8 of its capacity at all times.
 */
#ifndef FASTGSHARE_HOOK_ALLOC_TABLE_H
#define FASTGSHARE_HOOK_ALLOC_TABLE_H

#include <stddef.h>
#include <stdint.h>

enum fgs_alloc_kind {
    FGS_ALLOC_EMPTY = 0, /* an unused slot (never a valid kind for callers) */
    FGS_ALLOC_DEVPTR,    /* cuMemAlloc*, pitch, managed, async, pool: CUdeviceptr -> bytes */
    FGS_ALLOC_ARRAY,     /* cuArrayCreate, cuArray3DCreate: CUarray -> bytes */
    FGS_ALLOC_MIPMAP,    /* cuMipmappedArrayCreate: CUmipmappedArray -> bytes */
    FGS_ALLOC_HANDLE,    /* cuMemCreate: CUmemGenericAllocationHandle -> aux (struct fgs_phys *) */
    FGS_ALLOC_MAPPING,   /* cuMemMap: start address -> mapped length, aux (struct fgs_phys *) */
};

struct fgs_alloc_entry {
    uint64_t key;
    uint64_t size;
    void *aux;
    uint32_t kind; /* enum fgs_alloc_kind; FGS_ALLOC_EMPTY marks a free slot */
};

struct fgs_alloc_table {
    struct fgs_alloc_entry *slots; /* NULL until the first claim */
    size_t capacity;               /* 0 or a power of two */
    size_t count;                  /* live entries */
    size_t claims;                 /* puts promised by fgs_alloc_table_claim */
};

#define FGS_ALLOC_TABLE_INIT {NULL, 0, 0, 0}

/* Room for one more put (grows the table if needed). 0, or -1 when memory cannot be had. */
int fgs_alloc_table_claim(struct fgs_alloc_table *t);

/* Gives back a claim that will not be used. */
void fgs_alloc_table_unclaim(struct fgs_alloc_table *t);

/* Inserts (kind, key) -> (size, aux), consuming one claim. If the key was present its old
 * entry is overwritten and copied to *replaced (when not NULL) and 1 is returned; else 0
 * (and replaced->kind is set to FGS_ALLOC_EMPTY). */
int fgs_alloc_table_put(struct fgs_alloc_table *t, enum fgs_alloc_kind kind, uint64_t key, uint64_t size,
                        void *aux, struct fgs_alloc_entry *replaced);

/* The live entry for (kind, key), or NULL. The pointer is valid until the next put or take. */
struct fgs_alloc_entry *fgs_alloc_table_find(const struct fgs_alloc_table *t, enum fgs_alloc_kind kind,
                                             uint64_t key);

/* Removes (kind, key); 1 with *out filled (when not NULL) if it was present, else 0. Claims are
 * untouched (a caller that may put the entry back claims first). */
int fgs_alloc_table_take(struct fgs_alloc_table *t, enum fgs_alloc_kind kind, uint64_t key,
                         struct fgs_alloc_entry *out);

/* Frees the slots and empties the table. */
void fgs_alloc_table_destroy(struct fgs_alloc_table *t);

/* Empties the table WITHOUT freeing it (a fork()ed child: the parent's allocations are not the
 * child's; leaking the copy is cheaper and safer than touching it). */
void fgs_alloc_table_forget(struct fgs_alloc_table *t);

#endif
