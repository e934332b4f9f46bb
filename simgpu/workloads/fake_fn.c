/*
 * fake_fn.c: the function of fastgshare/fake-fn:local, a tiny model server whose "inference" runs
 * kernels on the GPU through the CUDA driver API, so the hook (LD_PRELOAD) gates every launch and a
 * shared GPU slows each request down by the pod's quota.
 *
 * It follows the OpenFaaS of-watchdog contract (HTTP mode) on its own: HTTP/1.1 on port 8080, any
 * path and method runs one inference and answers 200 with a JSON object
 *   {"pod", "seq", "method", "path", "gpu_ms", "kernels", "wall_ms", "bytes", "echo"}
 * (wall_ms: the inference's wall time, so GPU time plus the time spent waiting for tokens; bytes:
 * the request body's length; echo: its first FAKE_FN_ECHO_MAX bytes, each byte outside printable
 * ASCII as \u00XX). GET /_/health answers 200 "OK" (the GPU context is set up before listening).
 *
 * Weights (optional): with FAKE_FN_MODEL or FAKE_FN_MODEL_FILE the process holds a model's bytes on
 * the GPU, and each answer also carries
 *   "model": {"name", "bytes", "offset", "length", "fnv1a64"}
 * a window of the weights read back from the GPU (cuMemcpyDtoH) after the inference: offset =
 * (seq * 65537 * 4096) mod bytes, rounded down to a multiple of 4096; length = min(4096, bytes -
 * offset); fnv1a64 the FNV-1a 64 hash of those bytes as 16 lowercase hex digits. A test hashes the
 * same window of the file and compares.
 *   FAKE_FN_MODEL=<name>      map the pod's model, shared by every pod on the GPU, at start (before
 *                             listening), through the hook's fastgshare_model_open (resolved with
 *                             dlsym(RTLD_DEFAULT), vgpu_hook/include/fastgshare_model.h): the node
 *                             agent's model store holds the bytes and the pod is charged nothing
 *                             for them. Without the hook, or when the call fails: one line, exit 1.
 *   FAKE_FN_MODEL_FILE=<path> load the weights from this file instead, a copy of its own ("without
 *                             sharing"): cuMemAlloc (charged to the pod like any allocation) and
 *                             cuMemcpyHtoD. The model's name is FAKE_FN_MODEL if set, else the file's
 *                             base name. A missing or empty file: one line, exit 1.
 *
 * Settings, by environment (a bad value: one line naming it and what is allowed, exit 64):
 *   FAKE_FN_GPU_MS            GPU time per request in ms, decimal, 0..60000 (default 5)
 *   FAKE_FN_KERNEL_US         length of one kernel in us, 1..1000000 (default 1000); a request runs
 *                             ceil(GPU_MS*1000 / KERNEL_US) kernels, the last one the remainder
 *   FAKE_FN_PORT              TCP port, 0..65535 (default 8080; 0 picks a free one)
 *   FAKE_FN_HOST              IPv4 address to listen on (default 0.0.0.0)
 *   FAKE_FN_MAX_BODY          largest request body in bytes (default 1048576; larger: 413)
 *   FAKE_FN_MAX_HEADER        largest request line + headers in bytes, 256..1048576 (default 16384; 431)
 *   FAKE_FN_READ_TIMEOUT_MS   the whole request must arrive within this, 1..600000 (default 10000; 408)
 *   FAKE_FN_MAX_CONNECTIONS   connections served at once, 1..4096 (default 64; more: 503)
 *   FAKE_FN_CONCURRENCY       inferences run at once, 0..4096 (default 0: no limit, each connection's
 *                             thread runs its own); 1 is a batch-1 model server: one inference at a
 *                             time, the others wait their turn in arrival order while their
 *                             connections are read and answered in parallel
 *   FAKE_FN_ECHO_MAX          body bytes echoed back, 0..65536 (default 256)
 *   FAKE_FN_MEMORY            GPU memory to allocate at start, bytes or with Ki/Mi/Gi (default 0)
 *   FAKE_FN_LOAD_MS           a model's load time: after the GPU is set up, wait this long before
 *                             listening (so before /_/health answers), 0..600000 (default 0)
 * The pod's name in answers: FASTGSHARE_POD, else FASTGSHARE_POD_NAME, else the host name.
 *
 * HTTP: request line + headers (CRLF or bare LF line ends), a body by Content-Length or chunked
 * Transfer-Encoding, "Expect: 100-continue" honoured; each answer has a Content-Length and
 * "Connection: close", except that a request asking for "Connection: keep-alive" gets a 2xx answer with
 * "Connection: keep-alive" and the connection stays open for its next request (the idle wait for
 * it is FAKE_FN_READ_TIMEOUT_MS; then it closes without an answer). Bad requests get 400
 * (malformed), 408 (too slow), 413, 417, 431 or 501, with a one-line text body, and the connection
 * closes; a failed launch answers 500. One thread per connection, all sharing one context.
 *
 * Stdout: {"event": "ready", "pid", "port", "gpu_ms", "kernel_us", "pod"} once listening (with a model
 * also "model": {"name", "bytes", "shared"}, shared true for FAKE_FN_MODEL, false for the file), and
 * {"event": "stopped", "requests"} after SIGTERM or SIGINT (it stops accepting, lets the requests in
 * flight finish, at most 5 s, and exits 0). Exit 1: the GPU, the model or the socket could not be set up.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAX_KERNEL_US 1000000ULL
#define MAX_GPU_MS 60000.0
#define STOP_GRACE_NS UINT64_C(5000000000)
#define LINGER_BYTES (256 * 1024)
#define LINGER_MS 1000

struct config {
    unsigned long long gpu_us, kernel_us, max_body, max_header, read_timeout_ms, max_connections, echo_max, memory;
    unsigned long long concurrency, load_ms;
    unsigned long long port;
    double gpu_ms;
    struct in_addr host;
    char pod[256];
    const char *model_name; /* FAKE_FN_MODEL, else the file's base name; NULL: no model */
    const char *model_file; /* FAKE_FN_MODEL_FILE; NULL: map the shared one */
};

