/*
 * meter.h: what each pod really got, for the metrics: fastgshare/usage.py's UsageMeter in C,
 * fed by the native engine on its hot path (asked, granted, used) and read by a snapshot.
 *
 * The same definitions as the Python meter (the specification; the tests feed both the same
 * events): achieved share over a sliding window, token waits in buckets, throttled waits, and
 * each GPU's busy share. One difference, so that a pod renewing every few microseconds costs
 * bounded memory: uses that end within the same millisecond are kept as one, so a use that
 * straddles the window's start may count up to 1 ms more or less (1e-4 of a 10 s window), for uses
 * that do not overlap, as a pod's do while it reports no more than the time it held its token. A
 * use reported longer than 2^61 ns counts as that long, and totals saturate: no report overflows.
 */
#ifndef FGS_ARBITER_METER_H
#define FGS_ARBITER_METER_H

#include <stdbool.h>
#include <stdint.h>

#define FGS_MAX_WAIT_BUCKETS 32
#define FGS_MAX_POD_NAME 320 /* namespace (63) + "/" + name (253), with room */

typedef struct fgs_meter fgs_meter;
typedef struct fgs_pod_meter fgs_pod_meter;

typedef struct fgs_pod_usage {
    int32_t gpu;
    char pod[FGS_MAX_POD_NAME];
    int64_t in_window_ns; /* use inside the window: the share is this over the window, at most 1 */
    int64_t used_ns_total;
    int64_t throttled_ns_total;
    int64_t wait_sum_ns;
    int64_t wait_counts[FGS_MAX_WAIT_BUCKETS + 1]; /* per bucket, not cumulative; then +Inf */
} fgs_pod_usage;

/* What a returned token is charged: at least the time it was held (grant to now, at most the
 * token: a holder that returns it late held it until it expired), and the client's report only
 * where it is more (an overrun: work that ran past the token's end), clamped to the time since the
 * grant. Never negative, never more than now - granted_at (0 for a clock that went back). */
int64_t fgs_token_charge(int64_t granted_at_ns, int64_t token_ns, int64_t now_ns, uint64_t reported_ns);

/* bounds_ns: the wait buckets' upper bounds, ascending (at most FGS_MAX_WAIT_BUCKETS). */
fgs_meter *fgs_meter_new(int64_t window_ns, const int64_t *bounds_ns, int buckets, int gpus);
void fgs_meter_free(fgs_meter *meter);

/* The pod's first process connected on the GPU: its meter (the one it had, if it has not faded). */
fgs_pod_meter *fgs_meter_join(fgs_meter *meter, int gpu, const char *pod);
void fgs_meter_leave(fgs_pod_meter *pod);
void fgs_meter_asked(fgs_pod_meter *pod, int64_t now_ns, bool at_limit);
void fgs_meter_granted(const fgs_meter *meter, fgs_pod_meter *pod, int64_t now_ns);
void fgs_meter_used(fgs_meter *meter, fgs_pod_meter *pod, int64_t start_ns, int64_t used_ns);

/* Shares over the window ending now_ns; forgets pods that left and whose use has left the window.
 * Returns the number of pods (their usage in *pods, valid until the next call) or -1 (no memory);
 * busy_ns[gpu] gets the time a pod of the GPU used it in the window, -1 for a GPU never joined. */
int fgs_meter_snapshot(fgs_meter *meter, int64_t now_ns, const fgs_pod_usage **pods, int64_t *busy_ns);

#endif
