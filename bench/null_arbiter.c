/*
 * null_arbiter.c: the protocol's floor for bench/arbiter.py, as bench/null_extender.py is the
 * extender's.
 *
 *   null_arbiter SOCKET
 *
 * Listens on the unix socket SOCKET and answers the hook protocol (include/fastgshare_protocol.h)
 * with no policy at all: every HELLO gets a share of limit 1 and every TOKEN a 20 µs token at
 * once, from one thread with epoll, reading and writing frames as they come. It keeps no pod, no
 * window and no accounting, so what bench/arbiter.py measures through it is what the machine's
 * unix sockets, wake-ups and the load generator cost: the most any arbiter could do here.
 *
 * Prints "null arbiter ready" once it listens; runs until killed.
 */
#define _GNU_SOURCE
#include "fastgshare_byteorder.h"
#include "fastgshare_protocol.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define TOKEN_NS 20000u
#define BUFFER 8192

struct conn {
    int fd;
    uint8_t in[BUFFER];
    size_t have;
};

static void fail(const char *what)
{
    fprintf(stderr, "null_arbiter: %s\n", what);
    exit(1);
}

/* Appends the reply to the frame at `frame` to `out`; returns its size. */
static size_t answer(const uint8_t *frame, uint8_t *out)
{
    uint16_t type = fgs_get_le16(frame + 6);
    size_t payload = 0;
    uint8_t *body = out + FGS_HEADER_SIZE;
    switch (type) {
    case FGS_MSG_HELLO: /* window 100 ms, request 0, limit 1000 ‰, 100 % SM, no memory limit, 20 µs */
        fgs_put_le32(body, 100000);
        fgs_put_le32(body + 4, 0);
        fgs_put_le32(body + 8, 1000);
        fgs_put_le32(body + 12, 100);
        fgs_put_le64(body + 16, 0);
        fgs_put_le32(body + 24, 20);
        payload = 28;
        break;
    case FGS_MSG_TOKEN:
        fgs_put_le64(body, TOKEN_NS);
        payload = 8;
        break;
    case FGS_MSG_PING:
        break;
    default:
        fail("a request this null arbiter does not answer (only HELLO, TOKEN and PING)");
    }
    fgs_put_le32(out, (uint32_t)(FGS_HEADER_SIZE - 4 + payload));
    fgs_put_le16(out + 4, FGS_PROTOCOL_VERSION);
    fgs_put_le16(out + 6, (uint16_t)(type | FGS_REPLY_BIT));
    memcpy(out + 8, frame + 8, 4); /* the request id */
    return FGS_HEADER_SIZE + payload;
}

/* Reads what has arrived and answers every whole frame in it with one send; 0 when closed. */
static int serve(struct conn *c)
{
    ssize_t k = recv(c->fd, c->in + c->have, sizeof c->in - c->have, 0);
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
        return 0;
    if (k < 0)
        return 1;
    c->have += (size_t)k;
    uint8_t out[BUFFER * 4];
    size_t used = 0, written = 0;
    while (c->have - used >= 4) {
        size_t length = (size_t)fgs_get_le32(c->in + used);
        if (length < FGS_HEADER_SIZE - 4 || length > FGS_MAX_FRAME - 4)
            return 0;
        if (c->have - used < 4 + length)
            break;
        written += answer(c->in + used, out + written);
        used += 4 + length;
    }
    memmove(c->in, c->in + used, c->have - used);
    c->have -= used;
    if (written && send(c->fd, out, written, MSG_NOSIGNAL) != (ssize_t)written)
        return 0; /* a few small replies into a unix socket: all or the client is gone */
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 2)
        fail("usage: null_arbiter SOCKET");
    struct sockaddr_un address = {.sun_family = AF_UNIX};
    if (strlen(argv[1]) >= sizeof address.sun_path)
        fail("socket path too long");
    strcpy(address.sun_path, argv[1]);
    int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
    unlink(argv[1]);
    if (listener < 0 || bind(listener, (struct sockaddr *)&address, sizeof address) != 0 || listen(listener, 1024) != 0)
        fail(strerror(errno));
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, listener, &ev) != 0)
        fail(strerror(errno));
    printf("null arbiter ready\n");
    fflush(stdout);

    struct epoll_event events[256];
    for (;;) {
        int n = epoll_wait(ep, events, 256, -1);
        if (n < 0 && errno != EINTR)
            fail(strerror(errno));
        for (int e = 0; e < n; e++) {
            struct conn *c = events[e].data.ptr;
            if (c == NULL) {
                int fd = accept4(listener, NULL, NULL, SOCK_NONBLOCK);
                if (fd < 0)
                    continue;
                c = calloc(1, sizeof *c);
                if (!c)
                    fail("out of memory");
                c->fd = fd;
                struct epoll_event add = {.events = EPOLLIN, .data.ptr = c};
                if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &add) != 0)
                    fail(strerror(errno));
            } else if (!serve(c)) {
                close(c->fd); /* closing removes it from the epoll set */
                free(c);
            }
        }
    }
}
