/*
 * fastgshare_byteorder.h: the wire's little-endian integers (fastgshare_protocol.h), read and
 * written byte by byte, so no reader or writer depends on the host's order or on alignment.
 *
 * The one helper for every C file that speaks the protocol: the arbiter engine
 * (arbiter_engine/engine.c), the hook's client (src/arbiter_client.c), its flood tool
 * (tests/arbiter_flood.c) and the bench's C programs (null_arbiter.c, arbiter_load.c and the
 * http_timer.c pipe). None of them shifts bytes itself (tests/unit/test_wire_byteorder.py).
 */
#ifndef FASTGSHARE_BYTEORDER_H
#define FASTGSHARE_BYTEORDER_H

#include <stdint.h>

static inline uint16_t fgs_get_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static inline uint32_t fgs_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t fgs_get_le64(const uint8_t *p)
{
    return (uint64_t)fgs_get_le32(p) | (uint64_t)fgs_get_le32(p + 4) << 32;
}

static inline void fgs_put_le16(uint8_t *p, uint16_t value)
{
    p[0] = (uint8_t)value;
    p[1] = (uint8_t)(value >> 8);
}

static inline void fgs_put_le32(uint8_t *p, uint32_t value)
{
    fgs_put_le16(p, (uint16_t)value);
    fgs_put_le16(p + 2, (uint16_t)(value >> 16));
}

static inline void fgs_put_le64(uint8_t *p, uint64_t value)
{
    fgs_put_le32(p, (uint32_t)value);
    fgs_put_le32(p + 4, (uint32_t)(value >> 32));
}

#endif
