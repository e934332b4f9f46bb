/*
 * model_client.c: the pod's side of model sharing, the exported API of include/fastgshare_model.h.
 *
 * Owns:
 *   - fastgshare_model_open: one request to the node agent's model socket (pod -> agent wire format
 *     of issue 40: {"op": "open", "model": name} -> {"ok": true, "handle", "bytes", "model"} or
 *     {"ok": false, "error"}), one connection per call, one answer line of at most 4096 bytes, the
 *     connection and the answer within one deadline; the answer read by a small strict parser of
 *     exactly that flat object; the 64-byte handle decoded from its 128 hex digits and mapped with
 *     the real driver's cuIpcOpenMemHandle (_v2 where the driver has it). The hook wraps no cuIpc*
 *     call: imported memory is charged to its exporter (the node's model store), not to the pod.
 *   - fastgshare_model_close: the real cuIpcCloseMemHandle.
 *   - fastgshare_model_error: the calling thread's last failure, one line.
 * No state is shared between calls or threads except the loaded driver table (entry.c).
 */
#define _GNU_SOURCE
#include "entry.h"

#include "fastgshare_model.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define DEFAULT_SOCKET "/var/run/fastgshare/model.sock"
#define DEFAULT_TIMEOUT_MS 5000
#define MAX_TIMEOUT_MS 600000
#define MAX_LINE 4096
#define MAX_NAME 255
#define HANDLE_HEX (2 * CU_IPC_HANDLE_SIZE)

static __thread char last_error[1024];

__attribute__((format(printf, 1, 2))) static void set_error(const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(last_error, sizeof last_error, format, args);
    va_end(args);
    for (char *c = last_error; *c != '\0'; c++) /* one line, whatever the agent wrote */
        if ((unsigned char)*c < 0x20 || *c == 0x7f)
            *c = ' ';
}

FGS_EXPORT const char *fastgshare_model_error(void)
{
    return last_error;
}

/* --- settings ----------------------------------------------------------------------------- */

static const char *socket_path(void)
{
    const char *path = getenv("FASTGSHARE_MODEL_SOCKET");
    return path != NULL && *path != '\0' ? path : DEFAULT_SOCKET;
}

/* The deadline of one call in ms, or -1 after set_error. */
static long timeout_ms(void)
{
    const char *value = getenv("FASTGSHARE_MODEL_TIMEOUT_MS");
    if (value == NULL || *value == '\0')
        return DEFAULT_TIMEOUT_MS;
    long ms = 0;
    const char *p = value;
    for (; *p >= '0' && *p <= '9' && ms <= MAX_TIMEOUT_MS; p++)
        ms = ms * 10 + (*p - '0');
    if (p == value || *p != '\0' || ms < 1 || ms > MAX_TIMEOUT_MS) {
        set_error("FASTGSHARE_MODEL_TIMEOUT_MS=%.64s: expected milliseconds, 1..%d", value, MAX_TIMEOUT_MS);
        return -1;
    }
    return ms;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* --- the request -------------------------------------------------------------------------- */

/* {"op": "open", "model": <name as a JSON string>}\n into out (room for MAX_LINE + 1 bytes); its length. */
static size_t build_request(const char *name, char *out)
{
    static const char head[] = "{\"op\": \"open\", \"model\": \"";
    static const char hex[] = "0123456789abcdef";
    size_t n = sizeof head - 1;
    memcpy(out, head, n);
    for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++) {
        if (*c == '"' || *c == '\\') {
            out[n++] = '\\';
            out[n++] = (char)*c;
        } else if (*c < 0x20 || *c > 0x7e) { /* names are ASCII; anything else goes as its byte */
            memcpy(out + n, "\\u00", 4);
            out[n + 4] = hex[*c >> 4];
            out[n + 5] = hex[*c & 15];
            n += 6;
        } else {
            out[n++] = (char)*c;
        }
    }
    memcpy(out + n, "\"}\n", 3);
    return n + 3;
}

/* --- the exchange ------------------------------------------------------------------------- */

/* Waits until fd is ready for `events` or the deadline passes: 1 ready, 0 timed out, -1 error. */
static int wait_for(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0)
            return 0;
        struct pollfd pfd = {.fd = fd, .events = events};
        int ready = poll(&pfd, 1, (int)left);
        if (ready < 0 && errno == EINTR)
            continue;
        return ready < 0 ? -1 : ready > 0;
    }
}

