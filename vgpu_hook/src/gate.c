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
 * A lost connection (the node agent restarts: the socket closes, or the arbiter stops
 * answering) is not a failure yet: the gate reconnects and says HELLO again with backoff for up
 * to FASTGSHARE_HOOK_RECONNECT_S (default 30 s), launches waiting meanwhile, then asks for a
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

#include <pthread.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>

/* A token-end cuCtxSynchronize that took this long waited for GPU work (one that finds nothing to
 * wait for returns in microseconds). */
#define FGS_SYNC_WAITED_NS UINT64_C(500000)

enum link_state { LINK_UNCONNECTED, LINK_CONNECTED, LINK_FAILED };

static struct {
    pthread_mutex_t lock;
    const struct fgs_config *cfg; /* set once by fgs_gate_configure */
    enum link_state link;
    struct fgs_client client;
    struct fgs_quota quota;
    int failure_reported;
} g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .link = LINK_UNCONNECTED,
    .client = {.fd = -1},
    .quota = {.clock = fgs_clock_monotonic},
};

/* Launches that passed the gate and have not returned from the driver (atomic). */
static unsigned long g_in_flight;

void fgs_gate_configure(const struct fgs_config *cfg)
{
    pthread_mutex_lock(&g.lock);
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
static void sync_before_return_locked(void)
{
    if (fgs_real.cuCtxSynchronize == NULL)
        return;
    uint64_t before = fgs_clock_monotonic(NULL);
    CUresult r = fgs_real.cuCtxSynchronize();
    if (r != CUDA_SUCCESS)
        FGS_DEBUG("cuCtxSynchronize before returning the token failed with %d", (int)r);
    else if (fgs_clock_monotonic(NULL) - before >= FGS_SYNC_WAITED_NS)
        fgs_quota_note_activity(&g.quota); /* the token's work ran until now */
    else
        fgs_quota_note_until_token_end(&g.quota); /* it ran within the token, at most to its end */
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

static CUresult renew_locked(void)
{
    if (fgs_quota_valid(&g.quota))
        return CUDA_SUCCESS; /* another thread renewed it while this one waited for the lock */
    if (g.link == LINK_FAILED)
        return FGS_GATE_REFUSED;
    char err[320];
    if (g.link == LINK_UNCONNECTED && connect_locked(err, sizeof err) != 0)
        return fail_locked(err);
    wait_in_flight_locked();
    if (g.cfg->sync_at_token_end && fgs_quota_active(&g.quota))
        sync_before_return_locked();
    uint64_t used_ns = fgs_quota_used_ns(&g.quota), token_ns;
    /* A lost link is reconnected (a few times: the arbiter may restart again meanwhile). */
    for (int attempt = 0; fgs_client_token(&g.client, used_ns, &token_ns, err, sizeof err) != 0; attempt++) {
        if (g.client.refused || g.cfg->reconnect_ms <= 0 || attempt >= 3 || reconnect_locked(err, sizeof err) != 0)
            return fail_locked(err);
        used_ns = 0; /* the new arbiter never granted the old token */
    }
    /* The reply itself grants the launch that asked, even for a 0 ns token. */
    fgs_quota_grant(&g.quota, token_ns);
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
    if (r == CUDA_SUCCESS) /* in flight before the lock goes: the next renewal waits for this launch */
        __atomic_add_fetch(&g_in_flight, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&g.lock);
    return r;
}

CUresult fgs_gate_enter(void)
{
    /* Counted in flight BEFORE the validity check: a renewal that finds the token expired (after
     * this check passed) then sees the count and waits for this launch. */
    __atomic_add_fetch(&g_in_flight, 1, __ATOMIC_SEQ_CST);
    if (fgs_quota_valid(&g.quota))
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
}
