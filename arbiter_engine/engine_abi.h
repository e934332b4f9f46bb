/*
 * engine_abi.h: the arbiter's native engine as Python sees it, and all of it: every function and
 * struct that device_plugin/arbiter/native.py calls through ctypes, with fixed-width types. The
 * engine's other header (grow.h) is internal, and the wire's byte order comes from
 * vgpu_hook/include/fastgshare_byteorder.h; the library exports nothing else.
 *
 * native.py mirrors this header (ABI_FUNCTIONS, ABI_STRUCTS, ABI_CONSTANTS) and
 * tests/unit/device_plugin/test_engine_abi.py holds the two together: names, argument and return
 * types, struct fields, sizes and offsets as the compiler lays them out, constants. Change both
 * together. The test reads this file with a small parser, so keep to its forms: `#define FGS_NAME
 * value`; `typedef struct name name;`; `typedef struct name { type field; ... } name;` (one field a
 * declaration); `enum name { FGS_A = 1, ... };`; `_Static_assert(...);`; `type name(type arg, ...);`.
 * Types: fixed-width integers, bool (one byte, asserted below), char, void, fgs_* typedefs, const
 * and pointers.
 *
 * Three parts, one file each: the scheduler of one GPU (policy.c), the usage meter (meter.c), and
 * the engine around them (engine.c), which owns the connections and the token hot path. Python
 * drives the engine; the scheduler and the meter are here for the tests, which hold them to their
 * Python specifications.
 */
#ifndef FGS_ARBITER_ENGINE_ABI_H
#define FGS_ARBITER_ENGINE_ABI_H

#include <stdbool.h>
#include <stdint.h>

_Static_assert(sizeof(bool) == 1, "bool crosses the ABI as one byte (ctypes.c_bool)");

/* --- values ----------------------------------------------------------------------------------- */

#define FGS_NO_TIME INT64_MIN /* "none": no wake-up, no token held */
#define FGS_MAX_WAIT_BUCKETS 32
#define FGS_MAX_POD_NAME 320 /* namespace (63) + "/" + name (253), with room */

/* A pod's time share, as fastgshare/arbitration.py's TimeShare (which validates it): the share it
 * is promised and the most it may use, in thousandths of the GPU's time, and its SM percentage. */
typedef struct fgs_share {
    int32_t request_permille;
    int32_t limit_permille;
    int32_t sm_percent;
} fgs_share;

typedef struct fgs_grant {
    uint32_t client;
    int64_t token_ns;
} fgs_grant;

enum fgs_event_kind {
    FGS_EVENT_ACCEPTED = 1, /* a new connection; pid is the peer's (SO_PEERCRED), 0 if unknown */
    FGS_EVENT_FRAME = 2,    /* one whole frame, header included, for Python */
    FGS_EVENT_BAD = 3,      /* bytes that cannot be framed (a bad length); the engine reads no more of them */
    FGS_EVENT_CLOSED = 4,   /* the peer closed the connection; the engine has given its token back */
};

typedef struct fgs_event {
    uint64_t connection;
    int32_t kind; /* enum fgs_event_kind */
    int32_t pid;
    uint32_t length; /* bytes copied into the caller's buffer */
} fgs_event;

typedef struct fgs_pod_usage {
    int32_t gpu;
    char pod[FGS_MAX_POD_NAME];
    int64_t in_window_ns; /* use inside the window: the share is this over the window, at most 1 */
    int64_t used_ns_total;
    int64_t throttled_ns_total;
    int64_t wait_sum_ns;
    int64_t wait_counts[FGS_MAX_WAIT_BUCKETS + 1]; /* per bucket, not cumulative; then +Inf */
} fgs_pod_usage;

typedef struct fgs_policy fgs_policy;
typedef struct fgs_meter fgs_meter;
typedef struct fgs_pod_meter fgs_pod_meter;
typedef struct fgs_engine fgs_engine;

/* --- the token scheduler of one GPU (policy.c) -------------------------------------------------
 *
 * The rules, the integer arithmetic and the order of every decision are those of
 * fastgshare/arbitration.py's GpuArbiter, which stays the specification: the tests drive both
 * with the same operations and compare every grant, token and wake-up time
 * (tests/unit/device_plugin/test_native_policy.py). A change to the rules is made there first.
 *
 * Clients are small integers chosen by the caller (dense: the table is an array indexed by
 * them), so the hot path has no hashing. Time is nanoseconds from any monotonic origin.
 */

