/*
 * stream_engine.c: the asynchronous work queues of the simulated GPU (model: stream_engine.h).
 *
 * Locking: one process-wide mutex (eng.lock) guards every stream's queue and counters, every
 * event and the stream list; `done` is broadcast whenever an item completes (what synchronisers,
 * fences and full queues wait for); each stream's `has_work` wakes its worker. Work itself (a
 * kernel holding SM units, a host function) runs without the lock.
 *
 * Lifetimes are reference counts under the lock: a stream is held by its handle (or, for the
 * default streams, by the engine or its thread), by its worker while that runs, by every fence
 * that names it and by every event whose latest record is on it; an event by its handle and by
 * every queued record of it. Destroying a handle drops its reference; the object goes when the
 * last one does.
 *
 * Process lifecycle: workers block every signal, so the application's handlers run on its own
 * threads. Exit waits for nothing (gpu_state.c's exit handler gives the slot back; a worker that
 * then reaches the simulated GPU parks until the process is gone). A child forked after cuInit
 * cannot use CUDA: its copy of the engine is reset and never touched.
 */
#include "stream_engine.h"

#include "gpu_state.h"
#include "kernel_time.h"

#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum stream_kind { STREAM_USER, STREAM_LEGACY, STREAM_PER_THREAD };
enum work_kind { WORK_KERNEL, WORK_HOST, WORK_RECORD, WORK_WAIT };

struct fence {
    struct fake_stream *stream; /* NULL: nothing to wait for */
    uint64_t seq;               /* done once stream->completed >= seq */
};

struct work {
    struct work *next;
    enum work_kind kind;
    uint64_t seq;
    size_t fence_count;
    struct fence *fences;
    union {
        struct { uint64_t duration_ns; int is_graph; } kernel;
        struct { void (*fn)(void *arg); void *arg; } host;
        struct { CUevent event; uint64_t generation; } record;
    } u;
};

struct fake_stream {
    struct CUstream_st handle; /* magic, flags: the checks of fake_internal.h */
    enum stream_kind kind;
    int priority;
    unsigned long long id;
    CUcontext ctx;
    struct work *head, *tail; /* head: running or next to run */
    uint64_t submitted, completed;
    unsigned int refs;
    int destroyed, worker_started;
    pthread_cond_t has_work;
    struct fake_stream *prev, *next; /* eng.streams */
};

struct CUevent_st {
    uint32_t magic;
    unsigned int flags;
    unsigned int refs;
    struct fence latest;  /* the latest record */
    uint64_t generation;  /* records so far */
    uint64_t time_ns;     /* when the latest record completed (time_valid) */
    int time_valid;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t done;
    struct fake_stream *streams; /* every stream not yet freed */
    struct fake_stream *legacy;
    unsigned long long next_id;
} eng = {.lock = PTHREAD_MUTEX_INITIALIZER, .done = PTHREAD_COND_INITIALIZER, .next_id = 1};

static __thread struct fake_stream *tls_per_thread;
static pthread_key_t per_thread_key;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;

/* --- streams: making, finding, freeing (lock held unless said) --------------------------- */

static void stream_unref_locked(struct fake_stream *s)
{
    if (--s->refs > 0)
        return;
    if (s->prev != NULL)
        s->prev->next = s->next;
    else
        eng.streams = s->next;
    if (s->next != NULL)
        s->next->prev = s->prev;
    pthread_cond_destroy(&s->has_work);
    s->handle.magic = 0;
    free(s);
}

static struct fake_stream *stream_new_locked(enum stream_kind kind, unsigned int flags, int priority, CUcontext ctx)
{
    struct fake_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    s->handle.magic = FAKE_STREAM_MAGIC;
    s->handle.flags = flags;
    s->kind = kind;
    s->priority = priority;
    s->ctx = ctx;
    s->id = eng.next_id++;
    s->refs = 1;
    pthread_cond_init(&s->has_work, NULL);
    s->next = eng.streams;
    if (eng.streams != NULL)
        eng.streams->prev = s;
    eng.streams = s;
    return s;
}

