/* arbiter_client.c: frames of the hook <-> arbiter protocol over a unix socket (see arbiter_client.h). */
#define _GNU_SOURCE
#include "arbiter_client.h"

#include "fastgshare_byteorder.h"
#include "fastgshare_protocol.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define HELLO_REPLY_SIZE 28
#define U64_SIZE 8
#define MEM_RESERVE_REPLY_SIZE 20

/* --- strings in frames ------------------------------------------------------------------- */

/* A u16-length-prefixed string at *offset of buf; false if it does not fit. */
static bool put_text(uint8_t *buf, size_t size, size_t *offset, const char *text)
{
    size_t len = strlen(text);
    if (len > 0xffff || *offset + 2 + len > size)
        return false;
    fgs_put_le16(buf + *offset, (uint16_t)len);
    memcpy(buf + *offset + 2, text, len);
    *offset += 2 + len;
    return true;
}

/* --- deadlines and whole reads/writes ------------------------------------------------------ */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int write_all(struct fgs_client *c, const uint8_t *buf, size_t len, char *err, size_t err_len)
{
    while (len > 0) {
        ssize_t k = send(c->fd, buf, len, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            if (errno == EPIPE || errno == ECONNRESET)
                snprintf(err, err_len, "the arbiter closed the connection");
            else if (errno == EAGAIN || errno == EWOULDBLOCK)
                snprintf(err, err_len, "the arbiter did not take a request within %d ms", c->timeout_ms);
            else
                snprintf(err, err_len, "cannot send to the arbiter: %s", strerror(errno));
            return -1;
        }
        buf += k;
        len -= (size_t)k;
    }
    return 0;
}

static int read_exact(struct fgs_client *c, uint8_t *buf, size_t len, uint64_t deadline_ms, char *err,
                      size_t err_len)
{
    size_t got = 0;
    while (got < len) {
        uint64_t now = now_ms();
        if (now >= deadline_ms) {
            snprintf(err, err_len, "no reply from the arbiter within %d ms", c->timeout_ms);
            return -1;
        }
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int ready = poll(&pfd, 1, (int)(deadline_ms - now));
        if (ready < 0 && errno != EINTR) {
            snprintf(err, err_len, "cannot wait for the arbiter: %s", strerror(errno));
            return -1;
        }
        if (ready <= 0)
            continue; /* interrupted or timed out: the loop re-checks the deadline */
        ssize_t k = recv(c->fd, buf + got, len - got, 0);
        if (k == 0 || (k < 0 && errno == ECONNRESET)) {
            snprintf(err, err_len, "the arbiter closed the connection");
            return -1;
        }
        if (k < 0 && errno != EINTR && errno != EAGAIN) {
            snprintf(err, err_len, "cannot read from the arbiter: %s", strerror(errno));
            return -1;
        }
        if (k > 0)
            got += (size_t)k;
    }
    return 0;
}

/* --- frames ------------------------------------------------------------------------------- */

static const char *message_name(uint16_t type)
{
    switch (type) {
    case FGS_MSG_HELLO: return "HELLO";
    case FGS_MSG_TOKEN: return "TOKEN";
    case FGS_MSG_MEM_RESERVE: return "MEM_RESERVE";
    case FGS_MSG_MEM_RELEASE: return "MEM_RELEASE";
    case FGS_MSG_MEM_RESTORE: return "MEM_RESTORE";
    default: return "request";
    }
}

static const char *error_name(uint32_t code)
{
    switch (code) {
    case FGS_ERR_BAD_FRAME: return "BAD_FRAME";
    case FGS_ERR_VERSION: return "VERSION";
    case FGS_ERR_UNKNOWN_CLIENT: return "UNKNOWN_CLIENT";
    case FGS_ERR_NOT_REGISTERED: return "NOT_REGISTERED";
    case FGS_ERR_UNKNOWN_TYPE: return "UNKNOWN_TYPE";
    default: return "unknown error";
    }
}

