/*
 * grow.h: the arrays of the engine's tables grow by doubling; these two steps are all of it.
 */
#ifndef FGS_ARBITER_GROW_H
#define FGS_ARBITER_GROW_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The capacity to grow to: `initial` for an empty array, doubled until it holds `needed`. */
static inline uint32_t grown_capacity(uint32_t capacity, uint32_t needed, uint32_t initial)
{
    uint32_t grown = capacity ? capacity : initial;
    while (grown < needed)
        grown *= 2;
    return grown;
}

/* `items` reallocated to `capacity` items of `size` bytes, those past `old_capacity` zeroed; NULL
 * (and `items` untouched) when there is no memory. */
static inline void *resized(void *items, size_t size, uint32_t old_capacity, uint32_t capacity)
{
    unsigned char *grown = realloc(items, (size_t)capacity * size);
    if (grown != NULL && capacity > old_capacity)
        memset(grown + (size_t)old_capacity * size, 0, (size_t)(capacity - old_capacity) * size);
    return grown;
}

#endif
