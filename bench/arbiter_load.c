/*
 * arbiter_load.c: a load generator for the token arbiter (bench/arbiter.py builds and runs it).
 *
 *   arbiter_load SOCKET POD_PREFIX GPU CLIENTS SECONDS INTERVAL_US
 *
 * Opens CLIENTS connections to the arbiter at SOCKET and registers connection i as pod
 * "<POD_PREFIX><i>" on GPU with the hook's own client code (vgpu_hook/src/arbiter_client.c:
 * connect and HELLO). Then one thread drives every connection with epoll, speaking TOKEN frames
 * directly (the same layout as the hook's, from include/fastgshare_protocol.h), so one core of
 * C does the work of CLIENTS hooks and the arbiter, not the clients, is what is measured:
 *
 * - INTERVAL_US = 0, closed loop: each connection asks for its next token as soon as it has
 *   the last one (reporting the whole token as used);
 * - INTERVAL_US > 0, open loop: each connection asks once every INTERVAL_US, at a random phase
 *   (fixed seed) so the renewals are spread as independent tenants' are; a connection that is
 *   still waiting or has fallen behind skips the missed slots (no catch-up bursts).
 *
 * The latency of a grant runs from the request's send() to its reply's recv(). The first 10 %
 * of SECONDS (at most 0.5 s) is a warm-up that is not counted. Prints one JSON object:
 * {"clients", "seconds", "grants", "grants_per_s", "round_trip_us_p50", "_p99", "_p999", "_max",
 * "grants_total"} (the last with the warm-up).
 */
#define _GNU_SOURCE
#include "arbiter_client.h"
#include "fastgshare_byteorder.h"
#include "fastgshare_protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOKEN_FRAME 20 /* header (12) + u64 */

struct conn {
    int fd;
    uint32_t request_id;
    int waiting;        /* a TOKEN request is out */
    uint64_t sent_ns;   /* when it went out */
    uint64_t next_ns;   /* open loop: the next renewal slot */
    uint64_t token_ns;  /* the last token granted: reported as used with the next request */
    uint8_t buf[64];
    size_t have;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void fail(const char *what)
{
    fprintf(stderr, "arbiter_load: %s\n", what);
    exit(1);
}

static void send_token(struct conn *c)
{
    uint8_t frame[TOKEN_FRAME];
    fgs_put_le32(frame, (uint32_t)(TOKEN_FRAME - 4));
    fgs_put_le16(frame + 4, FGS_PROTOCOL_VERSION);
    fgs_put_le16(frame + 6, FGS_MSG_TOKEN);
    fgs_put_le32(frame + 8, ++c->request_id);
    fgs_put_le64(frame + 12, c->token_ns);
    c->sent_ns = now_ns();
    ssize_t k = send(c->fd, frame, sizeof frame, MSG_NOSIGNAL);
    if (k != (ssize_t)sizeof frame) /* 20 bytes into an empty unix socket buffer: all or an error */
        fail(k < 0 ? strerror(errno) : "short send");
    c->waiting = 1;
}

/* Reads what has arrived; returns 1 when a whole TOKEN reply is in (and consumes it). */
static int read_reply(struct conn *c)
{
    ssize_t k = recv(c->fd, c->buf + c->have, sizeof c->buf - c->have, 0);
    if (k == 0)
        fail("the arbiter closed a connection");
    if (k < 0)
        return errno == EAGAIN || errno == EINTR ? 0 : (fail(strerror(errno)), 0);
    c->have += (size_t)k;
    if (c->have < TOKEN_FRAME)
        return 0;
    uint32_t length = fgs_get_le32(c->buf);
    uint16_t type = fgs_get_le16(c->buf + 6);
    uint32_t id = fgs_get_le32(c->buf + 8);
    if (length != TOKEN_FRAME - 4 || type != (FGS_MSG_TOKEN | FGS_REPLY_BIT) || id != c->request_id || c->have != TOKEN_FRAME)
        fail("unexpected reply (not the TOKEN grant of the pending request)");
    c->token_ns = fgs_get_le64(c->buf + 12);
    c->have = 0;
    c->waiting = 0;
    return 1;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc != 7)
        fail("usage: arbiter_load SOCKET POD_PREFIX GPU CLIENTS SECONDS INTERVAL_US");
    const char *socket_path = argv[1], *prefix = argv[2], *gpu = argv[3];
    int clients = atoi(argv[4]);
    double seconds = atof(argv[5]);
    uint64_t interval = (uint64_t)(atof(argv[6]) * 1000.0);
    if (clients < 1 || seconds <= 0)
        fail("need CLIENTS >= 1 and SECONDS > 0");

