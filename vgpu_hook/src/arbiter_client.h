/*
 * arbiter_client.h: the hook's side of the hook <-> arbiter protocol, version 1
 * (include/fastgshare_protocol.h): one blocking unix-socket connection, explicit little-endian
 * frames, a request id per request, reply type and id checks, ERROR replies turned into text,
 * and a deadline on every reply (partial reads and writes and EINTR are handled).
 *
 * Not thread-safe: the caller serialises (gate.c and memory.c each own one client and hold
 * their own lock around it). Every call that fails writes
 * one human-readable reason, without a newline, into err.
 */
#ifndef FASTGSHARE_HOOK_ARBITER_CLIENT_H
#define FASTGSHARE_HOOK_ARBITER_CLIENT_H

#include <stddef.h>
#include <stdint.h>

struct fgs_hello_reply {
    uint32_t window_us;
    uint32_t request_permille;
    uint32_t limit_permille;
    uint32_t sm_percent;
    uint64_t memory_limit_bytes;
    uint32_t min_token_us;
};

struct fgs_client {
    int fd; /* -1 when not connected */
    uint32_t next_request_id;
    int timeout_ms; /* per reply, and for connect/send on a stuck peer */
    int refused;    /* the last failed call was an ERROR reply (the arbiter answered "no"), not a lost link */
};

void fgs_client_init(struct fgs_client *c, int timeout_ms);

/* 0 when connected; -1 with err set. */
int fgs_client_connect(struct fgs_client *c, const char *socket_path, char *err, size_t err_len);

/* HELLO: registers this process; 0 with *reply filled, or -1 with err set. */
int fgs_client_hello(struct fgs_client *c, uint32_t pid, const char *pod, const char *gpu_uuid,
                     struct fgs_hello_reply *reply, char *err, size_t err_len);

/* TOKEN: returns the previous token (used_ns of it) and blocks until the arbiter grants the next
 * one (up to timeout_ms); 0 with *token_ns set, or -1 with err set. */
int fgs_client_token(struct fgs_client *c, uint64_t used_ns, uint64_t *token_ns, char *err, size_t err_len);

/* MEM_RESERVE: asks to reserve `bytes` more for this connection within the pod's limit. 0 with
 * *granted (1 or 0), *pod_used and *pod_limit set (after the decision), or -1 with err set.
 * 0 bytes reserves nothing: it reads the pod's ledger. */
int fgs_client_mem_reserve(struct fgs_client *c, uint64_t bytes, int *granted, uint64_t *pod_used,
                           uint64_t *pod_limit, char *err, size_t err_len);

/* MEM_RESTORE: after a reconnect, `bytes` this process still holds (charged without the limit
 * check; the first memory request on the connection). 0 with *pod_used set, or -1 with err set. */
int fgs_client_mem_restore(struct fgs_client *c, uint64_t bytes, uint64_t *pod_used, char *err, size_t err_len);

/* Connect and HELLO again after the connection was lost (the arbiter restarted), retrying with
 * backoff (10 ms doubling to 200 ms) for up to bound_ms, HELLO refusals included (a restarted
 * arbiter may not know the pod yet). 0 when registered again, with *waited_ms set; -1 with err
 * set to the last failure. */
int fgs_client_reconnect(struct fgs_client *c, const char *socket_path, uint32_t pid, const char *pod,
                         const char *gpu_uuid, int bound_ms, struct fgs_hello_reply *reply, uint64_t *waited_ms,
                         char *err, size_t err_len);

/* MEM_RELEASE: gives back up to `bytes` this connection holds. 0 with *pod_used set, or -1. */
int fgs_client_mem_release(struct fgs_client *c, uint64_t bytes, uint64_t *pod_used, char *err, size_t err_len);

/* Closes the connection (the arbiter reclaims this process's token at once). */
void fgs_client_close(struct fgs_client *c);

#endif