/* The calling thread's per-thread default stream ends with the thread (once drained). */
static void per_thread_stream_end(void *value)
{
    struct fake_stream *s = value;
    pthread_mutex_lock(&eng.lock);
    s->destroyed = 1;
    pthread_cond_signal(&s->has_work);
    stream_unref_locked(s);
    pthread_mutex_unlock(&eng.lock);
}

static void make_key(void)
{
    pthread_key_create(&per_thread_key, per_thread_stream_end);
}

static struct fake_stream *per_thread_stream(void)
{
    if (tls_per_thread != NULL)
        return tls_per_thread;
    pthread_once(&key_once, make_key);
    pthread_mutex_lock(&eng.lock);
    struct fake_stream *s = stream_new_locked(STREAM_PER_THREAD, CU_STREAM_DEFAULT, 0, NULL);
    pthread_mutex_unlock(&eng.lock);
    if (s != NULL && pthread_setspecific(per_thread_key, s) != 0) {
        per_thread_stream_end(s);
        s = NULL;
    }
    return tls_per_thread = s;
}

static struct fake_stream *legacy_stream(void)
{
    pthread_mutex_lock(&eng.lock);
    if (eng.legacy == NULL)
        eng.legacy = stream_new_locked(STREAM_LEGACY, CU_STREAM_DEFAULT, 0, NULL); /* held for good */
    struct fake_stream *s = eng.legacy;
    pthread_mutex_unlock(&eng.lock);
    return s;
}

struct fake_stream *engine_stream(CUstream handle, int per_thread)
{
    if (handle == CU_STREAM_LEGACY || (handle == NULL && !per_thread))
        return legacy_stream();
    if (handle == CU_STREAM_PER_THREAD || handle == NULL)
        return per_thread_stream();
    if (handle->magic != FAKE_STREAM_MAGIC)
        return NULL;
    return (struct fake_stream *)handle; /* every stream handle is a struct fake_stream */
}