/* The weights on the GPU (FAKE_FN_MODEL or FAKE_FN_MODEL_FILE); bytes 0: none. */
static struct {
    CUdeviceptr ptr;
    size_t bytes;
} model;

/* fastgshare_model_open of vgpu_hook/include/fastgshare_model.h, found at run time in the hook. */
typedef int (*model_open_fn)(const char *name, CUdeviceptr *ptr, size_t *bytes);
typedef const char *(*model_error_fn)(void);

static struct config cfg;
static CUcontext ctx;
static CUfunction spin;
static volatile sig_atomic_t stopping;
/* FAKE_FN_CONCURRENCY: a ticket lock admitting `limit` inferences at once, in arrival order. */
static struct {
    pthread_mutex_t lock;
    pthread_cond_t turn;
    unsigned long long next_ticket, serving, running;
} inference_gate = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0};
static long active_connections; /* atomic */
static long served_requests;    /* atomic */

/* --- small helpers ------------------------------------------------------------------------ */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static const char *error_name(CUresult code)
{
    const char *name = NULL;
    if (cuGetErrorName(code, &name) != CUDA_SUCCESS || name == NULL)
        return "unknown";
    return name;
}

static void on_stop(int signo)
{
    (void)signo;
    stopping = 1;
}

/* A growable string; on allocation failure it stays empty and `failed` is set. */
struct text {
    char *data;
    size_t len, cap;
    int failed;
};

static void text_put(struct text *t, const char *s, size_t n)
{
    if (t->failed)
        return;
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *grown = realloc(t->data, cap);
        if (grown == NULL) {
            t->failed = 1;
            return;
        }
        t->data = grown;
        t->cap = cap;
    }
    memcpy(t->data + t->len, s, n);
    t->len += n;
    t->data[t->len] = '\0';
}

static void text_str(struct text *t, const char *s)
{
    text_put(t, s, strlen(s));
}

__attribute__((format(printf, 2, 3))) static void text_fmt(struct text *t, const char *format, ...)
{
    char small[256];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(small, sizeof small, format, args);
    va_end(args);
    if (n > 0)
        text_put(t, small, (size_t)n < sizeof small ? (size_t)n : sizeof small - 1);
}

/* A JSON string of `n` bytes: quotes, backslashes and every byte outside 0x20..0x7e escaped. */
static void text_json(struct text *t, const char *s, size_t n)
{
    text_put(t, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char escaped[2] = {'\\', (char)c};
            text_put(t, escaped, 2);
        } else if (c < 0x20 || c > 0x7e) {
            text_fmt(t, "\\u%04x", c);
        } else {
            text_put(t, (const char *)&s[i], 1);
        }
    }
    text_put(t, "\"", 1);
}

/* --- settings ----------------------------------------------------------------------------- */

__attribute__((noreturn)) static void bad_setting(const char *name, const char *value, const char *allowed)
{
    fprintf(stderr, "fake-fn: %s=%s: expected %s\n", name, value, allowed);
    exit(64);
}

static unsigned long long env_uint(const char *name, unsigned long long fallback, unsigned long long min,
                                   unsigned long long max, const char *allowed)
{
    const char *value = getenv(name);
    if (value == NULL || *value == '\0')
        return fallback;
    unsigned long long result = 0;
    const char *p = value;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (result > (ULLONG_MAX - 9) / 10)
            bad_setting(name, value, allowed);
        result = result * 10 + (unsigned)(*p - '0');
    }
    if (p == value || *p != '\0' || result < min || result > max)
        bad_setting(name, value, allowed);
    return result;
}

static unsigned long long env_size(const char *name)
{
    static const struct { const char *suffix; unsigned shift; } suffixes[] = {
        {"", 0}, {"Ki", 10}, {"Mi", 20}, {"Gi", 30}, {"Ti", 40},
    };
    const char *allowed = "a whole number of bytes, optionally with Ki, Mi, Gi or Ti (e.g. 512Mi)";
    const char *value = getenv(name);
    if (value == NULL || *value == '\0')
        return 0;
    unsigned long long number = 0;
    const char *p = value;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (number > (1ULL << 50))
            bad_setting(name, value, allowed);
        number = number * 10 + (unsigned)(*p - '0');
    }
    if (p == value)
        bad_setting(name, value, allowed);
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++)
        if (strcmp(p, suffixes[i].suffix) == 0) {
            if (suffixes[i].shift && number > (1ULL << (63 - suffixes[i].shift)))
                bad_setting(name, value, allowed);
            return number << suffixes[i].shift;
        }
    bad_setting(name, value, allowed);
}

