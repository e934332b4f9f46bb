/*
 * stream_queue.c: stream order for non-kernel work. Launches are synchronous for now, so every
 * stream is idle whenever a call returns and host work runs at once.
 */
#include "stream_queue.h"

CUresult fake_stream_enqueue_host(CUstream stream, void (*fn)(void *arg), void *arg)
{
    if (!fake_stream_valid(stream))
        return CUDA_ERROR_INVALID_HANDLE;
    fn(arg);
    return CUDA_SUCCESS;
}

CUresult fake_stream_wait_idle(CUstream stream)
{
    return fake_stream_valid(stream) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

void fake_all_streams_wait_idle(void)
{
}
