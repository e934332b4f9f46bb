/*
 * streams.c: the stream entry points of the simulated driver, on stream_engine.c: cuStreamCreate,
 * cuStreamCreateWithPriority (clamped to [-5, 0], the modelled GPU's range), cuStreamDestroy (both
 * ABIs: returns at once, the work still runs), cuStreamSynchronize, cuStreamQuery
 * (CUDA_ERROR_NOT_READY while the stream holds work), cuStreamWaitEvent, cuStreamAddCallback,
 * cuLaunchHostFunc, cuStreamGetFlags / GetPriority / GetCtx (both ABIs) / GetId / GetDevice, each
 * with its _ptsz variant, where NULL is the calling thread's per-thread default stream.
 */
#include "stream_engine.h"

#include <stdlib.h>

#define STREAM_FLAGS (CU_STREAM_DEFAULT | CU_STREAM_NON_BLOCKING)

static CUresult create(CUstream *phStream, unsigned int flags, int priority)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (phStream == NULL || (flags & ~(unsigned int)STREAM_FLAGS) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return engine_stream_create(phStream, flags, priority, fake_current_context());
}

CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    return create(phStream, Flags, 0);
}

CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority)
{
    return create(phStream, flags, priority);
}

CUresult cuStreamDestroy_v2(CUstream hStream)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD ||
        hStream->magic != FAKE_STREAM_MAGIC)
        return CUDA_ERROR_INVALID_HANDLE;
    engine_stream_destroy(engine_stream(hStream, 0));
    return CUDA_SUCCESS;
}

CUresult cuStreamDestroy(CUstream hStream)
{
    return cuStreamDestroy_v2(hStream);
}

/* --- waiting and querying ------------------------------------------------------------------- */

static CUresult synchronize(CUstream hStream, int per_thread)
{
    struct fake_stream *s;
    CUresult r = engine_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS)
        engine_stream_wait(s);
    return r;
}

CUresult cuStreamSynchronize(CUstream hStream)
{
    return synchronize(hStream, 0);
}

CUresult cuStreamSynchronize_ptsz(CUstream hStream)
{
    return synchronize(hStream, 1);
}

static CUresult query(CUstream hStream, int per_thread)
{
    struct fake_stream *s;
    CUresult r = engine_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS && !engine_stream_idle(s))
        r = CUDA_ERROR_NOT_READY;
    return r;
}

CUresult cuStreamQuery(CUstream hStream)
{
    return query(hStream, 0);
}

CUresult cuStreamQuery_ptsz(CUstream hStream)
{
    return query(hStream, 1);
}

static CUresult wait_event(CUstream hStream, CUevent hEvent, unsigned int flags, int per_thread)
{
    struct fake_stream *s;
    CUresult r = engine_resolve(hStream, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (!engine_event_valid(hEvent))
        return CUDA_ERROR_INVALID_HANDLE;
    if (flags & ~(unsigned int)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    return engine_submit_wait(s, hEvent);
}

CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return wait_event(hStream, hEvent, Flags, 0);
}

CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return wait_event(hStream, hEvent, Flags, 1);
}

/* --- host work ------------------------------------------------------------------------------ */

struct callback {
    CUstreamCallback fn;
    CUstream stream; /* as the application named it */
    void *user_data;
};

static void run_callback(void *arg)
{
    struct callback *cb = arg;
    cb->fn(cb->stream, CUDA_SUCCESS, cb->user_data);
    free(cb);
}