static void read_config(void)
{
    const char *gpu_ms = getenv("FAKE_FN_GPU_MS");
    cfg.gpu_ms = 5.0;
    if (gpu_ms != NULL && *gpu_ms != '\0') {
        char *end = NULL;
        errno = 0;
        double value = strtod(gpu_ms, &end);
        if (errno != 0 || end == gpu_ms || *end != '\0' || !isfinite(value) || value < 0 || value > MAX_GPU_MS)
            bad_setting("FAKE_FN_GPU_MS", gpu_ms, "milliseconds of GPU time per request, 0..60000 (e.g. 5 or 2.5)");
        cfg.gpu_ms = value;
    }
    cfg.gpu_us = (unsigned long long)(cfg.gpu_ms * 1000.0 + 0.5);
    cfg.kernel_us = env_uint("FAKE_FN_KERNEL_US", 1000, 1, MAX_KERNEL_US, "microseconds per kernel, 1..1000000");
    cfg.port = env_uint("FAKE_FN_PORT", 8080, 0, 65535, "a TCP port, 0..65535");
    cfg.max_body = env_uint("FAKE_FN_MAX_BODY", 1 << 20, 0, 1ULL << 30, "bytes, 0..1073741824");
    cfg.max_header = env_uint("FAKE_FN_MAX_HEADER", 16384, 256, 1 << 20, "bytes, 256..1048576");
    cfg.read_timeout_ms = env_uint("FAKE_FN_READ_TIMEOUT_MS", 10000, 1, 600000, "milliseconds, 1..600000");
    cfg.max_connections = env_uint("FAKE_FN_MAX_CONNECTIONS", 64, 1, 4096, "a count, 1..4096");
    cfg.concurrency = env_uint("FAKE_FN_CONCURRENCY", 0, 0, 4096, "a count, 0..4096 (0: no limit)");
    cfg.echo_max = env_uint("FAKE_FN_ECHO_MAX", 256, 0, 65536, "bytes, 0..65536");
    cfg.memory = env_size("FAKE_FN_MEMORY");
    cfg.load_ms = env_uint("FAKE_FN_LOAD_MS", 0, 0, 600000, "milliseconds, 0..600000");
    const char *model_name = getenv("FAKE_FN_MODEL"), *model_file = getenv("FAKE_FN_MODEL_FILE");
    if (model_file != NULL && *model_file != '\0') {
        cfg.model_file = model_file;
        const char *slash = strrchr(model_file, '/');
        cfg.model_name = slash != NULL ? slash + 1 : model_file;
        if (*cfg.model_name == '\0')
            bad_setting("FAKE_FN_MODEL_FILE", model_file, "the path of a file (not a directory)");
    }
    if (model_name != NULL && *model_name != '\0')
        cfg.model_name = model_name;
    const char *host = getenv("FAKE_FN_HOST");
    if (host == NULL || *host == '\0')
        host = "0.0.0.0";
    if (inet_pton(AF_INET, host, &cfg.host) != 1)
        bad_setting("FAKE_FN_HOST", host, "an IPv4 address (e.g. 0.0.0.0 or 127.0.0.1)");
    const char *pod = getenv("FASTGSHARE_POD");
    if (pod == NULL || *pod == '\0')
        pod = getenv("FASTGSHARE_POD_NAME");
    if (pod != NULL && *pod != '\0')
        snprintf(cfg.pod, sizeof cfg.pod, "%s", pod);
    else if (gethostname(cfg.pod, sizeof cfg.pod - 1) != 0)
        snprintf(cfg.pod, sizeof cfg.pod, "unknown");
}

/* --- the GPU ------------------------------------------------------------------------------ */

