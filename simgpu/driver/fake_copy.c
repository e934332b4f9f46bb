/*
 * fake_copy.c: the copies and memsets of the fake libcuda.so.1, on the memory behind every
 * allocation (fake_memory.c): cuMemcpy (unified), HtoD, DtoH, DtoD, to, from and between arrays,
 * peer copies, 2D and 3D copies (host, device, unified and array sides, v1 and v2 structures, and
 * the 3D peer form), each synchronous ABI (v1, _v2, _v2_ptds) and each stream-ordered one (v1,
 * _v2, _v2_ptsz), and cuMemsetD8/D16/D32 and their 2D forms, synchronous and stream-ordered.
 *
 * Ordering: a synchronous call on the legacy default stream first waits until every stream of the
 * process is idle (fake_all_streams_wait_idle), a _ptds one until the per-thread default stream is;
 * then it copies. A stream-ordered call with no pageable host memory on either side queues the
 * copy on its stream (fake_stream_enqueue_host); with pageable host memory it waits for the stream
 * and copies before returning, as the driver does (the caller may reuse the buffer at once). A
 * _ptsz call's NULL stream is the per-thread default stream.
 *
 * Checks as the driver makes them: a device side must lie inside one allocation (device memory,
 * or page-locked host memory through its unified address), an array side inside the array, a
 * host side must not be NULL; 2D/3D pitches must hold a row and slices their rows; a 16/32-bit
 * memset needs an aligned destination. Anything else is CUDA_ERROR_INVALID_VALUE, never a fault.
 */
#include "fake_memory.h"
#include "stream_queue.h"

#include <stdlib.h>
#include <string.h>

enum mode { SYNC_LEGACY, SYNC_PER_THREAD, ASYNC };

/* One side of a copy. */
enum side_type { SIDE_HOST, SIDE_DEVICE, SIDE_UNIFIED, SIDE_ARRAY };

struct endpoint {
    enum side_type type;
    uint64_t ptr;      /* HOST, DEVICE, UNIFIED */
    CUarray array;     /* ARRAY */
    uint64_t x, y, z;  /* where the region starts: byte in a row, row, slice */
    uint64_t pitch;    /* bytes a row (pointer sides) */
    uint64_t rows;     /* rows a slice (pointer sides; 3D only) */
    int linear;        /* an array's 1D byte offset (x), not a row */
};

/* A region of depth slices of height rows of width bytes. */
struct copy3d {
    struct endpoint dst, src;
    uint64_t width, height, depth;
};

/* Work for the stream: a copy (src != NULL) or a fill of `width` elements a row. */
struct job {
    unsigned char *dst;
    const unsigned char *src;
    uint64_t width, height, depth;
    uint64_t dst_pitch, dst_slice, src_pitch, src_slice;
    unsigned int elem; /* fill: 1, 2 or 4 bytes */
    uint32_t value;    /* fill */
};

static void fill_row(unsigned char *dst, unsigned int elem, uint32_t value, uint64_t count)
{
    if (elem == 1) {
        memset(dst, (int)(value & 0xff), (size_t)count);
        return;
    }
    uint16_t v16 = (uint16_t)value;
    for (uint64_t i = 0; i < count; i++)
        memcpy(dst + i * elem, elem == 2 ? (const void *)&v16 : (const void *)&value, elem);
}

static void run_job(void *arg)
{
    struct job *j = arg;
    for (uint64_t z = 0; z < j->depth; z++) {
        for (uint64_t y = 0; y < j->height; y++) {
            unsigned char *d = j->dst + z * j->dst_slice + y * j->dst_pitch;
            if (j->src != NULL)
                memmove(d, j->src + z * j->src_slice + y * j->src_pitch, (size_t)j->width);
            else
                fill_row(d, j->elem, j->value, j->width);
        }
    }
    free(j);
}

static CUstream ptsz(CUstream stream)
{
    return stream == NULL ? CU_STREAM_PER_THREAD : stream;
}

