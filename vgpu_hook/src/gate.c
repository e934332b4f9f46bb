/*
 * gate.c: the time-token gate (see gate.h). Owns the process's connection to the arbiter and
 * its token.
 *
 * Locking: `lock` guards everything below except quota.deadline_ns, which the fast path reads
 * atomically, and the count of launches in flight (atomic: a launch adds itself before it checks
 * the token and removes itself when the driver call returns; a renewal waits for it to reach 0
 * before it synchronises and returns the token). The slow path holds `lock` across the socket round trip (other launching threads
 * wait for the same token, which is the point) and across the real cuCtxSynchronize. The real
 * driver is loaded BEFORE the lock is taken, so a driver constructor calling back into the hook
 * cannot deadlock on it (pitfall 7).
 *
 * Token end on an asynchronous GPU (FASTGSHARE_SYNC_AT_TOKEN_END=1, the default): a launch returns
 * once queued, so the token's kernels run after their launches, and the application may wait for
 * them itself (cuStreamSynchronize, cuEventSynchronize) before its next launch, a wait the hook
 * does not see. Were the token's work settled only when the next launch renews it, a sync there
 * would find nothing left and could not tell a kernel that ran past the token's end from a pod
 * that idled. So a watcher thread (started with the first grant) settles every token at its end:
 * it waits for the launches in flight, then, if anything was launched under the token, makes the
 * token's context current on itself and synchronises it: a sync that waited says the work ran
 * until then (the overrun is charged), one that found nothing says it ended within the token. A
 * renewal that comes first settles the token itself, the same way; each token is settled once.
 * Pacing: a program that never waits can queue far more GPU work under one token than the token
 * lasts (the real driver queues ~1024 launches), and the token-end sync then stalls for all of it:
 * the token is charged in full, but its holder ran for that long past its slice. So when a token's
 * sync found at least two launches' worth of work still queued (its use / its launches = the GPU
 * time a launch queues), the next token admits only about as many launches as fit in it (at least
 * one); the launch past that budget renews the token early, its sync waiting for what the token
 * queued. A token whose work ended in time (a program that waits for its kernels) lifts the budget.
 * With FASTGSHARE_SYNC_AT_TOKEN_END=0 nothing synchronises: the token's use is taken to last to
 * its end (at most until the renewal), since its queued kernels keep the GPU busy after their
 * launches returned; what they run past the token's end is not charged (the queue's depth leaks).
 *
 * A lost connection (the node agent restarts: the socket closes, or the arbiter stops
 * answering) is not a failure yet: the gate reconnects and says HELLO again with backoff for up
 * to FASTGSHARE_HOOK_RECONNECT_S (default 120 s), launches waiting meanwhile, then asks for a
 * token again; one stderr line says the link was lost and one that it is back. Past the bound,
 * or when the arbiter answers with an ERROR (it refuses this process), the failure is permanent
 * for the process: the application sees launch errors, which frameworks treat as fatal, rather
 * than launches nobody arbitrates.
 */
#define _GNU_SOURCE
#include "gate.h"

#include "arbiter_client.h"
#include "log.h"
#include "memory.h"
#include "quota.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* A token-end cuCtxSynchronize that took this long waited for GPU work (one that finds nothing to
 * wait for returns in microseconds). A renewal's sync may come long after the token's end, so
 * taking the call's own noise for work would charge the pod's idle time until then: it needs a
 * clear wait. The watcher's sync starts at the token's end: what it waited is the overrun. */
#define FGS_SYNC_WAITED_NS UINT64_C(500000)
#define FGS_SYNC_WAITED_AT_END_NS UINT64_C(50000)

enum link_state { LINK_UNCONNECTED, LINK_CONNECTED, LINK_FAILED };

static struct {
    pthread_mutex_t lock;
    const struct fgs_config *cfg; /* set once by fgs_gate_configure */
    enum link_state link;
    struct fgs_client client;
    struct fgs_quota quota;
    int failure_reported;
    /* the token-end watcher (FASTGSHARE_SYNC_AT_TOKEN_END=1) */
    uint64_t granted_tokens;  /* grants so far: the current token's number */
    uint64_t settled_tokens;  /* the number of the last token whose work was settled */
    CUcontext token_ctx;      /* current where the token was granted: what the watcher syncs */
    pthread_cond_t granted;   /* CLOCK_MONOTONIC; signalled at every grant */
    int watcher_started;
    PFN_cuCtxGetCurrent_v4000 ctx_get; /* the real driver's, through its own resolver */
    PFN_cuCtxSetCurrent_v4000 ctx_set;
    /* pacing */
    uint64_t launch_cost_ns; /* GPU time a launch queued, from the last token that overran; 0: none */
} g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .link = LINK_UNCONNECTED,
    .client = {.fd = -1},
    .quota = {.clock = fgs_clock_monotonic},
};