#define SETUP(call)                                                                                \
    do {                                                                                           \
        CUresult setup_result = (call);                                                            \
        if (setup_result != CUDA_SUCCESS) {                                                        \
            fprintf(stderr, "fake-fn: %s failed: %s\n", #call, error_name(setup_result));          \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

/* FAKE_FN_MODEL: the node's shared copy, through the hook. */
static int open_shared_model(void)
{
    model_open_fn open_model = (model_open_fn)dlsym(RTLD_DEFAULT, "fastgshare_model_open");
    model_error_fn model_error = (model_error_fn)dlsym(RTLD_DEFAULT, "fastgshare_model_error");
    if (open_model == NULL || model_error == NULL) {
        fprintf(stderr, "fake-fn: FAKE_FN_MODEL=%s: no fastgshare_model_open in this process (it comes from the "
                "fastgshare hook, LD_PRELOAD=libfastgshare-hook.so; or set FAKE_FN_MODEL_FILE to load a copy)\n",
                cfg.model_name);
        return -1;
    }
    int code = open_model(cfg.model_name, &model.ptr, &model.bytes);
    if (code != 0) {
        fprintf(stderr, "fake-fn: FAKE_FN_MODEL=%s: fastgshare_model_open failed (%d): %s\n", cfg.model_name, code,
                model_error());
        return -1;
    }
    return 0;
}

/* FAKE_FN_MODEL_FILE: a copy of its own, read in pieces and copied to the GPU. */
static int load_model_file(void)
{
    enum { PIECE = 8 << 20 };
    struct stat st;
    int fd = open(cfg.model_file, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
        fprintf(stderr, "fake-fn: FAKE_FN_MODEL_FILE=%s: %s\n", cfg.model_file,
                fd < 0 ? strerror(errno) : !S_ISREG(st.st_mode) ? "not a regular file" : "the file is empty");
        if (fd >= 0)
            close(fd);
        return -1;
    }
    off_t size = st.st_size;
    char *piece = malloc(PIECE);
    CUresult r = piece == NULL ? CUDA_ERROR_OUT_OF_MEMORY : cuMemAlloc(&model.ptr, (size_t)size);
    size_t done = 0;
    while (r == CUDA_SUCCESS && done < (size_t)size) {
        size_t want = (size_t)size - done < PIECE ? (size_t)size - done : PIECE;
        ssize_t n = read(fd, piece, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            fprintf(stderr, "fake-fn: FAKE_FN_MODEL_FILE=%s: reading it failed at byte %zu: %s\n", cfg.model_file,
                    done, n < 0 ? strerror(errno) : "the file got shorter");
            free(piece);
            close(fd);
            return -1;
        }
        r = cuMemcpyHtoD(model.ptr + done, piece, (size_t)n);
        done += (size_t)n;
    }
    free(piece);
    close(fd);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "fake-fn: FAKE_FN_MODEL_FILE=%s: copying %lld bytes to the GPU failed: %s\n", cfg.model_file,
                (long long)size, error_name(r));
        return -1;
    }
    model.bytes = (size_t)size;
    return 0;
}

static int setup_gpu(void)
{
    CUdevice dev;
    CUmodule module;
    SETUP(cuInit(0));
    SETUP(cuDeviceGet(&dev, 0));
#if CUDA_VERSION >= 13000
    SETUP(cuCtxCreate(&ctx, NULL, 0, dev)); /* _v4 in 13.x headers */
#else
    SETUP(cuCtxCreate(&ctx, 0, dev));
#endif
    SETUP(cuModuleLoadData(&module, "FAKECUBIN fake-fn"));
    SETUP(cuModuleGetFunction(&spin, module, "spin"));
    if (cfg.memory > 0) {
        CUdeviceptr memory;
        SETUP(cuMemAlloc(&memory, (size_t)cfg.memory)); /* held for the process's life */
    }
    if (cfg.model_name != NULL && (cfg.model_file != NULL ? load_model_file() : open_shared_model()) != 0)
        return -1;
    if (cfg.load_ms > 0) { /* stands for reading the weights and copying them to the GPU */
        struct timespec load = {(time_t)(cfg.load_ms / 1000), (long)(cfg.load_ms % 1000) * 1000000L};
        while (nanosleep(&load, &load) != 0 && errno == EINTR && !stopping)
            ;
    }
    return 0;
}

/* Waits for a turn to infer (FAKE_FN_CONCURRENCY; no wait without a limit), in arrival order. */
static void inference_begin(void)
{
    if (cfg.concurrency == 0)
        return;
    pthread_mutex_lock(&inference_gate.lock);
    unsigned long long ticket = inference_gate.next_ticket++;
    while (ticket != inference_gate.serving || inference_gate.running >= cfg.concurrency)
        pthread_cond_wait(&inference_gate.turn, &inference_gate.lock);
    inference_gate.serving++;
    inference_gate.running++;
    pthread_cond_broadcast(&inference_gate.turn); /* the next ticket may fit beside this one */
    pthread_mutex_unlock(&inference_gate.lock);
}

static void inference_end(void)
{
    if (cfg.concurrency == 0)
        return;
    pthread_mutex_lock(&inference_gate.lock);
    inference_gate.running--;
    pthread_cond_broadcast(&inference_gate.turn);
    pthread_mutex_unlock(&inference_gate.lock);
}

/* One inference: the request's GPU time as kernels of at most kernel_us each. */
static CUresult infer(unsigned long long *kernels)
{
    CUresult r = cuCtxSetCurrent(ctx);
    *kernels = 0;
    for (unsigned long long left = cfg.gpu_us; r == CUDA_SUCCESS && left > 0;) {
        unsigned long long us = left < cfg.kernel_us ? left : cfg.kernel_us;
        void *params[] = {&us};
        r = cuLaunchKernel(spin, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
        if (r == CUDA_SUCCESS)
            (*kernels)++;
        left -= us;
    }
    if (r == CUDA_SUCCESS && *kernels > 0)
        r = cuCtxSynchronize(); /* a real GPU queues launches: the answer waits for the kernels */
    return r;
}

/* --- reading a request -------------------------------------------------------------------- */

enum read_status { READ_OK = 0, READ_EOF = -1, READ_TIMEOUT = -2, READ_ERROR = -3, READ_TOO_LONG = -4 };

struct conn {
    int fd;
    uint64_t deadline_ns;
    char *buf; /* bytes received and not consumed yet: buf[pos..len) */
    size_t pos, len, cap;
    int kept; /* kept open after an answer: waiting for the next request ends when the server stops */
};

/* Receives more bytes into buf (which has room), waiting until the request's deadline. */
static int conn_fill(struct conn *c)
{
    if (c->pos > 0 && c->pos == c->len)
        c->pos = c->len = 0;
    if (c->len == c->cap)
        return READ_TOO_LONG;
    for (;;) {
        uint64_t now = now_ns();
        if (now >= c->deadline_ns)
            return READ_TIMEOUT;
        if (c->kept && stopping && c->len == 0)
            return READ_EOF; /* an idle kept-open connection: the server is stopping */
        struct pollfd pfd = {.fd = c->fd, .events = POLLIN};
        int wait_ms = (int)((c->deadline_ns - now + 999999) / 1000000);
        if (c->kept && wait_ms > 250)
            wait_ms = 250; /* look at `stopping` now and then */
        int ready = poll(&pfd, 1, wait_ms);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready < 0)
            return READ_ERROR;
        if (ready == 0)
            continue; /* the deadline is checked above */
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            return READ_ERROR;
        if (n == 0)
            return READ_EOF;
        c->len += (size_t)n;
        return READ_OK;
    }
}

/* Copies n body bytes to dst (dst may be NULL to discard). */
static int conn_read(struct conn *c, char *dst, size_t n)
{
    while (n > 0) {
        if (c->pos == c->len) {
            int r = conn_fill(c);
            if (r != READ_OK)
                return r;
        }
        size_t take = c->len - c->pos < n ? c->len - c->pos : n;
        if (dst != NULL) {
            memcpy(dst, c->buf + c->pos, take);
            dst += take;
        }
        c->pos += take;
        n -= take;
    }
    return READ_OK;
}

/* One line (LF or CRLF ended, the end stripped) of at most `max` bytes, for chunk sizes and trailers. */
static int conn_line(struct conn *c, char *line, size_t max)
{
    size_t n = 0;
    for (;;) {
        if (c->pos == c->len) {
            int r = conn_fill(c);
            if (r != READ_OK)
                return r;
        }
        char ch = c->buf[c->pos++];
        if (ch == '\n')
            break;
        if (n + 1 >= max)
            return READ_TOO_LONG;
        line[n++] = ch;
    }
    if (n > 0 && line[n - 1] == '\r')
        n--;
    line[n] = '\0';
    return READ_OK;
}

/* --- answering ---------------------------------------------------------------------------- */

static int send_more(int fd, const char *data, size_t n, int more)
{
    while (n > 0) {
        ssize_t sent = send(fd, data, n, MSG_NOSIGNAL | (more ? MSG_MORE : 0));
        if (sent < 0 && errno == EINTR)
            continue;
        if (sent <= 0)
            return -1;
        data += sent;
        n -= (size_t)sent;
    }
    return 0;
}

static int send_all(int fd, const char *data, size_t n)
{
    return send_more(fd, data, n, 0);
}

static const char *reason(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 417: return "Expectation Failed";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    }
    return "Error";
}