    struct conn *conns = calloc((size_t)clients, sizeof *conns);
    int ep = epoll_create1(0);
    char err[256], pod[256];
    for (int i = 0; i < clients; i++) {
        struct fgs_client client;
        struct fgs_hello_reply hello;
        fgs_client_init(&client, 10000);
        snprintf(pod, sizeof pod, "%s%d", prefix, i);
        if (fgs_client_connect(&client, socket_path, err, sizeof err) != 0 ||
            fgs_client_hello(&client, (uint32_t)getpid(), pod, gpu, &hello, err, sizeof err) != 0)
            fail(err);
        conns[i].fd = client.fd;
        conns[i].request_id = client.next_request_id;
        fcntl(client.fd, F_SETFL, fcntl(client.fd, F_GETFL) | O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &conns[i]};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, client.fd, &ev) != 0)
            fail(strerror(errno));
    }

    uint64_t start = now_ns(), total = (uint64_t)(seconds * 1e9);
    uint64_t warmup = total / 10 < 500000000u ? total / 10 : 500000000u;
    uint64_t counted_from = start + warmup, end = start + warmup + total;
    size_t capacity = 1 << 20, count = 0, all = 0;
    uint64_t *latencies = malloc(capacity * sizeof *latencies);
    prctl(PR_SET_TIMERSLACK, 1000UL); /* wake within ~1 µs of a slot, not the default 50 µs */
    srand(12345);
    for (int i = 0; i < clients; i++) {
        if (interval == 0)
            send_token(&conns[i]);
        else
            conns[i].next_ns = start + (uint64_t)((double)rand() / RAND_MAX * (double)interval);
    }

    struct epoll_event events[256];
    for (;;) {
        uint64_t now = now_ns();
        if (now >= end)
            break;
        int timeout_ms = 1;
        if (interval) {
            uint64_t next = end;
            for (int i = 0; i < clients; i++) {
                struct conn *c = &conns[i];
                if (!c->waiting && c->next_ns <= now) {
                    send_token(c);
                    uint64_t behind = (now - c->next_ns) / interval + 1; /* skip missed slots */
                    c->next_ns += behind * interval;
                }
                if (!c->waiting && c->next_ns < next)
                    next = c->next_ns;
            }
            /* Sleep until the next slot or a reply, at nanosecond resolution (epoll's is 1 ms). */
            timeout_ms = 0;
            uint64_t wait = next > now ? next - now : 0;
            struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000u), .tv_nsec = (long)(wait % 1000000000u)};
            struct pollfd pfd = {.fd = ep, .events = POLLIN};
            if (wait && ppoll(&pfd, 1, &ts, NULL) < 0 && errno != EINTR)
                fail(strerror(errno));
        }
        int n = epoll_wait(ep, events, 256, timeout_ms);
        if (n < 0 && errno != EINTR)
            fail(strerror(errno));
        for (int e = 0; e < n; e++) {
            struct conn *c = events[e].data.ptr;
            if (!read_reply(c))
                continue;
            uint64_t got = now_ns();
            all++;
            if (c->sent_ns >= counted_from && got < end) {
                if (count == capacity) {
                    capacity *= 2;
                    latencies = realloc(latencies, capacity * sizeof *latencies);
                    if (!latencies)
                        fail("out of memory");
                }
                latencies[count++] = got - c->sent_ns;
            }
            if (!interval)
                send_token(c);
        }
    }
    if (count == 0)
        fail("no grants in the measured time");
    qsort(latencies, count, sizeof *latencies, compare_u64);
    printf("{\"clients\": %d, \"seconds\": %.3f, \"grants\": %zu, \"grants_per_s\": %.0f, "
           "\"round_trip_us_p50\": %.1f, \"round_trip_us_p99\": %.1f, \"round_trip_us_p999\": %.1f, "
           "\"round_trip_us_max\": %.1f, \"grants_total\": %zu}\n",
           clients, seconds, count, (double)count / seconds, latencies[count / 2] / 1e3,
           latencies[(size_t)((double)count * 0.99)] / 1e3, latencies[(size_t)((double)count * 0.999)] / 1e3,
           latencies[count - 1] / 1e3, all);
    for (int i = 0; i < clients; i++)
        close(conns[i].fd);
    free(conns);
    free(latencies);
    return 0;
}