static const char *connect_hint(int error)
{
    switch (error) {
    case ENOENT: return " (no such socket: is the node agent running with the model store? "
                        "FASTGSHARE_MODEL_SOCKET names it)";
    case ECONNREFUSED: return " (is the node agent running with the model store?)";
    case EACCES: return " (permission denied: the socket is the node agent's)";
    default: return "";
    }
}

/* Sends the request and reads the answer line (without its newline) into line[MAX_LINE + 1].
 * 0, or an error code after set_error. */
static int exchange(const char *path, const char *request, size_t request_len, long wait_ms, char *line)
{
    int64_t deadline = now_ms() + wait_ms;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) {
        set_error("FASTGSHARE_MODEL_SOCKET=%.64s...: a unix socket path has at most %zu bytes", path,
                  sizeof addr.sun_path - 1);
        return FASTGSHARE_MODEL_EINVAL;
    }
    memcpy(addr.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
        set_error("model socket %s: cannot create a socket: %s", path, strerror(errno));
        return FASTGSHARE_MODEL_EAGENT;
    }
    int code = FASTGSHARE_MODEL_EAGENT;
    /* A full backlog answers EAGAIN on a non-blocking unix socket: try again until the deadline. */
    while (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        int error = errno;
        if (error == EINTR)
            continue;
        if (error == EINPROGRESS) {
            int socket_error = 0;
            socklen_t len = sizeof socket_error;
            int ready = wait_for(fd, POLLOUT, deadline);
            if (ready > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &socket_error, &len) == 0 && socket_error == 0)
                break;
            if (ready == 0)
                set_error("model socket %s: no connection within %ld ms (FASTGSHARE_MODEL_TIMEOUT_MS)", path, wait_ms);
            else
                set_error("model socket %s: %s%s", path, strerror(socket_error ? socket_error : errno),
                          connect_hint(socket_error));
            goto out;
        }
        if ((error == EAGAIN) && now_ms() < deadline) {
            struct timespec pause = {0, 5 * 1000 * 1000};
            nanosleep(&pause, NULL);
            continue;
        }
        if (error == EAGAIN)
            set_error("model socket %s: no connection within %ld ms (FASTGSHARE_MODEL_TIMEOUT_MS)", path, wait_ms);
        else
            set_error("model socket %s: %s%s", path, strerror(error), connect_hint(error));
        goto out;
    }
    for (size_t sent = 0; sent < request_len;) {
        ssize_t n = send(fd, request + sent, request_len - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN && wait_for(fd, POLLOUT, deadline) > 0)
            continue;
        set_error("model socket %s: sending the request failed: %s", path,
                  n < 0 && errno != EAGAIN ? strerror(errno) : "timed out");
        goto out;
    }
    size_t got = 0;
    for (;;) {
        char *end = memchr(line, '\n', got);
        if (end != NULL) {
            *end = '\0';
            code = FASTGSHARE_MODEL_OK;
            goto out;
        }
        if (got == MAX_LINE) {
            set_error("model socket %s: the answer is longer than %d bytes", path, MAX_LINE);
            code = FASTGSHARE_MODEL_EPROTO;
            goto out;
        }
        int ready = wait_for(fd, POLLIN, deadline);
        if (ready == 0) {
            set_error("model socket %s: no answer within %ld ms (FASTGSHARE_MODEL_TIMEOUT_MS; a cold GPU loads "
                      "the model first)", path, wait_ms);
            goto out;
        }
        ssize_t n = ready < 0 ? -1 : recv(fd, line + got, MAX_LINE - got, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0) {
            set_error("model socket %s: reading the answer failed: %s", path, strerror(errno));
            goto out;
        }
        if (n == 0) {
            set_error("model socket %s: the node agent closed the connection without %s answer", path,
                      got ? "a whole" : "an");
            goto out;
        }
        got += (size_t)n;
    }
out:
    close(fd);
    return code;
}

/* --- the answer --------------------------------------------------------------------------- */

