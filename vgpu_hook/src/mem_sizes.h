/*
 * mem_sizes.h: how many bytes the hook charges a pod for an allocation whose size the driver
 * derives from the arguments (pitched memory, VMM allocations, CUDA arrays). No CUDA calls;
 * the array formats are CUarray_format codes (their numeric values are ABI-stable).
 *
 * All arithmetic saturates at UINT64_MAX: an overflowing descriptor is charged "everything",
 * so the ledger refuses it instead of a wrapped-around small size slipping through.
 *
 * Arrays are charged their texel data: width x height x depth (0 means 1) x bytes per texel,
 * where bytes per texel = channels x channel size for the per-channel formats (8/16/32-bit
 * integers, half, float, the normalized X1/X2/X4 formats) and a fixed size for packed, planar
 * YUV and block-compressed formats (BCn blocks are 4x4 texels; width and height round up to
 * whole blocks). A format this table does not know is charged 16 bytes per channel (at least
 * four channels), more than any known format. The driver's own padding and tiling are not
 * visible to the hook and are not charged.
 *
 * Mipmapped arrays: the sum over levels of their arrays, level l being max(1, dim >> l) in
 * width, height and depth; a layered or cubemap array keeps its depth (layers, faces) at every
 * level.
 */
#ifndef FASTGSHARE_HOOK_MEM_SIZES_H
#define FASTGSHARE_HOOK_MEM_SIZES_H

#include <stdint.h>

/* The pitch the hook assumes before cuMemAllocPitch returns the real one (corrected after). */
#define FGS_PITCH_GUESS_ALIGN 512u

/* CUDA_ARRAY3D_LAYERED and CUDA_ARRAY3D_CUBEMAP (cuda.h) */
#define FGS_ARRAY3D_LAYERED 0x01u
#define FGS_ARRAY3D_CUBEMAP 0x04u

uint64_t fgs_mul_sat(uint64_t a, uint64_t b);
uint64_t fgs_add_sat(uint64_t a, uint64_t b);

/* value rounded up to a multiple of align (align 0 or 1: value itself); saturates. */
uint64_t fgs_round_up(uint64_t value, uint64_t align);

/* Bytes of a CUDA array of the given CUarray_format code and channel count. */
uint64_t fgs_array_bytes(unsigned int format, unsigned int channels, uint64_t width, uint64_t height,
                         uint64_t depth);

/* Bytes of a mipmapped array with `levels` levels (0 is charged as 1); flags are the
 * CUDA_ARRAY3D_* flags of its descriptor. */
uint64_t fgs_mipmap_bytes(unsigned int format, unsigned int channels, uint64_t width, uint64_t height,
                          uint64_t depth, unsigned int flags, unsigned int levels);

#endif