/* An ERROR reply as one printable line: "arbiter refused TOKEN: NOT_REGISTERED (4): text". */
static void describe_error(uint16_t request_type, const uint8_t *payload, size_t len, char *err,
                           size_t err_len)
{
    if (len < 6 || 6 + (size_t)fgs_get_le16(payload + 4) != len) {
        snprintf(err, err_len, "arbiter refused %s with a malformed ERROR reply", message_name(request_type));
        return;
    }
    uint32_t code = fgs_get_le32(payload);
    char text[200];
    size_t text_len = fgs_get_le16(payload + 4) < sizeof text - 1 ? fgs_get_le16(payload + 4) : sizeof text - 1;
    for (size_t i = 0; i < text_len; i++) {
        uint8_t ch = payload[6 + i];
        text[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?'; /* keep the log one readable line */
    }
    text[text_len] = '\0';
    snprintf(err, err_len, "arbiter refused %s: %s (%u): %s", message_name(request_type), error_name(code),
             code, text);
}

/* Sends one request and reads its reply payload, which must be exactly reply_len bytes. */
static int request(struct fgs_client *c, uint16_t type, const uint8_t *payload, size_t payload_len,
                   uint8_t *reply, size_t reply_len, char *err, size_t err_len)
{
    c->refused = 0;
    if (c->fd < 0) {
        snprintf(err, err_len, "not connected to the arbiter");
        return -1;
    }
    uint8_t frame[FGS_MAX_FRAME];
    uint32_t id = c->next_request_id++;
    fgs_put_le32(frame, (uint32_t)(FGS_HEADER_SIZE - 4 + payload_len));
    fgs_put_le16(frame + 4, FGS_PROTOCOL_VERSION);
    fgs_put_le16(frame + 6, type);
    fgs_put_le32(frame + 8, id);
    memcpy(frame + FGS_HEADER_SIZE, payload, payload_len);
    if (write_all(c, frame, FGS_HEADER_SIZE + payload_len, err, err_len) != 0)
        return -1;

    uint64_t deadline = now_ms() + (uint64_t)c->timeout_ms;
    if (read_exact(c, frame, 4, deadline, err, err_len) != 0)
        return -1;
    uint32_t length = fgs_get_le32(frame);
    if (length < FGS_HEADER_SIZE - 4 || length > FGS_MAX_FRAME - 4) {
        snprintf(err, err_len, "the arbiter sent a frame of %u bytes (protocol error)", length);
        return -1;
    }
    if (read_exact(c, frame + 4, length, deadline, err, err_len) != 0)
        return -1;
    uint16_t version = fgs_get_le16(frame + 4), reply_type = fgs_get_le16(frame + 6);
    uint32_t reply_id = fgs_get_le32(frame + 8);
    const uint8_t *body = frame + FGS_HEADER_SIZE;
    size_t body_len = length - (FGS_HEADER_SIZE - 4);
    if (version != FGS_PROTOCOL_VERSION) {
        snprintf(err, err_len, "the arbiter speaks protocol version %u, this hook %u", version,
                 FGS_PROTOCOL_VERSION);
        return -1;
    }
    if (reply_id != id) {
        snprintf(err, err_len, "the arbiter answered request %u while %u was pending (protocol error)",
                 reply_id, id);
        return -1;
    }
    if (reply_type == FGS_MSG_ERROR) {
        describe_error(type, body, body_len, err, err_len);
        c->refused = 1;
        return -1;
    }
    if (reply_type != (type | FGS_REPLY_BIT) || body_len != reply_len) {
        snprintf(err, err_len, "the arbiter sent a malformed %s reply (type %u, %zu payload bytes)",
                 message_name(type), reply_type, body_len);
        return -1;
    }
    memcpy(reply, body, reply_len);
    return 0;
}

/* --- public calls ------------------------------------------------------------------------- */

void fgs_client_init(struct fgs_client *c, int timeout_ms)
{
    c->fd = -1;
    c->next_request_id = 1;
    c->timeout_ms = timeout_ms;
    c->refused = 0;
}

/* connect() interrupted by a signal goes on in the background: wait for it and fetch its result. */
static int finish_interrupted_connect(int fd, int timeout_ms)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    for (;;) {
        uint64_t now = now_ms();
        if (now >= deadline) {
            errno = ETIMEDOUT;
            return -1;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int ready = poll(&pfd, 1, (int)(deadline - now));
        if (ready > 0)
            break;
        if (ready < 0 && errno != EINTR)
            return -1;
    }
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0)
        return -1;
    errno = so_error;
    return so_error == 0 ? 0 : -1;
}

int fgs_client_connect(struct fgs_client *c, const char *socket_path, char *err, size_t err_len)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (socket_path == NULL || socket_path[0] == '\0') {
        snprintf(err, err_len, FGS_ENV_ARBITER_SOCKET " is not set, so the GPU time arbiter cannot be reached");
        return -1;
    }
    if (strlen(socket_path) >= sizeof addr.sun_path) {
        snprintf(err, err_len, FGS_ENV_ARBITER_SOCKET " is longer than %zu bytes", sizeof addr.sun_path - 1);
        return -1;
    }
    memcpy(addr.sun_path, socket_path, strlen(socket_path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, err_len, "cannot create a unix socket: %s", strerror(errno));
        return -1;
    }
    /* Bounds connect() on a full backlog and send() on a peer that stopped reading. */
    struct timeval tv = {.tv_sec = c->timeout_ms / 1000, .tv_usec = (c->timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, (const struct sockaddr *)&addr, sizeof addr) != 0 &&
        (errno != EINTR || finish_interrupted_connect(fd, c->timeout_ms) != 0)) {
        snprintf(err, err_len, "cannot connect to the arbiter at %s: %s", socket_path, strerror(errno));
        close(fd);
        return -1;
    }
    c->fd = fd;
    return 0;
}

