/*
 * gpu_state.c: the one fake GPU shared by all processes naming the same device directory.
 * Owns this process's slot in the state file (opened by state_file.c; layout fake_gpu_state.h),
 * the SM queue, the memory pool and the accounting.
 *
 * Invariants, under the state lock (a process-shared robust mutex in the file):
 *   sm_free + sum(sm_held of alive slots) == sm_total
 *   mem_used == sum(mem_used of alive slots); running_kernels == sum(running of alive slots)
 * Every change is made inside a seqlock write section (seq odd), so readers that take no lock
 * (tests, benchmarks) can sample a consistent copy while tenants run.
 *
 * Liveness: a process holds its slot through a POSIX record lock (fcntl F_SETLK, write lock) on
 * byte <slot index> of <dir>/fake_gpu.lock, taken under the state lock in the same step that marks
 * the slot ALIVE, so no process ever sees a taken slot without its lock. The kernel drops the lock
 * when the process exits, however it exits (SIGKILL too), before it becomes a zombie, and in any
 * PID namespace: the tenants of one fake GPU may each live in their own PID namespace (Kubernetes
 * pods without hostPID), where pids repeat. A slot is dead when it is ALIVE in the state but
 * F_GETLK finds no holder of its byte. The pid in the slot is informational only (the process's
 * pid in its own namespace); F_GETLK names the holder in the reader's namespace. POSIX locks are
 * per process and not inherited by fork(), so a forked child holds no slot (it stays unattached)
 * and its exit drops nothing of its parent's. Pitfall: closing ANY descriptor of the lock file in
 * a process drops all its locks on it, so only this file opens it, once per process (O_CLOEXEC),
 * and never closes it while attached.
 *
 * Dead processes: a process killed while it holds SM units or memory (SIGKILL mid-kernel) is
 * reaped by the next process that attaches or that waits for SM units (every 50 ms while it
 * waits): its slot gives its units and bytes back. A process that dies holding the state lock
 * itself is recovered through the robust mutex (EOWNERDEAD): the totals are recomputed from the
 * live slots.
 *
 * SM queue: FIFO across processes. The SM partition is the process's (MPS's
 * CUDA_MPS_ACTIVE_THREAD_PERCENTAGE limits the client process, all its kernels together), so a
 * process runs one kernel at a time, holding its units; its other streams' workers (the threads
 * that run kernels, stream_engine.c) wait for it. A kernel runs when its process runs no kernel,
 * enough units are free and the process is the one that has waited longest among those running
 * none (ties: lower slot); a process with more workers still waiting rejoins at the back after
 * each grant. Head-of-line blocking is intended: a 100-unit kernel at the head is not overtaken
 * by later small ones, so no tenant starves.
 *
 * Exit: the exit handler marks the process detached before it gives the slot back; from then on
 * a worker neither takes SM units nor accounts a kernel that was running (the slot may already
 * be another process's), so a process that exits with work queued leaves the state consistent.
 */
#define _GNU_SOURCE
#include "gpu_state.h"

#include "fake_gpu_state.h"
#include "kernel_time.h"
#include "state_file.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NS_PER_S UINT64_C(1000000000)
#define REAP_INTERVAL_NS (50 * UINT64_C(1000000))

static struct fake_gpu_state *g_state; /* mapped once by fgpu_attach; never unmapped */
static struct fake_gpu_proc *g_self;   /* this process's slot */
static uint32_t g_units;               /* SM units each kernel of this process holds */
static pid_t g_pid;
static int g_lock_fd = -1;             /* <dir>/fake_gpu.lock; open for the process's life */

/* Set at exit, before the slot is given back: from then on no thread of this process may touch
 * the slot (another process may take it). Read and written under the state lock. */
static int g_detached;

uint64_t fgpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * NS_PER_S + (uint64_t)ts.tv_nsec;
}

static struct timespec timespec_of(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / NS_PER_S), .tv_nsec = (long)(ns % NS_PER_S)};
    return ts;
}

/* --- seqlock and lock -------------------------------------------------------------------- */

static void write_begin(struct fake_gpu_state *s)
{
    uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&s->seq, seq + 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_RELEASE);
}

static void write_end(struct fake_gpu_state *s)
{
    uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&s->seq, seq + 1, __ATOMIC_RELEASE);
}

