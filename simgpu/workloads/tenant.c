/*
 * tenant.c: one configurable GPU tenant, an ordinary driver-API program built against cuda.h
 * and linked to (fake) libcuda. It reaches the launch entry point the way a chosen kind of real
 * program does, so the tests can show the hook catches each way:
 *
 *   --path linked           the link-time symbol (what a program linked with -lcuda calls)
 *          dlsym            dlopen("libcuda.so.1") + dlsym(handle, "<versioned name>")
 *          rtld-default     dlsym(RTLD_DEFAULT, ...)        rtld-next   dlsym(RTLD_NEXT, ...)
 *          procaddr-legacy  dlsym(handle, "cuGetProcAddress"), re-resolve the resolver through
 *                           itself at 11030, then look the BASE name up (CUDA 11.3-11.8 style)
 *          procaddr-v2      the same with cuGetProcAddress_v2 and 12000: what cudart 12/13 does
 *   --ptsz                  the per-thread-default-stream variant (_ptsz name, or the
 *                           CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM flag)
 *   --api kernel|ex|coop|graph   cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel,
 *                           cuGraphLaunch (a graph of --graph-nodes kernel nodes)
 *
 * A fake kernel runs --duration-us microseconds (its first parameter: the simulated GPU's spin
 * kernel, see the fake driver). Launches are asynchronous, as on a real GPU; --sync says when the
 * tenant waits for its kernels (cuStreamSynchronize of the stream it launches on, which the hook
 * does not gate): each (default: after every launch, as a tenant that times its kernels does),
 * end (once, when its launches are done, so the final counts include every kernel) or none (it
 * exits with its kernels still queued, which the driver then drops).
 * It runs --launches N launches (default 10), or for --seconds S, optionally in bursts
 * (--burst-on-ms / --burst-off-ms) from --threads T threads, after allocating --alloc SIZE bytes
 * (plain, or with a suffix k/K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (powers of 1024); or
 * --alloc-mb MiB), starting at CLOCK_MONOTONIC --start-at-ns. The first launch error stops it
 * unless --keep-going. A refused allocation never stops it: it prints the error and launches.
 * With --report-interval-s R > 0 and neither --launches nor --seconds > 0, it runs until SIGTERM.
 * SIGTERM stops it after the launches in flight (at most 1 s later), prints the final line and
 * exits 0.
 *
 * Output, one JSON object a line, flushed as it goes:
 *   {"event": "alloc_error", "code", "name", "bytes"}   the allocation was refused
 *   {"event": "start", "pid", "mem_free", "mem_total", "alloc_bytes", "alloc_error",
 *    "alloc_error_name", "meminfo_error"}             cuMemGetInfo after the allocation; printed
 *                                                      when --alloc(-mb) or reports are asked for
 *   {"event": "report", "t", "launches", "errors", "interval_launches", "alloc_error"}
 *                                                      every R s (t: s since the launches began;
 *                                                      launches: successful, cumulative)
 *   the final line, always last: pid, api, path, ptsz, threads, launches (successful), errors,
 *   first_error (+ _name), alloc_error, resolved, elapsed_s, terminated (by SIGTERM), first_launch_ms
 *   (wall time of the first launch call, which connects to the arbiter), max_later_launch_ms (the
 *   longest of the other launch calls: any wait for a token, or for room in the stream's queue).
 * Exit: 0 ok (or stopped by SIGTERM), 1 setup failed, 2 launch errors, 3 the entry point could
 * not be resolved, 64 bad usage.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <dlfcn.h>
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The _ptsz entry points, as a program built with --default-stream per-thread links them. */
CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                     unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned int, unsigned int, unsigned int,
                                                unsigned int, unsigned int, unsigned int, unsigned int,
                                                CUstream, void **);
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec, CUstream);

enum api { API_KERNEL, API_EX, API_COOP, API_GRAPH };
enum sync { SYNC_EACH, SYNC_END, SYNC_NONE };
static const char *const syncs[] = {"each", "end", "none"};