int fgs_client_hello(struct fgs_client *c, uint32_t pid, const char *pod, const char *gpu_uuid,
                     struct fgs_hello_reply *reply, char *err, size_t err_len)
{
    uint8_t payload[FGS_MAX_FRAME - FGS_HEADER_SIZE];
    size_t len = 4;
    fgs_put_le32(payload, pid);
    if (!put_text(payload, sizeof payload, &len, pod) || !put_text(payload, sizeof payload, &len, gpu_uuid)) {
        snprintf(err, err_len, "the pod name and GPU UUID do not fit in one HELLO frame");
        return -1;
    }
    uint8_t body[HELLO_REPLY_SIZE];
    if (request(c, FGS_MSG_HELLO, payload, len, body, sizeof body, err, err_len) != 0)
        return -1;
    reply->window_us = fgs_get_le32(body);
    reply->request_permille = fgs_get_le32(body + 4);
    reply->limit_permille = fgs_get_le32(body + 8);
    reply->sm_percent = fgs_get_le32(body + 12);
    reply->memory_limit_bytes = fgs_get_le64(body + 16);
    reply->min_token_us = fgs_get_le32(body + 24);
    return 0;
}

/* A request whose payload and reply are one u64 each (TOKEN, MEM_RELEASE). */
static int request_u64(struct fgs_client *c, uint16_t type, uint64_t value, uint64_t *answer, char *err,
                       size_t err_len)
{
    uint8_t payload[U64_SIZE], body[U64_SIZE];
    fgs_put_le64(payload, value);
    if (request(c, type, payload, sizeof payload, body, sizeof body, err, err_len) != 0)
        return -1;
    *answer = fgs_get_le64(body);
    return 0;
}

int fgs_client_token(struct fgs_client *c, uint64_t used_ns, uint64_t *token_ns, char *err, size_t err_len)
{
    return request_u64(c, FGS_MSG_TOKEN, used_ns, token_ns, err, err_len);
}

int fgs_client_mem_reserve(struct fgs_client *c, uint64_t bytes, int *granted, uint64_t *pod_used,
                           uint64_t *pod_limit, char *err, size_t err_len)
{
    uint8_t payload[U64_SIZE], body[MEM_RESERVE_REPLY_SIZE];
    fgs_put_le64(payload, bytes);
    if (request(c, FGS_MSG_MEM_RESERVE, payload, sizeof payload, body, sizeof body, err, err_len) != 0)
        return -1;
    uint32_t flag = fgs_get_le32(body);
    if (flag > 1) {
        snprintf(err, err_len, "the arbiter sent a MEM_RESERVE reply with granted=%u (protocol error)", flag);
        return -1;
    }
    *granted = (int)flag;
    *pod_used = fgs_get_le64(body + 4);
    *pod_limit = fgs_get_le64(body + 12);
    return 0;
}

int fgs_client_mem_restore(struct fgs_client *c, uint64_t bytes, uint64_t *pod_used, char *err, size_t err_len)
{
    uint8_t payload[U64_SIZE], body[MEM_RESERVE_REPLY_SIZE];
    fgs_put_le64(payload, bytes);
    if (request(c, FGS_MSG_MEM_RESTORE, payload, sizeof payload, body, sizeof body, err, err_len) != 0)
        return -1;
    *pod_used = fgs_get_le64(body + 4);
    return 0;
}

int fgs_client_reconnect(struct fgs_client *c, const char *socket_path, uint32_t pid, const char *pod,
                         const char *gpu_uuid, int bound_ms, struct fgs_hello_reply *reply, uint64_t *waited_ms,
                         char *err, size_t err_len)
{
    uint64_t start = now_ms(), deadline = start + (uint64_t)bound_ms;
    uint64_t delay_ms = 10;
    int reply_timeout_ms = c->timeout_ms;
    for (;;) {
        /* No attempt outlives the bound: a hung arbiter's HELLO waits at most what is left of it. */
        uint64_t left = deadline > now_ms() ? deadline - now_ms() : 1;
        fgs_client_close(c);
        fgs_client_init(c, left < (uint64_t)reply_timeout_ms ? (int)left : reply_timeout_ms);
        int ok = fgs_client_connect(c, socket_path, err, err_len) == 0 &&
                 fgs_client_hello(c, pid, pod, gpu_uuid, reply, err, err_len) == 0;
        c->timeout_ms = reply_timeout_ms;
        if (ok) {
            *waited_ms = now_ms() - start;
            return 0;
        }
        uint64_t now = now_ms();
        if (now >= deadline) {
            fgs_client_close(c);
            c->timeout_ms = reply_timeout_ms;
            return -1;
        }
        uint64_t pause = delay_ms < deadline - now ? delay_ms : deadline - now;
        struct timespec ts = {.tv_sec = (time_t)(pause / 1000), .tv_nsec = (long)(pause % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
        delay_ms = delay_ms * 2 > 200 ? 200 : delay_ms * 2;
    }
}

int fgs_client_mem_release(struct fgs_client *c, uint64_t bytes, uint64_t *pod_used, char *err, size_t err_len)
{
    return request_u64(c, FGS_MSG_MEM_RELEASE, bytes, pod_used, err, err_len);
}

void fgs_client_close(struct fgs_client *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}
