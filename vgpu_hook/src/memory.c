/*
 * memory.c: the memory connection to the arbiter (see memory.h). Owns that connection and its
 * state; the allocation table lives in memory_hooks.c.
 *
 * Locking: `lock` guards everything below and is held across one request/reply round trip, so
 * concurrent allocating threads take turns on the one connection (the arbiter answers memory
 * requests at once, never after a wait). Nothing else is locked while it is held.
 *
 * Restarts: `held` is what this process holds reserved (reservations granted minus releases).
 * When the registered connection is lost (the node agent restarts), a reservation or ledger
 * read reconnects with backoff for up to FASTGSHARE_HOOK_RECONNECT_S, says HELLO, reports `held`
 * (MEM_RESTORE: the new arbiter loaded the same from its saved ledger and now hands it to this
 * connection), then retries the request. A release while the link is lost only lowers `held`
 * (frees never wait for the arbiter); the next reservation reconnects.
 */
#define _GNU_SOURCE
#include "memory.h"

#include "arbiter_client.h"
#include "log.h"

#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

enum link_state { LINK_UNCONNECTED, LINK_CONNECTED, LINK_LOST, LINK_FAILED };

static struct {
    pthread_mutex_t lock;
    const struct fgs_config *cfg; /* set once by fgs_memory_configure */
    enum link_state link;
    struct fgs_client client;
    uint64_t held; /* bytes this process holds reserved in the pod's ledger */
    int failure_reported;
} m = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .link = LINK_UNCONNECTED,
    .client = {.fd = -1},
};

void fgs_memory_configure(const struct fgs_config *cfg)
{
    pthread_mutex_lock(&m.lock);
    m.cfg = cfg;
    pthread_mutex_unlock(&m.lock);
}

static void fail_locked(const char *reason)
{
    m.link = LINK_FAILED;
    fgs_client_close(&m.client);
    if (!m.failure_reported) {
        m.failure_reported = 1;
        FGS_ERROR("%s; refusing GPU memory allocations of process %d (fail closed: CUDA_ERROR_NOT_PERMITTED)",
                  reason, (int)getpid());
    }
}

/* The registered link was lost (err says how): reconnect within the bound and report `held`.
 * 0 when connected again; -1 after fail_locked. */
static int reconnect_locked(const char *why)
{
    const struct fgs_config *cfg = m.cfg;
    char err[320];
    if (cfg->reconnect_ms <= 0) {
        fail_locked(why);
        return -1;
    }
    FGS_ERROR("lost the arbiter's memory link (%s); reconnecting for up to %d ms, GPU memory allocations of "
              "process %d wait", why, cfg->reconnect_ms, (int)getpid());
    struct fgs_hello_reply hello;
    uint64_t waited_ms = 0, used = 0;
    char last[320];
    if (fgs_client_reconnect(&m.client, cfg->socket_path, (uint32_t)getpid(), cfg->pod, cfg->gpu_uuid,
                             cfg->reconnect_ms, &hello, &waited_ms, last, sizeof last) != 0) {
        snprintf(err, sizeof err, "no arbiter within %d ms of losing it (last: %.200s)", cfg->reconnect_ms, last);
        fail_locked(err);
        return -1;
    }
    if (fgs_client_mem_restore(&m.client, m.held, &used, err, sizeof err) != 0) {
        fail_locked(err);
        return -1;
    }
    m.link = LINK_CONNECTED;
    FGS_ERROR("reconnected the memory link after %llu ms; this process holds %llu bytes, the pod %llu of %llu",
              (unsigned long long)waited_ms, (unsigned long long)m.held, (unsigned long long)used,
              (unsigned long long)hello.memory_limit_bytes);
    return 0;
}

/* A request failed with err: refusals fail closed; a lost link is reconnected. 0: retry it. */
static int recover_locked(const char *err)
{
    if (m.client.refused) {
        fail_locked(err);
        return -1;
    }
    return reconnect_locked(err);
}

/* 0 when connected (connecting and saying HELLO on first use); -1 after fail_locked. */
static int ready_locked(void)
{
    if (m.link == LINK_CONNECTED)
        return 0;
    if (m.link == LINK_FAILED)
        return -1;
    if (m.link == LINK_LOST)
        return reconnect_locked("a release could not reach it");
    char err[320];
    const struct fgs_config *cfg = m.cfg;
    if (cfg == NULL) {
        fail_locked("the hook was not initialised");
        return -1;
    }
    if (cfg->error[0] != '\0') {
        fail_locked(cfg->error);
        return -1;
    }
    fgs_client_init(&m.client, cfg->reply_timeout_ms);
    struct fgs_hello_reply hello;
    if (fgs_client_connect(&m.client, cfg->socket_path, err, sizeof err) != 0 ||
        fgs_client_hello(&m.client, (uint32_t)getpid(), cfg->pod, cfg->gpu_uuid, &hello, err, sizeof err) != 0) {
        fail_locked(err);
        return -1;
    }
    m.link = LINK_CONNECTED;
    FGS_INFO("memory connection to the arbiter at %s: the pod's limit is %llu bytes", cfg->socket_path,
             (unsigned long long)hello.memory_limit_bytes);
    return 0;
}

