/*
 * http_timer.c: times HTTP requests the way a Go client (kube-scheduler) sends them, for
 * bench/extender_latency.py, so the bench's own Python does not add to what it measures.
 *
 *   http_timer HOST PORT
 *
 * Keeps one TCP connection (TCP_NODELAY, kept alive) to HOST:PORT. Reads requests from stdin,
 * each a u32 length and that many bytes: a whole HTTP/1.1 request, headers and body. Sends it,
 * reads the whole response (headers, then Content-Length bytes of body), and writes to stdout a
 * u64 of the nanoseconds from the send to the last byte of the body, a u32 status code, and, for a
 * status other than 200, a u32 length and the body's first bytes (at most 512). Integers are
 * little-endian (vgpu_hook/include/fastgshare_byteorder.h). Ends on EOF. Python waits for each
 * answer before it sends the next request, so nothing else of the bench's runs while a request is
 * timed.
 */
#define _GNU_SOURCE
#include "fastgshare_byteorder.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_REQUEST (64u << 20)
#define ERROR_PREFIX 512

static void fail(const char *what)
{
    fprintf(stderr, "http_timer: %s\n", what);
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int read_exactly(int fd, uint8_t *buffer, size_t length)
{
    size_t have = 0;
    while (have < length) {
        ssize_t k = read(fd, buffer + have, length - have);
        if (k == 0)
            return 0;
        if (k < 0) {
            if (errno == EINTR)
                continue;
            fail(strerror(errno));
        }
        have += (size_t)k;
    }
    return 1;
}

static void write_exactly(int fd, const uint8_t *buffer, size_t length)
{
    while (length) {
        ssize_t k = write(fd, buffer, length);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            fail(strerror(errno));
        }
        buffer += k;
        length -= (size_t)k;
    }
}

/* The response: headers into *buffer (grown as needed), then the body; returns the status. */
static int read_response(int sock, uint8_t **buffer, size_t *capacity, size_t *body_offset, size_t *body_length)
{
    size_t have = 0;
    char *end = NULL;
    for (;;) {
        if (have == *capacity) {
            *capacity *= 2;
            *buffer = realloc(*buffer, *capacity);
            if (*buffer == NULL)
                fail("out of memory");
        }
        ssize_t k = recv(sock, *buffer + have, *capacity - have, 0);
        if (k <= 0)
            fail(k == 0 ? "the server closed the connection" : strerror(errno));
        have += (size_t)k;
        end = memmem(*buffer, have, "\r\n\r\n", 4);
        if (end != NULL)
            break;
    }
    size_t headers = (size_t)(end - (char *)*buffer) + 4;
    int status = 0;
    if (sscanf((char *)*buffer, "HTTP/1.%*d %d", &status) != 1)
        fail("a response without a status line");
    size_t content_length = 0;
    const char *field = memmem(*buffer, headers, "\r\nContent-Length:", 17);
    if (field == NULL)
        field = memmem(*buffer, headers, "\r\ncontent-length:", 17);
    if (field == NULL)
        fail("a response without Content-Length");
    content_length = strtoul(field + 17, NULL, 10);
    size_t total = headers + content_length;
    if (total > *capacity) {
        *capacity = total;
        *buffer = realloc(*buffer, *capacity);
        if (*buffer == NULL)
            fail("out of memory");
    }
    while (have < total) {
        ssize_t k = recv(sock, *buffer + have, total - have, 0);
        if (k <= 0)
            fail(k == 0 ? "the server closed the connection" : strerror(errno));
        have += (size_t)k;
    }
    if (have != total)
        fail("bytes after the response (this client sends one request at a time)");
    *body_offset = headers;
    *body_length = content_length;
    return status;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        fail("usage: http_timer HOST PORT");
    struct sockaddr_in address = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[2]))};
    if (inet_pton(AF_INET, argv[1], &address.sin_addr) != 1)
        fail("HOST must be an IPv4 address");
    int sock = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    if (sock < 0 || setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0
        || connect(sock, (struct sockaddr *)&address, sizeof address) != 0)
        fail(strerror(errno));
    size_t capacity = 1 << 20;
    uint8_t *request = malloc(MAX_REQUEST), *response = malloc(capacity);
    if (request == NULL || response == NULL)
        fail("out of memory");
    for (;;) {
        uint8_t header[4];
        if (!read_exactly(0, header, sizeof header))
            break;
        uint32_t length = fgs_get_le32(header);
        if (length > MAX_REQUEST || !read_exactly(0, request, length))
            fail("a request longer than 64 MiB, or cut short");
        uint64_t started = now_ns();
        for (size_t sent = 0; sent < length;) {
            ssize_t k = send(sock, request + sent, length - sent, MSG_NOSIGNAL);
            if (k < 0)
                fail(strerror(errno));
            sent += (size_t)k;
        }
        size_t body_offset, body_length;
        int status = read_response(sock, &response, &capacity, &body_offset, &body_length);
        uint64_t elapsed = now_ns() - started;
        uint8_t answer[16];
        fgs_put_le64(answer, elapsed);
        fgs_put_le32(answer + 8, (uint32_t)status);
        write_exactly(1, answer, 12);
        if (status != 200) {
            uint32_t prefix = body_length < ERROR_PREFIX ? (uint32_t)body_length : ERROR_PREFIX;
            fgs_put_le32(answer, prefix);
            write_exactly(1, answer, 4);
            write_exactly(1, response + body_offset, prefix);
        }
    }
    close(sock);
    return 0;
}