/* Launches that passed the gate and have not returned from the driver (atomic). */
static unsigned long g_in_flight;

/* Launches that passed under the current token, and how many it admits (both atomic; pacing). */
static unsigned long g_token_launches;
static unsigned long g_launch_budget = ULONG_MAX;

static void init_granted_cond(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g.granted, &attr);
    pthread_condattr_destroy(&attr);
}

void fgs_gate_configure(const struct fgs_config *cfg)
{
    pthread_mutex_lock(&g.lock);
    init_granted_cond();
    g.cfg = cfg;
    pthread_mutex_unlock(&g.lock);
}

static CUresult fail_locked(const char *reason)
{
    g.link = LINK_FAILED;
    fgs_client_close(&g.client);
    fgs_quota_reset(&g.quota);
    if (!g.failure_reported) {
        g.failure_reported = 1;
        FGS_ERROR("%s; refusing GPU launches of process %d (fail closed: CUDA_ERROR_NOT_PERMITTED)", reason,
                  (int)getpid());
    }
    return FGS_GATE_REFUSED;
}

static int connect_locked(char *err, size_t err_len)
{
    const struct fgs_config *cfg = g.cfg;
    if (cfg->error[0] != '\0') {
        snprintf(err, err_len, "%s", cfg->error);
        return -1;
    }
    fgs_client_init(&g.client, cfg->reply_timeout_ms);
    struct fgs_hello_reply hello;
    if (fgs_client_connect(&g.client, cfg->socket_path, err, err_len) != 0 ||
        fgs_client_hello(&g.client, (uint32_t)getpid(), cfg->pod, cfg->gpu_uuid, &hello, err, err_len) != 0)
        return -1;
    g.link = LINK_CONNECTED;
    FGS_INFO("registered with the arbiter at %s: window %u us, request %u/1000, limit %u/1000, SM %u%%, "
             "memory limit %llu bytes, min token %u us", cfg->socket_path, hello.window_us,
             hello.request_permille, hello.limit_permille, hello.sm_percent,
             (unsigned long long)hello.memory_limit_bytes, hello.min_token_us);
    return 0;
}

/* The registered connection was lost (err says how): connect and HELLO again within the bound.
 * 0 when registered again; -1 with err set to why not. */
static int reconnect_locked(char *err, size_t err_len)
{
    const struct fgs_config *cfg = g.cfg;
    FGS_ERROR("lost the arbiter (%s); reconnecting for up to %d ms, GPU launches of process %d wait", err,
              cfg->reconnect_ms, (int)getpid());
    struct fgs_hello_reply hello;
    uint64_t waited_ms = 0;
    char last[320];
    if (fgs_client_reconnect(&g.client, cfg->socket_path, (uint32_t)getpid(), cfg->pod, cfg->gpu_uuid,
                             cfg->reconnect_ms, &hello, &waited_ms, last, sizeof last) != 0) {
        snprintf(err, err_len, "no arbiter within %d ms of losing it (last: %.200s)", cfg->reconnect_ms, last);
        return -1;
    }
    FGS_ERROR("reconnected to the arbiter after %llu ms; GPU launches of process %d resume",
              (unsigned long long)waited_ms, (int)getpid());
    fgs_memory_relink(); /* the memory link reports what it holds to the new arbiter now */
    return 0;
}

/* Queued work of the expiring token must not run into the next holder's slice on a real GPU.
 * When the synchronize really waited for work (it took at least FGS_SYNC_WAITED_NS), that work ran
 * until now and the token's use extends to now. When it returned at once, nothing was left: on a
 * real GPU the token's kernels may have run after their launches returned, but not past the
 * token's end, so the use extends to the token's end at most (never to now: the pod may have idled
 * for seconds since, and that time is not charged). */
static uint64_t sync_before_return_locked(uint64_t waited_ns)
{
    if (fgs_real.cuCtxSynchronize == NULL)
        return 0;
    uint64_t before = fgs_clock_monotonic(NULL);
    CUresult r = fgs_real.cuCtxSynchronize();
    uint64_t took = fgs_clock_monotonic(NULL) - before;
    if (r != CUDA_SUCCESS)
        FGS_DEBUG("cuCtxSynchronize before returning the token failed with %d", (int)r);
    if (r == CUDA_SUCCESS && took >= waited_ns) {
        fgs_quota_note_activity(&g.quota); /* the token's work ran until now */
        return took;
    }
    fgs_quota_note_until_token_end(&g.quota); /* it ran within the token, at most to its end */
    return 0;
}

/* Pacing: what the settled token's sync says a launch queues. Two or more launches' worth still
 * queued when it synchronised (waited_ns) start a budget, and any wait keeps it (a budgeted token
 * holds few launches); a sync that found nothing (the program waits for its own kernels) ends it. */
