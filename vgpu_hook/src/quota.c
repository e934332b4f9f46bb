/* quota.c: the time-token bookkeeping (see quota.h). No CUDA, no I/O. */
#define _GNU_SOURCE
#include "quota.h"

#include <time.h>

uint64_t fgs_clock_monotonic(void *ctx)
{
    (void)ctx;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * UINT64_C(1000000000) + (uint64_t)ts.tv_nsec;
}

void fgs_quota_init(struct fgs_quota *q, fgs_clock_fn clock, void *clock_ctx)
{
    q->clock = clock;
    q->clock_ctx = clock_ctx;
    fgs_quota_reset(q);
}

bool fgs_quota_valid(const struct fgs_quota *q)
{
    uint64_t deadline = __atomic_load_n(&q->deadline_ns, __ATOMIC_ACQUIRE);
    return deadline != 0 && q->clock(q->clock_ctx) < deadline;
}

bool fgs_quota_granted(const struct fgs_quota *q)
{
    return q->granted;
}

void fgs_quota_note_activity(struct fgs_quota *q)
{
    uint64_t now = q->clock(q->clock_ctx);
    uint64_t seen = __atomic_load_n(&q->active_until_ns, __ATOMIC_RELAXED);
    while (seen < now &&
           !__atomic_compare_exchange_n(&q->active_until_ns, &seen, now, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ; /* another thread noted a time: keep the later one */
}

void fgs_quota_note_until_token_end(struct fgs_quota *q)
{
    if (!q->granted)
        return;
    uint64_t now = q->clock(q->clock_ctx);
    uint64_t end = q->grant_ns + q->token_ns;
    if (end < q->grant_ns || end > now) /* saturated, or the token has not ended yet */
        end = now;
    uint64_t seen = __atomic_load_n(&q->active_until_ns, __ATOMIC_RELAXED);
    while (seen < end &&
           !__atomic_compare_exchange_n(&q->active_until_ns, &seen, end, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

bool fgs_quota_active(const struct fgs_quota *q)
{
    return q->granted && __atomic_load_n(&q->active_until_ns, __ATOMIC_RELAXED) > q->grant_ns;
}

uint64_t fgs_quota_used_ns(const struct fgs_quota *q)
{
    if (!fgs_quota_active(q))
        return 0;
    uint64_t now = q->clock(q->clock_ctx);
    uint64_t active = __atomic_load_n(&q->active_until_ns, __ATOMIC_RELAXED);
    uint64_t end = active < now ? active : now;
    return end - q->grant_ns;
}

void fgs_quota_grant(struct fgs_quota *q, uint64_t token_ns)
{
    uint64_t now = q->clock(q->clock_ctx);
    uint64_t deadline = token_ns > UINT64_MAX - now ? UINT64_MAX : now + token_ns;
    q->grant_ns = now;
    q->token_ns = token_ns;
    q->granted = true;
    __atomic_store_n(&q->deadline_ns, token_ns == 0 ? 0 : deadline, __ATOMIC_RELEASE);
}

void fgs_quota_reset(struct fgs_quota *q)
{
    __atomic_store_n(&q->deadline_ns, 0, __ATOMIC_RELEASE);
    __atomic_store_n(&q->active_until_ns, 0, __ATOMIC_RELAXED);
    q->grant_ns = 0;
    q->token_ns = 0;
    q->granted = false;
}