/* Runs or queues j (which it owns) as mode says; pageable: a side is pageable host memory. */
static CUresult submit(struct job *j, enum mode mode, CUstream stream, int pageable)
{
    CUresult r = CUDA_SUCCESS;
    if (mode == ASYNC && !fake_stream_valid(stream))
        r = CUDA_ERROR_INVALID_HANDLE;
    else if (mode == SYNC_LEGACY)
        fake_all_streams_wait_idle();
    else if (mode == SYNC_PER_THREAD)
        r = fake_stream_wait_idle(CU_STREAM_PER_THREAD);
    else if (pageable)
        r = fake_stream_wait_idle(stream);
    else if ((r = fake_stream_enqueue_host(stream, run_job, j)) == CUDA_SUCCESS)
        return r; /* the stream runs and frees it */
    if (r != CUDA_SUCCESS) {
        free(j);
        return r;
    }
    run_job(j);
    return CUDA_SUCCESS;
}

/* --- resolving a side ---------------------------------------------------------------------- */

static int mul_add(uint64_t a, uint64_t b, uint64_t c, uint64_t *out)
{
    uint64_t product;
    return __builtin_mul_overflow(a, b, &product) || __builtin_add_overflow(product, c, out);
}

/* The bytes a region spans on one side: (depth-1) slices + (height-1) rows + width. */
static int region_extent(uint64_t width, uint64_t height, uint64_t depth, uint64_t pitch, uint64_t slice,
                         uint64_t *extent)
{
    uint64_t rows;
    return mul_add(depth - 1, slice, 0, &rows) || mul_add(height - 1, pitch, rows, &rows) ||
           __builtin_add_overflow(rows, width, extent);
}

/* Where a side's region starts in memory, its pitch and slice, and whether it is pageable. */
struct placed {
    unsigned char *base;
    uint64_t pitch, slice;
    int pageable;
};

static CUresult place_array(const struct endpoint *e, const struct copy3d *c, struct placed *out)
{
    struct fake_array_layout a;
    if (fake_array_layout(e->array, &a) != 0)
        return CUDA_ERROR_INVALID_HANDLE;
    if (a.data == NULL)
        return CUDA_ERROR_INVALID_VALUE; /* a sparse or deferred-mapping array holds no memory here */
    uint64_t start, extent;
    if (e->linear) {
        if (__builtin_add_overflow(e->x, c->width, &extent) || extent > a.bytes)
            return CUDA_ERROR_INVALID_VALUE;
        *out = (struct placed){a.data + e->x, a.pitch, a.pitch * a.height, 0};
        return CUDA_SUCCESS;
    }
    if (e->x + c->width < e->x || e->x + c->width > a.pitch || e->y + c->height < e->y ||
        e->y + c->height > a.height || e->z + c->depth < e->z || e->z + c->depth > a.depth)
        return CUDA_ERROR_INVALID_VALUE;
    start = e->z * a.pitch * a.height + e->y * a.pitch + e->x;
    *out = (struct placed){a.data + start, a.pitch, a.pitch * a.height, 0};
    return CUDA_SUCCESS;
}