static void learn_launch_cost_locked(uint64_t waited_ns)
{
    unsigned long launches = __atomic_load_n(&g_token_launches, __ATOMIC_RELAXED);
    unsigned long budget = __atomic_load_n(&g_launch_budget, __ATOMIC_RELAXED);
    if (launches > budget)
        launches = budget; /* the ones past the budget asked, and did not pass */
    uint64_t used = fgs_quota_used_ns(&g.quota);
    uint64_t cost = launches > 0 && waited_ns > 0 ? used / launches : 0;
    int budgeted = g.launch_cost_ns != 0;
    g.launch_cost_ns = cost > 0 && (budgeted || waited_ns >= 2 * cost) ? cost : 0;
}

/* How many launches a token of token_ns admits: all, or as many as the learnt cost fits, rounded
 * to the nearest (at least one). */
static unsigned long launch_budget(uint64_t token_ns)
{
    if (g.launch_cost_ns == 0)
        return ULONG_MAX;
    uint64_t fit = token_ns > UINT64_MAX / 2 ? UINT64_MAX / g.launch_cost_ns
                                             : (token_ns + g.launch_cost_ns / 2) / g.launch_cost_ns;
    return fit < 1 ? 1 : fit > ULONG_MAX / 2 ? ULONG_MAX : (unsigned long)fit;
}

/* The current token is valid and may admit one more launch. */
static int token_admits(void)
{
    unsigned long budget = __atomic_load_n(&g_launch_budget, __ATOMIC_RELAXED);
    return fgs_quota_valid(&g.quota) && __atomic_load_n(&g_token_launches, __ATOMIC_RELAXED) < budget;
}

/* Launches that passed the gate and have not returned from the driver yet belong to the token
 * they passed under: wait for them (on a real GPU a launch returns once queued, on the fake when
 * its kernel has run) before the token is returned, so none starts after it. */
static void wait_in_flight_locked(void)
{
    const struct timespec poll = {.tv_sec = 0, .tv_nsec = 100 * 1000};
    while (__atomic_load_n(&g_in_flight, __ATOMIC_SEQ_CST) > 0)
        nanosleep(&poll, NULL);
}

/* The expired token's work is done (synchronised, or not asked to be): settled once per token,
 * by the watcher at the token's end or by the renewal that comes first. */
static void settle_locked(uint64_t waited_ns)
{
    if (g.settled_tokens == g.granted_tokens)
        return;
    wait_in_flight_locked();
    uint64_t waited = 0;
    if (fgs_quota_active(&g.quota)) {
        if (g.cfg->sync_at_token_end)
            waited = sync_before_return_locked(waited_ns);
        else
            fgs_quota_note_until_token_end(&g.quota); /* queued work ran on after its launches */
    }
    learn_launch_cost_locked(waited);
    g.settled_tokens = g.granted_tokens;
}

/* The watcher: settles each token when it expires, on its own thread, in the context the token
 * was granted in. Holds the gate lock while it settles, as a renewal does. */
static void *watcher_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&g.lock);
    for (;;) {
        uint64_t deadline = __atomic_load_n(&g.quota.deadline_ns, __ATOMIC_ACQUIRE);
        if (!fgs_quota_granted(&g.quota) || g.settled_tokens == g.granted_tokens) {
            pthread_cond_wait(&g.granted, &g.lock);
        } else if (fgs_quota_valid(&g.quota)) {
            struct timespec until = {.tv_sec = (time_t)(deadline / 1000000000u),
                                     .tv_nsec = (long)(deadline % 1000000000u)};
            pthread_cond_timedwait(&g.granted, &g.lock, &until);
        } else {
            if (g.ctx_set != NULL && g.token_ctx != NULL)
                g.ctx_set(g.token_ctx);
            settle_locked(FGS_SYNC_WAITED_AT_END_NS);
        }
    }
    return NULL;
}

/* The real driver's cuCtxGetCurrent and cuCtxSetCurrent, through its own resolver (not rows of the
 * hook: it never wraps them). */
static void *real_driver_function(const char *base, int version)
{
    void *fn = NULL;
    if (fgs_real.cuGetProcAddress_v2 == NULL ||
        fgs_real.cuGetProcAddress_v2(base, &fn, version, CU_GET_PROC_ADDRESS_DEFAULT, NULL) != CUDA_SUCCESS)
        return NULL;
    return fn;
}

static void load_context_functions_locked(void)
{
    if (g.ctx_get == NULL)
        g.ctx_get = (PFN_cuCtxGetCurrent_v4000)real_driver_function("cuCtxGetCurrent", 4000);
    if (g.ctx_set == NULL)
        g.ctx_set = (PFN_cuCtxSetCurrent_v4000)real_driver_function("cuCtxSetCurrent", 4000);
}

