/*
 * tenant.c: the GPU-day tenant, a driver-API program (cudrv.h: the driver found through
 * cuGetProcAddress_v2) that loads kernels.cu's PTX with cuModuleLoadData and launches one of its
 * kernels with cuLaunchKernel, on the real GPU or the simulated one alike.
 *
 *   tenant --ptx FILE [--kernel spin|empty] [--iters N] [--grid G] [--block B]
 *          [--seconds S | --launches N] [--depth D] [--timing events|none]
 *          [--burst-on-ms X --burst-off-ms Y] [--start-at-ns T]
 *   tenant --ptx FILE --calibrate-us U [--grid G] [--block B]
 *
 * A run launches for --seconds (or --launches N) from CLOCK_MONOTONIC --start-at-ns on, keeping
 * up to --depth kernels in flight on the legacy default stream (so a real GPU's queue holds
 * kernels past a token's end, as a framework's does). --grid 0 (the default) is one block per SM.
 * Timing "events" (default) brackets every kernel with two CUDA events (GPU timestamps) and sums
 * their elapsed times; "none" records nothing and synchronizes the context every --depth launches
 * (0: only at the end), for the launch overhead. Without events in the driver, depth 1 times each
 * launch + cuCtxSynchronize on the host clock ("timing": "host").
 * --calibrate-us U finds the --iters for which one spin kernel alone takes U microseconds.
 *
 * Output, one JSON line: the run's summary (pid, kernel, iters, grid, block, depth, sm_count,
 * clock_khz, context, timing, launches, busy_ms (null when not timed), wall_ms, launch_call_ns
 * (mean time inside cuLaunchKernel), first_error, first_error_name), or {"iters", "kernel_ms"} for
 * --calibrate-us, or {"error", "stage"} when setting up failed.
 * Exit: 0 ok, 1 setup failed, 2 a launch failed, 64 bad usage.
 */
#define _GNU_SOURCE
#include "cudrv.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_DEPTH 256

struct options {
    const char *ptx, *kernel, *timing;
    unsigned long long iters;
    unsigned grid, block;
    int depth;
    double seconds, on_ms, off_ms, calibrate_us;
    long launches;
    long long start_at_ns;
};

struct ring {
    CUevent begin[MAX_DEPTH], end[MAX_DEPTH];
    int used[MAX_DEPTH];
};

struct gpu {
    struct cudrv drv;
    CUfunction function;
    const char *context;
    int sm_count, clock_khz, events;
    struct ring ring; /* with events: a begin and an end event per kernel in flight */
};

struct tally {
    long launches;
    double busy_ms, launch_call_ns;
    int timed; /* busy_ms means something */
    CUresult first_error;
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* `text` as a JSON string (quotes, backslashes and control characters escaped). */
static void print_json_string(const char *text)
{
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c < 0x20)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
    putchar('"');
}

static void fail_setup(const char *stage, const char *why)
{
    fprintf(stderr, "tenant: %s: %s\n", stage, why);
    printf("{\"error\": ");
    print_json_string(why);
    printf(", \"stage\": ");
    print_json_string(stage);
    printf("}\n");
    exit(1);
}

static void usage(const char *why)
{
    fprintf(stderr, "tenant: %s\n", why);
    exit(64);
}

static double parse_number(const char *flag, const char *text, double low)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !isfinite(value) || value < low) {
        char why[160];
        snprintf(why, sizeof why, "--%s: '%s' is not a number >= %g", flag, text, low);
        usage(why);
    }
    return value;
}