struct api_info {
    const char *option, *symbol, *symbol_ptsz, *base;
    int version, version_ptsz; /* the CUDA version each ABI appeared in, as cudart asks */
    void *linked, *linked_ptsz;
};

static const struct api_info apis[] = {
    [API_KERNEL] = {"kernel", "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernel", 4000, 7000,
                    (void *)cuLaunchKernel, (void *)cuLaunchKernel_ptsz},
    [API_EX] = {"ex", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz", "cuLaunchKernelEx", 11060, 11060,
                (void *)cuLaunchKernelEx, (void *)cuLaunchKernelEx_ptsz},
    [API_COOP] = {"coop", "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz",
                  "cuLaunchCooperativeKernel", 9000, 9000, (void *)cuLaunchCooperativeKernel,
                  (void *)cuLaunchCooperativeKernel_ptsz},
    [API_GRAPH] = {"graph", "cuGraphLaunch", "cuGraphLaunch_ptsz", "cuGraphLaunch", 10000, 10000,
                   (void *)cuGraphLaunch, (void *)cuGraphLaunch_ptsz},
};

static const char *const paths[] = {"linked", "dlsym", "rtld-default", "rtld-next", "procaddr-legacy",
                                    "procaddr-v2"};
enum path { PATH_LINKED, PATH_DLSYM, PATH_RTLD_DEFAULT, PATH_RTLD_NEXT, PATH_PROCADDR_LEGACY, PATH_PROCADDR_V2 };

struct tenant {
    /* options */
    enum api api;
    enum path path;
    int ptsz, procaddr_version, threads, graph_nodes, keep_going, sync;
    unsigned long long duration_us;
    long launches;
    double seconds, burst_on_ms, burst_off_ms, report_interval_s;
    unsigned long long alloc_bytes, start_at_ns;
    /* set up */
    CUcontext ctx;
    CUfunction func;
    CUgraphExec exec;
    void *launch_fn;
    uint64_t end_ns;
    /* results (atomic) */
    long issued, ok, errors, timed;
    uint64_t first_launch_ns, max_later_launch_ns; /* wall time of a launch call, gate wait included */
    int first_error, stop;
    /* workers still running: under done_lock, signalled on done_cond */
    int active;
    pthread_mutex_t done_lock;
    pthread_cond_t done_cond;
};

#define TERM_GRACE_NS UINT64_C(1000000000) /* after SIGTERM, wait this long for launches in flight */
#define POLL_NS UINT64_C(100000000)        /* how often the main thread looks for SIGTERM */

static volatile sig_atomic_t terminated; /* SIGTERM arrived */

static void on_sigterm(int signo)
{
    (void)signo;
    terminated = 1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t when)
{
    struct timespec ts = {.tv_sec = (time_t)(when / 1000000000u), .tv_nsec = (long)(when % 1000000000u)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
}

static const char *error_name(int code)
{
    const char *name = NULL;
    if (cuGetErrorName((CUresult)code, &name) != CUDA_SUCCESS || name == NULL)
        return "unknown";
    return name;
}

/* --alloc: a whole number of bytes, "1.5Gi", "512Mi", "2G" (decimal suffixes k/K, M, G, T as in
 * Kubernetes quantities, binary Ki, Mi, Gi, Ti). 0 or -1. */
static int parse_size(const char *text, unsigned long long *bytes)
{
    static const struct { const char *suffix; unsigned long long factor; } suffixes[] = {
        {"Ki", 1ULL << 10}, {"Mi", 1ULL << 20}, {"Gi", 1ULL << 30}, {"Ti", 1ULL << 40}, {"k", 1000ULL},
        {"K", 1000ULL}, {"M", 1000000ULL}, {"G", 1000000000ULL}, {"T", 1000000000000ULL}, {"", 1ULL},
    };
    const char *p = text;
    unsigned __int128 whole = 0, fraction = 0, scale = 1;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++)
        if ((whole = whole * 10 + (unsigned)(*p - '0')) > UINT64_MAX)
            return -1;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, digits++) {
            if (scale >= (unsigned __int128)1000000000000000000ULL)
                return -1; /* more fraction digits than any byte count needs */
            fraction = fraction * 10 + (unsigned)(*p - '0');
            scale *= 10;
        }
    }
    if (digits == 0)
        return -1;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        if (strcmp(p, suffixes[i].suffix) != 0)
            continue;
        unsigned __int128 part = fraction * suffixes[i].factor;
        unsigned __int128 value = whole * suffixes[i].factor + part / scale;
        if (part % scale != 0 || value > UINT64_MAX)
            return -1; /* not a whole number of bytes, or too large */
        *bytes = (unsigned long long)value;
        return 0;
    }
    return -1;
}