/* --- slot locks (<dir>/fake_gpu.lock, one byte per slot) ------------------------------- */

static struct flock slot_lock_of(uint32_t index, short type)
{
    struct flock lock = {.l_type = type, .l_whence = SEEK_SET, .l_start = (off_t)index, .l_len = 1};
    return lock;
}

/* 1: this process now holds the slot's byte; 0: another process holds it; -1: error (errno). */
static int lock_slot(uint32_t index)
{
    struct flock lock = slot_lock_of(index, F_WRLCK);
    while (fcntl(g_lock_fd, F_SETLK, &lock) != 0) {
        if (errno == EACCES || errno == EAGAIN)
            return 0;
        if (errno != EINTR)
            return -1;
    }
    return 1;
}

static void unlock_slot(uint32_t index)
{
    struct flock lock = slot_lock_of(index, F_UNLCK);
    fcntl(g_lock_fd, F_SETLK, &lock);
}

/* A process is gone once it has exited, reaped by its parent or not (a real driver frees a
 * process's GPU resources when it exits): then the kernel has dropped its lock. Our own locks
 * never conflict with our F_GETLK, so this must not be asked about our own slot. */
static bool slot_holder_gone(uint32_t index)
{
    struct flock lock = slot_lock_of(index, F_WRLCK);
    if (g_lock_fd < 0 || fcntl(g_lock_fd, F_GETLK, &lock) != 0)
        return false; /* cannot tell: keep the slot */
    return lock.l_type == F_UNLCK;
}

/* Gives back everything a slot holds and marks it exited. Lock held, inside a write section. */
static void release_slot_locked(struct fake_gpu_state *s, struct fake_gpu_proc *p, uint64_t now)
{
    uint64_t sm_free = (uint64_t)s->sm_free + p->sm_held;
    s->sm_free = sm_free > s->sm_total ? s->sm_total : (uint32_t)sm_free;
    p->sm_held = 0;
    if (p->running > 0) {
        s->running_kernels = s->running_kernels > p->running ? s->running_kernels - p->running : 0;
        if (s->running_kernels == 0)
            s->device_busy_ns += now - s->busy_since_ns;
        p->running = 0;
    }
    s->mem_used -= p->mem_used < s->mem_used ? p->mem_used : s->mem_used;
    p->mem_used = 0;
    p->waiting_threads = 0;
    p->wait_since_ns = 0;
    p->status = FAKE_GPU_PROC_EXITED;
}

/* A slot is stale when it is ALIVE but no process holds its lock byte. Lock held, outside a
 * write section. */
static void reap_dead_locked(struct fake_gpu_state *s)
{
    uint64_t now = fgpu_now_ns();
    for (uint32_t i = 0; i < s->procs_used && i < FAKE_GPU_MAX_PROCS; i++) {
        struct fake_gpu_proc *p = &s->procs[i];
        if (p->status != FAKE_GPU_PROC_ALIVE || p == g_self)
            continue;
        if (slot_holder_gone(i)) {
            write_begin(s);
            release_slot_locked(s, p, now);
            write_end(s);
        }
    }
}

/* The previous owner died holding the lock, possibly mid-update: close its write section,
 * reap it, and recompute the totals from the live slots. */
static void recover_locked(struct fake_gpu_state *s)
{
    uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_RELAXED);
    if (seq & 1)
        __atomic_store_n(&s->seq, seq + 1, __ATOMIC_RELEASE);
    reap_dead_locked(s);
    uint64_t held = 0, mem = 0, running = 0;
    for (uint32_t i = 0; i < s->procs_used && i < FAKE_GPU_MAX_PROCS; i++) {
        const struct fake_gpu_proc *p = &s->procs[i];
        if (p->status == FAKE_GPU_PROC_ALIVE) {
            held += p->sm_held;
            mem += p->mem_used;
            running += p->running;
        }
    }
    write_begin(s);
    s->sm_free = held >= s->sm_total ? 0 : s->sm_total - (uint32_t)held;
    s->mem_used = mem;
    s->running_kernels = (uint32_t)running;
    write_end(s);
    pthread_mutex_consistent(&s->lock.mutex);
}

