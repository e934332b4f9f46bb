/*
 * engine.h: the arbiter's native engine: its connections and its token hot path, on a thread of
 * its own (device_plugin/arbiter/native.py loads it with ctypes; device_plugin/arbiter/server.py
 * drives it).
 *
 * The engine accepts on the arbiter's listening socket and owns every connection: it reads and
 * frames what hooks send, and answers the renewal every hook sends, TOKEN on a registered
 * connection, itself: the pod's queue of connections, the GPU's scheduler (policy.h), the usage
 * meter (meter.h), the reply, and the wake-up timer, without Python; and every PING. A returned
 * token is charged at least the time it was held (fgs_token_charge). Everything else (a new
 * connection and its peer, every other frame, a connection the peer closed) becomes an event
 * for Python, which decides identity, memory and errors as before and answers through
 * fgs_engine_send, registers a connection after its HELLO (fgs_engine_register) and closes
 * connections (fgs_engine_close). Events wait in one queue per peer (fgs_engine_set_group), taken
 * in turn, so one pod's flood cannot delay another pod's requests; the engine writes to an eventfd
 * when the queues stop being empty.
 *
 * One mutex guards the engine: its thread holds it while it handles what epoll reported, and
 * every call below takes it, so the calls may come from any thread.
 */
#ifndef FGS_ARBITER_ENGINE_H
#define FGS_ARBITER_ENGINE_H

#include "meter.h"

#include <stdint.h>

typedef struct fgs_engine fgs_engine;

enum fgs_event_kind {
    FGS_EVENT_ACCEPTED = 1, /* a new connection; pid is the peer's (SO_PEERCRED), 0 if unknown */
    FGS_EVENT_FRAME = 2,    /* one whole frame, header included, for Python */
    FGS_EVENT_BAD = 3,      /* bytes that cannot be framed (a bad length); the engine reads no more of them */
    FGS_EVENT_CLOSED = 4,   /* the peer closed the connection; the engine has given its token back */
};

typedef struct fgs_event {
    uint64_t connection;
    int32_t kind;
    int32_t pid;
    uint32_t length; /* bytes copied into the caller's buffer */
} fgs_event;

/* listen_fd: a listening unix socket (the caller keeps it and closes it after fgs_engine_free).
 * mps[i]: whether GPU i runs MPS. wait_bounds_ns: the meter's wait buckets. NULL on bad
 * arguments or no memory. */
fgs_engine *fgs_engine_new(int listen_fd, int gpus, const uint8_t *mps, int64_t window_ns, int64_t min_token_ns,
                           int64_t meter_window_ns, const int64_t *wait_bounds_ns, int buckets);
/* Start the engine's thread: 0, or an errno. */
int fgs_engine_start(fgs_engine *engine);
/* Stop the thread and close every connection, without events; the calls below then do nothing. */
void fgs_engine_stop(fgs_engine *engine);
void fgs_engine_free(fgs_engine *engine);

/* Readable while events wait; read it (8 bytes) before taking them. */
int fgs_engine_event_fd(const fgs_engine *engine);
/* The next event, its bytes into buffer (capacity >= 2 * FGS_MAX_FRAME): 1, or 0 if none. */
int fgs_engine_next_event(fgs_engine *engine, fgs_event *event, uint8_t *buffer, uint32_t capacity);

/* Whose the connection is, for fairness: Python's number (1..2^20) for its peer (a pod, or a
 * process outside pods). The engine reads a new connection only once it has one; the events of
 * each group wait in a queue of their own, and fgs_engine_next_event takes one from each group in
 * turn. 0; -1: gone; -2: no memory; -3: a bad number. */
int fgs_engine_set_group(fgs_engine *engine, uint64_t connection, uint32_t group);
/* The liveness probe's private connection (one end of a socketpair; the engine owns fd from now
 * on, also on failure): the engine answers its PINGs itself, with a u64 payload saying for how
 * many ns Python has not taken an event while events waited (0 while it keeps up); anything
 * else closes it. No events. 0, or -1. */
int fgs_engine_add_probe(fgs_engine *engine, int fd);

/* 0, or -1 for a connection that is gone (or a stopped engine). */
int fgs_engine_send(fgs_engine *engine, uint64_t connection, const uint8_t *data, uint32_t length);
/* Close after what was sent has left; a registered connection gives its token back at once. */
int fgs_engine_close(fgs_engine *engine, uint64_t connection);
/* After its HELLO: the connection belongs to the pod on the GPU, with this share if the pod is
 * new to the GPU's scheduler. -2: no memory, -3: a bad GPU index or an already registered connection. */
int fgs_engine_register(fgs_engine *engine, uint64_t connection, int gpu, const char *pod, int32_t request_permille,
                        int32_t limit_permille, int32_t sm_percent);
/* A TOKEN request Python received (it arrived before the connection was registered). */
int fgs_engine_token(fgs_engine *engine, uint64_t connection, uint32_t request_id, uint64_t used_ns);
/* A connected pod's share changed: 1 if it differs from what the scheduler had, 0 if not, -1 if the
 * pod has no connection on the GPU. */
int fgs_engine_set_share(fgs_engine *engine, int gpu, const char *pod, int32_t request_permille,
                         int32_t limit_permille, int32_t sm_percent);
/* The meter's snapshot now (see fgs_meter_snapshot); busy_ns has one entry per GPU. */
int fgs_engine_snapshot(fgs_engine *engine, const fgs_pod_usage **pods, int64_t *busy_ns, int64_t *now_ns);

#endif