/* --- options ------------------------------------------------------------------------------ */

static int lookup(const char *value, const char *const *names, int count)
{
    for (int i = 0; i < count; i++)
        if (strcmp(value, names[i]) == 0)
            return i;
    return -1;
}

static int parse_api(const char *value)
{
    for (int i = 0; i < (int)(sizeof apis / sizeof apis[0]); i++)
        if (strcmp(value, apis[i].option) == 0)
            return i;
    return -1;
}

static void usage(void)
{
    fprintf(stderr, "usage: tenant [--api kernel|ex|coop|graph] [--path linked|dlsym|rtld-default|rtld-next|"
                    "procaddr-legacy|procaddr-v2] [--ptsz] [--procaddr-version N] [--duration-us N] "
                    "[--launches N] [--seconds S] [--burst-on-ms A --burst-off-ms B] [--threads T] "
                    "[--graph-nodes K] [--alloc SIZE | --alloc-mb M] [--start-at-ns T] [--keep-going] "
                    "[--report-interval-s R] [--sync each|end|none]\n");
    exit(64);
}

static void parse_options(int argc, char **argv, struct tenant *t)
{
    static const struct option options[] = {
        {"api", required_argument, 0, 'a'},         {"path", required_argument, 0, 'p'},
        {"ptsz", no_argument, 0, 'z'},              {"procaddr-version", required_argument, 0, 'v'},
        {"duration-us", required_argument, 0, 'd'}, {"launches", required_argument, 0, 'n'},
        {"seconds", required_argument, 0, 's'},     {"burst-on-ms", required_argument, 0, 'o'},
        {"burst-off-ms", required_argument, 0, 'f'}, {"threads", required_argument, 0, 't'},
        {"graph-nodes", required_argument, 0, 'g'}, {"alloc-mb", required_argument, 0, 'm'},
        {"start-at-ns", required_argument, 0, 'w'}, {"keep-going", no_argument, 0, 'k'},
        {"alloc", required_argument, 0, 'A'},       {"report-interval-s", required_argument, 0, 'r'},
        {"sync", required_argument, 0, 'S'},        {0, 0, 0, 0},
    };
    *t = (struct tenant){.api = API_KERNEL, .path = PATH_LINKED, .threads = 1, .graph_nodes = 1,
                         .duration_us = 1000, .launches = -1};
    int opt, value;
    while ((opt = getopt_long(argc, argv, "", options, NULL)) != -1) {
        switch (opt) {
        case 'a': if ((value = parse_api(optarg)) < 0) usage(); t->api = (enum api)value; break;
        case 'p': if ((value = lookup(optarg, paths, 6)) < 0) usage(); t->path = (enum path)value; break;
        case 'z': t->ptsz = 1; break;
        case 'v': t->procaddr_version = atoi(optarg); break;
        case 'd': t->duration_us = strtoull(optarg, NULL, 10); break;
        case 'n': t->launches = atol(optarg); break;
        case 's': t->seconds = atof(optarg); break;
        case 'o': t->burst_on_ms = atof(optarg); break;
        case 'f': t->burst_off_ms = atof(optarg); break;
        case 't': t->threads = atoi(optarg); break;
        case 'g': t->graph_nodes = atoi(optarg); break;
        case 'm': t->alloc_bytes = strtoull(optarg, NULL, 10) << 20; break;
        case 'A': if (parse_size(optarg, &t->alloc_bytes) != 0) usage(); break;
        case 'r': t->report_interval_s = atof(optarg); break;
        case 'w': t->start_at_ns = strtoull(optarg, NULL, 10); break;
        case 'k': t->keep_going = 1; break;
        case 'S': if ((value = lookup(optarg, syncs, 3)) < 0) usage(); t->sync = value; break;
        default: usage();
        }
    }
    if (optind != argc || t->threads < 1 || t->graph_nodes < 1 || (t->burst_on_ms > 0) != (t->burst_off_ms > 0) ||
        t->report_interval_s < 0)
        usage();
    if (t->launches < 0) /* 0: no count limit; with reports and no --seconds: until SIGTERM */
        t->launches = t->seconds > 0 || t->report_interval_s > 0 ? 0 : 10;
}

