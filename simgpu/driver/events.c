/*
 * events.c: the event entry points of the simulated driver, on stream_engine.c: cuEventCreate,
 * cuEventRecord and cuEventRecordWithFlags (and _ptsz), cuEventQuery, cuEventSynchronize,
 * cuEventElapsedTime (v1 and _v2), cuEventDestroy (v1 and _v2). An event's time is when the
 * simulated GPU reached its record: the stream's earlier work (and what the legacy stream's rule
 * makes it wait for) had completed. Interprocess events are not modelled.
 */
#include "stream_engine.h"

#define EVENT_FLAGS (CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS)

static CUresult check_event(CUevent event)
{
    CUresult r = fake_ready();
    if (r == CUDA_SUCCESS && !engine_event_valid(event))
        r = CUDA_ERROR_INVALID_HANDLE;
    return r;
}

CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    CUresult r = fake_ready_with_context();
    if (r != CUDA_SUCCESS)
        return r;
    if (phEvent == NULL || (Flags & ~(unsigned int)EVENT_FLAGS) != 0 ||
        ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    return engine_event_create(phEvent, Flags);
}

static CUresult record(CUevent hEvent, CUstream hStream, unsigned int flags, int per_thread)
{
    struct fake_stream *s;
    CUresult r = engine_resolve(hStream, per_thread, &s);
    if (r == CUDA_SUCCESS)
        r = check_event(hEvent);
    if (r == CUDA_SUCCESS && (flags & ~(unsigned int)CU_EVENT_RECORD_EXTERNAL) != 0)
        r = CUDA_ERROR_INVALID_VALUE;
    return r == CUDA_SUCCESS ? engine_submit_record(s, hEvent) : r;
}

CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return record(hEvent, hStream, 0, 0);
}

CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    return record(hEvent, hStream, 0, 1);
}

CUresult cuEventRecordWithFlags(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    return record(hEvent, hStream, flags, 0);
}

CUresult cuEventRecordWithFlags_ptsz(CUevent hEvent, CUstream hStream, unsigned int flags)
{
    return record(hEvent, hStream, flags, 1);
}

CUresult cuEventQuery(CUevent hEvent)
{
    CUresult r = check_event(hEvent);
    return r == CUDA_SUCCESS ? engine_event_query(hEvent) : r;
}

CUresult cuEventSynchronize(CUevent hEvent)
{
    CUresult r = check_event(hEvent);
    if (r == CUDA_SUCCESS)
        engine_event_wait(hEvent);
    return r;
}

CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    CUresult r = check_event(hStart);
    if (r == CUDA_SUCCESS)
        r = check_event(hEnd);
    if (r == CUDA_SUCCESS && pMilliseconds == NULL)
        r = CUDA_ERROR_INVALID_VALUE;
    return r == CUDA_SUCCESS ? engine_event_elapsed(pMilliseconds, hStart, hEnd) : r;
}

CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime_v2(pMilliseconds, hStart, hEnd);
}

CUresult cuEventDestroy_v2(CUevent hEvent)
{
    CUresult r = check_event(hEvent);
    if (r == CUDA_SUCCESS)
        engine_event_destroy(hEvent);
    return r;
}

CUresult cuEventDestroy(CUevent hEvent)
{
    return cuEventDestroy_v2(hEvent);
}