static void check_lock(struct fake_gpu_state *s, int rc)
{
    if (rc == EOWNERDEAD) {
        recover_locked(s);
    } else if (rc != 0) {
        fprintf(stderr, "fake libcuda: the fake GPU's state lock failed: %s\n", strerror(rc));
        abort();
    }
}

static void state_lock(struct fake_gpu_state *s)
{
    check_lock(s, pthread_mutex_lock(&s->lock.mutex));
}

static void state_unlock(struct fake_gpu_state *s)
{
    pthread_mutex_unlock(&s->lock.mutex);
}

/* --- attaching ------------------------------------------------------------------------- */

/* The best slot not yet tried: a never-used one, else the exited one that ended longest ago. */
static struct fake_gpu_proc *candidate_locked(struct fake_gpu_state *s, const bool tried[])
{
    struct fake_gpu_proc *slot = NULL;
    for (uint32_t i = 0; i < FAKE_GPU_MAX_PROCS; i++)
        if (!tried[i] && s->procs[i].status == FAKE_GPU_PROC_FREE)
            return &s->procs[i];
    for (uint32_t i = 0; i < FAKE_GPU_MAX_PROCS; i++) {
        struct fake_gpu_proc *p = &s->procs[i];
        if (!tried[i] && p->status == FAKE_GPU_PROC_EXITED && (slot == NULL || p->last_end_ns < slot->last_end_ns))
            slot = p;
    }
    return slot;
}

/* Takes the best free slot whose lock byte this process can take, and marks it ALIVE: both
 * under the state lock, so a reaper never sees the slot taken but unlocked. NULL with
 * *lock_errno 0 when every slot is taken, with the errno of fcntl when locking failed. */
static struct fake_gpu_proc *take_slot_locked(struct fake_gpu_state *s, pid_t pid, uint32_t units, int *lock_errno)
{
    bool tried[FAKE_GPU_MAX_PROCS] = {false};
    struct fake_gpu_proc *slot;
    *lock_errno = 0;
    while ((slot = candidate_locked(s, tried)) != NULL) {
        uint32_t index = (uint32_t)(slot - s->procs);
        int locked = lock_slot(index);
        if (locked < 0) {
            *lock_errno = errno;
            return NULL;
        }
        if (locked > 0)
            break;
        tried[index] = true; /* its holder is alive (an exiting process still releasing it) */
    }
    if (slot == NULL)
        return NULL;
    uint32_t index = (uint32_t)(slot - s->procs);
    write_begin(s);
    memset(slot, 0, sizeof *slot);
    slot->pid = pid;
    slot->status = FAKE_GPU_PROC_ALIVE;
    slot->sm_units = units;
    if (index + 1 > s->procs_used)
        s->procs_used = index + 1;
    write_end(s);
    return slot;
}

/* Opens <dir>/fake_gpu.lock, which only this file opens (closing any descriptor of it would drop
 * this process's locks). -1 with err set when it cannot. */
static int open_lock_file(const char *dir, char *err, size_t err_len)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, FAKE_GPU_LOCK_FILE) >= sizeof path) {
        snprintf(err, err_len, FGPU_ENV_DIR " is too long");
        return -1;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0)
        snprintf(err, err_len, "cannot open %s: %s", path, strerror(errno));
    return fd;
}

enum fgpu_status fgpu_attach(char *err, size_t err_len)
{
    const char *dir = getenv(FGPU_ENV_DIR);
    if (dir == NULL || *dir == '\0') {
        snprintf(err, err_len, FGPU_ENV_DIR " is not set: it names the fake GPU's directory");
        return FGPU_NO_DEVICE;
    }
    if (fake_timing_configure(err, err_len) != 0)
        return FGPU_BAD_CONFIG;
    uint32_t units;
    if (fgpu_parse_units(getenv(FGPU_ENV_SM), &units) != 0) {
        snprintf(err, err_len, FGPU_ENV_SM "=%s is not a percentage in (0, 100]", getenv(FGPU_ENV_SM));
        return FGPU_BAD_CONFIG;
    }
    uint64_t mem_total;
    if (fgpu_parse_bytes(getenv(FGPU_ENV_MEMORY), &mem_total) != 0) {
        snprintf(err, err_len, FGPU_ENV_MEMORY "=%s is not a byte count (e.g. 17179869184 or 16G)",
                 getenv(FGPU_ENV_MEMORY));
        return FGPU_BAD_CONFIG;
    }
    struct fake_gpu_state *s = fgpu_open_state(dir, mem_total, err, err_len);
    if (s == NULL)
        return FGPU_NO_DEVICE;
    g_lock_fd = open_lock_file(dir, err, err_len);
    if (g_lock_fd < 0)
        return FGPU_NO_DEVICE;

