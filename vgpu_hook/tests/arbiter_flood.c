/*
 * arbiter_flood.c: a hostile tenant for tests (issue 37 item 4), shipped in the tenant image as
 * /opt/fastgshare/bin/arbiter-flood. Not part of the hook.
 *
 *   arbiter-flood [--connections N] [--seconds S] [--what ping|reserve|hold]
 *
 * Opens N connections (default 256) to the arbiter at $FASTGSHARE_ARBITER_SOCKET (what the node
 * agent's Allocate gives a GPU container) and says HELLO on each with the hook's own client code
 * (src/arbiter_client.c: connect and HELLO, with the pid, $FASTGSHARE_POD and $FASTGSHARE_GPU_UUID
 * the hook sends). Then one thread floods every connection with epoll: PING frames, or MEM_RESERVE
 * of 0 bytes (which reads the pod's ledger), as fast as the arbiter takes them, reading and counting
 * the replies, for S seconds (default: until SIGTERM or SIGINT). A connection the arbiter refuses
 * (at connect or HELLO) or closes later is counted, not fatal.
 *
 * Prints "arbiter-flood: flooding N connections ..." once they are open (tests wait for it) and one
 * summary line at the end. Exit 0 after the flood, 1 when the arbiter took no connection at all, 2
 * on bad usage.
 *
 * --what hold (issue 42 row 5's client) opens ONE connection the same way and then, until S seconds
 * or SIGTERM, asks for a TOKEN reporting used_ns=0 for the previous one and holds the granted token
 * for its whole token_ns (sleeping) before asking again. Before the arbiter charged held time this
 * got 0.79 of the GPU at a limit of 0.2. Prints "arbiter-flood: holding tokens ..." once registered
 * and "arbiter-flood: held T tokens for H s of E s (...)" at the end; exit 1 when the arbiter
 * refused the connection or dropped it. --connections does not apply.
 */
#define _GNU_SOURCE
#include "arbiter_client.h"
#include "fastgshare_byteorder.h"
#include "fastgshare_protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNECTIONS 100000
#define BURST_FRAMES 64
#define MAX_REQUEST_FRAME (FGS_HEADER_SIZE + 8)
#define HELLO_TIMEOUT_MS 5000
#define READ_BUFFER 8192
#define TOKEN_TIMEOUT_MS 30000 /* as the hook's default reply timeout: a token may be queued behind others */

enum what { WHAT_PING, WHAT_RESERVE, WHAT_HOLD };

struct options {
    int connections;
    double seconds; /* 0: until killed */
    enum what what;
};

struct conn {
    int fd;
    size_t burst_offset; /* where the next send starts in the burst (a short send splits a frame) */
    uint8_t in[READ_BUFFER];
    size_t have;
};

struct stats {
    int opened, refused, closed;
    uint64_t bytes_sent, replies, errors;
    char first_refusal[256];
};

static volatile sig_atomic_t stop_requested;

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void usage_error(const char *message)
{
    fprintf(stderr,
            "arbiter-flood: %s\nusage: arbiter-flood [--connections N] [--seconds S] [--what ping|reserve|hold]\n",
            message);
    exit(2);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static enum what parse_what(const char *text)
{
    char message[256];
    if (strcmp(text, "ping") == 0)
        return WHAT_PING;
    if (strcmp(text, "reserve") == 0)
        return WHAT_RESERVE;
    if (strcmp(text, "hold") == 0)
        return WHAT_HOLD;
    snprintf(message, sizeof message, "--what %.64s: expected ping, reserve or hold", text);
    usage_error(message);
    return WHAT_PING; /* not reached */
}

static struct options parse_options(int argc, char **argv)
{
    struct options o = {.connections = 256, .seconds = 0, .what = WHAT_PING};
    static const struct option longopts[] = {{"connections", required_argument, NULL, 'c'},
                                             {"seconds", required_argument, NULL, 's'},
                                             {"what", required_argument, NULL, 'w'},
                                             {NULL, 0, NULL, 0}};
    char message[256], *end;
    int opt;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (opt == 'c') {
            long n = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || n < 1 || n > MAX_CONNECTIONS) {
                snprintf(message, sizeof message, "--connections %.64s: expected a whole number from 1 to %d",
                         optarg, MAX_CONNECTIONS);
                usage_error(message);
            }
            o.connections = (int)n;
        } else if (opt == 's') {
            double s = strtod(optarg, &end);
            if (*optarg == '\0' || *end != '\0' || !(s > 0) || s > 1e7) {
                snprintf(message, sizeof message, "--seconds %.64s: expected a number of seconds above 0", optarg);
                usage_error(message);
            }
            o.seconds = s;
        } else if (opt == 'w') {
            o.what = parse_what(optarg);
        } else {
            usage_error("unknown option");
        }
    }
    if (optind != argc)
        usage_error("unexpected argument");
    return o;
}