/* --- resolving the launch entry point ------------------------------------------------------ */

static void *driver_handle(void)
{
    void *handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL)
        fprintf(stderr, "tenant: dlopen(libcuda.so.1): %s\n", dlerror());
    return handle;
}

static void *resolve_procaddr(const struct tenant *t, const struct api_info *info, int v2)
{
    void *handle = driver_handle();
    if (handle == NULL)
        return NULL;
    int version = t->procaddr_version ? t->procaddr_version : (t->ptsz ? info->version_ptsz : info->version);
    cuuint64_t flags = t->ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
    void *fn = NULL;
    CUresult r;
    if (v2) {
        PFN_cuGetProcAddress_v12000 gpa = (PFN_cuGetProcAddress_v12000)dlsym(handle, "cuGetProcAddress_v2");
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
        void *again = NULL; /* cudart re-resolves the resolver through itself */
        if (gpa == NULL || gpa("cuGetProcAddress", &again, 12000, 0, &status) != CUDA_SUCCESS || again == NULL)
            return NULL;
        gpa = (PFN_cuGetProcAddress_v12000)again;
        r = gpa(info->base, &fn, version, flags, &status);
        if (r != CUDA_SUCCESS)
            fprintf(stderr, "tenant: cuGetProcAddress_v2(%s, %d): error %d, status %d\n", info->base, version,
                    (int)r, (int)status);
    } else {
        PFN_cuGetProcAddress_v11030 gpa = (PFN_cuGetProcAddress_v11030)dlsym(handle, "cuGetProcAddress");
        void *again = NULL;
        if (gpa == NULL || gpa("cuGetProcAddress", &again, 11030, 0) != CUDA_SUCCESS || again == NULL)
            return NULL;
        gpa = (PFN_cuGetProcAddress_v11030)again;
        r = gpa(info->base, &fn, version, flags);
        if (r != CUDA_SUCCESS)
            fprintf(stderr, "tenant: cuGetProcAddress(%s, %d): error %d\n", info->base, version, (int)r);
    }
    return r == CUDA_SUCCESS ? fn : NULL;
}

static void *resolve(const struct tenant *t)
{
    const struct api_info *info = &apis[t->api];
    const char *symbol = t->ptsz ? info->symbol_ptsz : info->symbol;
    void *handle;
    switch (t->path) {
    case PATH_LINKED: return t->ptsz ? info->linked_ptsz : info->linked;
    case PATH_DLSYM: return (handle = driver_handle()) != NULL ? dlsym(handle, symbol) : NULL;
    case PATH_RTLD_DEFAULT: return dlsym(RTLD_DEFAULT, symbol);
    case PATH_RTLD_NEXT: return dlsym(RTLD_NEXT, symbol);
    case PATH_PROCADDR_LEGACY: return resolve_procaddr(t, info, 0);
    case PATH_PROCADDR_V2: return resolve_procaddr(t, info, 1);
    }
    return NULL;
}

