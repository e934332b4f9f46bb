/*
 * little_endian.h: the protocol's explicit little-endian integers, for the bench's C programs
 * (arbiter_load.c, null_arbiter.c). The hook has its own in vgpu_hook/src/arbiter_client.c.
 */
#ifndef FASTGSHARE_BENCH_LITTLE_ENDIAN_H
#define FASTGSHARE_BENCH_LITTLE_ENDIAN_H

#include <stdint.h>

static inline void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint64_t get_le(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#endif