static void parse_options(int argc, char **argv, struct options *o)
{
    static const struct option long_options[] = {
        {"ptx", required_argument, 0, 'p'},          {"kernel", required_argument, 0, 'k'},
        {"iters", required_argument, 0, 'i'},        {"grid", required_argument, 0, 'g'},
        {"block", required_argument, 0, 'b'},        {"depth", required_argument, 0, 'd'},
        {"timing", required_argument, 0, 't'},       {"seconds", required_argument, 0, 's'},
        {"launches", required_argument, 0, 'n'},     {"burst-on-ms", required_argument, 0, 'o'},
        {"burst-off-ms", required_argument, 0, 'f'}, {"start-at-ns", required_argument, 0, 'a'},
        {"calibrate-us", required_argument, 0, 'c'}, {0, 0, 0, 0},
    };
    *o = (struct options){.kernel = "spin", .timing = "events", .iters = 1000, .block = 128, .depth = 1};
    int c, index = 0;
    while ((c = getopt_long(argc, argv, "", long_options, &index)) != -1) {
        const char *flag = c == '?' ? "?" : long_options[index].name;
        switch (c) {
        case 'p': o->ptx = optarg; break;
        case 'k': o->kernel = optarg; break;
        case 't': o->timing = optarg; break;
        case 'i': o->iters = (unsigned long long)parse_number(flag, optarg, 0); break;
        case 'g': o->grid = (unsigned)parse_number(flag, optarg, 0); break;
        case 'b': o->block = (unsigned)parse_number(flag, optarg, 1); break;
        case 'd': o->depth = (int)parse_number(flag, optarg, 0); break;
        case 's': o->seconds = parse_number(flag, optarg, 0); break;
        case 'n': o->launches = (long)parse_number(flag, optarg, 0); break;
        case 'o': o->on_ms = parse_number(flag, optarg, 0); break;
        case 'f': o->off_ms = parse_number(flag, optarg, 0); break;
        case 'a': o->start_at_ns = (long long)parse_number(flag, optarg, 0); break;
        case 'c': o->calibrate_us = parse_number(flag, optarg, 1); break;
        default: usage("unknown option (see the comment at the top of bench/gpu/tenant.c)");
        }
    }
    if (o->ptx == NULL)
        usage("--ptx FILE is required (kernels.cu compiled with nvcc -ptx)");
    if (strcmp(o->kernel, "spin") != 0 && strcmp(o->kernel, "empty") != 0)
        usage("--kernel: allowed are spin and empty");
    if (strcmp(o->timing, "events") != 0 && strcmp(o->timing, "none") != 0)
        usage("--timing: allowed are events and none");
    if (o->depth > MAX_DEPTH || (o->depth == 0 && strcmp(o->timing, "events") == 0))
        usage("--depth: 1..256 with --timing events, 0..256 with --timing none");
    if (o->seconds <= 0 && o->launches <= 0 && o->calibrate_us <= 0)
        usage("give --seconds S, --launches N or --calibrate-us U");
}

static void check(struct gpu *g, CUresult status, const char *stage)
{
    if (status != CUDA_SUCCESS)
        fail_setup(stage, cudrv_error_name(&g->drv, status));
}

static void make_events(struct gpu *g, int depth)
{
    for (int i = 0; g->events && i < depth; i++)
        if (g->drv.event_create(&g->ring.begin[i], CU_EVENT_DEFAULT) != CUDA_SUCCESS ||
            g->drv.event_create(&g->ring.end[i], CU_EVENT_DEFAULT) != CUDA_SUCCESS)
            g->events = 0; /* a driver that cannot make events: host timing */
}

static void set_up(struct gpu *g, const struct options *o)
{
    char why[256];
    if (cudrv_load(&g->drv, why, sizeof why) != 0)
        fail_setup("load the driver", why);
    CUdevice device;
    CUcontext ctx;
    CUmodule module;
    check(g, g->drv.init(0), "cuInit");
    check(g, g->drv.device_get(&device, 0), "cuDeviceGet");
    if (g->drv.device_attribute(&g->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device) != CUDA_SUCCESS)
        g->sm_count = -1;
    if (g->drv.device_attribute(&g->clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, device) != CUDA_SUCCESS)
        g->clock_khz = -1;
    check(g, cudrv_context(&g->drv, device, &ctx, &g->context), "make a context");
    char *image = cudrv_read_file(o->ptx, why, sizeof why);
    if (image == NULL)
        fail_setup("read the PTX", why);
    check(g, g->drv.module_load_data(&module, image), "cuModuleLoadData");
    free(image);
    check(g, g->drv.module_get_function(&g->function, module, o->kernel), "cuModuleGetFunction");
    g->events = strcmp(o->timing, "events") == 0 && cudrv_has_events(&g->drv);
    make_events(g, o->depth > 0 ? o->depth : 1);
}