struct answer {
    int ok, has_ok, has_handle, has_bytes, has_model, has_error;
    char handle[HANDLE_HEX + 1];
    unsigned long long bytes;
    char model[256];
    char error[1024];
};

static void skip_space(const char **p)
{
    while (**p == ' ' || **p == '\t' || **p == '\r')
        (*p)++;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A JSON string at *p into out[cap] (UTF-8; NULL out: skipped). 0; 1 when it did not fit (the
 * rest is dropped); -1 when malformed. */
static int parse_string(const char **p, char *out, size_t cap)
{
    size_t n = 0;
    int truncated = 0;
    if (**p != '"')
        return -1;
    (*p)++;
    for (;;) {
        unsigned char c = (unsigned char)*(*p)++;
        char bytes[4];
        size_t len = 1;
        if (c == '"')
            break;
        if (c < 0x20)
            return -1; /* includes the end of the line */
        bytes[0] = (char)c;
        if (c == '\\') {
            char e = *(*p)++;
            switch (e) {
            case '"': case '\\': case '/': bytes[0] = e; break;
            case 'b': bytes[0] = '\b'; break;
            case 'f': bytes[0] = '\f'; break;
            case 'n': bytes[0] = '\n'; break;
            case 'r': bytes[0] = '\r'; break;
            case 't': bytes[0] = '\t'; break;
            case 'u': {
                unsigned code = 0;
                for (int i = 0; i < 4; i++) {
                    int d = hex_digit(**p);
                    if (d < 0)
                        return -1;
                    code = code * 16 + (unsigned)d;
                    (*p)++;
                }
                if (code >= 0xd800 && code <= 0xdfff)
                    code = '?'; /* surrogates: not worth pairing for an error line */
                if (code < 0x80) {
                    bytes[0] = (char)code;
                } else if (code < 0x800) {
                    bytes[0] = (char)(0xc0 | (code >> 6));
                    bytes[1] = (char)(0x80 | (code & 0x3f));
                    len = 2;
                } else {
                    bytes[0] = (char)(0xe0 | (code >> 12));
                    bytes[1] = (char)(0x80 | ((code >> 6) & 0x3f));
                    bytes[2] = (char)(0x80 | (code & 0x3f));
                    len = 3;
                }
                break;
            }
            default: return -1;
            }
        }
        if (out != NULL) {
            if (n + len < cap) {
                memcpy(out + n, bytes, len);
                n += len;
            } else {
                truncated = 1;
            }
        }
    }
    if (out != NULL)
        out[n] = '\0';
    return truncated;
}

/* A whole number (no sign, fraction or exponent) at *p; 0 or -1. */
static int parse_count(const char **p, unsigned long long *out)
{
    unsigned long long value = 0;
    const char *start = *p;
    for (; **p >= '0' && **p <= '9'; (*p)++) {
        if (value > (UINT64_MAX - 9) / 10)
            return -1;
        value = value * 10 + (unsigned)(**p - '0');
    }
    if (*p == start || (**p == '.' || **p == 'e' || **p == 'E'))
        return -1;
    *out = value;
    return 0;
}

static int parse_literal(const char **p, const char *word)
{
    size_t len = strlen(word);
    if (strncmp(*p, word, len) != 0)
        return -1;
    *p += len;
    return 0;
}

/* A value of a field this client does not know: a string, number, true, false or null. */
static int skip_scalar(const char **p)
{
    if (**p == '"')
        return parse_string(p, NULL, 0) < 0 ? -1 : 0;
    if (**p == 't')
        return parse_literal(p, "true");
    if (**p == 'f')
        return parse_literal(p, "false");
    if (**p == 'n')
        return parse_literal(p, "null");
    const char *start = *p;
    if (**p == '-')
        (*p)++;
    while ((**p >= '0' && **p <= '9') || **p == '.' || **p == 'e' || **p == 'E' || **p == '+' || **p == '-')
        (*p)++;
    return *p > start ? 0 : -1;
}

/* The answer line as a flat JSON object; NULL, or what is wrong with it. */
static const char *parse_answer(const char *line, struct answer *a)
{
    const char *p = line;
    memset(a, 0, sizeof *a);
    skip_space(&p);
    if (*p++ != '{')
        return "not a JSON object";
    skip_space(&p);
    if (*p == '}') {
        p++;
    } else {
        for (;;) {
            char key[16];
            int r = parse_string(&p, key, sizeof key);
            if (r < 0)
                return "a field name is not a JSON string";
            skip_space(&p);
            if (*p++ != ':')
                return "a field name without ':'";
            skip_space(&p);
            if (r == 0 && strcmp(key, "ok") == 0) {
                if (a->has_ok++)
                    return "\"ok\" twice";
                if (parse_literal(&p, "true") == 0)
                    a->ok = 1;
                else if (parse_literal(&p, "false") != 0)
                    return "\"ok\" is not true or false";
            } else if (r == 0 && strcmp(key, "handle") == 0) {
                if (a->has_handle++)
                    return "\"handle\" twice";
                if (parse_string(&p, a->handle, sizeof a->handle) != 0)
                    return "\"handle\" is not a string of 128 hex digits";
            } else if (r == 0 && strcmp(key, "bytes") == 0) {
                if (a->has_bytes++)
                    return "\"bytes\" twice";
                if (parse_count(&p, &a->bytes) != 0)
                    return "\"bytes\" is not a whole number";
            } else if (r == 0 && strcmp(key, "model") == 0) {
                if (a->has_model++)
                    return "\"model\" twice";
                if (parse_string(&p, a->model, sizeof a->model) < 0)
                    return "\"model\" is not a string";
            } else if (r == 0 && strcmp(key, "error") == 0) {
                if (a->has_error++)
                    return "\"error\" twice";
                if (parse_string(&p, a->error, sizeof a->error) < 0) /* a long reason is cut short */
                    return "\"error\" is not a string";
            } else if (skip_scalar(&p) != 0) {
                return "a field's value is not a string, number, true, false or null";
            }
            skip_space(&p);
            if (*p == '}') {
                p++;
                break;
            }
            if (*p++ != ',')
                return "fields not separated by ','";
            skip_space(&p);
        }
    }
    skip_space(&p);
    if (*p != '\0')
        return "text after the object";
    if (!a->has_ok)
        return "no \"ok\"";
    if (a->ok && (!a->has_handle || !a->has_bytes))
        return "\"ok\": true without \"handle\" and \"bytes\"";
    if (a->ok && strlen(a->handle) != HANDLE_HEX)
        return "\"handle\" is not 128 hex digits";
    if (a->ok && a->bytes == 0)
        return "\"bytes\" is 0";
    return NULL;
}

/* The 128 lowercase hex digits into the 64-byte handle; 0 or -1. */
static int decode_handle(const char *hex, CUipcMemHandle *handle)
{
    for (int i = 0; i < CU_IPC_HANDLE_SIZE; i++) {
        char hi = hex[2 * i], lo = hex[2 * i + 1];
        if (hex_digit(hi) < 0 || hex_digit(lo) < 0 || (hi >= 'A' && hi <= 'F') || (lo >= 'A' && lo <= 'F'))
            return -1;
        handle->reserved[i] = (char)(hex_digit(hi) * 16 + hex_digit(lo));
    }
    return 0;
}

/* --- the driver --------------------------------------------------------------------------- */

static const char *result_name(CUresult r, char *buf, size_t cap)
{
    const char *name = NULL;
    if (fgs_real.cuGetErrorName == NULL || fgs_real.cuGetErrorName(r, &name) != CUDA_SUCCESS || name == NULL)
        name = "CUresult";
    snprintf(buf, cap, "%s (%d)", name, (int)r);
    return buf;
}

static const char *open_hint(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_NOT_INITIALIZED:
        return ": the CUDA driver is not initialised in this process (call cuInit and make a context current "
               "first)";
    case CUDA_ERROR_INVALID_CONTEXT:
        return ": no current context on this thread (make one current first, e.g. cuDevicePrimaryCtxRetain + "
               "cuCtxSetCurrent, or torch.cuda.init())";
    case CUDA_ERROR_INVALID_VALUE:
        return ": the handle is not valid here (the model store freed or reloaded the model, or it is another GPU's)";
    default: return "";
    }
}