/* NULL on bad arguments (window_ns <= 0, min_token_ns outside 1..window_ns) or no memory. */
fgs_policy *fgs_policy_new(int64_t window_ns, int64_t min_token_ns, bool mps_enabled);
void fgs_policy_free(fgs_policy *policy);

/* 0 on success; -1: already registered (add) or unknown (the others); -2: no memory. */
int32_t fgs_policy_add(fgs_policy *policy, uint32_t client, fgs_share share);
int32_t fgs_policy_set_share(fgs_policy *policy, uint32_t client, fgs_share share);
int32_t fgs_policy_get_share(const fgs_policy *policy, uint32_t client, fgs_share *share);
void fgs_policy_remove(fgs_policy *policy, uint32_t client);
int32_t fgs_policy_request(fgs_policy *policy, uint32_t client, int64_t now_ns, int64_t used_ns);
int32_t fgs_policy_release(fgs_policy *policy, uint32_t client, int64_t now_ns, int64_t used_ns);

/* 1 or 0; -1 for an unknown client. */
int32_t fgs_policy_is_waiting(const fgs_policy *policy, uint32_t client);
/* The end of the client's token, FGS_NO_TIME if it holds none (or is unknown). */
int64_t fgs_policy_holding_until(const fgs_policy *policy, uint32_t client);
/* Time the client's grants overlap the window ending at now_ns; -1 for an unknown client. */
int64_t fgs_policy_usage(fgs_policy *policy, uint32_t client, int64_t now_ns);
bool fgs_policy_anyone_waiting(const fgs_policy *policy);

/* Grants what the rules allow at now_ns. Returns the number of grants, which stay valid until
 * the next call (in *grants); *wake_at_ns is when to look again, or FGS_NO_TIME. -2: no memory. */
int32_t fgs_policy_schedule(fgs_policy *policy, int64_t now_ns, const fgs_grant **grants, int64_t *wake_at_ns);

/* --- what each pod really got (meter.c) --------------------------------------------------------
 *
 * fastgshare/usage.py's UsageMeter in C, fed by the engine on its hot path (asked, granted, used)
 * and read by a snapshot. The same definitions as the Python meter (the specification; the tests
 * feed both the same events): achieved share over a sliding window, token waits in buckets,
 * throttled waits, and each GPU's busy share. One difference, so that a pod renewing every few
 * microseconds costs bounded memory: uses that end within the same millisecond are kept as one, so
 * a use that straddles the window's start may count up to 1 ms more or less (1e-4 of a 10 s
 * window), for uses that do not overlap, as a pod's do while it reports no more than the time it
 * held its token. A use reported longer than 2^61 ns counts as that long, and totals saturate: no
 * report overflows.
 */

/* What a returned token is charged: at least the time it was held (grant to now, at most the
 * token: a holder that returns it late held it until it expired), and the client's report only
 * where it is more (an overrun: work that ran past the token's end), clamped to the time since the
 * grant. Never negative, never more than now - granted_at (0 for a clock that went back). */
int64_t fgs_token_charge(int64_t granted_at_ns, int64_t token_ns, int64_t now_ns, uint64_t reported_ns);

/* bounds_ns: the wait buckets' upper bounds, ascending (at most FGS_MAX_WAIT_BUCKETS). */
fgs_meter *fgs_meter_new(int64_t window_ns, const int64_t *bounds_ns, int32_t buckets, int32_t gpus);
void fgs_meter_free(fgs_meter *meter);

/* The pod's first process connected on the GPU: its meter (the one it had, if it has not faded). */
fgs_pod_meter *fgs_meter_join(fgs_meter *meter, int32_t gpu, const char *pod);
void fgs_meter_leave(fgs_pod_meter *pod);
void fgs_meter_asked(fgs_pod_meter *pod, int64_t now_ns, bool at_limit);
void fgs_meter_granted(const fgs_meter *meter, fgs_pod_meter *pod, int64_t now_ns);
void fgs_meter_used(fgs_meter *meter, fgs_pod_meter *pod, int64_t start_ns, int64_t used_ns);

/* Shares over the window ending now_ns; forgets pods that left and whose use has left the window.
 * Returns the number of pods (their usage in *pods, valid until the next call) or -1 (no memory);
 * busy_ns[gpu] gets the time a pod of the GPU used it in the window, -1 for a GPU never joined. */
int32_t fgs_meter_snapshot(fgs_meter *meter, int64_t now_ns, const fgs_pod_usage **pods, int64_t *busy_ns);