static unsigned grid_of(const struct gpu *g, const struct options *o)
{
    return o->grid > 0 ? o->grid : (unsigned)(g->sm_count > 0 ? g->sm_count : 1);
}

/* One launch; the time spent inside cuLaunchKernel goes to the tally. */
static CUresult launch(struct gpu *g, const struct options *o, unsigned long long iters, struct tally *t)
{
    void *params[] = {&iters};
    double before = now_ms();
    CUresult status = g->drv.launch_kernel(g->function, grid_of(g, o), 1, 1, o->block, 1, 1, 0, NULL, params, NULL);
    t->launch_call_ns += (now_ms() - before) * 1e6;
    return status;
}

/* Wait for the kernel in `slot` and add its GPU time. */
static void collect(struct gpu *g, int slot, struct tally *t)
{
    struct ring *r = &g->ring;
    float ms = 0;
    if (g->drv.event_synchronize(r->end[slot]) == CUDA_SUCCESS &&
        g->drv.event_elapsed(&ms, r->begin[slot], r->end[slot]) == CUDA_SUCCESS)
        t->busy_ms += ms;
    r->used[slot] = 0;
}

static void drain(struct gpu *g, struct tally *t)
{
    for (int slot = 0; slot < MAX_DEPTH; slot++)
        if (g->ring.used[slot])
            collect(g, slot, t);
    if (!g->events)
        g->drv.ctx_synchronize();
}

/* One kernel, timed: with events, or launch + cuCtxSynchronize on the host clock. */
static CUresult timed_launch(struct gpu *g, const struct options *o, long n, struct tally *t)
{
    struct ring *r = &g->ring;
    if (g->events) {
        int slot = (int)(n % o->depth);
        if (r->used[slot])
            collect(g, slot, t);
        g->drv.event_record(r->begin[slot], NULL);
        CUresult status = launch(g, o, o->iters, t);
        g->drv.event_record(r->end[slot], NULL);
        r->used[slot] = status == CUDA_SUCCESS;
        return status;
    }
    double before = now_ms();
    CUresult status = launch(g, o, o->iters, t);
    if (status == CUDA_SUCCESS && o->depth > 0 && (n + 1) % o->depth == 0)
        status = g->drv.ctx_synchronize();
    if (o->depth == 1)
        t->busy_ms += now_ms() - before;
    return status;
}

static void wait_for_start(long long start_at_ns)
{
    if (start_at_ns <= 0)
        return;
    struct timespec at = {.tv_sec = start_at_ns / 1000000000LL, .tv_nsec = start_at_ns % 1000000000LL};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR) {
    }
}

static int in_burst_off(const struct options *o, double elapsed)
{
    return o->on_ms > 0 && fmod(elapsed, o->on_ms + o->off_ms) >= o->on_ms;
}

static double run(struct gpu *g, const struct options *o, struct tally *t)
{
    t->timed = g->events || o->depth == 1;
    wait_for_start(o->start_at_ns);
    double start = now_ms();
    for (long n = 0;; n++) {
        double elapsed = now_ms() - start;
        if ((o->launches > 0 && n >= o->launches) || (o->launches <= 0 && elapsed >= o->seconds * 1e3))
            break;
        if (in_burst_off(o, elapsed)) {
            drain(g, t);
            usleep(500);
            n--;
            continue;
        }
        CUresult status = timed_launch(g, o, n, t);
        if (status != CUDA_SUCCESS) {
            t->first_error = status;
            break;
        }
        t->launches++;
    }
    drain(g, t);
    return now_ms() - start;
}

