/*
 * Stream order for work other than kernels (async copies, memsets, host functions): the seam
 * between the memory entry points and the stream engine.
 */
#ifndef SIMGPU_STREAM_QUEUE_H
#define SIMGPU_STREAM_QUEUE_H

#include "fake_internal.h"

/* Runs fn(arg) on the simulated GPU in `stream`'s order (after all work queued on it before, with
 * the legacy default stream's implicit synchronisation); fn owns arg. CUDA_ERROR_INVALID_HANDLE
 * for a stream that is not valid. */
CUresult fake_stream_enqueue_host(CUstream stream, void (*fn)(void *arg), void *arg);

/* Waits until `stream` has no queued or running work (cuStreamSynchronize's wait). */
CUresult fake_stream_wait_idle(CUstream stream);

/* Waits until every stream of the process is idle (what a synchronous cuMemcpy does before it
 * copies, and cuCtxSynchronize). */
void fake_all_streams_wait_idle(void);

#endif
