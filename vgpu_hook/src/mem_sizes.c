/* mem_sizes.c: bytes charged for pitched memory, VMM allocations and CUDA arrays (see mem_sizes.h). */
#include "mem_sizes.h"

#include <stddef.h>

uint64_t fgs_mul_sat(uint64_t a, uint64_t b)
{
    uint64_t product;
    return __builtin_mul_overflow(a, b, &product) ? UINT64_MAX : product;
}

uint64_t fgs_add_sat(uint64_t a, uint64_t b)
{
    uint64_t sum;
    return __builtin_add_overflow(a, b, &sum) ? UINT64_MAX : sum;
}

uint64_t fgs_round_up(uint64_t value, uint64_t align)
{
    if (align <= 1)
        return value;
    uint64_t rest = value % align;
    return rest == 0 ? value : fgs_add_sat(value, align - rest);
}

/* How a format stores one texel: channel_bytes x channels, or bits_per_texel for packed/planar
 * formats, with block x block texels stored together for the compressed ones. */
struct texel_format {
    unsigned int code;          /* CUarray_format */
    unsigned int channel_bytes; /* 0: use bits_per_texel */
    unsigned int bits_per_texel;
    unsigned int block;
};

static const struct texel_format formats[] = {
    {0x01, 1, 0, 1},   /* UNSIGNED_INT8 */
    {0x02, 2, 0, 1},   /* UNSIGNED_INT16 */
    {0x03, 4, 0, 1},   /* UNSIGNED_INT32 */
    {0x08, 1, 0, 1},   /* SIGNED_INT8 */
    {0x09, 2, 0, 1},   /* SIGNED_INT16 */
    {0x0a, 4, 0, 1},   /* SIGNED_INT32 */
    {0x10, 2, 0, 1},   /* HALF */
    {0x20, 4, 0, 1},   /* FLOAT */
    {0xc0, 1, 0, 1},   /* UNORM_INT8X1 (channels must match the Xn) */
    {0xc1, 1, 0, 1},   /* UNORM_INT8X2 */
    {0xc2, 1, 0, 1},   /* UNORM_INT8X4 */
    {0xc3, 2, 0, 1},   /* UNORM_INT16X1 */
    {0xc4, 2, 0, 1},   /* UNORM_INT16X2 */
    {0xc5, 2, 0, 1},   /* UNORM_INT16X4 */
    {0xc6, 1, 0, 1},   /* SNORM_INT8X1 */
    {0xc7, 1, 0, 1},   /* SNORM_INT8X2 */
    {0xc8, 1, 0, 1},   /* SNORM_INT8X4 */
    {0xc9, 2, 0, 1},   /* SNORM_INT16X1 */
    {0xca, 2, 0, 1},   /* SNORM_INT16X2 */
    {0xcb, 2, 0, 1},   /* SNORM_INT16X4 */
    {0x50, 0, 32, 1},  /* UNORM_INT_101010_2 */
    {0x91, 0, 4, 4},   /* BC1_UNORM: 8 bytes per 4x4 block */
    {0x92, 0, 4, 4},   /* BC1_UNORM_SRGB */
    {0x93, 0, 8, 4},   /* BC2_UNORM: 16 bytes per 4x4 block */
    {0x94, 0, 8, 4},   /* BC2_UNORM_SRGB */
    {0x95, 0, 8, 4},   /* BC3_UNORM */
    {0x96, 0, 8, 4},   /* BC3_UNORM_SRGB */
    {0x97, 0, 4, 4},   /* BC4_UNORM */
    {0x98, 0, 4, 4},   /* BC4_SNORM */
    {0x99, 0, 8, 4},   /* BC5_UNORM */
    {0x9a, 0, 8, 4},   /* BC5_SNORM */
    {0x9b, 0, 8, 4},   /* BC6H_UF16 */
    {0x9c, 0, 8, 4},   /* BC6H_SF16 */
    {0x9d, 0, 8, 4},   /* BC7_UNORM */
    {0x9e, 0, 8, 4},   /* BC7_UNORM_SRGB */
    {0xb0, 0, 12, 1},  /* NV12: 8-bit 4:2:0 */
    {0x9f, 0, 24, 1},  /* P010: 10-bit (16-bit storage) 4:2:0 */
    {0xa1, 0, 24, 1},  /* P016 */
    {0xa2, 0, 16, 1},  /* NV16: 8-bit 4:2:2 */
    {0xa3, 0, 32, 1},  /* P210 */
    {0xa4, 0, 32, 1},  /* P216 */
    {0xa5, 0, 16, 1},  /* YUY2: packed 8-bit 4:2:2 */
    {0xa6, 0, 32, 1},  /* Y210 */
    {0xa7, 0, 32, 1},  /* Y216 */
    {0xa8, 0, 32, 1},  /* AYUV */
    {0xa9, 0, 32, 1},  /* Y410 */
    {0xb1, 0, 64, 1},  /* Y416 */
    {0xb2, 0, 24, 1},  /* Y444_PLANAR8 */
    {0xb3, 0, 48, 1},  /* Y444_PLANAR10 (16-bit storage) */
    {0xb4, 0, 24, 1},  /* YUV444_8bit_SemiPlanar */
    {0xb5, 0, 48, 1},  /* YUV444_16bit_SemiPlanar */
};