/* Sends one answer; 0 when all of it was sent. `keep`: the connection stays open after it. */
static int respond_on(int fd, int status, const char *content_type, const char *body, size_t body_len, int head,
                      int keep)
{
    char header[256];
    int n = snprintf(header, sizeof header,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nConnection: %s\r\n\r\n",
                     status, reason(status), content_type, body_len, keep ? "keep-alive" : "close");
    int body_follows = !head && body_len > 0; /* one segment for both (MSG_MORE), not two (Nagle) */
    if (n <= 0 || (size_t)n >= sizeof header || send_more(fd, header, (size_t)n, body_follows) != 0)
        return -1;
    if (!head && body_len > 0)
        return send_all(fd, body, body_len);
    return 0;
}

static void respond(int fd, int status, const char *content_type, const char *body, size_t body_len, int head)
{
    respond_on(fd, status, content_type, body, body_len, head, 0);
}

/* An error answer: one text line naming what was wrong. */
static void respond_error(int fd, int status, const char *message)
{
    char body[512];
    int n = snprintf(body, sizeof body, "%s\n", message);
    respond(fd, status, "text/plain; charset=utf-8", body, n > 0 ? (size_t)n : 0, 0);
}

/* Closes after the answer without resetting it: stop sending, then read (and drop) what the client
 * still sends for a moment, so unread request bytes do not make the kernel answer with a RST. */
