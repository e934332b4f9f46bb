/*
 * stream_engine.h: the simulated GPU's asynchronous work queues (stream_engine.c): streams, the
 * work they hold (kernels, host functions, event records and waits) and events. The entry points
 * live in streams.c, events.c, fake_launch.c and stream_queue.c.
 *
 * Model: every stream has a FIFO of work, bounded by FASTGSHARE_FAKE_GPU_QUEUE_DEPTH (a submit
 * blocks while the stream holds that many unfinished items), and one worker thread (started with
 * its first work, ended when the stream is destroyed and drained) that runs the items in order.
 * A kernel item holds the process's SM units on the shared simulated GPU for its run time
 * (gpu_state.c: one kernel of the process at a time, FIFO across processes). An item may wait for
 * other streams' work (a fence: stream, sequence number), which is how the legacy default stream
 * and cuStreamWaitEvent are ordered: work on the legacy stream waits for all earlier work of the
 * blocking streams (user streams without CU_STREAM_NON_BLOCKING, and per-thread default streams),
 * and work on a blocking stream waits for all earlier work of the legacy stream. Fences always
 * name work submitted earlier, so the streams cannot wait for each other in a cycle.
 */
#ifndef SIMGPU_STREAM_ENGINE_H
#define SIMGPU_STREAM_ENGINE_H

#include "fake_internal.h"

#include <stdint.h>

#define FAKE_EVENT_MAGIC 0x45564e31u

struct fake_stream;

/* The stream an entry point means by `handle`: NULL is the legacy default stream, or the calling
 * thread's per-thread default stream when `per_thread` (a _ptsz/_ptds entry point);
 * CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name those; else a stream from engine_stream_create.
 * NULL when the handle is not valid (or the per-thread stream cannot be made). */
struct fake_stream *engine_stream(CUstream handle, int per_thread);

/* engine_stream after the entry point's checks: CUDA_ERROR_NOT_INITIALIZED before cuInit, a
 * default stream needs a current context (CUDA_ERROR_INVALID_CONTEXT), any other handle must be a
 * live stream (CUDA_ERROR_INVALID_HANDLE). */
CUresult engine_resolve(CUstream handle, int per_thread, struct fake_stream **out);

CUresult engine_stream_create(CUstream *out, unsigned int flags, int priority, CUcontext ctx);

/* The stream ends once its work is done; the handle is invalid from now on. */
void engine_stream_destroy(struct fake_stream *s);

unsigned int engine_stream_flags(const struct fake_stream *s);
int engine_stream_priority(const struct fake_stream *s);
unsigned long long engine_stream_id(const struct fake_stream *s);
/* The context a user stream was created in; NULL for the default streams (the caller's). */
CUcontext engine_stream_ctx(const struct fake_stream *s);

/* Queue work on s (blocking while s is full). A kernel holds the SM units for duration_ns. */
CUresult engine_submit_kernel(struct fake_stream *s, uint64_t duration_ns, int is_graph);
/* fn(arg) runs on the stream's worker thread, in stream order; fn owns arg once this succeeds. */
CUresult engine_submit_host(struct fake_stream *s, void (*fn)(void *arg), void *arg);
CUresult engine_submit_record(struct fake_stream *s, CUevent event);
/* Later work on s waits for the event's latest record (nothing to wait for if never recorded). */
CUresult engine_submit_wait(struct fake_stream *s, CUevent event);

/* 1 when s has no queued or running work. */
int engine_stream_idle(struct fake_stream *s);
/* Waits until the work queued on s before the call has finished. */
void engine_stream_wait(struct fake_stream *s);
/* Waits until the work queued on every stream of the process before the call has finished. */
void engine_wait_all(void);

int engine_event_valid(CUevent event);
CUresult engine_event_create(CUevent *out, unsigned int flags);
void engine_event_destroy(CUevent event);
/* CUDA_SUCCESS when the event's latest record has completed (or it was never recorded), else
 * CUDA_ERROR_NOT_READY. */
CUresult engine_event_query(CUevent event);
void engine_event_wait(CUevent event);
/* cuEventElapsedTime's answer. */
CUresult engine_event_elapsed(float *ms, CUevent start, CUevent end);

#endif