/* --- the engine (engine.c) ---------------------------------------------------------------------
 *
 * Its connections and its token hot path, on a thread of its own (device_plugin/arbiter/server.py
 * drives it). The engine accepts on the arbiter's listening socket and owns every connection: it
 * reads and frames what hooks send, and answers the renewal every hook sends, TOKEN on a
 * registered connection, itself: the pod's queue of connections, the GPU's scheduler, the usage
 * meter, the reply, and the wake-up timer, without Python; and every PING. A returned token is
 * charged at least the time it was held (fgs_token_charge). Everything else (a new connection and
 * its peer, every other frame, a connection the peer closed) becomes an event for Python, which
 * decides identity, memory and errors as before and answers through fgs_engine_send, registers a
 * connection after its HELLO (fgs_engine_register) and closes connections (fgs_engine_close).
 * Events wait in one queue per peer (fgs_engine_set_group), taken in turn, so one pod's flood
 * cannot delay another pod's requests; the engine writes to an eventfd when the queues stop being
 * empty.
 *
 * One mutex guards the engine: its thread holds it while it handles what epoll reported, and
 * every call below takes it, so the calls may come from any thread.
 */

/* listen_fd: a listening unix socket (the caller keeps it and closes it after fgs_engine_free).
 * mps[i]: whether GPU i runs MPS. wait_bounds_ns: the meter's wait buckets. NULL on bad
 * arguments or no memory. */
fgs_engine *fgs_engine_new(int32_t listen_fd, int32_t gpus, const uint8_t *mps, int64_t window_ns,
                           int64_t min_token_ns, int64_t meter_window_ns, const int64_t *wait_bounds_ns,
                           int32_t buckets);
/* Start the engine's thread: 0, or an errno. */
int32_t fgs_engine_start(fgs_engine *engine);
/* Stop the thread and close every connection, without events; the calls below then do nothing. */
void fgs_engine_stop(fgs_engine *engine);
void fgs_engine_free(fgs_engine *engine);

/* Readable while events wait; read it (8 bytes) before taking them. */
int32_t fgs_engine_event_fd(const fgs_engine *engine);
/* The next event, its bytes into buffer (capacity >= 2 * FGS_MAX_FRAME): 1, or 0 if none. */
int32_t fgs_engine_next_event(fgs_engine *engine, fgs_event *event, uint8_t *buffer, uint32_t capacity);

/* Whose the connection is, for fairness: Python's number (1..2^20) for its peer (a pod, or a
 * process outside pods). The engine reads a new connection only once it has one; the events of
 * each group wait in a queue of their own, and fgs_engine_next_event takes one from each group in
 * turn. 0; -1: gone; -2: no memory; -3: a bad number. */
int32_t fgs_engine_set_group(fgs_engine *engine, uint64_t connection, uint32_t group);
/* The liveness probe's private connection (one end of a socketpair; the engine owns fd from now
 * on, also on failure): the engine answers its PINGs itself, with a u64 payload saying for how
 * many ns Python has not taken an event while events waited (0 while it keeps up); anything
 * else closes it. No events. 0, or -1. */
int32_t fgs_engine_add_probe(fgs_engine *engine, int32_t fd);

/* 0, or -1 for a connection that is gone (or a stopped engine). */
int32_t fgs_engine_send(fgs_engine *engine, uint64_t connection, const uint8_t *data, uint32_t length);
/* Close after what was sent has left; a registered connection gives its token back at once. */
int32_t fgs_engine_close(fgs_engine *engine, uint64_t connection);
/* After its HELLO: the connection belongs to the pod on the GPU, with this share if the pod is
 * new to the GPU's scheduler. 0; -1: gone; -2: no memory; -3: a bad GPU index, a pod name of
 * FGS_MAX_POD_NAME bytes or more, or an already registered connection. */
int32_t fgs_engine_register(fgs_engine *engine, uint64_t connection, int32_t gpu, const char *pod, fgs_share share);
/* A TOKEN request Python received (it arrived before the connection was registered). */
int32_t fgs_engine_token(fgs_engine *engine, uint64_t connection, uint32_t request_id, uint64_t used_ns);
/* A connected pod's share changed: 1 if it differs from what the scheduler had, 0 if not, -1 if the
 * pod has no connection on the GPU. */
int32_t fgs_engine_set_share(fgs_engine *engine, int32_t gpu, const char *pod, fgs_share share);
/* The meter's snapshot now (see fgs_meter_snapshot); busy_ns has one entry per GPU. */
int32_t fgs_engine_snapshot(fgs_engine *engine, const fgs_pod_usage **pods, int64_t *busy_ns, int64_t *now_ns);

#endif