CUresult engine_resolve(CUstream handle, int per_thread, struct fake_stream **out)
{
    CUresult r = fake_ready();
    if (r != CUDA_SUCCESS)
        return r;
    int special = handle == NULL || handle == CU_STREAM_LEGACY || handle == CU_STREAM_PER_THREAD;
    if (special && (r = fake_ready_with_context()) != CUDA_SUCCESS)
        return r;
    struct fake_stream *s = engine_stream(handle, per_thread);
    if (s == NULL)
        return special ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

int fake_stream_valid(CUstream stream)
{
    return stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD ||
           stream->magic == FAKE_STREAM_MAGIC;
}

CUresult engine_stream_create(CUstream *out, unsigned int flags, int priority, CUcontext ctx)
{
    if (priority < FAKE_STREAM_GREATEST_PRIORITY)
        priority = FAKE_STREAM_GREATEST_PRIORITY; /* clamped, as the driver does */
    if (priority > FAKE_STREAM_LEAST_PRIORITY)
        priority = FAKE_STREAM_LEAST_PRIORITY;
    pthread_mutex_lock(&eng.lock);
    struct fake_stream *s = stream_new_locked(STREAM_USER, flags, priority, ctx);
    pthread_mutex_unlock(&eng.lock);
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *out = &s->handle;
    return CUDA_SUCCESS;
}

void engine_stream_destroy(struct fake_stream *s)
{
    pthread_mutex_lock(&eng.lock);
    s->handle.magic = 0; /* the handle is gone now; the work goes on */
    s->destroyed = 1;
    pthread_cond_signal(&s->has_work);
    stream_unref_locked(s);
    pthread_mutex_unlock(&eng.lock);
}

unsigned int engine_stream_flags(const struct fake_stream *s)
{
    return s->handle.flags;
}

int engine_stream_priority(const struct fake_stream *s)
{
    return s->priority;
}

unsigned long long engine_stream_id(const struct fake_stream *s)
{
    return s->id;
}

CUcontext engine_stream_ctx(const struct fake_stream *s)
{
    return s->kind == STREAM_USER ? s->ctx : NULL;
}

static int blocking(const struct fake_stream *s)
{
    return s->kind == STREAM_PER_THREAD || (s->kind == STREAM_USER && !(s->handle.flags & CU_STREAM_NON_BLOCKING));
}

/* --- fences --------------------------------------------------------------------------------- */

static int fence_done_locked(const struct fence *f)
{
    return f->stream == NULL || f->stream->completed >= f->seq;
}

/* A fence on everything queued on `s` so far; stream NULL when nothing is pending. */
static struct fence fence_on_locked(struct fake_stream *s)
{
    struct fence f = {NULL, 0};
    if (s != NULL && s->completed < s->submitted) {
        f.stream = s;
        f.seq = s->submitted;
        s->refs++;
    }
    return f;
}

static void fences_release_locked(struct work *w)
{
    for (size_t i = 0; i < w->fence_count; i++)
        if (w->fences[i].stream != NULL)
            stream_unref_locked(w->fences[i].stream);
    free(w->fences);
    w->fences = NULL;
    w->fence_count = 0;
}

/* The legacy stream's rule for work submitted to s: fences on the streams it must wait for, into
 * out (NULL: only count them). How many. */
static size_t legacy_fences_locked(struct fake_stream *s, struct fence *out)
{
    size_t n = 0;
    if (s->kind == STREAM_LEGACY) {
        for (struct fake_stream *o = eng.streams; o != NULL; o = o->next)
            if (o != s && blocking(o) && o->completed < o->submitted) {
                if (out != NULL)
                    out[n] = fence_on_locked(o);
                n++;
            }
    } else if (blocking(s) && eng.legacy != NULL && eng.legacy->completed < eng.legacy->submitted) {
        if (out != NULL)
            out[n] = fence_on_locked(eng.legacy);
        n++;
    }
    return n;
}

/* What work submitted to s must wait for besides s's own order: the legacy stream's rule, and
 * `extra` (an event's record; its reference is taken here). -1 when out of memory. */
static int collect_fences_locked(struct work *w, struct fake_stream *s, const struct fence *extra)
{
    int with_extra = extra != NULL && extra->stream != NULL && extra->stream != s && !fence_done_locked(extra);
    size_t count = legacy_fences_locked(s, NULL) + (size_t)with_extra;
    if (count == 0)
        return 0; /* the common case: nothing to allocate */
    struct fence *fences = calloc(count, sizeof *fences);
    if (fences == NULL)
        return -1;
    size_t n = legacy_fences_locked(s, fences);
    if (with_extra) {
        fences[n++] = *extra;
        extra->stream->refs++;
    }
    w->fences = fences;
    w->fence_count = n;
    return 0;
}

/* --- workers -------------------------------------------------------------------------------- */

/* The process is exiting and has given its slot back: this worker never runs again. */
static void park_forever(void)
{
    for (;;)
        pause();
}

static void run_work(struct work *w)
{
    switch (w->kind) {
    case WORK_KERNEL:
        if (fgpu_run_kernel(w->u.kernel.duration_ns, w->u.kernel.is_graph) != 0)
            park_forever();
        break;
    case WORK_HOST:
        w->u.host.fn(w->u.host.arg);
        break;
    case WORK_RECORD:
    case WORK_WAIT:
        break; /* their effect is their completion */
    }
}

static void event_unref_locked(CUevent e);

static void complete_locked(struct fake_stream *s, struct work *w)
{
    if (w->kind == WORK_RECORD) {
        CUevent e = w->u.record.event;
        if (e->generation == w->u.record.generation) {
            e->time_ns = fgpu_now_ns();
            e->time_valid = 1;
        }
        event_unref_locked(e);
    }
    s->head = w->next;
    if (s->head == NULL)
        s->tail = NULL;
    s->completed = w->seq;
    fences_release_locked(w);
    free(w);
    pthread_cond_broadcast(&eng.done);
}

static int fences_done_locked(const struct work *w)
{
    for (size_t i = 0; i < w->fence_count; i++)
        if (!fence_done_locked(&w->fences[i]))
            return 0;
    return 1;
}

static void *worker_main(void *arg)
{
    struct fake_stream *s = arg;
    pthread_mutex_lock(&eng.lock);
    for (;;) {
        while (s->head == NULL && !s->destroyed)
            pthread_cond_wait(&s->has_work, &eng.lock);
        struct work *w = s->head;
        if (w == NULL)
            break; /* destroyed and drained */
        while (!fences_done_locked(w))
            pthread_cond_wait(&eng.done, &eng.lock);
        pthread_mutex_unlock(&eng.lock);
        run_work(w);
        pthread_mutex_lock(&eng.lock);
        complete_locked(s, w);
    }
    stream_unref_locked(s); /* the worker's reference */
    pthread_mutex_unlock(&eng.lock);
    return NULL;
}

/* Starts s's worker with every signal blocked. 0 or -1. */
static int start_worker_locked(struct fake_stream *s)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED); /* the default stack: callbacks run here */
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    s->refs++;
    int rc = pthread_create(&thread, &attr, worker_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        s->refs--;
        return -1;
    }
    s->worker_started = 1;
    return 0;
}