static void lock_initialised(void)
{
    fgs_init(); /* configuration first: a memory call may be the process's first hooked call */
    pthread_mutex_lock(&m.lock);
}

CUresult fgs_memory_reserve(uint64_t bytes, const char *what)
{
    if (bytes == 0)
        return CUDA_SUCCESS;
    lock_initialised();
    CUresult result = FGS_MEMORY_REFUSED;
    int granted = 0;
    uint64_t used = 0, limit = 0;
    char err[320];
    if (ready_locked() == 0) {
        int sent = fgs_client_mem_reserve(&m.client, bytes, &granted, &used, &limit, err, sizeof err);
        if (sent != 0 && recover_locked(err) == 0)
            sent = fgs_client_mem_reserve(&m.client, bytes, &granted, &used, &limit, err, sizeof err);
        if (sent != 0 && m.link != LINK_FAILED)
            fail_locked(err);
        else if (sent == 0) {
            result = granted ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
            if (granted)
                m.held += bytes;
        }
    }
    pthread_mutex_unlock(&m.lock);
    if (result == CUDA_SUCCESS)
        FGS_DEBUG("%s: reserved %llu bytes; the pod uses %llu of %llu", what, (unsigned long long)bytes,
                  (unsigned long long)used, (unsigned long long)limit);
    else if (result == CUDA_ERROR_OUT_OF_MEMORY)
        FGS_INFO("%s of %llu bytes refused: the pod uses %llu of its %llu bytes (CUDA_ERROR_OUT_OF_MEMORY)", what,
                 (unsigned long long)bytes, (unsigned long long)used, (unsigned long long)limit);
    return result;
}

void fgs_memory_release(uint64_t bytes, const char *what)
{
    if (bytes == 0)
        return;
    lock_initialised();
    uint64_t used = 0;
    char err[320];
    int released = 0;
    /* The process no longer has the memory, whether or not the arbiter hears of it now. */
    m.held -= bytes < m.held ? bytes : m.held;
    /* Never connect just to release: without a connection this process holds nothing, and after
     * a lost link the next reservation reports the lower `held`. */
    if (m.link == LINK_CONNECTED) {
        if (fgs_client_mem_release(&m.client, bytes, &used, err, sizeof err) == 0)
            released = 1;
        else if (m.client.refused || m.cfg->reconnect_ms <= 0)
            fail_locked(err);
        else {
            fgs_client_close(&m.client);
            m.link = LINK_LOST;
            FGS_INFO("a release of %llu bytes could not reach the arbiter (%s); reported when it is back",
                     (unsigned long long)bytes, err);
        }
    }
    pthread_mutex_unlock(&m.lock);
    if (released)
        FGS_DEBUG("%s: released %llu bytes; the pod uses %llu", what, (unsigned long long)bytes,
                  (unsigned long long)used);
}

CUresult fgs_memory_ledger(uint64_t *used, uint64_t *limit)
{
    lock_initialised();
    CUresult result = FGS_MEMORY_REFUSED;
    int granted = 0;
    char err[320];
    if (ready_locked() == 0) {
        int sent = fgs_client_mem_reserve(&m.client, 0, &granted, used, limit, err, sizeof err);
        if (sent != 0 && recover_locked(err) == 0)
            sent = fgs_client_mem_reserve(&m.client, 0, &granted, used, limit, err, sizeof err);
        if (sent != 0 && m.link != LINK_FAILED)
            fail_locked(err);
        else if (sent == 0)
            result = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&m.lock);
    return result;
}

void fgs_memory_relink(void)
{
    lock_initialised();
    char err[320];
    int granted = 0;
    uint64_t used = 0, limit = 0;
    if (m.link == LINK_LOST)
        reconnect_locked("a release could not reach it");
    else if (m.link == LINK_CONNECTED &&
             fgs_client_mem_reserve(&m.client, 0, &granted, &used, &limit, err, sizeof err) != 0)
        recover_locked(err);
    pthread_mutex_unlock(&m.lock);
}

void fgs_memory_after_fork_child(void)
{
    /* Only the forking thread exists in the child; the lock may have been held by another. */
    pthread_mutex_init(&m.lock, NULL);
    fgs_client_close(&m.client); /* the parent's reservations stay the parent's */
    m.link = LINK_UNCONNECTED;
    m.held = 0;
    m.failure_reported = 0;
}
