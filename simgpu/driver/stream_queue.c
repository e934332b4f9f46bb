/*
 * stream_queue.c: stream order for work other than kernels (stream_queue.h), on the stream engine
 * (stream_engine.c): host work runs on the stream's worker thread after everything queued on the
 * stream before it.
 */
#include "stream_queue.h"

#include "stream_engine.h"

CUresult fake_stream_enqueue_host(CUstream stream, void (*fn)(void *arg), void *arg)
{
    struct fake_stream *s = fake_stream_valid(stream) ? engine_stream(stream, 0) : NULL;
    if (s == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    return engine_submit_host(s, fn, arg);
}

CUresult fake_stream_wait_idle(CUstream stream)
{
    struct fake_stream *s = fake_stream_valid(stream) ? engine_stream(stream, 0) : NULL;
    if (s == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    engine_stream_wait(s);
    return CUDA_SUCCESS;
}

void fake_all_streams_wait_idle(void)
{
    engine_wait_all();
}

CUstream fake_stream_per_thread(CUstream stream)
{
    return stream == NULL ? CU_STREAM_PER_THREAD : stream;
}
