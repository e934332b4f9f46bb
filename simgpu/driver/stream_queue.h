/*
 * Stream order for work other than kernels (async copies, memsets, host functions): the seam
 * between the memory entry points and the stream engine (stream_queue.c on stream_engine.c).
 *
 * A stream argument is what the application passed to a non-_ptsz entry point: NULL and
 * CU_STREAM_LEGACY are the legacy default stream, CU_STREAM_PER_THREAD the calling thread's
 * per-thread default stream. A _ptsz/_ptds entry point passes fake_stream_per_thread(stream), so
 * that its NULL means the per-thread default stream.
 */
#ifndef SIMGPU_STREAM_QUEUE_H
#define SIMGPU_STREAM_QUEUE_H

#include "fake_internal.h"

/* Runs fn(arg) on the simulated GPU in `stream`'s order (after all work queued on it before, with
 * the legacy default stream's implicit synchronisation), on the stream's worker thread; the call
 * returns at once (it blocks only while the stream's queue is full). fn owns arg once this
 * returns CUDA_SUCCESS; on an error fn is not called and arg stays the caller's.
 * CUDA_ERROR_INVALID_HANDLE for a stream that is not valid. */
CUresult fake_stream_enqueue_host(CUstream stream, void (*fn)(void *arg), void *arg);

/* Waits until `stream` has no queued or running work (cuStreamSynchronize's wait). */
CUresult fake_stream_wait_idle(CUstream stream);

/* Waits until every stream of the process is idle (what a synchronous cuMemcpy does before it
 * copies, and cuCtxSynchronize). */
void fake_all_streams_wait_idle(void);

/* What a _ptsz/_ptds entry point passes for its stream argument: NULL becomes
 * CU_STREAM_PER_THREAD, any other handle is unchanged. */
CUstream fake_stream_per_thread(CUstream stream);

#endif