static CUresult place_pointer(const struct endpoint *e, const struct copy3d *c, struct placed *out)
{
    uint64_t pitch = c->height > 1 || c->depth > 1 ? e->pitch : c->width;
    uint64_t rows = e->rows != 0 ? e->rows : c->height; /* rows a slice: 0 is allowed when depth is 1 */
    uint64_t slice, offset, extent, start;
    if (pitch < c->width || (c->depth > 1 && rows < c->height) || e->ptr == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (__builtin_mul_overflow(pitch, rows, &slice) || mul_add(e->z, slice, e->x, &offset) ||
        mul_add(e->y, pitch, offset, &offset) || __builtin_add_overflow(e->ptr, offset, &start) ||
        region_extent(c->width, c->height, c->depth, pitch, slice, &extent) || start + extent < start)
        return CUDA_ERROR_INVALID_VALUE;
    int kind = fake_mem_range(start, extent);
    if (kind < 0 || (e->type == SIDE_DEVICE && kind == FAKE_MEM_NONE))
        return CUDA_ERROR_INVALID_VALUE; /* not (all) inside one allocation */
    *out = (struct placed){(unsigned char *)(uintptr_t)start, pitch, slice, kind == FAKE_MEM_NONE};
    return CUDA_SUCCESS;
}

static CUresult place(const struct endpoint *e, const struct copy3d *c, struct placed *out)
{
    return e->type == SIDE_ARRAY ? place_array(e, c, out) : place_pointer(e, c, out);
}

/* --- the copy and the fill ----------------------------------------------------------------- */

static CUresult copy3d(const struct copy3d *c, enum mode mode, CUstream stream)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (c->width == 0 || c->height == 0 || c->depth == 0)
        return mode == ASYNC && !fake_stream_valid(stream) ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    struct placed dst, src;
    if ((r = place(&c->dst, c, &dst)) != CUDA_SUCCESS || (r = place(&c->src, c, &src)) != CUDA_SUCCESS)
        return r;
    struct job *j = malloc(sizeof *j);
    if (j == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *j = (struct job){.dst = dst.base, .src = src.base, .width = c->width, .height = c->height, .depth = c->depth,
                      .dst_pitch = dst.pitch, .dst_slice = dst.slice, .src_pitch = src.pitch, .src_slice = src.slice};
    return submit(j, mode, stream, dst.pageable || src.pageable);
}

static struct endpoint pointer_side(enum side_type type, uint64_t ptr)
{
    return (struct endpoint){.type = type, .ptr = ptr};
}

static struct endpoint array_side(CUarray array, uint64_t offset)
{
    return (struct endpoint){.type = SIDE_ARRAY, .array = array, .x = offset, .linear = 1};
}

static CUresult copy1d(enum mode mode, CUstream stream, struct endpoint dst, struct endpoint src, uint64_t bytes)
{
    struct copy3d c = {.dst = dst, .src = src, .width = bytes, .height = 1, .depth = 1};
    return copy3d(&c, mode, stream);
}

static CUresult fill(enum mode mode, CUstream stream, uint64_t dst, uint64_t pitch, unsigned int elem, uint32_t value,
                     uint64_t width, uint64_t height)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (width == 0 || height == 0)
        return mode == ASYNC && !fake_stream_valid(stream) ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
    uint64_t row, extent;
    if (dst % elem != 0 || __builtin_mul_overflow(width, elem, &row))
        return CUDA_ERROR_INVALID_VALUE;
    if (height == 1)
        pitch = row;
    if (pitch < row || pitch % elem != 0 || mul_add(height - 1, pitch, row, &extent))
        return CUDA_ERROR_INVALID_VALUE;
    int kind = fake_mem_range(dst, extent);
    if (kind != FAKE_MEM_DEVICE && kind != FAKE_MEM_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    struct job *j = malloc(sizeof *j);
    if (j == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *j = (struct job){.dst = (unsigned char *)(uintptr_t)dst, .width = width, .height = height, .depth = 1,
                      .dst_pitch = pitch, .elem = elem, .value = value};
    return submit(j, mode, stream, 0);
}

/* --- 1D copies: every ABI ------------------------------------------------------------------- */

static CUresult htod(enum mode m, CUstream s, uint64_t dst, const void *src, uint64_t n)
{
    return copy1d(m, s, pointer_side(SIDE_DEVICE, dst), pointer_side(SIDE_HOST, (uint64_t)(uintptr_t)src), n);
}

static CUresult dtoh(enum mode m, CUstream s, void *dst, uint64_t src, uint64_t n)
{
    return copy1d(m, s, pointer_side(SIDE_HOST, (uint64_t)(uintptr_t)dst), pointer_side(SIDE_DEVICE, src), n);
}

static CUresult dtod(enum mode m, CUstream s, uint64_t dst, uint64_t src, uint64_t n)
{
    return copy1d(m, s, pointer_side(SIDE_DEVICE, dst), pointer_side(SIDE_DEVICE, src), n);
}

static CUresult dtoa(enum mode m, CUstream s, CUarray dst, uint64_t offset, uint64_t src, uint64_t n)
{
    return copy1d(m, s, array_side(dst, offset), pointer_side(SIDE_DEVICE, src), n);
}

static CUresult atod(enum mode m, CUstream s, uint64_t dst, CUarray src, uint64_t offset, uint64_t n)
{
    return copy1d(m, s, pointer_side(SIDE_DEVICE, dst), array_side(src, offset), n);
}

static CUresult htoa(enum mode m, CUstream s, CUarray dst, uint64_t offset, const void *src, uint64_t n)
{
    return copy1d(m, s, array_side(dst, offset), pointer_side(SIDE_HOST, (uint64_t)(uintptr_t)src), n);
}

static CUresult atoh(enum mode m, CUstream s, void *dst, CUarray src, uint64_t offset, uint64_t n)
{
    return copy1d(m, s, pointer_side(SIDE_HOST, (uint64_t)(uintptr_t)dst), array_side(src, offset), n);
}

static CUresult atoa(enum mode m, CUstream s, CUarray dst, uint64_t dst_offset, CUarray src, uint64_t src_offset,
                     uint64_t n)
{
    return copy1d(m, s, array_side(dst, dst_offset), array_side(src, src_offset), n);
}

static CUresult unified(enum mode m, CUstream s, uint64_t dst, uint64_t src, uint64_t n)
{
    return copy1d(m, s, pointer_side(SIDE_UNIFIED, dst), pointer_side(SIDE_UNIFIED, src), n);
}

static CUresult peer(enum mode m, CUstream s, uint64_t dst, CUcontext dst_ctx, uint64_t src, CUcontext src_ctx,
                     uint64_t n)
{
    if (fake_ready() == CUDA_SUCCESS && (!fake_context_valid(dst_ctx) || !fake_context_valid(src_ctx)))
        return CUDA_ERROR_INVALID_CONTEXT;
    return dtod(m, s, dst, src, n);
}

/* The three synchronous ABIs of a copy: v1 (32-bit), _v2 and _v2_ptds. */
#define SYNC_ABIS(v1, v2, ptds, params_v1, params_v2, core, ...)                                   \
    CUresult v1 params_v1 { return core(SYNC_LEGACY, NULL, __VA_ARGS__); }                        \
    CUresult v2 params_v2 { return core(SYNC_LEGACY, NULL, __VA_ARGS__); }                        \
    CUresult ptds params_v2 { return core(SYNC_PER_THREAD, NULL, __VA_ARGS__); }

/* The three stream-ordered ABIs: v1, _v2 and _v2_ptsz (whose NULL stream is per-thread). */
#define ASYNC_ABIS(v1, v2, pt, params_v1, params_v2, core, ...)                                    \
    CUresult v1 params_v1 { return core(ASYNC, hStream, __VA_ARGS__); }                           \
    CUresult v2 params_v2 { return core(ASYNC, hStream, __VA_ARGS__); }                           \
    CUresult pt params_v2 { return core(ASYNC, ptsz(hStream), __VA_ARGS__); }

/* Entry points without a v1 ABI: the plain one and its per-thread variant. */
#define SYNC_PAIR(name, ptds, params, core, ...)                                                   \
    CUresult name params { return core(SYNC_LEGACY, NULL, __VA_ARGS__); }                         \
    CUresult ptds params { return core(SYNC_PER_THREAD, NULL, __VA_ARGS__); }

#define ASYNC_PAIR(name, pt, params, core, ...)                                                    \
    CUresult name params { return core(ASYNC, hStream, __VA_ARGS__); }                            \
    CUresult pt params { return core(ASYNC, ptsz(hStream), __VA_ARGS__); }

SYNC_ABIS(cuMemcpyHtoD, cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds,
          (CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount),
          (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount), htod, dstDevice, srcHost, ByteCount)
SYNC_ABIS(cuMemcpyDtoH, cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds,
          (void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount),
          (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount), dtoh, dstHost, srcDevice, ByteCount)
SYNC_ABIS(cuMemcpyDtoD, cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds,
          (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount),
          (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount), dtod, dstDevice, srcDevice, ByteCount)
SYNC_ABIS(cuMemcpyDtoA, cuMemcpyDtoA_v2, cuMemcpyDtoA_v2_ptds,
          (CUarray dstArray, unsigned int dstOffset, CUdeviceptr_v1 srcDevice, unsigned int ByteCount),
          (CUarray dstArray, size_t dstOffset, CUdeviceptr srcDevice, size_t ByteCount), dtoa, dstArray, dstOffset,
          srcDevice, ByteCount)
SYNC_ABIS(cuMemcpyAtoD, cuMemcpyAtoD_v2, cuMemcpyAtoD_v2_ptds,
          (CUdeviceptr_v1 dstDevice, CUarray srcArray, unsigned int srcOffset, unsigned int ByteCount),
          (CUdeviceptr dstDevice, CUarray srcArray, size_t srcOffset, size_t ByteCount), atod, dstDevice, srcArray,
          srcOffset, ByteCount)
SYNC_ABIS(cuMemcpyHtoA, cuMemcpyHtoA_v2, cuMemcpyHtoA_v2_ptds,
          (CUarray dstArray, unsigned int dstOffset, const void *srcHost, unsigned int ByteCount),
          (CUarray dstArray, size_t dstOffset, const void *srcHost, size_t ByteCount), htoa, dstArray, dstOffset,
          srcHost, ByteCount)
SYNC_ABIS(cuMemcpyAtoH, cuMemcpyAtoH_v2, cuMemcpyAtoH_v2_ptds,
          (void *dstHost, CUarray srcArray, unsigned int srcOffset, unsigned int ByteCount),
          (void *dstHost, CUarray srcArray, size_t srcOffset, size_t ByteCount), atoh, dstHost, srcArray, srcOffset,
          ByteCount)
SYNC_ABIS(cuMemcpyAtoA, cuMemcpyAtoA_v2, cuMemcpyAtoA_v2_ptds,
          (CUarray dstArray, unsigned int dstOffset, CUarray srcArray, unsigned int srcOffset, unsigned int ByteCount),
          (CUarray dstArray, size_t dstOffset, CUarray srcArray, size_t srcOffset, size_t ByteCount), atoa, dstArray,
          dstOffset, srcArray, srcOffset, ByteCount)
SYNC_PAIR(cuMemcpy, cuMemcpy_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount), unified, dst, src,
          ByteCount)
SYNC_PAIR(cuMemcpyPeer, cuMemcpyPeer_ptds,
          (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext, size_t ByteCount),
          peer, dstDevice, dstContext, srcDevice, srcContext, ByteCount)

ASYNC_ABIS(cuMemcpyHtoDAsync, cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz,
           (CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount, CUstream hStream),
           (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream), htod, dstDevice, srcHost,
           ByteCount)
ASYNC_ABIS(cuMemcpyDtoHAsync, cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz,
           (void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount, CUstream hStream),
           (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream), dtoh, dstHost, srcDevice,
           ByteCount)
ASYNC_ABIS(cuMemcpyDtoDAsync, cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz,
           (CUdeviceptr_v1 dstDevice, CUdeviceptr_v1 srcDevice, unsigned int ByteCount, CUstream hStream),
           (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream), dtod, dstDevice,
           srcDevice, ByteCount)
ASYNC_ABIS(cuMemcpyHtoAAsync, cuMemcpyHtoAAsync_v2, cuMemcpyHtoAAsync_v2_ptsz,
           (CUarray dstArray, unsigned int dstOffset, const void *srcHost, unsigned int ByteCount, CUstream hStream),
           (CUarray dstArray, size_t dstOffset, const void *srcHost, size_t ByteCount, CUstream hStream), htoa,
           dstArray, dstOffset, srcHost, ByteCount)
ASYNC_ABIS(cuMemcpyAtoHAsync, cuMemcpyAtoHAsync_v2, cuMemcpyAtoHAsync_v2_ptsz,
           (void *dstHost, CUarray srcArray, unsigned int srcOffset, unsigned int ByteCount, CUstream hStream),
           (void *dstHost, CUarray srcArray, size_t srcOffset, size_t ByteCount, CUstream hStream), atoh, dstHost,
           srcArray, srcOffset, ByteCount)
ASYNC_PAIR(cuMemcpyAsync, cuMemcpyAsync_ptsz, (CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream),
           unified, dst, src, ByteCount)
ASYNC_PAIR(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz,
           (CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice, CUcontext srcContext,
            size_t ByteCount, CUstream hStream),
           peer, dstDevice, dstContext, srcDevice, srcContext, ByteCount)

/* --- 2D and 3D copies ------------------------------------------------------------------------ */

static int side_from(CUmemorytype type, const void *host, uint64_t device, CUarray array, struct endpoint *e)
{
    switch (type) {
    case CU_MEMORYTYPE_HOST: *e = pointer_side(SIDE_HOST, (uint64_t)(uintptr_t)host); return 0;
    case CU_MEMORYTYPE_DEVICE: *e = pointer_side(SIDE_DEVICE, device); return 0;
    case CU_MEMORYTYPE_UNIFIED: *e = pointer_side(SIDE_UNIFIED, device); return 0;
    case CU_MEMORYTYPE_ARRAY: *e = (struct endpoint){.type = SIDE_ARRAY, .array = array}; return 0;
    default: return -1;
    }
}

/* Fills one side of c from a memcpy structure's fields; -1 for an unknown memory type. */
static int set_side(struct endpoint *e, CUmemorytype type, const void *host, uint64_t device, CUarray array,
                    uint64_t x, uint64_t y, uint64_t z, uint64_t pitch, uint64_t rows)
{
    if (side_from(type, host, device, array, e) != 0)
        return -1;
    e->x = x, e->y = y, e->z = z, e->pitch = pitch, e->rows = rows;
    return 0;
}

#define COPY_2D(p, c)                                                                              \
    (set_side(&(c)->src, (p)->srcMemoryType, (p)->srcHost, (p)->srcDevice, (p)->srcArray, (p)->srcXInBytes, \
              (p)->srcY, 0, (p)->srcPitch, 0) == 0 &&                                             \
     set_side(&(c)->dst, (p)->dstMemoryType, (p)->dstHost, (p)->dstDevice, (p)->dstArray, (p)->dstXInBytes, \
              (p)->dstY, 0, (p)->dstPitch, 0) == 0)

#define COPY_3D(p, c)                                                                              \
    ((p)->srcLOD == 0 && (p)->dstLOD == 0 &&                                                       \
     set_side(&(c)->src, (p)->srcMemoryType, (p)->srcHost, (p)->srcDevice, (p)->srcArray, (p)->srcXInBytes, \
              (p)->srcY, (p)->srcZ, (p)->srcPitch, (p)->srcHeight) == 0 &&                        \
     set_side(&(c)->dst, (p)->dstMemoryType, (p)->dstHost, (p)->dstDevice, (p)->dstArray, (p)->dstXInBytes, \
              (p)->dstY, (p)->dstZ, (p)->dstPitch, (p)->dstHeight) == 0)

/* A copy structure that is NULL or names an unknown memory type, a LOD or a reserved field. */
static CUresult bad_structure(void)
{
    CUresult r = fake_ready_with_context();
    return r != CUDA_SUCCESS ? r : CUDA_ERROR_INVALID_VALUE;
}

static CUresult copy2d_v2(const CUDA_MEMCPY2D *p, enum mode mode, CUstream stream)
{
    struct copy3d c = {.width = p != NULL ? p->WidthInBytes : 0, .height = p != NULL ? p->Height : 0, .depth = 1};
    if (p == NULL || !COPY_2D(p, &c))
        return bad_structure();
    return copy3d(&c, mode, stream);
}

static CUresult copy2d_v1(const CUDA_MEMCPY2D_v1 *p, enum mode mode, CUstream stream)
{
    struct copy3d c = {.width = p != NULL ? p->WidthInBytes : 0, .height = p != NULL ? p->Height : 0, .depth = 1};
    if (p == NULL || !COPY_2D(p, &c))
        return bad_structure();
    return copy3d(&c, mode, stream);
}

static CUresult copy3d_v2(const CUDA_MEMCPY3D *p, enum mode mode, CUstream stream)
{
    struct copy3d c = {0};
    if (p == NULL || p->reserved0 != NULL || p->reserved1 != NULL || !COPY_3D(p, &c))
        return bad_structure();
    c.width = p->WidthInBytes, c.height = p->Height, c.depth = p->Depth;
    return copy3d(&c, mode, stream);
}

static CUresult copy3d_v1(const CUDA_MEMCPY3D_v1 *p, enum mode mode, CUstream stream)
{
    struct copy3d c = {0};
    if (p == NULL || p->reserved0 != NULL || p->reserved1 != NULL || !COPY_3D(p, &c))
        return bad_structure();
    c.width = p->WidthInBytes, c.height = p->Height, c.depth = p->Depth;
    return copy3d(&c, mode, stream);
}

static CUresult copy3d_peer(const CUDA_MEMCPY3D_PEER *p, enum mode mode, CUstream stream)
{
    struct copy3d c = {0};
    if (p == NULL || !COPY_3D(p, &c))
        return bad_structure();
    if (fake_ready() == CUDA_SUCCESS &&
        ((p->srcMemoryType != CU_MEMORYTYPE_ARRAY && !fake_context_valid(p->srcContext)) ||
         (p->dstMemoryType != CU_MEMORYTYPE_ARRAY && !fake_context_valid(p->dstContext))))
        return CUDA_ERROR_INVALID_CONTEXT;
    c.width = p->WidthInBytes, c.height = p->Height, c.depth = p->Depth;
    return copy3d(&c, mode, stream);
}

CUresult cuMemcpy2D(const CUDA_MEMCPY2D_v1 *pCopy) { return copy2d_v1(pCopy, SYNC_LEGACY, NULL); }
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *pCopy) { return copy2d_v2(pCopy, SYNC_LEGACY, NULL); }
CUresult cuMemcpy2D_v2_ptds(const CUDA_MEMCPY2D *pCopy) { return copy2d_v2(pCopy, SYNC_PER_THREAD, NULL); }
CUresult cuMemcpy2DUnaligned(const CUDA_MEMCPY2D_v1 *pCopy) { return copy2d_v1(pCopy, SYNC_LEGACY, NULL); }
CUresult cuMemcpy2DUnaligned_v2(const CUDA_MEMCPY2D *pCopy) { return copy2d_v2(pCopy, SYNC_LEGACY, NULL); }
CUresult cuMemcpy2DUnaligned_v2_ptds(const CUDA_MEMCPY2D *pCopy) { return copy2d_v2(pCopy, SYNC_PER_THREAD, NULL); }
CUresult cuMemcpy3D(const CUDA_MEMCPY3D_v1 *pCopy) { return copy3d_v1(pCopy, SYNC_LEGACY, NULL); }
CUresult cuMemcpy3D_v2(const CUDA_MEMCPY3D *pCopy) { return copy3d_v2(pCopy, SYNC_LEGACY, NULL); }
CUresult cuMemcpy3D_v2_ptds(const CUDA_MEMCPY3D *pCopy) { return copy3d_v2(pCopy, SYNC_PER_THREAD, NULL); }
CUresult cuMemcpy3DPeer(const CUDA_MEMCPY3D_PEER *pCopy) { return copy3d_peer(pCopy, SYNC_LEGACY, NULL); }
CUresult cuMemcpy3DPeer_ptds(const CUDA_MEMCPY3D_PEER *pCopy) { return copy3d_peer(pCopy, SYNC_PER_THREAD, NULL); }

CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D_v1 *pCopy, CUstream hStream) { return copy2d_v1(pCopy, ASYNC, hStream); }
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *pCopy, CUstream hStream) { return copy2d_v2(pCopy, ASYNC, hStream); }
CUresult cuMemcpy2DAsync_v2_ptsz(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    return copy2d_v2(pCopy, ASYNC, ptsz(hStream));
}
CUresult cuMemcpy3DAsync(const CUDA_MEMCPY3D_v1 *pCopy, CUstream hStream) { return copy3d_v1(pCopy, ASYNC, hStream); }
CUresult cuMemcpy3DAsync_v2(const CUDA_MEMCPY3D *pCopy, CUstream hStream) { return copy3d_v2(pCopy, ASYNC, hStream); }
CUresult cuMemcpy3DAsync_v2_ptsz(const CUDA_MEMCPY3D *pCopy, CUstream hStream)
{
    return copy3d_v2(pCopy, ASYNC, ptsz(hStream));
}
CUresult cuMemcpy3DPeerAsync(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream)
{
    return copy3d_peer(pCopy, ASYNC, hStream);
}
CUresult cuMemcpy3DPeerAsync_ptsz(const CUDA_MEMCPY3D_PEER *pCopy, CUstream hStream)
{
    return copy3d_peer(pCopy, ASYNC, ptsz(hStream));
}

