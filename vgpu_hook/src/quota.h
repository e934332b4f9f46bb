/*
 * quota.h: the time token a process holds, and what it reports when it gives the token back.
 * Pure bookkeeping: no CUDA, no I/O; the clock is injected (tests/test_quota.c drives it).
 *
 * A token granted at g for t ns is valid while g <= now < g + t. Every gated launch notes
 * when it returned (fgs_quota_note_activity; after the real call, so a synchronous launch's
 * end), and so does the token-end sync of FASTGSHARE_SYNC_AT_TOKEN_END when it really waited
 * for the token's work (gate.c). When the token is returned the process reports
 * used_ns = (last activity - g), at most now - g: a launch that ran past the token's end is
 * charged in full (the arbiter counts the overrun against the pod's limit), and the time after
 * the last activity (a token left idle, however long the pod then idled) is credited back.
 *
 * Thread safety: fgs_quota_valid may run on any thread without a lock (one clock read, one
 * atomic acquire load; a grant publishes with release). Every other call must be serialised
 * by the caller (gate.c holds its lock).
 */
#ifndef FASTGSHARE_HOOK_QUOTA_H
#define FASTGSHARE_HOOK_QUOTA_H

#include <stdbool.h>
#include <stdint.h>

typedef uint64_t (*fgs_clock_fn)(void *ctx); /* monotonic nanoseconds */

struct fgs_quota {
    fgs_clock_fn clock;
    void *clock_ctx;
    uint64_t deadline_ns; /* atomic: grant_ns + token_ns (saturating); 0 = no token */
    uint64_t grant_ns;
    uint64_t token_ns;
    bool granted; /* a token was granted since init/reset (so there is one to return) */
    uint64_t active_until_ns; /* atomic: when the last gated launch (or sync) returned; 0 = never */
};

/* CLOCK_MONOTONIC (vDSO, no syscall); ctx is unused. */
uint64_t fgs_clock_monotonic(void *ctx);

void fgs_quota_init(struct fgs_quota *q, fgs_clock_fn clock, void *clock_ctx);

/* The current token is still valid. Lock-free. */
bool fgs_quota_valid(const struct fgs_quota *q);

/* A token was granted since init or the last reset. */
bool fgs_quota_granted(const struct fgs_quota *q);

/* A launch (or a sync) under the current token returned now. Lock-free, any thread. */
void fgs_quota_note_activity(struct fgs_quota *q);

/* The token's work may have run until now, but not past the token's end: notes activity at
 * min(now, grant + token_ns) (kept if a later one was noted). For the token-end sync that found
 * nothing left to wait for: on a real GPU the token's kernels ran after their launches returned,
 * at most until the token ended (else the sync would have waited); the idle time after the token
 * is not charged. Caller-serialised. */
void fgs_quota_note_until_token_end(struct fgs_quota *q);

/* Something was launched under the current token. */
bool fgs_quota_active(const struct fgs_quota *q);

/* What to report when returning the current token: last activity - grant, at most now - grant;
 * 0 with no token or no activity under it. */
uint64_t fgs_quota_used_ns(const struct fgs_quota *q);

/* Starts a token of token_ns from now (a 0 ns token is granted but never valid). */
void fgs_quota_grant(struct fgs_quota *q, uint64_t token_ns);

/* Drops the token (connection lost, fork): nothing to report, nothing valid. */
void fgs_quota_reset(struct fgs_quota *q);

#endif