/* The length of one request frame: PING is a bare header, MEM_RESERVE carries a u64. */
static size_t frame_length(int reserve)
{
    return reserve ? FGS_HEADER_SIZE + 8 : FGS_HEADER_SIZE;
}

/* Fills buf with BURST_FRAMES request frames; returns their total length. */
static size_t build_burst(uint8_t *buf, int reserve)
{
    size_t len = frame_length(reserve);
    for (int i = 0; i < BURST_FRAMES; i++) {
        uint8_t *frame = buf + (size_t)i * len;
        fgs_put_le32(frame, (uint32_t)(len - 4));
        fgs_put_le16(frame + 4, FGS_PROTOCOL_VERSION);
        fgs_put_le16(frame + 6, (uint16_t)(reserve ? FGS_MSG_MEM_RESERVE : FGS_MSG_PING));
        fgs_put_le32(frame + 8, (uint32_t)i + 100);
        if (reserve)
            fgs_put_le64(frame + FGS_HEADER_SIZE, 0);
    }
    return len * BURST_FRAMES;
}

static void note_refusal(struct stats *st, const char *err)
{
    st->refused++;
    if (st->first_refusal[0] == '\0')
        snprintf(st->first_refusal, sizeof st->first_refusal, "%s", err);
}

/* Connect and HELLO as the hook does (replies awaited up to timeout_ms); 0, or -1 when refused. */
static int register_client(struct fgs_client *client, const char *socket_path, int timeout_ms, struct stats *st)
{
    struct fgs_hello_reply hello;
    char err[256];
    const char *pod = getenv(FGS_ENV_POD), *gpu = getenv(FGS_ENV_GPU_UUID);
    fgs_client_init(client, timeout_ms);
    if (fgs_client_connect(client, socket_path, err, sizeof err) != 0) {
        note_refusal(st, err);
        return -1;
    }
    if (fgs_client_hello(client, (uint32_t)getpid(), pod ? pod : "", gpu ? gpu : "", &hello, err, sizeof err) != 0) {
        fgs_client_close(client);
        note_refusal(st, err);
        return -1;
    }
    return 0;
}

/* A registered connection's fd (non-blocking), or -1 when refused. */
static int open_connection(const char *socket_path, struct stats *st)
{
    struct fgs_client client;
    if (register_client(&client, socket_path, HELLO_TIMEOUT_MS, st) != 0)
        return -1;
    int fd = client.fd;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    return fd;
}

static void drop(struct conn *c, struct stats *st)
{
    close(c->fd); /* also leaves the epoll set */
    c->fd = -1;
    st->closed++;
}

/* Sends as much of the burst as the socket takes; 0, or -1 when the arbiter closed the connection. */
static int send_some(struct conn *c, const uint8_t *burst, size_t burst_len, struct stats *st)
{
    for (;;) {
        ssize_t k = send(c->fd, burst + c->burst_offset, burst_len - c->burst_offset, MSG_NOSIGNAL);
        if (k < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        st->bytes_sent += (uint64_t)k;
        c->burst_offset = (c->burst_offset + (size_t)k) % burst_len;
    }
}

/* Counts the whole reply frames in c->in and keeps a partial one; -1 on a frame no arbiter sends. */
static int count_replies(struct conn *c, struct stats *st)
{
    size_t at = 0;
    while (c->have - at >= 4) {
        uint32_t length = fgs_get_le32(c->in + at);
        if (length < FGS_HEADER_SIZE - 4 || length > FGS_MAX_FRAME - 4)
            return -1;
        if (c->have - at < 4 + (size_t)length)
            break;
        if (fgs_get_le16(c->in + at + 6) == FGS_MSG_ERROR)
            st->errors++;
        else
            st->replies++;
        at += 4 + length;
    }
    memmove(c->in, c->in + at, c->have - at);
    c->have -= at;
    return 0;
}

/* Reads what has arrived; 0, or -1 when the connection is gone. */
static int receive_some(struct conn *c, struct stats *st)
{
    for (;;) {
        ssize_t k = recv(c->fd, c->in + c->have, sizeof c->in - c->have, 0);
        if (k == 0)
            return -1;
        if (k < 0)
            return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
        c->have += (size_t)k;
        if (count_replies(c, st) != 0)
            return -1;
    }
}

/* Floods until the deadline (0: none), a signal, or no connection is left. */
static void flood(struct conn *conns, int count, int ep, const struct options *o, struct stats *st)
{
    uint8_t burst[BURST_FRAMES * MAX_REQUEST_FRAME];
    size_t burst_len = build_burst(burst, o->what == WHAT_RESERVE);
    double end = o->seconds > 0 ? now_s() + o->seconds : 0;
    struct epoll_event events[256];
    int live = count;
    while (!stop_requested && live > 0 && (end == 0 || now_s() < end)) {
        int n = epoll_wait(ep, events, 256, 100);
        if (n < 0 && errno != EINTR) {
            perror("arbiter-flood: epoll_wait");
            break;
        }
        for (int e = 0; e < n; e++) {
            struct conn *c = &conns[events[e].data.u32];
            int gone = (events[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && receive_some(c, st) != 0;
            if (!gone && (events[e].events & EPOLLOUT))
                gone = send_some(c, burst, burst_len, st) != 0;
            if (gone) {
                drop(c, st);
                live--;
            }
        }
    }
}

static int open_all(struct conn *conns, int count, int ep, const char *socket_path, struct stats *st)
{
    int opened = 0;
    for (int i = 0; i < count; i++) {
        int fd = open_connection(socket_path, st);
        if (fd < 0)
            continue;
        struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)opened};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
            close(fd);
            note_refusal(st, strerror(errno));
            continue;
        }
        conns[opened++].fd = fd;
    }
    return opened;
}