/* --- setup -------------------------------------------------------------------------------- */

#define SETUP(call)                                                                                \
    do {                                                                                           \
        CUresult setup_result = (call);                                                            \
        if (setup_result != CUDA_SUCCESS) {                                                        \
            fprintf(stderr, "tenant: %s failed: %s\n", #call, error_name(setup_result));           \
            return -1;                                                                             \
        }                                                                                          \
    } while (0)

static int build_graph(struct tenant *t)
{
    CUgraph graph;
    SETUP(cuGraphCreate(&graph, 0));
    unsigned long long us = t->duration_us;
    void *params[] = {&us};
    CUDA_KERNEL_NODE_PARAMS node_params = {.func = t->func, .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1,
                                           .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1,
                                           .kernelParams = params};
    CUgraphNode previous = NULL, node;
    for (int i = 0; i < t->graph_nodes; i++) {
        SETUP(cuGraphAddKernelNode(&node, graph, previous ? &previous : NULL, previous ? 1 : 0, &node_params));
        previous = node;
    }
    SETUP(cuGraphInstantiate(&t->exec, graph, 0));
    SETUP(cuGraphDestroy(graph));
    return 0;
}

static int setup(struct tenant *t)
{
    CUdevice dev;
    CUmodule module;
    SETUP(cuInit(0));
    SETUP(cuDeviceGet(&dev, 0));
#if CUDA_VERSION >= 13000
    SETUP(cuCtxCreate(&t->ctx, NULL, 0, dev)); /* _v4 in 13.x headers (pitfall 5) */
#else
    SETUP(cuCtxCreate(&t->ctx, 0, dev)); /* _v2 in 12.x headers */
#endif
    SETUP(cuModuleLoadData(&module, "FAKECUBIN tenant"));
    SETUP(cuModuleGetFunction(&t->func, module, "spin"));
    return t->api == API_GRAPH ? build_graph(t) : 0;
}

/* --- launching ---------------------------------------------------------------------------- */

static CUresult launch_once(const struct tenant *t)
{
    unsigned long long us = t->duration_us;
    void *params[] = {&us};
    switch (t->api) {
    case API_KERNEL:
        return ((PFN_cuLaunchKernel_v4000)t->launch_fn)(t->func, 1, 1, 1, 32, 1, 1, 0, NULL, params, NULL);
    case API_EX: {
        CUlaunchConfig config = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32, .blockDimY = 1,
                                 .blockDimZ = 1};
        return ((PFN_cuLaunchKernelEx_v11060)t->launch_fn)(&config, t->func, params, NULL);
    }
    case API_COOP:
        return ((PFN_cuLaunchCooperativeKernel_v9000)t->launch_fn)(t->func, 1, 1, 1, 32, 1, 1, 0, NULL, params);
    case API_GRAPH:
        return ((PFN_cuGraphLaunch_v10000)t->launch_fn)(t->exec, NULL);
    }
    return CUDA_ERROR_INVALID_VALUE;
}

/* May this thread launch once more? Sleeps through burst off-periods. */
static int next_launch(struct tenant *t, uint64_t *burst_start)
{
    if (__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE) || terminated)
        return 0;
    if (t->burst_on_ms > 0 && now_ns() - *burst_start >= (uint64_t)(t->burst_on_ms * 1e6)) {
        sleep_until(now_ns() + (uint64_t)(t->burst_off_ms * 1e6));
        *burst_start = now_ns();
    }
    if (t->seconds > 0 && now_ns() >= t->end_ns)
        return 0;
    return t->launches == 0 || __atomic_fetch_add(&t->issued, 1, __ATOMIC_RELAXED) < t->launches;
}

static void worker_done(struct tenant *t)
{
    pthread_mutex_lock(&t->done_lock);
    t->active--;
    pthread_cond_broadcast(&t->done_cond);
    pthread_mutex_unlock(&t->done_lock);
}

