/* alloc_table.c: the live-allocation hash table (see alloc_table.h). No CUDA, no I/O, no lock. */
#include "alloc_table.h"

#include <stdlib.h>
#include <string.h>

#define MIN_CAPACITY 64
/* count + claims <= capacity * 5/8 */
#define FITS(n, capacity) ((n) * 8 <= (capacity) * 5)

static uint64_t mix(uint64_t x)
{
    x ^= x >> 30; /* splitmix64's finaliser: pointers differ mostly in their middle bits */
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return x;
}

static size_t home_of(uint32_t kind, uint64_t key, size_t capacity)
{
    return (size_t)(mix(key ^ ((uint64_t)kind * UINT64_C(0x9e3779b97f4a7c15))) & (capacity - 1));
}

/* The slot holding (kind, key), or the empty slot where it would go. capacity > 0. */
static size_t probe(const struct fgs_alloc_table *t, uint32_t kind, uint64_t key)
{
    size_t mask = t->capacity - 1, i = home_of(kind, key, t->capacity);
    while (t->slots[i].kind != FGS_ALLOC_EMPTY && (t->slots[i].kind != kind || t->slots[i].key != key))
        i = (i + 1) & mask;
    return i;
}

static int grow(struct fgs_alloc_table *t, size_t needed)
{
    size_t capacity = t->capacity ? t->capacity : MIN_CAPACITY;
    while (!FITS(needed, capacity)) {
        if (capacity > SIZE_MAX / 16)
            return -1;
        capacity *= 2;
    }
    if (capacity == t->capacity)
        return 0;
    struct fgs_alloc_entry *slots = calloc(capacity, sizeof *slots);
    if (slots == NULL)
        return -1;
    struct fgs_alloc_table grown = {slots, capacity, 0, 0};
    for (size_t i = 0; i < t->capacity; i++) {
        const struct fgs_alloc_entry *e = &t->slots[i];
        if (e->kind != FGS_ALLOC_EMPTY) {
            grown.slots[probe(&grown, e->kind, e->key)] = *e;
            grown.count++;
        }
    }
    free(t->slots);
    t->slots = grown.slots;
    t->capacity = capacity;
    return 0;
}

int fgs_alloc_table_claim(struct fgs_alloc_table *t)
{
    if (grow(t, t->count + t->claims + 1) != 0)
        return -1;
    t->claims++;
    return 0;
}

void fgs_alloc_table_unclaim(struct fgs_alloc_table *t)
{
    if (t->claims > 0)
        t->claims--;
}

int fgs_alloc_table_put(struct fgs_alloc_table *t, enum fgs_alloc_kind kind, uint64_t key, uint64_t size,
                        void *aux, struct fgs_alloc_entry *replaced)
{
    if (t->claims == 0 && fgs_alloc_table_claim(t) != 0)
        return -1; /* a caller that did not claim first, and no memory to make room */
    t->claims--;
    size_t i = probe(t, kind, key);
    struct fgs_alloc_entry *slot = &t->slots[i];
    int existed = slot->kind != FGS_ALLOC_EMPTY;
    if (replaced != NULL) {
        if (existed)
            *replaced = *slot;
        else
            memset(replaced, 0, sizeof *replaced);
    }
    if (!existed)
        t->count++;
    *slot = (struct fgs_alloc_entry){.key = key, .size = size, .aux = aux, .kind = kind};
    return existed;
}

struct fgs_alloc_entry *fgs_alloc_table_find(const struct fgs_alloc_table *t, enum fgs_alloc_kind kind,
                                             uint64_t key)
{
    if (t->capacity == 0 || kind == FGS_ALLOC_EMPTY)
        return NULL;
    size_t i = probe(t, kind, key);
    return t->slots[i].kind == FGS_ALLOC_EMPTY ? NULL : &t->slots[i];
}

int fgs_alloc_table_take(struct fgs_alloc_table *t, enum fgs_alloc_kind kind, uint64_t key,
                         struct fgs_alloc_entry *out)
{
    if (t->capacity == 0 || kind == FGS_ALLOC_EMPTY)
        return 0;
    size_t mask = t->capacity - 1, hole = probe(t, kind, key);
    if (t->slots[hole].kind == FGS_ALLOC_EMPTY)
        return 0;
    if (out != NULL)
        *out = t->slots[hole];
    /* Backward-shift deletion: pull later entries of the cluster into the hole when the hole
     * lies between their home slot and where they sit, so probes never stop early. */
    for (size_t j = (hole + 1) & mask; t->slots[j].kind != FGS_ALLOC_EMPTY; j = (j + 1) & mask) {
        size_t home = home_of(t->slots[j].kind, t->slots[j].key, t->capacity);
        if (((j - home) & mask) >= ((j - hole) & mask)) {
            t->slots[hole] = t->slots[j];
            hole = j;
        }
    }
    memset(&t->slots[hole], 0, sizeof t->slots[hole]);
    t->count--;
    return 1;
}

void fgs_alloc_table_destroy(struct fgs_alloc_table *t)
{
    free(t->slots);
    *t = (struct fgs_alloc_table)FGS_ALLOC_TABLE_INIT;
}

void fgs_alloc_table_forget(struct fgs_alloc_table *t)
{
    *t = (struct fgs_alloc_table)FGS_ALLOC_TABLE_INIT;
}
