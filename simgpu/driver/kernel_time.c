/*
 * kernel_time.c: the simulated kernels' run times and the stream queue depth, from the
 * environment (grammar in kernel_time.h). Parsed once, at cuInit, before any launch; read-only
 * afterwards, so lookups take no lock.
 */
#include "kernel_time.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_KERNEL_NS (UINT64_C(100) * 1000)
#define DEFAULT_QUEUE_DEPTH 1024u
#define MAX_QUEUE_DEPTH (1u << 20)
#define MAX_NAME 1024u
#define KERNEL_TIME_HELP                                                                               \
    "allowed: comma-separated KEY=DURATION, KEY default, per_block or a kernel name, DURATION a "     \
    "number with ns, us, ms or s up to 60s (e.g. default=100us,saxpy=2ms,per_block=1us)"

struct named_time {
    char *name;
    uint64_t ns;
};

static struct {
    uint64_t default_ns, per_block_ns;
    struct named_time *named;
    size_t named_count;
    uint32_t queue_depth;
} g = {DEFAULT_KERNEL_NS, 0, NULL, 0, DEFAULT_QUEUE_DEPTH};

/* "2.5ms" -> 2500000. 0 or -1. */
static int parse_duration(const char *text, size_t len, uint64_t *ns)
{
    static const struct { const char *unit; uint64_t ns; } units[] = {
        {"ns", 1}, {"us", 1000}, {"ms", 1000 * 1000}, {"s", 1000 * 1000 * 1000},
    };
    size_t i = 0;
    uint64_t whole = 0, fraction = 0, scale = 1;
    for (; i < len && text[i] >= '0' && text[i] <= '9'; i++)
        if ((whole = whole * 10 + (uint64_t)(text[i] - '0')) > FAKE_MAX_KERNEL_NS)
            return -1;
    size_t digits = i;
    if (i < len && text[i] == '.')
        for (i++; i < len && text[i] >= '0' && text[i] <= '9'; i++, digits++)
            if (scale < UINT64_C(1000000000)) {
                fraction = fraction * 10 + (uint64_t)(text[i] - '0');
                scale *= 10;
            }
    if (digits == 0)
        return -1;
    if (i == len && whole == 0 && fraction == 0) {
        *ns = 0;
        return 0;
    }
    for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
        if (len - i != strlen(units[u].unit) || memcmp(text + i, units[u].unit, len - i) != 0)
            continue;
        if (whole > FAKE_MAX_KERNEL_NS / units[u].ns)
            return -1;
        uint64_t value = whole * units[u].ns + fraction * units[u].ns / scale;
        if (value > FAKE_MAX_KERNEL_NS)
            return -1;
        *ns = value;
        return 0;
    }
    return -1;
}

static int name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$' ||
           c == '.';
}

static int valid_name(const char *name, size_t len)
{
    if (len == 0 || len >= MAX_NAME)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (!name_char(name[i]))
            return 0;
    return 1;
}

static int add_named(const char *name, size_t len, uint64_t ns)
{
    for (size_t i = 0; i < g.named_count; i++)
        if (strlen(g.named[i].name) == len && memcmp(g.named[i].name, name, len) == 0) {
            g.named[i].ns = ns; /* the later value wins */
            return 0;
        }
    struct named_time *bigger = realloc(g.named, (g.named_count + 1) * sizeof *bigger);
    char *copy = malloc(len + 1);
    if (bigger == NULL || copy == NULL) {
        free(copy);
        if (bigger != NULL)
            g.named = bigger;
        return -1;
    }
    memcpy(copy, name, len);
    copy[len] = '\0';
    g.named = bigger;
    g.named[g.named_count++] = (struct named_time){copy, ns};
    return 0;
}

/* One KEY=DURATION item. 0 or -1 with err set. */
static int parse_item(const char *item, size_t len, char *err, size_t err_len)
{
    const char *eq = memchr(item, '=', len);
    uint64_t ns;
    if (eq == NULL) {
        snprintf(err, err_len, "'%.*s' is not KEY=DURATION", (int)len, item);
        return -1;
    }
    size_t key_len = (size_t)(eq - item), value_len = len - key_len - 1;
    if (parse_duration(eq + 1, value_len, &ns) != 0) {
        snprintf(err, err_len, "'%.*s' is not a duration", (int)value_len, eq + 1);
        return -1;
    }
    if (key_len == 7 && memcmp(item, "default", 7) == 0)
        g.default_ns = ns;
    else if (key_len == 9 && memcmp(item, "per_block", 9) == 0)
        g.per_block_ns = ns;
    else if (!valid_name(item, key_len)) {
        snprintf(err, err_len, "'%.*s' is not a kernel name", (int)key_len, item);
        return -1;
    } else if (add_named(item, key_len, ns) != 0) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }
    return 0;
}

static int parse_kernel_time(const char *text, char *err, size_t err_len)
{
    char why[256];
    const char *p = text;
    while (*p != '\0') {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (parse_item(p, len, why, sizeof why) != 0) {
            snprintf(err, err_len, FAKE_ENV_KERNEL_TIME "=%s: %s; " KERNEL_TIME_HELP, text, why);
            return -1;
        }
        p += len + (comma != NULL);
    }
    return 0;
}

static int parse_queue_depth(const char *text, char *err, size_t err_len)
{
    char *end;
    unsigned long depth = strtoul(text, &end, 10);
    if (end == text || *end != '\0' || text[0] == '-' || depth < 1 || depth > MAX_QUEUE_DEPTH) {
        snprintf(err, err_len, FAKE_ENV_QUEUE_DEPTH "=%s is not a number of launches in 1..%u", text, MAX_QUEUE_DEPTH);
        return -1;
    }
    g.queue_depth = (uint32_t)depth;
    return 0;
}

int fake_timing_configure(char *err, size_t err_len)
{
    const char *kernel_time = getenv(FAKE_ENV_KERNEL_TIME);
    const char *depth = getenv(FAKE_ENV_QUEUE_DEPTH);
    if (kernel_time != NULL && parse_kernel_time(kernel_time, err, err_len) != 0)
        return -1;
    if (depth != NULL && *depth != '\0' && parse_queue_depth(depth, err, err_len) != 0)
        return -1;
    return 0;
}

uint64_t fake_kernel_base_ns(const char *name)
{
    for (size_t i = 0; i < g.named_count; i++)
        if (strcmp(g.named[i].name, name) == 0)
            return g.named[i].ns;
    return g.default_ns;
}

uint64_t fake_kernel_per_block_ns(void)
{
    return g.per_block_ns;
}

uint64_t fake_kernel_duration_ns(uint64_t base_ns, uint64_t per_block_ns, uint64_t blocks)
{
    if (per_block_ns != 0 && blocks > (FAKE_MAX_KERNEL_NS - base_ns) / per_block_ns)
        return FAKE_MAX_KERNEL_NS;
    return base_ns + per_block_ns * blocks;
}

uint32_t fake_queue_depth(void)
{
    return g.queue_depth;
}