    pid_t pid = getpid();
    int lock_errno;
    state_lock(s);
    g_pid = pid;
    reap_dead_locked(s);
    struct fake_gpu_proc *slot = take_slot_locked(s, pid, units, &lock_errno);
    state_unlock(s);
    if (slot == NULL) {
        if (lock_errno != 0)
            snprintf(err, err_len, "cannot lock a process slot in %s/" FAKE_GPU_LOCK_FILE ": %s", dir,
                     strerror(lock_errno));
        else
            snprintf(err, err_len, "all %u process slots of the fake GPU are in use", FAKE_GPU_MAX_PROCS);
        close(g_lock_fd); /* holds no lock of ours */
        g_lock_fd = -1;
        return lock_errno != 0 ? FGPU_NO_DEVICE : FGPU_NO_SLOT;
    }
    g_units = units;
    g_self = slot;
    g_state = s;
    return FGPU_OK;
}

/* At exit, give back what this process still holds so the next tenant need not reap it. */
__attribute__((destructor)) static void fgpu_detach(void)
{
    struct fake_gpu_state *s = g_state;
    if (s == NULL || g_self == NULL || getpid() != g_pid)
        return;
    __atomic_store_n(&g_detached, 1, __ATOMIC_SEQ_CST); /* stream workers stop touching the slot */
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 1;
    int rc = pthread_mutex_timedlock(&s->lock.mutex, &deadline);
    if (rc != 0 && rc != EOWNERDEAD)
        return; /* a stuck peer: the next process reaps this slot instead */
    check_lock(s, rc);
    write_begin(s);
    release_slot_locked(s, g_self, fgpu_now_ns());
    write_end(s);
    unlock_slot((uint32_t)(g_self - s->procs)); /* EXITED first, so no reaper sees it unlocked */
    pthread_cond_broadcast(&s->cond.cond);
    state_unlock(s);
}

/* The child is not attached: POSIX locks are not inherited, so it holds no slot, and closing its
 * copy of the lock file's descriptor (at exec: O_CLOEXEC, or at exit) drops only its own locks,
 * of which it has none; the parent keeps its slot. */
void fgpu_forget_after_fork(void)
{
    g_state = NULL;
    g_self = NULL;
}

/* --- SM units and kernels --------------------------------------------------------------- */

static bool my_turn_locked(const struct fake_gpu_state *s, const struct fake_gpu_proc *me)
{
    if (me->running > 0)
        return false; /* the process's partition is busy with its own kernel */
    if (s->sm_free < g_units)
        return false;
    for (uint32_t i = 0; i < s->procs_used && i < FAKE_GPU_MAX_PROCS; i++) {
        const struct fake_gpu_proc *p = &s->procs[i];
        /* A process whose own kernel runs cannot start another: it does not hold up the queue. */
        if (p == me || p->status != FAKE_GPU_PROC_ALIVE || p->waiting_threads == 0 || p->running > 0)
            continue;
        if (p->wait_since_ns < me->wait_since_ns || (p->wait_since_ns == me->wait_since_ns && p < me))
            return false;
    }
    return true;
}

/* Waits for this process's turn and units; *start_ns is the kernel's start time. -1 (holding
 * nothing) once the process has detached at exit. */
