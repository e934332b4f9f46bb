/*
 * test_memory.c: unit test of the hook's allocation table (src/alloc_table.c) and the sizes it
 * charges (src/mem_sizes.c). Host-only: built without any CUDA header. Run by
 * `make -C vgpu_hook test`; exits non-zero and names each failed check.
 */
#include "alloc_table.h"
#include "check.h"
#include "mem_sizes.h"

#include <stdio.h>
#include <stdlib.h>


#define MIB (UINT64_C(1) << 20)

/* Claims and puts a new entry; 1 when both worked. */
static int put(struct fgs_alloc_table *t, enum fgs_alloc_kind kind, uint64_t key, uint64_t size)
{
    return fgs_alloc_table_claim(t) == 0 && fgs_alloc_table_put(t, kind, key, size, NULL, NULL) == 0;
}

static void test_put_find_take(void)
{
    struct fgs_alloc_table t = FGS_ALLOC_TABLE_INIT;
    CHECK(fgs_alloc_table_find(&t, FGS_ALLOC_DEVPTR, 0x1000) == NULL); /* empty, never allocated */
    CHECK(put(&t, FGS_ALLOC_DEVPTR, 0x1000, 4096));
    CHECK(put(&t, FGS_ALLOC_ARRAY, 0x1000, 77)); /* same key, other kind: another entry */
    CHECK(t.count == 2 && t.claims == 0);
    struct fgs_alloc_entry *e = fgs_alloc_table_find(&t, FGS_ALLOC_DEVPTR, 0x1000);
    CHECK(e != NULL && e->size == 4096);
    struct fgs_alloc_entry out;
    CHECK(fgs_alloc_table_take(&t, FGS_ALLOC_DEVPTR, 0x1000, &out) == 1);
    CHECK(out.size == 4096 && out.kind == FGS_ALLOC_DEVPTR);
    CHECK(fgs_alloc_table_take(&t, FGS_ALLOC_DEVPTR, 0x1000, &out) == 0); /* a double free */
    e = fgs_alloc_table_find(&t, FGS_ALLOC_ARRAY, 0x1000);
    CHECK(e != NULL && e->size == 77);
    CHECK(t.count == 1);
    fgs_alloc_table_destroy(&t);
    CHECK(t.slots == NULL && t.count == 0);
}

static void test_put_over_a_live_key_reports_the_stale_entry(void)
{
    struct fgs_alloc_table t = FGS_ALLOC_TABLE_INIT;
    CHECK(put(&t, FGS_ALLOC_DEVPTR, 0xabc, 10));
    struct fgs_alloc_entry stale;
    CHECK(fgs_alloc_table_claim(&t) == 0);
    CHECK(fgs_alloc_table_put(&t, FGS_ALLOC_DEVPTR, 0xabc, 20, NULL, &stale) == 1);
    CHECK(stale.size == 10);
    CHECK(t.count == 1 && fgs_alloc_table_find(&t, FGS_ALLOC_DEVPTR, 0xabc)->size == 20);
    fgs_alloc_table_destroy(&t);
}

/* Many keys that share their low bits (like aligned device pointers), removed in an order that
 * exercises backward-shift deletion across the wrap-around of the slot array. */
static void test_many_entries_grow_and_survive_removal(void)
{
    struct fgs_alloc_table t = FGS_ALLOC_TABLE_INIT;
    const uint64_t n = 20000, base = UINT64_C(0x7f0000000000);
    int puts_ok = 1;
    for (uint64_t i = 0; i < n; i++)
        puts_ok &= put(&t, FGS_ALLOC_DEVPTR, base + i * 512, i + 1);
    CHECK(puts_ok);
    CHECK(t.count == n);
    CHECK(t.count * 8 <= t.capacity * 5);
    int lookups_ok = 1;
    for (uint64_t i = 0; i < n; i++) {
        struct fgs_alloc_entry *e = fgs_alloc_table_find(&t, FGS_ALLOC_DEVPTR, base + i * 512);
        lookups_ok &= e != NULL && e->size == i + 1;
    }
    CHECK(lookups_ok);
    int takes_ok = 1;
    for (uint64_t i = 0; i < n; i += 2) /* every other one */
        takes_ok &= fgs_alloc_table_take(&t, FGS_ALLOC_DEVPTR, base + i * 512, NULL) == 1;
    CHECK(takes_ok);
    int rest_ok = 1;
    for (uint64_t i = 0; i < n; i++) {
        struct fgs_alloc_entry *e = fgs_alloc_table_find(&t, FGS_ALLOC_DEVPTR, base + i * 512);
        rest_ok &= (i % 2 == 0) ? e == NULL : (e != NULL && e->size == i + 1);
    }
    CHECK(rest_ok);
    CHECK(t.count == n / 2);
    fgs_alloc_table_destroy(&t);
}