/* The first launch call's wall time (it connects to the arbiter) and the longest of the others. */
static void note_latency(struct tenant *t, uint64_t took_ns)
{
    if (__atomic_fetch_add(&t->timed, 1, __ATOMIC_RELAXED) == 0) {
        __atomic_store_n(&t->first_launch_ns, took_ns, __ATOMIC_RELAXED);
        return;
    }
    uint64_t seen = __atomic_load_n(&t->max_later_launch_ns, __ATOMIC_RELAXED);
    while (seen < took_ns && !__atomic_compare_exchange_n(&t->max_later_launch_ns, &seen, took_ns, 1,
                                                          __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
}

/* Waits for this thread's kernels: the stream it launches on (NULL through a _ptsz entry point is
 * the thread's per-thread default stream). */
static void wait_for_kernels(const struct tenant *t)
{
    cuStreamSynchronize(t->ptsz ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY);
}

static void launch_loop(struct tenant *t)
{
    if (cuCtxSetCurrent(t->ctx) != CUDA_SUCCESS)
        return;
    uint64_t burst_start = now_ns();
    while (next_launch(t, &burst_start)) {
        uint64_t called = now_ns();
        CUresult r = launch_once(t);
        note_latency(t, now_ns() - called);
        if (r == CUDA_SUCCESS) {
            __atomic_fetch_add(&t->ok, 1, __ATOMIC_RELAXED);
            if (t->sync == SYNC_EACH)
                wait_for_kernels(t);
            continue;
        }
        __atomic_fetch_add(&t->errors, 1, __ATOMIC_RELAXED);
        int none = 0;
        __atomic_compare_exchange_n(&t->first_error, &none, (int)r, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        if (!t->keep_going)
            __atomic_store_n(&t->stop, 1, __ATOMIC_RELEASE);
    }
}

static void *worker(void *arg)
{
    struct tenant *t = arg;
    launch_loop(t);
    if (t->sync != SYNC_NONE)
        wait_for_kernels(t);
    worker_done(t);
    return NULL;
}

static void report(const struct tenant *t, uint64_t since_start_ns, long *reported, int alloc_error)
{
    long ok = __atomic_load_n(&t->ok, __ATOMIC_RELAXED);
    printf("{\"event\": \"report\", \"t\": %.3f, \"launches\": %ld, \"errors\": %ld, \"interval_launches\": %ld, "
           "\"alloc_error\": %d}\n",
           (double)since_start_ns / 1e9, ok, __atomic_load_n(&t->errors, __ATOMIC_RELAXED), ok - *reported,
           alloc_error);
    fflush(stdout);
    *reported = ok;
}

/* Runs the workers; reports every --report-interval-s while they run. Returns the elapsed
 * seconds; *abandoned is set when SIGTERM came and a launch was still in flight after the grace
 * period (the caller then exits without waiting for it). */
static double run(struct tenant *t, int alloc_error, int *abandoned)
{
    if (t->start_at_ns > now_ns())
        sleep_until(t->start_at_ns);
    uint64_t start = now_ns();
    t->end_ns = start + (uint64_t)(t->seconds * 1e9);
    uint64_t interval = (uint64_t)(t->report_interval_s * 1e9);
    uint64_t next_report = interval > 0 ? start + interval : UINT64_MAX, term_seen = 0;
    long reported = 0;
    pthread_t threads[64];
    int started = 0;
    pthread_mutex_lock(&t->done_lock);
    for (; started < t->threads && started < 64; started++) {
        if (pthread_create(&threads[started], NULL, worker, t) != 0)
            break;
        t->active++;
    }
    while (t->active > 0) {
        uint64_t now = now_ns();
        if (now >= next_report) {
            pthread_mutex_unlock(&t->done_lock);
            report(t, now - start, &reported, alloc_error);
            pthread_mutex_lock(&t->done_lock);
            next_report += interval;
            if (next_report <= now)
                next_report = now + interval;
            continue;
        }
        if (terminated && term_seen == 0)
            term_seen = now;
        if (term_seen != 0 && now - term_seen >= TERM_GRACE_NS)
            break;
        uint64_t wake = now + POLL_NS < next_report ? now + POLL_NS : next_report;
        struct timespec until = {.tv_sec = (time_t)(wake / 1000000000u), .tv_nsec = (long)(wake % 1000000000u)};
        pthread_cond_timedwait(&t->done_cond, &t->done_lock, &until);
    }
    uint64_t end = now_ns();
    *abandoned = t->active > 0;
    pthread_mutex_unlock(&t->done_lock);
    if (!*abandoned)
        for (int i = 0; i < started; i++)
            pthread_join(threads[i], NULL);
    return (double)(end - start) / 1e9;
}

static void init_sync(struct tenant *t)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&t->done_cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&t->done_lock, NULL);
    struct sigaction action = {.sa_handler = on_sigterm};
    sigemptyset(&action.sa_mask);
    sigaction(SIGTERM, &action, NULL);
}

/* The allocation (refused: one line naming the error) and the memory the process then sees. */
static CUresult allocate(const struct tenant *t, CUdeviceptr *memory)
{
    CUresult alloc_error = t->alloc_bytes ? cuMemAlloc(memory, (size_t)t->alloc_bytes) : CUDA_SUCCESS;
    if (alloc_error != CUDA_SUCCESS) {
        *memory = 0;
        printf("{\"event\": \"alloc_error\", \"code\": %d, \"name\": \"%s\", \"bytes\": %llu}\n", (int)alloc_error,
               error_name(alloc_error), t->alloc_bytes);
    }
    if (t->alloc_bytes || t->report_interval_s > 0) {
        size_t mem_free = 0, mem_total = 0;
        CUresult info = cuMemGetInfo(&mem_free, &mem_total);
        printf("{\"event\": \"start\", \"pid\": %d, \"mem_free\": %zu, \"mem_total\": %zu, \"alloc_bytes\": %llu, "
               "\"alloc_error\": %d, \"alloc_error_name\": \"%s\", \"meminfo_error\": %d}\n",
               (int)getpid(), mem_free, mem_total, t->alloc_bytes, (int)alloc_error,
               alloc_error ? error_name(alloc_error) : "", (int)info);
    }
    fflush(stdout);
    return alloc_error;
}

int main(int argc, char **argv)
{
    struct tenant t;
    parse_options(argc, argv, &t);
    init_sync(&t);
    if (setup(&t) != 0)
        return 1;
    CUdeviceptr memory = 0;
    CUresult alloc_error = allocate(&t, &memory);
    t.launch_fn = resolve(&t);
    int abandoned = 0;
    double elapsed = t.launch_fn != NULL ? run(&t, (int)alloc_error, &abandoned) : 0.0;
    printf("{\"pid\": %d, \"api\": \"%s\", \"path\": \"%s\", \"ptsz\": %s, \"threads\": %d, \"launches\": %ld, "
           "\"errors\": %ld, \"first_error\": %d, \"first_error_name\": \"%s\", \"alloc_error\": %d, "
           "\"resolved\": %s, \"elapsed_s\": %.6f, \"terminated\": %s, \"first_launch_ms\": %.3f, "
           "\"max_later_launch_ms\": %.3f}\n",
           (int)getpid(), apis[t.api].option, paths[t.path], t.ptsz ? "true" : "false", t.threads, t.ok, t.errors,
           t.first_error, t.first_error ? error_name(t.first_error) : "", (int)alloc_error,
           t.launch_fn ? "true" : "false", elapsed, terminated ? "true" : "false", (double)t.first_launch_ns / 1e6,
           (double)t.max_later_launch_ns / 1e6);
    fflush(stdout);
    if (abandoned)
        _exit(0); /* SIGTERM, and a launch still in flight: the driver frees what it holds */
    if (memory != 0)
        cuMemFree(memory);
    if (t.launch_fn == NULL)
        return 3;
    if (terminated)
        return 0;
    return t.errors > 0 ? 2 : 0;
}