/* With sync at token end, the first grant starts the watcher (every signal blocked, detached).
 * Without it (no context functions, no thread), renewals settle tokens as before. */
static void start_watcher_locked(void)
{
    if (g.watcher_started || !g.cfg->sync_at_token_end)
        return;
    load_context_functions_locked();
    if (g.ctx_get == NULL || g.ctx_set == NULL)
        return;
    g.watcher_started = 1;
    sigset_t all, old;
    sigfillset(&all);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t thread;
    if (pthread_create(&thread, &attr, watcher_main, NULL) != 0) {
        g.watcher_started = 0;
        FGS_DEBUG("cannot start the token-end watcher; renewals settle tokens");
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
}

/* A new token: its number, its context (for the watcher), and the watcher woken to wait for its end. */
static void granted_locked(uint64_t token_ns)
{
    /* Before the deadline is published: a fast-path launch that sees it sees these too. */
    __atomic_store_n(&g_token_launches, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&g_launch_budget, launch_budget(token_ns), __ATOMIC_RELAXED);
    fgs_quota_grant(&g.quota, token_ns);
    g.granted_tokens++;
    start_watcher_locked();
    if (g.watcher_started) {
        CUcontext ctx = NULL;
        if (g.ctx_get(&ctx) == CUDA_SUCCESS && ctx != NULL)
            g.token_ctx = ctx;
        pthread_cond_signal(&g.granted);
    }
}

static CUresult renew_locked(void)
{
    if (token_admits())
        return CUDA_SUCCESS; /* another thread renewed it while this one waited for the lock */
    if (g.link == LINK_FAILED)
        return FGS_GATE_REFUSED;
    char err[320];
    if (g.link == LINK_UNCONNECTED && connect_locked(err, sizeof err) != 0)
        return fail_locked(err);
    settle_locked(FGS_SYNC_WAITED_NS);
    uint64_t used_ns = fgs_quota_used_ns(&g.quota), token_ns;
    /* A lost link is reconnected (a few times: the arbiter may restart again meanwhile). */
    for (int attempt = 0; fgs_client_token(&g.client, used_ns, &token_ns, err, sizeof err) != 0; attempt++) {
        if (g.client.refused || g.cfg->reconnect_ms <= 0 || attempt >= 3 || reconnect_locked(err, sizeof err) != 0)
            return fail_locked(err);
        used_ns = 0; /* the new arbiter never granted the old token */
    }
    /* The reply itself grants the launch that asked, even for a 0 ns token. */
    granted_locked(token_ns);
    FGS_DEBUG("returned a token after %llu ns; granted %llu ns", (unsigned long long)used_ns,
              (unsigned long long)token_ns);
    return CUDA_SUCCESS;
}

static CUresult renew(void)
{
    fgs_init();
    int loaded = fgs_load_real();
    pthread_mutex_lock(&g.lock);
    CUresult r = loaded == 0 ? renew_locked() : fail_locked("the real CUDA driver could not be loaded");
    if (r == CUDA_SUCCESS) { /* in flight before the lock goes: the next renewal waits for this launch */
        __atomic_add_fetch(&g_in_flight, 1, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&g_token_launches, 1, __ATOMIC_RELAXED);
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUresult fgs_gate_enter(void)
{
    /* Counted in flight BEFORE the validity check: a renewal that finds the token expired (after
     * this check passed) then sees the count and waits for this launch. */
    __atomic_add_fetch(&g_in_flight, 1, __ATOMIC_SEQ_CST);
    if (fgs_quota_valid(&g.quota) && __atomic_add_fetch(&g_token_launches, 1, __ATOMIC_RELAXED) <=
                                         __atomic_load_n(&g_launch_budget, __ATOMIC_RELAXED))
        return CUDA_SUCCESS;
    __atomic_sub_fetch(&g_in_flight, 1, __ATOMIC_SEQ_CST);
    return renew();
}

void fgs_gate_leave(void)
{
    fgs_quota_note_activity(&g.quota);
    __atomic_sub_fetch(&g_in_flight, 1, __ATOMIC_SEQ_CST);
}

void fgs_gate_after_fork_child(void)
{
    /* Only the forking thread exists in the child; the lock may have been held by another. */
    pthread_mutex_init(&g.lock, NULL);
    fgs_client_close(&g.client); /* the parent's connection stays the parent's */
    fgs_quota_reset(&g.quota);
    g.link = LINK_UNCONNECTED;
    g.failure_reported = 0;
    g_in_flight = 0; /* the parent's other threads' launches are not the child's */
    init_granted_cond();
    g.watcher_started = 0; /* the parent's watcher is not the child's; a grant starts one */
    g.granted_tokens = g.settled_tokens = 0;
    g.token_ctx = NULL;
    g.launch_cost_ns = 0;
    g_token_launches = 0;
    g_launch_budget = ULONG_MAX;
}