#define UNKNOWN_CHANNEL_BYTES 16u
#define UNKNOWN_MIN_CHANNELS 4u

/* The format's storage and the channel count it is charged for. */
static struct texel_format lookup(unsigned int code, unsigned int *channels)
{
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        if (formats[i].code == code) {
            if (*channels == 0)
                *channels = 1;
            return formats[i];
        }
    }
    if (*channels < UNKNOWN_MIN_CHANNELS)
        *channels = UNKNOWN_MIN_CHANNELS;
    return (struct texel_format){code, UNKNOWN_CHANNEL_BYTES, 0, 1};
}

static uint64_t at_least_one(uint64_t v)
{
    return v == 0 ? 1 : v;
}

static uint64_t level_bytes(const struct texel_format *f, unsigned int channels, uint64_t w, uint64_t h,
                            uint64_t d)
{
    w = fgs_round_up(at_least_one(w), f->block);
    h = fgs_round_up(at_least_one(h), f->block);
    uint64_t texels = fgs_mul_sat(fgs_mul_sat(w, h), at_least_one(d));
    if (f->channel_bytes != 0)
        return fgs_mul_sat(texels, fgs_mul_sat(f->channel_bytes, channels));
    uint64_t bits = fgs_mul_sat(texels, f->bits_per_texel);
    return bits == UINT64_MAX ? UINT64_MAX : bits / 8 + (bits % 8 != 0);
}

uint64_t fgs_array_bytes(unsigned int format, unsigned int channels, uint64_t width, uint64_t height,
                         uint64_t depth)
{
    struct texel_format f = lookup(format, &channels);
    return level_bytes(&f, channels, width, height, depth);
}

static uint64_t shifted(uint64_t dim, unsigned int level)
{
    if (dim == 0)
        return 0; /* an absent dimension stays absent (charged as 1) */
    uint64_t v = level < 64 ? dim >> level : 0;
    return v == 0 ? 1 : v;
}

uint64_t fgs_mipmap_bytes(unsigned int format, unsigned int channels, uint64_t width, uint64_t height,
                          uint64_t depth, unsigned int flags, unsigned int levels)
{
    struct texel_format f = lookup(format, &channels);
    int fixed_depth = (flags & (FGS_ARRAY3D_LAYERED | FGS_ARRAY3D_CUBEMAP)) != 0;
    uint64_t total = 0;
    if (levels == 0)
        levels = 1;
    for (unsigned int l = 0; l < levels; l++) {
        uint64_t w = shifted(width, l), h = shifted(height, l), d = fixed_depth ? depth : shifted(depth, l);
        uint64_t bytes = level_bytes(&f, channels, w, h, d);
        if (at_least_one(w) == 1 && at_least_one(h) == 1 && (fixed_depth || at_least_one(d) == 1)) {
            /* every remaining level is this same smallest one */
            return fgs_add_sat(total, fgs_mul_sat(bytes, (uint64_t)(levels - l)));
        }
        total = fgs_add_sat(total, bytes);
    }
    return total;
}