/* --- memsets ----------------------------------------------------------------------------------- */

static CUresult set1d(enum mode m, CUstream s, uint64_t dst, unsigned int elem, uint32_t value, uint64_t n)
{
    return fill(m, s, dst, 0, elem, value, n, 1);
}

static CUresult set2d(enum mode m, CUstream s, uint64_t dst, uint64_t pitch, unsigned int elem, uint32_t value,
                      uint64_t width, uint64_t height)
{
    return fill(m, s, dst, pitch, elem, value, width, height);
}

SYNC_ABIS(cuMemsetD8, cuMemsetD8_v2, cuMemsetD8_v2_ptds, (CUdeviceptr_v1 dstDevice, unsigned char uc, unsigned int N),
          (CUdeviceptr dstDevice, unsigned char uc, size_t N), set1d, dstDevice, 1, uc, N)
SYNC_ABIS(cuMemsetD16, cuMemsetD16_v2, cuMemsetD16_v2_ptds,
          (CUdeviceptr_v1 dstDevice, unsigned short us, unsigned int N),
          (CUdeviceptr dstDevice, unsigned short us, size_t N), set1d, dstDevice, 2, us, N)
SYNC_ABIS(cuMemsetD32, cuMemsetD32_v2, cuMemsetD32_v2_ptds, (CUdeviceptr_v1 dstDevice, unsigned int ui, unsigned int N),
          (CUdeviceptr dstDevice, unsigned int ui, size_t N), set1d, dstDevice, 4, ui, N)