/* --- submitting ----------------------------------------------------------------------------- */

static void event_take_record_locked(CUevent e, struct fake_stream *s, struct work *w)
{
    if (e->latest.stream != NULL)
        stream_unref_locked(e->latest.stream);
    e->latest = (struct fence){s, w->seq};
    s->refs++;
    e->generation++;
    e->time_valid = 0;
    e->refs++; /* the queued record's */
    w->u.record.event = e;
    w->u.record.generation = e->generation;
}

/* Queues w on s after what s holds and what the legacy rule and `extra` ask; a record of
 * `event` takes the event's place as its latest. Blocks while s is full. */
static CUresult submit(struct fake_stream *s, struct work *w, const struct fence *extra, CUevent event)
{
    pthread_mutex_lock(&eng.lock);
    while (s->submitted - s->completed >= fake_queue_depth())
        pthread_cond_wait(&eng.done, &eng.lock);
    if (collect_fences_locked(w, s, extra) != 0 || (!s->worker_started && start_worker_locked(s) != 0)) {
        fences_release_locked(w);
        pthread_mutex_unlock(&eng.lock);
        free(w);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    w->seq = ++s->submitted;
    if (event != NULL)
        event_take_record_locked(event, s, w);
    if (s->tail != NULL)
        s->tail->next = w;
    else
        s->head = w;
    s->tail = w;
    pthread_cond_signal(&s->has_work);
    pthread_mutex_unlock(&eng.lock);
    return CUDA_SUCCESS;
}

static struct work *new_work(enum work_kind kind)
{
    struct work *w = calloc(1, sizeof *w);
    if (w != NULL)
        w->kind = kind;
    return w;
}

CUresult engine_submit_kernel(struct fake_stream *s, uint64_t duration_ns, int is_graph)
{
    struct work *w = new_work(WORK_KERNEL);
    if (w == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    w->u.kernel.duration_ns = duration_ns;
    w->u.kernel.is_graph = is_graph;
    return submit(s, w, NULL, NULL);
}

CUresult engine_submit_host(struct fake_stream *s, void (*fn)(void *arg), void *arg)
{
    struct work *w = new_work(WORK_HOST);
    if (w == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    w->u.host.fn = fn;
    w->u.host.arg = arg;
    return submit(s, w, NULL, NULL);
}

CUresult engine_submit_record(struct fake_stream *s, CUevent event)
{
    struct work *w = new_work(WORK_RECORD);
    return w != NULL ? submit(s, w, NULL, event) : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult engine_submit_wait(struct fake_stream *s, CUevent event)
{
    pthread_mutex_lock(&eng.lock);
    struct fence latest = event->latest;
    int nothing = fence_done_locked(&latest) || latest.stream == s;
    if (!nothing)
        latest.stream->refs++; /* kept until submit has taken its own */
    pthread_mutex_unlock(&eng.lock);
    if (nothing)
        return CUDA_SUCCESS; /* never recorded, already complete, or earlier on the same stream */
    struct work *w = new_work(WORK_WAIT);
    CUresult r = w != NULL ? submit(s, w, &latest, NULL) : CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&eng.lock);
    stream_unref_locked(latest.stream);
    pthread_mutex_unlock(&eng.lock);
    return r;
}

/* --- waiting -------------------------------------------------------------------------------- */

int engine_stream_idle(struct fake_stream *s)
{
    pthread_mutex_lock(&eng.lock);
    int idle = s->completed == s->submitted;
    pthread_mutex_unlock(&eng.lock);
    return idle;
}

void engine_stream_wait(struct fake_stream *s)
{
    pthread_mutex_lock(&eng.lock);
    uint64_t target = s->submitted;
    while (s->completed < target)
        pthread_cond_wait(&eng.done, &eng.lock);
    pthread_mutex_unlock(&eng.lock);
}

/* Out of memory for a snapshot: waits until no stream has work (later work too). */
static void wait_all_idle_locked(void)
{
    for (;;) {
        struct fake_stream *busy = eng.streams;
        while (busy != NULL && busy->completed == busy->submitted)
            busy = busy->next;
        if (busy == NULL)
            return;
        pthread_cond_wait(&eng.done, &eng.lock);
    }
}

void engine_wait_all(void)
{
    pthread_mutex_lock(&eng.lock);
    size_t count = 0, n = 0;
    for (struct fake_stream *s = eng.streams; s != NULL; s = s->next)
        count += s->completed < s->submitted;
    struct fence *pending = calloc(count ? count : 1, sizeof *pending);
    if (pending == NULL) {
        wait_all_idle_locked();
        pthread_mutex_unlock(&eng.lock);
        return;
    }
    for (struct fake_stream *s = eng.streams; s != NULL && n < count; s = s->next)
        if ((pending[n] = fence_on_locked(s)).stream != NULL)
            n++;
    for (size_t i = 0; i < n; i++) {
        while (!fence_done_locked(&pending[i]))
            pthread_cond_wait(&eng.done, &eng.lock);
        stream_unref_locked(pending[i].stream);
    }
    free(pending);
    pthread_mutex_unlock(&eng.lock);
}

/* --- events --------------------------------------------------------------------------------- */

int engine_event_valid(CUevent event)
{
    return event != NULL && event->magic == FAKE_EVENT_MAGIC;
}

CUresult engine_event_create(CUevent *out, unsigned int flags)
{
    CUevent e = calloc(1, sizeof *e);
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = FAKE_EVENT_MAGIC;
    e->flags = flags;
    e->refs = 1;
    *out = e;
    return CUDA_SUCCESS;
}

static void event_unref_locked(CUevent e)
{
    if (--e->refs > 0)
        return;
    if (e->latest.stream != NULL)
        stream_unref_locked(e->latest.stream);
    free(e);
}

void engine_event_destroy(CUevent event)
{
    pthread_mutex_lock(&eng.lock);
    event->magic = 0; /* a queued record still completes; the handle is gone */
    event_unref_locked(event);
    pthread_mutex_unlock(&eng.lock);
}

CUresult engine_event_query(CUevent event)
{
    pthread_mutex_lock(&eng.lock);
    int done = fence_done_locked(&event->latest);
    pthread_mutex_unlock(&eng.lock);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

void engine_event_wait(CUevent event)
{
    pthread_mutex_lock(&eng.lock);
    uint64_t generation = event->generation;
    while (event->generation == generation && !fence_done_locked(&event->latest))
        pthread_cond_wait(&eng.done, &eng.lock);
    pthread_mutex_unlock(&eng.lock);
}

CUresult engine_event_elapsed(float *ms, CUevent start, CUevent end)
{
    if ((start->flags | end->flags) & CU_EVENT_DISABLE_TIMING)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&eng.lock);
    CUresult r = CUDA_SUCCESS;
    if (start->generation == 0 || end->generation == 0)
        r = CUDA_ERROR_INVALID_HANDLE; /* never recorded */
    else if (!start->time_valid || !end->time_valid)
        r = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)((double)((int64_t)(end->time_ns - start->time_ns)) / 1e6);
    pthread_mutex_unlock(&eng.lock);
    return r;
}

/* --- fork ----------------------------------------------------------------------------------- */

/* Only the forking thread exists in the child, which cannot use CUDA (cuInit refuses after
 * fork): forget the parent's streams without touching them, and make the lock usable for exit. */
static void engine_after_fork_child(void)
{
    pthread_mutex_init(&eng.lock, NULL);
    pthread_cond_init(&eng.done, NULL);
    eng.streams = NULL;
    eng.legacy = NULL;
    tls_per_thread = NULL;
}

__attribute__((constructor)) static void engine_register_fork_handler(void)
{
    pthread_atfork(NULL, NULL, engine_after_fork_child);
}