/* --- the API ------------------------------------------------------------------------------ */

FGS_EXPORT int fastgshare_model_open(const char *name, CUdeviceptr *ptr, size_t *bytes)
{
    char request[MAX_LINE + 1], line[MAX_LINE + 1], why[96];
    struct answer answer;
    last_error[0] = '\0';
    if (name == NULL)
        name = "";
    if (ptr == NULL || bytes == NULL) {
        set_error("fastgshare_model_open: ptr and bytes must not be NULL");
        return FASTGSHARE_MODEL_EINVAL;
    }
    if (strlen(name) > MAX_NAME) {
        set_error("fastgshare_model_open: the model name has %zu bytes; at most %d", strlen(name), MAX_NAME);
        return FASTGSHARE_MODEL_EINVAL;
    }
    long wait_ms = timeout_ms();
    if (wait_ms < 0)
        return FASTGSHARE_MODEL_EINVAL;
    const char *path = socket_path();
    int code = exchange(path, request, build_request(name, request), wait_ms, line);
    if (code != FASTGSHARE_MODEL_OK)
        return code;
    const char *malformed = parse_answer(line, &answer);
    if (malformed != NULL) {
        set_error("model socket %s: malformed answer (%s): %.200s", path, malformed, line);
        return FASTGSHARE_MODEL_EPROTO;
    }
    if (!answer.ok) {
        set_error("node agent: %s", answer.has_error && answer.error[0] ? answer.error
                                                                            : "refused the model without a reason");
        return FASTGSHARE_MODEL_EREFUSED;
    }
    if ((unsigned long long)(size_t)answer.bytes != answer.bytes) {
        set_error("model %s: %llu bytes do not fit this process's address space", answer.model, answer.bytes);
        return FASTGSHARE_MODEL_EPROTO;
    }
    const char *model = answer.has_model && answer.model[0] ? answer.model : (*name ? name : "of the pod");
    CUipcMemHandle handle;
    if (decode_handle(answer.handle, &handle) != 0) {
        set_error("model socket %s: malformed answer (\"handle\" is not 128 lowercase hex digits)", path);
        return FASTGSHARE_MODEL_EPROTO;
    }
    if (fgs_load_real() != 0) {
        set_error("model %s: cannot load the CUDA driver libcuda.so.1 to map it", model);
        return FASTGSHARE_MODEL_EDRIVER;
    }
    const char *call = fgs_real.cuIpcOpenMemHandle_v2 ? "cuIpcOpenMemHandle_v2" : "cuIpcOpenMemHandle";
    CUdeviceptr mapped = 0;
    CUresult r;
    if (fgs_real.cuIpcOpenMemHandle_v2 != NULL)
        r = fgs_real.cuIpcOpenMemHandle_v2(&mapped, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    else if (fgs_real.cuIpcOpenMemHandle != NULL)
        r = fgs_real.cuIpcOpenMemHandle(&mapped, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    else {
        set_error("model %s: the CUDA driver has no cuIpcOpenMemHandle", model);
        return FASTGSHARE_MODEL_EDRIVER;
    }
    if (r != CUDA_SUCCESS) {
        set_error("model %s: %s failed: %s%s", model, call, result_name(r, why, sizeof why), open_hint(r));
        return FASTGSHARE_MODEL_EDRIVER;
    }
    *ptr = mapped;
    *bytes = (size_t)answer.bytes;
    return FASTGSHARE_MODEL_OK;
}

FGS_EXPORT int fastgshare_model_close(CUdeviceptr ptr)
{
    char why[96];
    last_error[0] = '\0';
    if (fgs_load_real() != 0 || fgs_real.cuIpcCloseMemHandle == NULL) {
        set_error("fastgshare_model_close: cannot load cuIpcCloseMemHandle of the CUDA driver libcuda.so.1");
        return FASTGSHARE_MODEL_EDRIVER;
    }
    CUresult r = fgs_real.cuIpcCloseMemHandle(ptr);
    if (r != CUDA_SUCCESS) {
        set_error("fastgshare_model_close(0x%llx): cuIpcCloseMemHandle failed: %s%s", (unsigned long long)ptr,
                  result_name(r, why, sizeof why),
                  r == CUDA_ERROR_INVALID_VALUE ? " (not a mapping of fastgshare_model_open, or closed already)" : "");
        return FASTGSHARE_MODEL_EDRIVER;
    }
    return FASTGSHARE_MODEL_OK;
}