SYNC_ABIS(cuMemsetD2D8, cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds,
          (CUdeviceptr_v1 dstDevice, unsigned int dstPitch, unsigned char uc, unsigned int Width, unsigned int Height),
          (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height), set2d, dstDevice,
          dstPitch, 1, uc, Width, Height)
SYNC_ABIS(cuMemsetD2D16, cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds,
          (CUdeviceptr_v1 dstDevice, unsigned int dstPitch, unsigned short us, unsigned int Width,
           unsigned int Height),
          (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height), set2d, dstDevice,
          dstPitch, 2, us, Width, Height)
SYNC_ABIS(cuMemsetD2D32, cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds,
          (CUdeviceptr_v1 dstDevice, unsigned int dstPitch, unsigned int ui, unsigned int Width, unsigned int Height),
          (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height), set2d, dstDevice,
          dstPitch, 4, ui, Width, Height)

ASYNC_PAIR(cuMemsetD8Async, cuMemsetD8Async_ptsz,
           (CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream), set1d, dstDevice, 1, uc, N)
ASYNC_PAIR(cuMemsetD16Async, cuMemsetD16Async_ptsz,
           (CUdeviceptr dstDevice, unsigned short us, size_t N, CUstream hStream), set1d, dstDevice, 2, us, N)
ASYNC_PAIR(cuMemsetD32Async, cuMemsetD32Async_ptsz,
           (CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream), set1d, dstDevice, 4, ui, N)
ASYNC_PAIR(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz,
           (CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height, CUstream hStream),
           set2d, dstDevice, dstPitch, 1, uc, Width, Height)
ASYNC_PAIR(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz,
           (CUdeviceptr dstDevice, size_t dstPitch, unsigned short us, size_t Width, size_t Height, CUstream hStream),
           set2d, dstDevice, dstPitch, 2, us, Width, Height)
ASYNC_PAIR(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz,
           (CUdeviceptr dstDevice, size_t dstPitch, unsigned int ui, size_t Width, size_t Height, CUstream hStream),
           set2d, dstDevice, dstPitch, 4, ui, Width, Height)