static void close_gently(int fd)
{
    shutdown(fd, SHUT_WR);
    char sink[4096];
    size_t drained = 0;
    uint64_t until = now_ns() + (uint64_t)LINGER_MS * 1000000u;
    while (drained < LINGER_BYTES) {
        uint64_t now = now_ns();
        if (now >= until)
            break;
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int ready = poll(&pfd, 1, (int)((until - now) / 1000000u) + 1);
        if (ready < 0 && errno == EINTR)
            continue;
        if (ready <= 0)
            break;
        ssize_t n = recv(fd, sink, sizeof sink, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        drained += (size_t)n;
    }
    close(fd);
}

/* --- parsing ------------------------------------------------------------------------------ */

struct request {
    char method[32];
    char *target; /* owned: the header buffer is reused for the body */
    size_t target_len;
    int http11;
    int chunked, has_length, expect_continue;
    int keep_alive; /* the client asked for Connection: keep-alive */
    unsigned long long content_length;
    char *body;
    size_t body_len;
};

static int is_tchar(unsigned char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c != '\0' && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Where the header block ends (the byte after its empty line), or 0 if not received yet. */
static size_t header_end(const char *buf, size_t len)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (buf[i] != '\n')
            continue;
        if (buf[i + 1] == '\n')
            return i + 2;
        if (buf[i + 1] == '\r' && i + 2 < len && buf[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

/* The next line of the header block [*p, end): NUL-terminated in place, CR stripped. NULL at the end;
 * *bad is set for a stray CR or NUL inside a line. */
static char *next_line(char **p, char *end, int *bad)
{
    if (*p >= end)
        return NULL;
    char *line = *p, *nl = memchr(line, '\n', (size_t)(end - line));
    if (nl == NULL)
        return NULL;
    *p = nl + 1;
    if (nl > line && nl[-1] == '\r')
        nl--;
    *nl = '\0';
    if (memchr(line, '\r', (size_t)(nl - line)) != NULL || strlen(line) != (size_t)(nl - line))
        *bad = 1;
    return line;
}

/* Parses the request line and headers in [start, end). 0, or an HTTP status with *message set. */
static int parse_head(char *start, char *end, struct request *req, const char **message)
{
    int bad = 0;
    char *p = start;
    char *line = next_line(&p, end, &bad);
    if (line == NULL || bad) {
        *message = "bad request line";
        return 400;
    }
    char *sp1 = strchr(line, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (sp1 == NULL || sp2 == NULL || strchr(sp2 + 1, ' ') != NULL || sp1 == line ||
        (size_t)(sp1 - line) >= sizeof req->method || sp2 == sp1 + 1) {
        *message = "bad request line: expected METHOD TARGET HTTP/1.x";
        return 400;
    }
    for (char *m = line; m < sp1; m++)
        if (!is_tchar((unsigned char)*m)) {
            *message = "bad request line: invalid method";
            return 400;
        }
    memcpy(req->method, line, (size_t)(sp1 - line));
    req->method[sp1 - line] = '\0';
    for (char *t = sp1 + 1; t < sp2; t++)
        if ((unsigned char)*t <= 0x20 || (unsigned char)*t >= 0x7f) {
            *message = "bad request line: invalid target";
            return 400;
        }
    req->target_len = (size_t)(sp2 - sp1 - 1);
    if ((req->target = strndup(sp1 + 1, req->target_len)) == NULL) {
        *message = "out of memory for the request";
        return 503;
    }
    if (strcmp(sp2 + 1, "HTTP/1.1") == 0)
        req->http11 = 1;
    else if (strcmp(sp2 + 1, "HTTP/1.0") != 0) {
        *message = "bad request line: only HTTP/1.0 and HTTP/1.1 are served";
        return 400;
    }
    while ((line = next_line(&p, end, &bad)) != NULL && *line != '\0') {
        char *colon = strchr(line, ':');
        if (bad || colon == NULL || colon == line) {
            *message = "bad header line";
            return 400;
        }
        for (char *n = line; n < colon; n++)
            if (!is_tchar((unsigned char)*n)) {
                *message = "bad header name (no space before the colon, no folded lines)";
                return 400;
            }
        *colon = '\0';
        char *value = colon + 1, *value_end = value + strlen(value);
        while (*value == ' ' || *value == '\t')
            value++;
        while (value_end > value && (value_end[-1] == ' ' || value_end[-1] == '\t'))
            *--value_end = '\0';
        if (strcasecmp(line, "Content-Length") == 0) {
            unsigned long long length = 0;
            const char *d = value;
            for (; *d >= '0' && *d <= '9'; d++) {
                if (length > (ULLONG_MAX - 9) / 10) {
                    *message = "Content-Length too large";
                    return 413;
                }
                length = length * 10 + (unsigned)(*d - '0');
            }
            if (d == value || *d != '\0' || (req->has_length && length != req->content_length)) {
                *message = "bad Content-Length: expected one whole number of bytes";
                return 400;
            }
            req->has_length = 1;
            req->content_length = length;
        } else if (strcasecmp(line, "Transfer-Encoding") == 0) {
            if (strcasecmp(value, "chunked") != 0) {
                *message = "Transfer-Encoding: only chunked is supported";
                return 501;
            }
            req->chunked = 1;
        } else if (strcasecmp(line, "Expect") == 0) {
            if (strcasecmp(value, "100-continue") != 0) {
                *message = "Expect: only 100-continue is supported";
                return 417;
            }
            req->expect_continue = req->http11;
        } else if (strcasecmp(line, "Connection") == 0) {
            if (strcasestr(value, "close") != NULL)
                req->keep_alive = 0;
            else if (strcasestr(value, "keep-alive") != NULL)
                req->keep_alive = 1;
        }
    }
    if (req->chunked && req->has_length) {
        *message = "both Content-Length and Transfer-Encoding: send one";
        return 400;
    }
    if (req->has_length && req->content_length > cfg.max_body) {
        *message = "request body too large (FAKE_FN_MAX_BODY)";
        return 413;
    }
    return 0;
}

static int read_status_code(int r, const char **message)
{
    switch (r) {
    case READ_TIMEOUT: *message = "request not received in time (FAKE_FN_READ_TIMEOUT_MS)"; return 408;
    case READ_TOO_LONG: *message = "chunk size line too long"; return 400;
    default: *message = "request body ended early"; return 400;
    }
}

static int read_chunked(struct conn *c, struct request *req, const char **message)
{
    char line[256];
    size_t cap = 0;
    for (;;) {
        int r = conn_line(c, line, sizeof line);
        if (r != READ_OK)
            return read_status_code(r, message);
        char *ext = strchr(line, ';');
        if (ext != NULL)
            *ext = '\0';
        char *end = NULL;
        errno = 0;
        unsigned long long size = strtoull(line, &end, 16);
        while (end != NULL && (*end == ' ' || *end == '\t'))
            end++;
        if (errno != 0 || end == line || *end != '\0' || line[0] == '-' || line[0] == '+' || line[0] == ' ') {
            *message = "bad chunk size";
            return 400;
        }
        if (size == 0)
            break;
        if (size > cfg.max_body - req->body_len) {
            *message = "request body too large (FAKE_FN_MAX_BODY)";
            return 413;
        }
        if (req->body_len + size > cap) {
            size_t grown = cap ? cap : 4096;
            while (grown < req->body_len + size)
                grown *= 2;
            char *bigger = realloc(req->body, grown);
            if (bigger == NULL) {
                *message = "out of memory for the request body";
                return 413;
            }
            req->body = bigger;
            cap = grown;
        }
        if ((r = conn_read(c, req->body + req->body_len, (size_t)size)) != READ_OK)
            return read_status_code(r, message);
        req->body_len += (size_t)size;
        if ((r = conn_line(c, line, sizeof line)) != READ_OK)
            return read_status_code(r, message);
        if (line[0] != '\0') {
            *message = "bad chunk: data longer than its size";
            return 400;
        }
    }
    for (;;) { /* trailers, up to the empty line */
        int r = conn_line(c, line, sizeof line);
        if (r != READ_OK)
            return read_status_code(r, message);
        if (line[0] == '\0')
            return 0;
    }
}

static int read_body(struct conn *c, struct request *req, const char **message)
{
    if (req->expect_continue && (req->chunked || req->content_length > 0) && c->pos == c->len) {
        static const char go_on[] = "HTTP/1.1 100 Continue\r\n\r\n";
        send_all(c->fd, go_on, sizeof go_on - 1);
    }
    if (req->chunked)
        return read_chunked(c, req, message);
    if (!req->has_length || req->content_length == 0)
        return 0;
    req->body = malloc((size_t)req->content_length);
    if (req->body == NULL) {
        *message = "out of memory for the request body";
        return 413;
    }
    int r = conn_read(c, req->body, (size_t)req->content_length);
    if (r != READ_OK)
        return read_status_code(r, message);
    req->body_len = (size_t)req->content_length;
    return 0;
}

/* --- one connection ----------------------------------------------------------------------- */

/* The answer's "model" field: the window of the weights for request `seq`, read back and hashed. */
static void model_window(struct text *body, long seq)
{
    unsigned char window[4096];
    unsigned long long offset = ((unsigned long long)seq * 65537ULL * 4096ULL) % model.bytes / 4096 * 4096;
    size_t length = model.bytes - offset < sizeof window ? (size_t)(model.bytes - offset) : sizeof window;
    CUresult r = cuCtxSetCurrent(ctx);
    if (r == CUDA_SUCCESS)
        r = cuMemcpyDtoH(window, model.ptr + offset, length);
    text_str(body, ", \"model\": {\"name\": ");
    text_json(body, cfg.model_name, strlen(cfg.model_name));
    text_fmt(body, ", \"bytes\": %zu, \"offset\": %llu, \"length\": %zu, ", model.bytes, offset, length);
    if (r != CUDA_SUCCESS) {
        text_fmt(body, "\"error\": \"cuMemcpyDtoH failed: %s\"}", error_name(r));
        return;
    }
    uint64_t hash = UINT64_C(0xcbf29ce484222325);
    for (size_t i = 0; i < length; i++)
        hash = (hash ^ window[i]) * UINT64_C(0x100000001b3);
    text_fmt(body, "\"fnv1a64\": \"%016llx\"}", (unsigned long long)hash);
}

/* Answers one inference request; 1 when the connection stays open for the next request. */
static int answer_inference(int fd, const struct request *req)
{
    unsigned long long kernels = 0;
    inference_begin();
    uint64_t start = now_ns();
    CUresult r = infer(&kernels);
    double wall_ms = (double)(now_ns() - start) / 1e6;
    inference_end();
    long seq = __atomic_add_fetch(&served_requests, 1, __ATOMIC_RELAXED);
    struct text body = {0};
    if (r != CUDA_SUCCESS) {
        text_str(&body, "{\"error\": ");
        char what[128];
        snprintf(what, sizeof what, "kernel launch failed: %s (%d)", error_name(r), (int)r);
        text_json(&body, what, strlen(what));
        text_str(&body, ", \"pod\": ");
        text_json(&body, cfg.pod, strlen(cfg.pod));
        text_fmt(&body, ", \"kernels\": %llu}\n", kernels);
    } else {
        size_t path_len = strcspn(req->target, "?");
        if (path_len > req->target_len)
            path_len = req->target_len;
        text_str(&body, "{\"pod\": ");
        text_json(&body, cfg.pod, strlen(cfg.pod));
        text_fmt(&body, ", \"seq\": %ld, \"method\": ", seq);
        text_json(&body, req->method, strlen(req->method));
        text_str(&body, ", \"path\": ");
        text_json(&body, req->target, path_len);
        text_fmt(&body, ", \"gpu_ms\": %.3f, \"kernels\": %llu, \"wall_ms\": %.3f, \"bytes\": %zu, \"echo\": ",
                 (double)cfg.gpu_us / 1000.0, kernels, wall_ms, req->body_len);
        text_json(&body, req->body ? req->body : "", req->body_len < cfg.echo_max ? req->body_len : cfg.echo_max);
        if (model.bytes > 0)
            model_window(&body, seq);
        text_str(&body, "}\n");
    }
    int keep = 0;
    if (body.failed) {
        respond_error(fd, 500, "out of memory for the answer");
    } else {
        keep = r == CUDA_SUCCESS && req->keep_alive;
        if (respond_on(fd, r == CUDA_SUCCESS ? 200 : 500, "application/json", body.data, body.len,
                       strcmp(req->method, "HEAD") == 0, keep) != 0)
            keep = 0;
    }
    free(body.data);
    return keep;
}

/* Reads and answers one request on the connection; 1 when the connection stays open for the next
 * one (the client asked for keep-alive and got a 2xx answer). `first`: the connection's first
 * request (a later one that never starts is an idle connection closing, not a slow client). */
static int serve_one(struct conn *c, int first)
{
    struct request req = {0};
    const char *message = NULL;
    int status = 0, keep = 0;
    if (c->pos > 0) { /* bytes of this request that came with the last one stay; the rest is done */
        memmove(c->buf, c->buf + c->pos, c->len - c->pos);
        c->len -= c->pos;
        c->pos = 0;
    }
    c->deadline_ns = now_ns() + cfg.read_timeout_ms * 1000000ull;
    size_t end = 0;
    while ((end = header_end(c->buf, c->len)) == 0) {
        int r = conn_fill(c);
        if (r == READ_TOO_LONG) {
            status = 431, message = "request line and headers too large (FAKE_FN_MAX_HEADER)";
            break;
        }
        if ((r == READ_EOF || (!first && r != READ_OK)) && c->len == 0)
            goto done; /* a connection opened (or kept open) and closed: nothing to answer */
        if (r != READ_OK) {
            status = read_status_code(r, &message);
            if (r != READ_TIMEOUT)
                message = "connection closed inside the request headers";
            break;
        }
    }
    if (status == 0) {
        c->pos = end;
        status = parse_head(c->buf, c->buf + end, &req, &message);
    }
    if (status == 0) {
        size_t path_len = strcspn(req.target, "?");
        if (path_len > req.target_len)
            path_len = req.target_len;
        status = read_body(c, &req, &message);
        if (status == 0 && path_len == 9 && strncmp(req.target, "/_/health", 9) == 0)
            keep = respond_on(c->fd, 200, "text/plain; charset=utf-8", "OK", 2, strcmp(req.method, "HEAD") == 0,
                              req.keep_alive) == 0 && req.keep_alive;
        else if (status == 0)
            keep = answer_inference(c->fd, &req);
    }
    if (status != 0)
        respond_error(c->fd, status, message);
done:
    free(req.target);
    free(req.body);
    return keep && !stopping;
}

static void serve(int fd)
{
    struct conn c = {.fd = fd, .cap = cfg.max_header};
    c.buf = malloc(c.cap + 1);
    if (c.buf == NULL) {
        respond_error(fd, 503, "out of memory");
        return;
    }
    for (int first = 1; serve_one(&c, first); first = 0)
        c.kept = 1;
    free(c.buf);
}

static void *connection_thread(void *arg)
{
    int fd = (int)(intptr_t)arg;
    serve(fd);
    close_gently(fd);
    __atomic_sub_fetch(&active_connections, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* --- main --------------------------------------------------------------------------------- */

static int listen_socket(unsigned short *port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((unsigned short)cfg.port),
                               .sin_addr = cfg.host};
    socklen_t len = sizeof addr;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 128) != 0 ||
        getsockname(fd, (struct sockaddr *)&addr, &len) != 0) {
        char host[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &cfg.host, host, sizeof host);
        fprintf(stderr, "fake-fn: cannot listen on %s:%llu: %s\n", host, cfg.port, strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(addr.sin_port);
    return fd;
}

static void start_connection(int fd)
{
    struct timeval send_timeout = {.tv_sec = (time_t)(cfg.read_timeout_ms / 1000),
                                   .tv_usec = (suseconds_t)(cfg.read_timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
    /* An answer goes out whole at once: on a kept-open connection Nagle's algorithm would hold
     * its tail for the client's delayed ACK (40 ms). */
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (__atomic_add_fetch(&active_connections, 1, __ATOMIC_ACQ_REL) > (long)cfg.max_connections) {
        respond_error(fd, 503, "too many connections (FAKE_FN_MAX_CONNECTIONS)");
        close_gently(fd);
        __atomic_sub_fetch(&active_connections, 1, __ATOMIC_RELEASE);
        return;
    }
    pthread_attr_t attr;
    pthread_t thread;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, connection_thread, (void *)(intptr_t)fd) != 0) {
        respond_error(fd, 503, "cannot start a thread for the connection");
        close_gently(fd);
        __atomic_sub_fetch(&active_connections, 1, __ATOMIC_RELEASE);
    }
    pthread_attr_destroy(&attr);
}

int main(void)
{
    read_config();
    signal(SIGPIPE, SIG_IGN);
    struct sigaction action = {.sa_handler = on_stop};
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);
    if (setup_gpu() != 0)
        return 1;
    unsigned short port = 0;
    int listener = listen_socket(&port);
    if (listener < 0)
        return 1;
    struct text ready = {0};
    text_fmt(&ready, "{\"event\": \"ready\", \"pid\": %d, \"port\": %u, \"gpu_ms\": %.3f, \"kernel_us\": %llu, \"pod\": ",
             (int)getpid(), (unsigned)port, (double)cfg.gpu_us / 1000.0, cfg.kernel_us);
    text_json(&ready, cfg.pod, strlen(cfg.pod));
    if (model.bytes > 0) {
        text_str(&ready, ", \"model\": {\"name\": ");
        text_json(&ready, cfg.model_name, strlen(cfg.model_name));
        text_fmt(&ready, ", \"bytes\": %zu, \"shared\": %s}", model.bytes, cfg.model_file ? "false" : "true");
    }
    text_str(&ready, "}\n");
    fputs(ready.data ? ready.data : "{\"event\": \"ready\"}\n", stdout);
    fflush(stdout);
    free(ready.data);
    while (!stopping) {
        struct pollfd pfd = {.fd = listener, .events = POLLIN};
        if (poll(&pfd, 1, 250) <= 0)
            continue;
        int fd = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0)
            start_connection(fd);
        else if (errno == EMFILE || errno == ENFILE)
            usleep(10000); /* out of descriptors: let connections finish */
    }
    close(listener);
    uint64_t give_up = now_ns() + STOP_GRACE_NS;
    while (__atomic_load_n(&active_connections, __ATOMIC_ACQUIRE) > 0 && now_ns() < give_up)
        usleep(10000);
    printf("{\"event\": \"stopped\", \"requests\": %ld}\n", __atomic_load_n(&served_requests, __ATOMIC_RELAXED));
    fflush(stdout);
    _exit(0); /* threads still in flight after the grace period are abandoned */
}