static void test_claims_keep_room_for_their_puts(void)
{
    struct fgs_alloc_table t = FGS_ALLOC_TABLE_INIT;
    int claims_ok = 1;
    for (int i = 0; i < 100; i++)
        claims_ok &= fgs_alloc_table_claim(&t) == 0;
    CHECK(claims_ok);
    size_t capacity = t.capacity;
    CHECK((t.count + t.claims) * 8 <= capacity * 5);
    for (uint64_t i = 0; i < 100; i++)
        fgs_alloc_table_put(&t, FGS_ALLOC_HANDLE, i, i, NULL, NULL);
    CHECK(t.capacity == capacity); /* the puts never had to grow the table */
    CHECK(t.claims == 0 && t.count == 100);
    CHECK(fgs_alloc_table_claim(&t) == 0);
    fgs_alloc_table_unclaim(&t);
    CHECK(t.claims == 0);
    struct fgs_alloc_entry *slots = t.slots;
    fgs_alloc_table_forget(&t); /* a fork()ed child leaks the parent's copy on purpose */
    CHECK(t.slots == NULL && t.count == 0);
    free(slots);
}

static void test_arithmetic_saturates(void)
{
    CHECK(fgs_mul_sat(UINT64_MAX / 2, 3) == UINT64_MAX);
    CHECK(fgs_add_sat(UINT64_MAX, 1) == UINT64_MAX);
    CHECK(fgs_round_up(1100, 512) == 1536);
    CHECK(fgs_round_up(1024, 512) == 1024);
    CHECK(fgs_round_up(5, 0) == 5);
    CHECK(fgs_round_up(UINT64_MAX - 1, 512) == UINT64_MAX);
}

#define FLOAT 0x20u
#define UINT8 0x01u
#define HALF 0x10u

static void test_array_sizes(void)
{
    CHECK(fgs_array_bytes(FLOAT, 4, 1024, 2560, 0) == 40 * MIB);     /* 2D: depth 0 counts as 1 */
    CHECK(fgs_array_bytes(FLOAT, 4, 256, 64, 160) == 40 * MIB);      /* 3D */
    CHECK(fgs_array_bytes(UINT8, 1, 1000, 0, 0) == 1000);            /* 1D */
    CHECK(fgs_array_bytes(HALF, 2, 10, 10, 6) == 10 * 10 * 6 * 4);   /* a cubemap's six faces */
    CHECK(fgs_array_bytes(0xc2, 4, 100, 100, 1) == 100 * 100 * 4);   /* UNORM_INT8X4 */
    CHECK(fgs_array_bytes(0x91, 4, 10, 10, 1) == 3 * 3 * 8);         /* BC1: 8 bytes per 4x4 block */
    CHECK(fgs_array_bytes(0x9d, 4, 16, 16, 1) == 16 * 16);           /* BC7: 16 bytes per block */
    CHECK(fgs_array_bytes(0xb0, 1, 1920, 1080, 1) == 1920 * 1080 * 3 / 2); /* NV12 */
    CHECK(fgs_array_bytes(0x7777, 1, 10, 10, 1) == 10 * 10 * 16 * 4); /* unknown: the upper bound */
    CHECK(fgs_array_bytes(FLOAT, 4, UINT64_MAX / 2, 4, 1) == UINT64_MAX);
}

static void test_mipmap_sizes(void)
{
    /* 2048 x 1280 float4, three levels: 2048x1280 + 1024x640 + 512x320 texels */
    CHECK(fgs_mipmap_bytes(FLOAT, 4, 2048, 1280, 0, 0, 3) == 16 * (2048 * 1280 + 1024 * 640 + 512 * 320));
    /* a 3D mipmap halves its depth too */
    CHECK(fgs_mipmap_bytes(UINT8, 1, 8, 8, 8, 0, 4) == 512 + 64 + 8 + 1);
    /* a layered one keeps its layers at every level */
    CHECK(fgs_mipmap_bytes(UINT8, 1, 8, 8, 3, FGS_ARRAY3D_LAYERED, 4) == 3 * (64 + 16 + 4 + 1));
    /* a 1D mipmap, and levels past 1x1 are 1x1 */
    CHECK(fgs_mipmap_bytes(UINT8, 1, 4, 0, 0, 0, 5) == 4 + 2 + 1 + 1 + 1);
    CHECK(fgs_mipmap_bytes(UINT8, 1, 4, 0, 0, 0, 0) == 4); /* 0 levels charged as 1 */
    CHECK(fgs_mipmap_bytes(UINT8, 1, 1, 1, 0, 0, 4000000000u) == 4000000000u); /* no 4e9-step loop */
}

int main(void)
{
    test_put_find_take();
    test_put_over_a_live_key_reports_the_stale_entry();
    test_many_entries_grow_and_survive_removal();
    test_claims_keep_room_for_their_puts();
    test_arithmetic_saturates();
    test_array_sizes();
    test_mipmap_sizes();
    return check_report("test_memory");
}