static int acquire_units(struct fake_gpu_state *s, struct fake_gpu_proc *me, uint64_t *start_ns)
{
    state_lock(s);
    if (g_detached) {
        state_unlock(s);
        return -1;
    }
    uint64_t asked = fgpu_now_ns();
    write_begin(s);
    if (me->waiting_threads++ == 0)
        me->wait_since_ns = asked;
    write_end(s);
    uint64_t next_reap = asked + REAP_INTERVAL_NS;
    while (!g_detached && !my_turn_locked(s, me)) {
        struct timespec until = timespec_of(next_reap);
        int rc = pthread_cond_timedwait(&s->cond.cond, &s->lock.mutex, &until);
        if (rc == ETIMEDOUT) {
            reap_dead_locked(s);
            next_reap = fgpu_now_ns() + REAP_INTERVAL_NS;
        } else {
            check_lock(s, rc);
        }
    }
    if (g_detached) { /* the exit handler gave the slot back (waiting_threads included) */
        state_unlock(s);
        return -1;
    }
    uint64_t start = fgpu_now_ns();
    write_begin(s);
    s->sm_free -= g_units;
    me->sm_held += g_units;
    me->running++;
    me->waiting_threads--;
    me->wait_since_ns = me->waiting_threads > 0 ? start : 0;
    if (s->running_kernels++ == 0)
        s->busy_since_ns = start;
    me->wait_ns += start - asked;
    if (me->first_start_ns == 0)
        me->first_start_ns = start;
    write_end(s);
    pthread_cond_broadcast(&s->cond.cond); /* the next in line may fit beside this kernel */
    state_unlock(s);
    *start_ns = start;
    return 0;
}

static void release_units(struct fake_gpu_state *s, struct fake_gpu_proc *me, uint64_t start,
                          int is_graph)
{
    state_lock(s);
    if (g_detached) { /* the slot was given back at exit while this kernel ran: not ours now */
        state_unlock(s);
        return;
    }
    uint64_t end = fgpu_now_ns();
    write_begin(s);
    if (me->sm_held >= g_units) {
        me->sm_held -= g_units;
        s->sm_free += g_units;
    }
    if (me->running > 0)
        me->running--;
    if (s->running_kernels > 0 && --s->running_kernels == 0)
        s->device_busy_ns += end - s->busy_since_ns;
    me->kernels++;
    me->busy_ns += end - start;
    me->last_end_ns = end;
    if (is_graph)
        me->graph_launches++;
    write_end(s);
    pthread_cond_broadcast(&s->cond.cond);
    state_unlock(s);
}

static void sleep_until(uint64_t when_ns)
{
    struct timespec until = timespec_of(when_ns);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, NULL) == EINTR) {
    }
}

int fgpu_run_kernel(uint64_t duration_ns, int is_graph)
{
    struct fake_gpu_state *s = g_state;
    struct fake_gpu_proc *me = g_self;
    uint64_t start;
    if (s == NULL || me == NULL || acquire_units(s, me, &start) != 0)
        return -1;
    if (duration_ns > 0)
        sleep_until(start + duration_ns);
    release_units(s, me, start, is_graph);
    return 0;
}

/* --- memory pool and counters ----------------------------------------------------------- */

enum fgpu_status fgpu_mem_reserve(uint64_t bytes)
{
    struct fake_gpu_state *s = g_state;
    enum fgpu_status status = FGPU_OUT_OF_MEMORY;
    state_lock(s);
    if (bytes <= s->mem_total - s->mem_used) {
        write_begin(s);
        s->mem_used += bytes;
        g_self->mem_used += bytes;
        write_end(s);
        status = FGPU_OK;
    }
    state_unlock(s);
    return status;
}

void fgpu_mem_release(uint64_t bytes)
{
    struct fake_gpu_state *s = g_state;
    state_lock(s);
    write_begin(s);
    s->mem_used -= bytes < s->mem_used ? bytes : s->mem_used;
    g_self->mem_used -= bytes < g_self->mem_used ? bytes : g_self->mem_used;
    write_end(s);
    state_unlock(s);
}

void fgpu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes)
{
    struct fake_gpu_state *s = g_state;
    state_lock(s);
    *free_bytes = s->mem_total - s->mem_used;
    *total_bytes = s->mem_total;
    state_unlock(s);
}

void fgpu_count_ctx_sync(void)
{
    struct fake_gpu_state *s = g_state;
    state_lock(s);
    write_begin(s);
    g_self->ctx_syncs++;
    write_end(s);
    state_unlock(s);
}

void fgpu_state_lock(void)
{
    state_lock(g_state);
}

void fgpu_state_unlock(void)
{
    state_unlock(g_state);
}

int fgpu_lock_file(void)
{
    return g_state != NULL ? g_lock_fd : -1;
}

void fgpu_uuid(uint8_t out[16])
{
    memcpy(out, g_state->uuid, sizeof g_state->uuid); /* immutable after creation */
}