/* Sleeps until `until` (now_s's clock) unless a signal asks to stop; the seconds slept. */
static double sleep_until(double until)
{
    double from = now_s(), left;
    while (!stop_requested && (left = until - now_s()) > 0) {
        struct timespec ts = {.tv_sec = (time_t)left, .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL); /* EINTR: the loop looks at stop_requested again */
    }
    return now_s() - from;
}

/* --what hold: one connection; each token held to its end, each reported as used_ns=0. */
static int hold(const char *socket_path, const struct options *o)
{
    struct fgs_client client;
    struct stats st = {0};
    char err[256];
    if (register_client(&client, socket_path, TOKEN_TIMEOUT_MS, &st) != 0) {
        printf("arbiter-flood: the arbiter refused the connection: %s\n", st.first_refusal);
        return 1;
    }
    printf("arbiter-flood: holding tokens to their end on %s, reporting used_ns=0 for each\n", socket_path);
    fflush(stdout);
    double started = now_s(), end = o->seconds > 0 ? started + o->seconds : 0, held = 0;
    uint64_t tokens = 0, token_ns;
    int lost = 0;
    while (!stop_requested && (end == 0 || now_s() < end)) {
        if (fgs_client_token(&client, 0, &token_ns, err, sizeof err) != 0) {
            lost = !stop_requested;
            break;
        }
        tokens++;
        held += sleep_until(now_s() + (double)token_ns / 1e9);
    }
    double elapsed = now_s() - started;
    if (lost)
        printf("arbiter-flood: the arbiter stopped granting tokens: %s\n", err);
    printf("arbiter-flood: held %llu tokens for %.3f s of %.3f s (%.3f of the time), reporting used_ns=0\n",
           (unsigned long long)tokens, held, elapsed, elapsed > 0 ? held / elapsed : 0.0);
    fflush(stdout);
    fgs_client_close(&client);
    return lost ? 1 : 0;
}

static void install_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

int main(int argc, char **argv)
{
    struct options o = parse_options(argc, argv);
    const char *socket_path = getenv(FGS_ENV_ARBITER_SOCKET);
    if (socket_path == NULL || socket_path[0] == '\0')
        usage_error(FGS_ENV_ARBITER_SOCKET " is not set: it names the arbiter's socket (a GPU container has it)");
    install_signals();
    if (o.what == WHAT_HOLD)
        return hold(socket_path, &o);
    struct conn *conns = calloc((size_t)o.connections, sizeof *conns);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (conns == NULL || ep < 0) {
        perror("arbiter-flood");
        return 1;
    }
    const char *what = o.what == WHAT_RESERVE ? "MEM_RESERVE 0" : "PING";
    struct stats st = {0};
    st.opened = open_all(conns, o.connections, ep, socket_path, &st);
    printf("arbiter-flood: flooding %d connections with %s to %s (%d refused%s%s)\n", st.opened, what,
           socket_path, st.refused, st.refused ? ": " : "", st.first_refusal);
    fflush(stdout);
    if (st.opened == 0)
        return 1;
    double started = now_s();
    flood(conns, st.opened, ep, &o, &st);
    double elapsed = now_s() - started;
    uint64_t frames = st.bytes_sent / frame_length(o.what == WHAT_RESERVE);
    printf("arbiter-flood: sent %llu %s frames in %.1f s (%.0f/s), %llu replies, %llu errors; "
           "%d connections opened, %d refused, %d closed by the arbiter\n",
           (unsigned long long)frames, what, elapsed, elapsed > 0 ? (double)frames / elapsed : 0.0,
           (unsigned long long)st.replies, (unsigned long long)st.errors, st.opened, st.refused, st.closed);
    fflush(stdout);
    for (int i = 0; i < st.opened; i++)
        if (conns[i].fd >= 0)
            close(conns[i].fd);
    close(ep);
    free(conns);
    return 0;
}
