/*
 * policy.h: the token scheduler of one GPU, in C, for the arbiter's native engine (engine.c).
 *
 * The rules, the integer arithmetic and the order of every decision are those of
 * fastgshare/arbitration.py's GpuArbiter, which stays the specification: the tests drive both
 * with the same operations and compare every grant, token and wake-up time
 * (tests/unit/device_plugin/test_native_policy.py). A change to the rules is made there first.
 *
 * Clients are small integers chosen by the caller (dense: the table is an array indexed by
 * them), so the hot path has no hashing. Time is nanoseconds from any monotonic origin.
 */
#ifndef FGS_ARBITER_POLICY_H
#define FGS_ARBITER_POLICY_H

#include <stdbool.h>
#include <stdint.h>

#define FGS_NO_TIME INT64_MIN /* "none": no wake-up, no token held */

typedef struct fgs_share {
    int32_t request_permille;
    int32_t limit_permille;
    int32_t sm_percent;
} fgs_share;

typedef struct fgs_grant {
    uint32_t client;
    int64_t token_ns;
} fgs_grant;

typedef struct fgs_policy fgs_policy;

/* NULL on bad arguments (window_ns <= 0, min_token_ns outside 1..window_ns) or no memory. */
fgs_policy *fgs_policy_new(int64_t window_ns, int64_t min_token_ns, bool mps_enabled);
void fgs_policy_free(fgs_policy *policy);

/* 0 on success; -1: already registered (add) or unknown (the others); -2: no memory. */
int fgs_policy_add(fgs_policy *policy, uint32_t client, fgs_share share);
int fgs_policy_set_share(fgs_policy *policy, uint32_t client, fgs_share share);
int fgs_policy_get_share(const fgs_policy *policy, uint32_t client, fgs_share *share);
void fgs_policy_remove(fgs_policy *policy, uint32_t client);
int fgs_policy_request(fgs_policy *policy, uint32_t client, int64_t now_ns, int64_t used_ns);
int fgs_policy_release(fgs_policy *policy, uint32_t client, int64_t now_ns, int64_t used_ns);

/* 1 or 0; -1 for an unknown client. */
int fgs_policy_is_waiting(const fgs_policy *policy, uint32_t client);
/* The end of the client's token, FGS_NO_TIME if it holds none (or is unknown). */
int64_t fgs_policy_holding_until(const fgs_policy *policy, uint32_t client);
/* Time the client's grants overlap the window ending at now_ns; -1 for an unknown client. */
int64_t fgs_policy_usage(fgs_policy *policy, uint32_t client, int64_t now_ns);
bool fgs_policy_anyone_waiting(const fgs_policy *policy);

/* Grants what the rules allow at now_ns. Returns the number of grants, which stay valid until
 * the next call (in *grants); *wake_at_ns is when to look again, or FGS_NO_TIME. -2: no memory. */
int fgs_policy_schedule(fgs_policy *policy, int64_t now_ns, const fgs_grant **grants, int64_t *wake_at_ns);

#endif