/* Median of three timed single kernels, in ms. */
static double kernel_ms(struct gpu *g, const struct options *o, unsigned long long iters)
{
    struct options one = *o;
    one.iters = iters;
    one.depth = 1;
    double samples[3];
    for (int i = 0; i < 3; i++) {
        struct tally t = {0};
        if (timed_launch(g, &one, 0, &t) != CUDA_SUCCESS)
            fail_setup("calibrate", "the spin kernel failed to launch");
        drain(g, &t);
        samples[i] = t.busy_ms;
    }
    double low = fmin(samples[0], fmin(samples[1], samples[2]));
    double high = fmax(samples[0], fmax(samples[1], samples[2]));
    return samples[0] + samples[1] + samples[2] - low - high;
}

/* Scale the iterations until one kernel takes --calibrate-us (at most 12 tries), after 200 ms of
 * kernels that bring the GPU's clock up from idle to what a busy GPU runs at. */
static void calibrate(struct gpu *g, const struct options *o)
{
    double target_ms = o->calibrate_us / 1e3, warm_until = now_ms() + 200;
    while (now_ms() < warm_until)
        kernel_ms(g, o, 1ULL << 16);
    unsigned long long iters = 4096;
    double ms = kernel_ms(g, o, iters);
    for (int i = 0; i < 12 && fabs(ms - target_ms) > 0.02 * target_ms; i++) {
        if (ms < 0.05 * target_ms)
            iters *= 8; /* too short to scale from */
        else
            iters = (unsigned long long)((double)iters * target_ms / ms) + 1;
        if (iters > (1ULL << 40))
            break;
        ms = kernel_ms(g, o, iters);
    }
    printf("{\"iters\": %llu, \"kernel_ms\": %.4f, \"grid\": %u, \"block\": %u, \"sm_count\": %d, \"timing\": \"%s\"}\n",
           iters, ms, grid_of(g, o), o->block, g->sm_count, g->events ? "events" : "host");
}

static void print_summary(struct gpu *g, const struct options *o, const struct tally *t, double wall_ms)
{
    char busy[32] = "null";
    if (t->timed)
        snprintf(busy, sizeof busy, "%.3f", t->busy_ms);
    printf("{\"pid\": %d, \"kernel\": \"%s\", \"iters\": %llu, \"grid\": %u, \"block\": %u, \"depth\": %d, "
           "\"sm_count\": %d, \"clock_khz\": %d, \"context\": \"%s\", \"timing\": \"%s\", \"launches\": %ld, "
           "\"busy_ms\": %s, \"wall_ms\": %.3f, \"launch_call_ns\": %.1f, \"first_error\": %d, "
           "\"first_error_name\": \"%s\"}\n",
           (int)getpid(), o->kernel, o->iters, grid_of(g, o), o->block, o->depth, g->sm_count, g->clock_khz,
           g->context, g->events ? "events" : (o->depth == 1 ? "host" : "none"), t->launches, busy, wall_ms,
           t->launches ? t->launch_call_ns / (double)t->launches : 0.0, (int)t->first_error,
           cudrv_error_name(&g->drv, t->first_error));
}

int main(int argc, char **argv)
{
    struct options o;
    parse_options(argc, argv, &o);
    static struct gpu g;
    set_up(&g, &o);
    if (o.calibrate_us > 0) {
        calibrate(&g, &o);
        return 0;
    }
    struct tally t = {0};
    double wall_ms = run(&g, &o, &t);
    print_summary(&g, &o, &t, wall_ms);
    return t.first_error == CUDA_SUCCESS ? 0 : 2;
}