static CUresult add_callback(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags,
                             int per_thread)
{
    struct fake_stream *s;
    CUresult r = engine_resolve(hStream, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (callback == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct callback *cb = malloc(sizeof *cb);
    if (cb == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *cb = (struct callback){callback, hStream, userData};
    if ((r = engine_submit_host(s, run_callback, cb)) != CUDA_SUCCESS)
        free(cb);
    return r;
}

CUresult cuStreamAddCallback(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags)
{
    return add_callback(hStream, callback, userData, flags, 0);
}

CUresult cuStreamAddCallback_ptsz(CUstream hStream, CUstreamCallback callback, void *userData, unsigned int flags)
{
    return add_callback(hStream, callback, userData, flags, 1);
}

static CUresult host_func(CUstream hStream, CUhostFn fn, void *userData, int per_thread)
{
    struct fake_stream *s;
    CUresult r = engine_resolve(hStream, per_thread, &s);
    if (r != CUDA_SUCCESS)
        return r;
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    return engine_submit_host(s, fn, userData);
}

CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    return host_func(hStream, fn, userData, 0);
}

CUresult cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData)
{
    return host_func(hStream, fn, userData, 1);
}

/* --- properties ----------------------------------------------------------------------------- */

/* The getters' common start: the stream resolved, and somewhere to write the answer. */
static CUresult resolve_for_answer(CUstream hStream, int per_thread, const void *out, struct fake_stream **s)
{
    CUresult r = engine_resolve(hStream, per_thread, s);
    if (r == CUDA_SUCCESS && out == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    return r;
}

static CUresult get_flags(CUstream hStream, unsigned int *flags, int per_thread)
{
    struct fake_stream *s;
    CUresult r = resolve_for_answer(hStream, per_thread, flags, &s);
    if (r == CUDA_SUCCESS)
        *flags = engine_stream_flags(s);
    return r;
}

CUresult cuStreamGetFlags(CUstream hStream, unsigned int *flags)
{
    return get_flags(hStream, flags, 0);
}

CUresult cuStreamGetFlags_ptsz(CUstream hStream, unsigned int *flags)
{
    return get_flags(hStream, flags, 1);
}

static CUresult get_priority(CUstream hStream, int *priority, int per_thread)
{
    struct fake_stream *s;
    CUresult r = resolve_for_answer(hStream, per_thread, priority, &s);
    if (r == CUDA_SUCCESS)
        *priority = engine_stream_priority(s);
    return r;
}

CUresult cuStreamGetPriority(CUstream hStream, int *priority)
{
    return get_priority(hStream, priority, 0);
}

CUresult cuStreamGetPriority_ptsz(CUstream hStream, int *priority)
{
    return get_priority(hStream, priority, 1);
}

static CUresult get_id(CUstream hStream, unsigned long long *id, int per_thread)
{
    struct fake_stream *s;
    CUresult r = resolve_for_answer(hStream, per_thread, id, &s);
    if (r == CUDA_SUCCESS)
        *id = engine_stream_id(s);
    return r;
}

CUresult cuStreamGetId(CUstream hStream, unsigned long long *streamId)
{
    return get_id(hStream, streamId, 0);
}

CUresult cuStreamGetId_ptsz(CUstream hStream, unsigned long long *streamId)
{
    return get_id(hStream, streamId, 1);
}

static CUresult get_ctx(CUstream hStream, CUcontext *pctx, int per_thread)
{
    struct fake_stream *s;
    CUresult r = resolve_for_answer(hStream, per_thread, pctx, &s);
    if (r == CUDA_SUCCESS) {
        CUcontext ctx = engine_stream_ctx(s);
        *pctx = ctx != NULL ? ctx : fake_current_context();
    }
    return r;
}

CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    return get_ctx(hStream, pctx, 0);
}

CUresult cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
    return get_ctx(hStream, pctx, 1);
}

CUresult cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    CUresult r = get_ctx(hStream, pCtx, 0);
    if (r == CUDA_SUCCESS && pGreenCtx != NULL)
        *pGreenCtx = NULL;
    return r;
}

CUresult cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    CUresult r = get_ctx(hStream, pCtx, 1);
    if (r == CUDA_SUCCESS && pGreenCtx != NULL)
        *pGreenCtx = NULL;
    return r;
}

static CUresult get_device(CUstream hStream, CUdevice *device, int per_thread)
{
    struct fake_stream *s;
    CUresult r = resolve_for_answer(hStream, per_thread, device, &s);
    if (r == CUDA_SUCCESS)
        *device = 0; /* the one device */
    return r;
}

CUresult cuStreamGetDevice(CUstream hStream, CUdevice *device)
{
    return get_device(hStream, device, 0);
}

CUresult cuStreamGetDevice_ptsz(CUstream hStream, CUdevice *device)
{
    return get_device(hStream, device, 1);
}
