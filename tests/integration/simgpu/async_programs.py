"""Programs for test_modules.py and test_async.py: the ``stream-probe`` driver-API program, real
module images made by NVIDIA's NVRTC (and nvcc where present), and running them.

``stream-probe`` (C, compiled here with gcc against the simulated ``libcuda.so``) runs a script of
driver calls given on its command line, commands separated by ``;``, and prints one JSON line a
command (``{"i": n, "op": ..., "rc": CUresult, ...}``), flushed as it goes, then
``{"op": "end", "log": [...]}``. Host functions and callbacks append their tag to the log (in the
order they ran), gates let a test hold a stream at a known point, and named threads run commands on
their own threads (per-thread default streams). Commands:

    load M HOW PATH        HOW: data, dataex, fatbinary (the 0x466243B1 wrapper), file, library, libfile
    link M TYPE:PATH...    cuLink* the inputs (TYPE ptx, cubin, fatbin, library, nvvm), load the output as M
    func F M NAME          cuModuleGetFunction (kernel F M NAME: cuLibraryGetKernel, used as a function)
    count M / params F / name F / attr F N / global M NAME (size, and a copy in and out of it)
    stream S [nonblocking] [prio=P] / destroy S / event E [notiming]
    launch F S [ptsz] [grid=N] [us=N]    (us: the spin kernel's parameter)
    record E S [ptsz] / wait S E [ptsz] / query S [ptsz] / equery E / sync S [ptsz] / esync E / ctxsync
    elapsed E1 E2 / host S TAG [ptsz] / callback S TAG / hostwait S GATE [ptsz] / open GATE
    waitfor TAG / log TAG / sleep MS / on T CMD... / spawn T CMD... / join T / pause / exit

A command run on a named thread logs ``T:done`` when it returns.

Streams ``null``, ``legacy`` and ``perthread`` are NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import attrs

REPO = Path(__file__).resolve().parents[3]
SIMGPU_BUILD = REPO / "simgpu" / "build"

# Variables of the outer environment that would change what the probe sees.
_SCRUBBED = ("LD_PRELOAD", "LD_LIBRARY_PATH", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
_SCRUBBED_PREFIX = "FASTGSHARE_"

PROBE_SOURCE = textwrap.dedent(r"""
    #define _GNU_SOURCE
    #include <cuda.h>
    #include <errno.h>
    #include <pthread.h>
    #include <stdint.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <time.h>
    #include <unistd.h>

    CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                                         unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
    CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream);
    CUresult CUDAAPI cuStreamQuery_ptsz(CUstream);
    CUresult CUDAAPI cuEventRecord_ptsz(CUevent, CUstream);
    CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream, CUevent, unsigned int);
    CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream, CUhostFn, void *);

    #define MAX_NAMED 64
    #define MAX_LOG 4096
    struct named { char name[64]; void *ptr; };
    static struct named modules[MAX_NAMED], functions[MAX_NAMED], streams[MAX_NAMED], events[MAX_NAMED];
    static CUcontext ctx;
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    static pthread_cond_t changed = PTHREAD_COND_INITIALIZER;
    static char *log_tags[MAX_LOG];
    static int log_count;
    static struct named gates[MAX_NAMED];
    static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

    static void emit(int i, const char *op, CUresult rc, const char *extra)
    {
        pthread_mutex_lock(&out_lock);
        printf("{\"i\": %d, \"op\": \"%s\", \"rc\": %d%s%s}\n", i, op, (int)rc, extra[0] ? ", " : "", extra);
        fflush(stdout);
        pthread_mutex_unlock(&out_lock);
    }

    static void **slot(struct named *table, const char *name)
    {
        for (int i = 0; i < MAX_NAMED; i++)
            if (strcmp(table[i].name, name) == 0)
                return &table[i].ptr;
        for (int i = 0; i < MAX_NAMED; i++)
            if (table[i].name[0] == '\0') {
                snprintf(table[i].name, sizeof table[i].name, "%s", name);
                return &table[i].ptr;
            }
        fprintf(stderr, "stream-probe: too many names\n");
        exit(2);
    }

    static CUstream stream_of(const char *name)
    {
        if (strcmp(name, "null") == 0) return NULL;
        if (strcmp(name, "legacy") == 0) return CU_STREAM_LEGACY;
        if (strcmp(name, "perthread") == 0) return CU_STREAM_PER_THREAD;
        return *(CUstream *)slot(streams, name);
    }

    static void add_log(const char *tag)
    {
        pthread_mutex_lock(&lock);
        if (log_count < MAX_LOG)
            log_tags[log_count++] = strdup(tag);
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&lock);
    }

    static void host_fn(void *arg) { add_log(arg); }
    static void CUDA_CB callback_fn(CUstream s, CUresult status, void *arg) { (void)s; (void)status; add_log(arg); }

    static void gate_wait(void *arg)
    {
        int *open = *(int **)arg;
        pthread_mutex_lock(&lock);
        while (!*open)
            pthread_cond_wait(&changed, &lock);
        pthread_mutex_unlock(&lock);
        add_log(((char **)arg)[1]);
    }

    static int has_opt(int argc, char **argv, const char *opt)
    {
        for (int i = 0; i < argc; i++) if (strcmp(argv[i], opt) == 0) return 1;
        return 0;
    }

    static long opt_value(int argc, char **argv, const char *key, long fallback)
    {
        size_t n = strlen(key);
        for (int i = 0; i < argc; i++) if (strncmp(argv[i], key, n) == 0) return atol(argv[i] + n);
        return fallback;
    }

    static void *read_file(const char *path, size_t *size)
    {
        FILE *f = fopen(path, "rb");
        if (f == NULL) return NULL;
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        char *data = calloc(1, (size_t)len + 1);
        if (fread(data, 1, (size_t)len, f) != (size_t)len) { free(data); data = NULL; }
        fclose(f);
        *size = (size_t)len;
        return data;
    }

    static CUresult load(const char *name, const char *how, const char *path)
    {
        size_t size = 0;
        void *data = read_file(path, &size);
        CUmodule mod = NULL;
        CUresult rc;
        if (strcmp(how, "file") == 0) {
            rc = cuModuleLoad(&mod, path);
        } else if (data == NULL) {
            return CUDA_ERROR_FILE_NOT_FOUND;
        } else if (strcmp(how, "data") == 0) {
            rc = cuModuleLoadData(&mod, data);
        } else if (strcmp(how, "dataex") == 0) {
            char log[64] = "unchanged";
            CUjit_option options[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
            void *values[] = {log, (void *)(uintptr_t)sizeof log};
            rc = cuModuleLoadDataEx(&mod, data, 2, options, values);
        } else if (strcmp(how, "fatbinary") == 0) {
            struct { int magic; int version; const void *data; void *filename; } wrapper = {0x466243B1, 1, data, NULL};
            rc = cuModuleLoadFatBinary(&mod, &wrapper);
        } else {
            CUlibrary lib = NULL;
            rc = strcmp(how, "library") == 0 ? cuLibraryLoadData(&lib, data, NULL, NULL, 0, NULL, NULL, 0)
                                             : cuLibraryLoadFromFile(&lib, path, NULL, NULL, 0, NULL, NULL, 0);
            if (rc == CUDA_SUCCESS) rc = cuLibraryGetModule(&mod, lib);
            *slot(modules, name) = mod;
            *(CUlibrary *)slot(modules, "library") = lib;
        }
        free(data);
        *slot(modules, name) = mod;
        return rc;
    }

    static CUjitInputType input_type(const char *type)
    {
        if (strcmp(type, "ptx") == 0) return CU_JIT_INPUT_PTX;
        if (strcmp(type, "cubin") == 0) return CU_JIT_INPUT_CUBIN;
        if (strcmp(type, "fatbin") == 0) return CU_JIT_INPUT_FATBINARY;
        if (strcmp(type, "library") == 0) return CU_JIT_INPUT_LIBRARY;
        if (strcmp(type, "nvvm") == 0) return CU_JIT_INPUT_NVVM;
        return CU_JIT_INPUT_OBJECT;
    }

    static CUresult link_inputs(int argc, char **argv, size_t *out_size)
    {
        CUlinkState state;
        CUresult rc = cuLinkCreate(0, NULL, NULL, &state);
        for (int i = 2; rc == CUDA_SUCCESS && i < argc; i++) {
            char type[32];
            const char *colon = strchr(argv[i], ':');
            snprintf(type, sizeof type, "%.*s", (int)(colon - argv[i]), argv[i]);
            rc = cuLinkAddFile(state, input_type(type), colon + 1, 0, NULL, NULL);
        }
        void *cubin = NULL;
        if (rc == CUDA_SUCCESS) rc = cuLinkComplete(state, &cubin, out_size);
        CUmodule mod = NULL;
        if (rc == CUDA_SUCCESS) rc = cuModuleLoadData(&mod, cubin);
        *slot(modules, argv[1]) = mod;
        cuLinkDestroy(state);
        return rc;
    }

    static void names_of(CUmodule mod, char *extra, size_t len)
    {
        unsigned int count = 0;
        CUresult rc = cuModuleGetFunctionCount(&count, mod);
        CUfunction fns[64];
        unsigned int n = count < 64 ? count : 64;
        if (rc == CUDA_SUCCESS) rc = cuModuleEnumerateFunctions(fns, n, mod);
        size_t at = (size_t)snprintf(extra, len, "\"count\": %u, \"count_rc\": %d, \"names\": [", count, (int)rc);
        for (unsigned int i = 0; rc == CUDA_SUCCESS && i < n && at < len; i++) {
            const char *name = "?";
            cuFuncGetName(&name, fns[i]);
            at += (size_t)snprintf(extra + at, len - at, "%s\"%s\"", i ? ", " : "", name);
        }
        if (at < len) snprintf(extra + at, len - at, "]");
    }

    static void params_of(CUfunction f, char *extra, size_t len)
    {
        size_t at = (size_t)snprintf(extra, len, "\"params\": [");
        CUresult rc = CUDA_SUCCESS;
        for (size_t i = 0; i < 64 && at < len; i++) {
            size_t offset, size;
            if ((rc = cuFuncGetParamInfo(f, i, &offset, &size)) != CUDA_SUCCESS) break;
            at += (size_t)snprintf(extra + at, len - at, "%s[%zu, %zu]", i ? ", " : "", offset, size);
        }
        if (at < len) snprintf(extra + at, len - at, "], \"end_rc\": %d", (int)rc);
    }

    static CUresult global(CUmodule mod, const char *name, char *extra, size_t len)
    {
        CUdeviceptr dptr = 0;
        size_t bytes = 0;
        CUresult rc = cuModuleGetGlobal(&dptr, &bytes, mod, name);
        CUresult copy = CUDA_ERROR_NOT_FOUND;
        int same = 0;
        if (rc == CUDA_SUCCESS && bytes > 0) {
            unsigned char *in = malloc(bytes), *out = calloc(1, bytes);
            for (size_t i = 0; i < bytes; i++) in[i] = (unsigned char)(i * 7 + 3);
            copy = cuMemcpyHtoD(dptr, in, bytes);
            if (copy == CUDA_SUCCESS) copy = cuMemcpyDtoH(out, dptr, bytes);
            same = copy == CUDA_SUCCESS && memcmp(in, out, bytes) == 0;
            free(in);
            free(out);
        }
        snprintf(extra, len, "\"size\": %zu, \"copy_rc\": %d, \"round_trip\": %s", bytes, (int)copy,
                 same ? "true" : "false");
        return rc;
    }

    static double now_ms(void)
    {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
    }

    static int run(int i, int argc, char **argv);

    /* Named threads: each runs the commands posted to it, in order. */
    struct worker { char name[64]; pthread_t thread; int argc; char **argv; int index, busy, stop; };
    static struct worker workers[16];

    static void *worker_main(void *arg)
    {
        struct worker *w = arg;
        cuCtxSetCurrent(ctx);
        pthread_mutex_lock(&lock);
        for (;;) {
            while (!w->busy) pthread_cond_wait(&changed, &lock);
            pthread_mutex_unlock(&lock);
            run(w->index, w->argc, w->argv);
            char tag[80];
            snprintf(tag, sizeof tag, "%s:done", w->name);
            add_log(tag);
            pthread_mutex_lock(&lock);
            w->busy = 0;
            pthread_cond_broadcast(&changed);
        }
        return NULL;
    }

    static struct worker *worker_named(const char *name)
    {
        for (int i = 0; i < 16; i++)
            if (strcmp(workers[i].name, name) == 0) return &workers[i];
        for (int i = 0; i < 16; i++)
            if (workers[i].name[0] == '\0') {
                snprintf(workers[i].name, sizeof workers[i].name, "%s", name);
                pthread_create(&workers[i].thread, NULL, worker_main, &workers[i]);
                return &workers[i];
            }
        exit(2);
    }

    static void join(struct worker *w)
    {
        pthread_mutex_lock(&lock);
        while (w->busy) pthread_cond_wait(&changed, &lock);
        pthread_mutex_unlock(&lock);
    }

    static void post(int i, struct worker *w, int argc, char **argv, int wait)
    {
        join(w);
        pthread_mutex_lock(&lock);
        w->argc = argc; w->argv = argv; w->index = i; w->busy = 1;
        pthread_cond_broadcast(&changed);
        pthread_mutex_unlock(&lock);
        if (wait) join(w);
    }

    static int waitfor(const char *tag, long timeout_ms)
    {
        double until = now_ms() + (double)timeout_ms;
        pthread_mutex_lock(&lock);
        for (;;) {
            for (int i = 0; i < log_count; i++)
                if (strcmp(log_tags[i], tag) == 0) { pthread_mutex_unlock(&lock); return 0; }
            if (now_ms() >= until) { pthread_mutex_unlock(&lock); return 1; }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 10 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&changed, &lock, &ts);
        }
    }

    #define IS(word) (strcmp(op, word) == 0)

    static int run(int i, int argc, char **argv)
    {
        const char *op = argv[0];
        char extra[4096] = "";
        CUresult rc = CUDA_SUCCESS;
        int ptsz = has_opt(argc, argv, "ptsz");
        if (IS("load")) {
            rc = load(argv[1], argv[2], argv[3]);
        } else if (IS("link")) {
            size_t size = 0;
            rc = link_inputs(argc, argv, &size);
            snprintf(extra, sizeof extra, "\"size\": %zu", size);
        } else if (IS("func")) {
            CUfunction f = NULL;
            rc = cuModuleGetFunction(&f, *(CUmodule *)slot(modules, argv[2]), argv[3]);
            *slot(functions, argv[1]) = f;
        } else if (IS("kernel")) {
            CUkernel k = NULL;
            rc = cuLibraryGetKernel(&k, *(CUlibrary *)slot(modules, "library"), argv[3]);
            *slot(functions, argv[1]) = k;
        } else if (IS("count")) {
            names_of(*(CUmodule *)slot(modules, argv[1]), extra, sizeof extra);
        } else if (IS("params")) {
            params_of(*(CUfunction *)slot(functions, argv[1]), extra, sizeof extra);
        } else if (IS("name")) {
            const char *name = "";
            rc = cuFuncGetName(&name, *(CUfunction *)slot(functions, argv[1]));
            snprintf(extra, sizeof extra, "\"name\": \"%s\"", rc == CUDA_SUCCESS ? name : "");
        } else if (IS("attr")) {
            int value = -1;
            CUfunction f = *(CUfunction *)slot(functions, argv[1]);
            rc = cuFuncGetAttribute(&value, (CUfunction_attribute)atoi(argv[2]), f);
            snprintf(extra, sizeof extra, "\"value\": %d", value);
        } else if (IS("global")) {
            rc = global(*(CUmodule *)slot(modules, argv[1]), argv[2], extra, sizeof extra);
        } else if (IS("stream")) {
            CUstream s = NULL;
            unsigned int flags = has_opt(argc, argv, "nonblocking") ? CU_STREAM_NON_BLOCKING : CU_STREAM_DEFAULT;
            rc = cuStreamCreateWithPriority(&s, flags, (int)opt_value(argc, argv, "prio=", 0));
            *slot(streams, argv[1]) = s;
        } else if (IS("destroy")) {
            rc = cuStreamDestroy(stream_of(argv[1]));
        } else if (IS("event")) {
            CUevent e = NULL;
            rc = cuEventCreate(&e, has_opt(argc, argv, "notiming") ? CU_EVENT_DISABLE_TIMING : CU_EVENT_DEFAULT);
            *slot(events, argv[1]) = e;
        } else if (IS("launch")) {
            unsigned long long us = (unsigned long long)opt_value(argc, argv, "us=", 0);
            void *params[] = {&us};
            unsigned int grid = (unsigned int)opt_value(argc, argv, "grid=", 1);
            CUfunction f = *(CUfunction *)slot(functions, argv[1]);
            double before = now_ms();
            rc = (ptsz ? cuLaunchKernel_ptsz : cuLaunchKernel)(f, grid, 1, 1, 32, 1, 1, 0, stream_of(argv[2]),
                                                               params, NULL);
            snprintf(extra, sizeof extra, "\"call_ms\": %.3f", now_ms() - before);
        } else if (IS("record")) {
            rc = (ptsz ? cuEventRecord_ptsz : cuEventRecord)(*(CUevent *)slot(events, argv[1]), stream_of(argv[2]));
        } else if (IS("wait")) {
            CUevent e = *(CUevent *)slot(events, argv[2]);
            rc = (ptsz ? cuStreamWaitEvent_ptsz : cuStreamWaitEvent)(stream_of(argv[1]), e, 0);
        } else if (IS("query")) {
            rc = (ptsz ? cuStreamQuery_ptsz : cuStreamQuery)(stream_of(argv[1]));
        } else if (IS("equery")) {
            rc = cuEventQuery(*(CUevent *)slot(events, argv[1]));
        } else if (IS("sync")) {
            rc = (ptsz ? cuStreamSynchronize_ptsz : cuStreamSynchronize)(stream_of(argv[1]));
        } else if (IS("esync")) {
            rc = cuEventSynchronize(*(CUevent *)slot(events, argv[1]));
        } else if (IS("ctxsync")) {
            rc = cuCtxSynchronize();
        } else if (IS("elapsed")) {
            float ms = -1;
            rc = cuEventElapsedTime(&ms, *(CUevent *)slot(events, argv[1]), *(CUevent *)slot(events, argv[2]));
            snprintf(extra, sizeof extra, "\"ms\": %.3f", ms);
        } else if (IS("host")) {
            rc = (ptsz ? cuLaunchHostFunc_ptsz : cuLaunchHostFunc)(stream_of(argv[1]), host_fn, strdup(argv[2]));
        } else if (IS("callback")) {
            rc = cuStreamAddCallback(stream_of(argv[1]), callback_fn, strdup(argv[2]), 0);
        } else if (IS("hostwait")) {
            void **arg = malloc(2 * sizeof *arg);
            int **open = (int **)slot(gates, argv[2]);
            if (*open == NULL) *open = calloc(1, sizeof **open);
            arg[0] = *open;
            arg[1] = malloc(strlen(argv[2]) + 8);
            sprintf(arg[1], "passed:%s", argv[2]);
            rc = (ptsz ? cuLaunchHostFunc_ptsz : cuLaunchHostFunc)(stream_of(argv[1]), gate_wait, arg);
        } else if (IS("open")) {
            char tag[80];
            snprintf(tag, sizeof tag, "open:%s", argv[1]);
            add_log(tag);
            int **open = (int **)slot(gates, argv[1]);
            pthread_mutex_lock(&lock);
            if (*open == NULL) *open = calloc(1, sizeof **open);
            **open = 1;
            pthread_cond_broadcast(&changed);
            pthread_mutex_unlock(&lock);
        } else if (IS("waitfor")) {
            rc = (CUresult)waitfor(argv[1], opt_value(argc, argv, "timeout=", 20000));
        } else if (IS("log")) {
            add_log(argv[1]);
        } else if (IS("sleep")) {
            usleep((useconds_t)atol(argv[1]) * 1000);
        } else if (IS("on") || IS("spawn")) {
            post(i, worker_named(argv[1]), argc - 2, argv + 2, IS("on"));
            return 0;
        } else if (IS("join")) {
            join(worker_named(argv[1]));
        } else if (IS("pause")) {
            char line[16];
            if (fgets(line, sizeof line, stdin) == NULL) rc = CUDA_ERROR_UNKNOWN;
        } else if (IS("exit")) {
            emit(i, op, rc, extra);
            exit(0);
        } else {
            fprintf(stderr, "stream-probe: unknown command %s\n", op);
            exit(64);
        }
        emit(i, op, rc, extra);
        return 0;
    }

    int main(int argc, char **argv)
    {
        CUdevice dev;
        CUresult rc = cuInit(0);
        if (rc == CUDA_SUCCESS) rc = cuDeviceGet(&dev, 0);
        if (rc == CUDA_SUCCESS) rc = cuCtxCreate(&ctx, NULL, 0, dev);
        char extra[64];
        snprintf(extra, sizeof extra, "\"pid\": %d", (int)getpid());
        emit(-1, "start", rc, extra);
        if (rc != CUDA_SUCCESS) return 1;
        int start = 1, index = 0;
        for (int i = 1; i <= argc; i++) {
            if (i == argc || strcmp(argv[i], ";") == 0) {
                if (i > start) {
                    argv[i < argc ? i : argc] = NULL;
                    run(index++, i - start, argv + start);
                }
                start = i + 1;
            }
        }
        for (int i = 0; i < 16; i++) if (workers[i].name[0]) join(&workers[i]);
        pthread_mutex_lock(&out_lock);
        printf("{\"op\": \"end\", \"log\": [");
        pthread_mutex_lock(&lock);
        for (int i = 0; i < log_count; i++) printf("%s\"%s\"", i ? ", " : "", log_tags[i]);
        pthread_mutex_unlock(&lock);
        printf("]}\n");
        fflush(stdout);
        pthread_mutex_unlock(&out_lock);
        return 0;
    }
""")


def cuda_include() -> Path:
    """The directory holding cuda.h: the nvidia-cuda-runtime wheel's (what make uses), else CUDA's."""
    for entry in sys.path:
        candidate = Path(entry) / "nvidia" / "cu13" / "include"
        if (candidate / "cuda.h").exists():
            return candidate
    return Path("/usr/local/cuda/include")


def build_probe(directory: Path) -> Path:
    """Compiles stream-probe into ``directory`` against the simulated driver."""
    source = directory / "stream_probe.c"
    binary = directory / "stream-probe"
    source.write_text(PROBE_SOURCE)
    subprocess.run(["gcc", "-std=gnu11", "-O1", "-Wall", "-Werror", "-Wno-unused-result", "-isystem",
                    str(cuda_include()), "-o", str(binary), str(source), f"-L{SIMGPU_BUILD}", "-lcuda", "-lpthread",
                    f"-Wl,-rpath,{SIMGPU_BUILD}"], check=True, capture_output=True, text=True, timeout=120)
    return binary


def probe_env(gpu_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIX)}
    env["FASTGSHARE_FAKE_GPU_DIR"] = str(gpu_dir)
    env.update(extra or {})
    return env


def script_args(script: str) -> list[str]:
    """``"stream s; launch f s"`` -> the probe's argv: words, with ";" between commands."""
    args: list[str] = []
    for command in script.split(";"):
        if command.strip():
            args += [*command.split(), ";"]
    return args


@attrs.frozen
class ProbeRun:
    returncode: int
    lines: list[dict[str, Any]]
    stderr: str

    @property
    def pid(self) -> int:
        return int(self.lines[0]["pid"])

    def op(self, index: int) -> dict[str, Any]:
        """The output of the command at ``index`` (0-based, in the script's order)."""
        return next(line for line in self.lines if line.get("i") == index)

    def rc(self, index: int) -> int:
        return int(self.op(index)["rc"])

    @property
    def log(self) -> list[str]:
        end = [line for line in self.lines if line["op"] == "end"]
        assert end, f"the probe did not finish: {self.lines}\n{self.stderr}"
        return list(end[0]["log"])


def parse_lines(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def run_probe(probe: Path, gpu_dir: Path, script: str, *, env: dict[str, str] | None = None,
              timeout_s: float = 60) -> ProbeRun:
    """Runs a script to the end; fails the test (with what it printed) if it hangs."""
    process = subprocess.Popen([str(probe), *script_args(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=probe_env(gpu_dir, env))
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        stdout, stderr = process.communicate()
        raise AssertionError(f"stream-probe hung on {script!r}:\n{stdout}\n{stderr}") from None
    return ProbeRun(process.returncode, parse_lines(stdout), stderr)


class LiveProbe:
    """A probe still running: read its lines as they come, resume it past ``pause``, kill it."""

    def __init__(self, probe: Path, gpu_dir: Path, script: str, env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen([str(probe), *script_args(script)], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        env=probe_env(gpu_dir, env))
        self.lines: list[dict[str, Any]] = []

    def read_until(self, op: str) -> dict[str, Any]:
        """Reads lines up to the first of ``op`` (the probe prints one as each command returns)."""
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line: dict[str, Any] = json.loads(raw)
            self.lines.append(line)
            if line["op"] == op:
                return line
        raise AssertionError(f"the probe ended before printing {op!r}: {self.lines}")

    def resume(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()

    def finish(self, timeout_s: float = 20) -> ProbeRun:
        try:
            stdout, stderr = self.process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            stdout, stderr = self.process.communicate()
            raise AssertionError(f"the probe did not exit within {timeout_s} s: {stderr}") from None
        return ProbeRun(self.process.returncode, self.lines + parse_lines(stdout), stderr)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate()


# --- module images ----------------------------------------------------------------------------

KERNELS_CU = textwrap.dedent("""
    __device__ float scale_by = 2.0f;
    __constant__ float coef[16];
    __device__ int counter;
    extern "C" __global__ void saxpy(float a, const float *x, float *y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] * scale_by + y[i] + coef[i % 16];
    }
    extern "C" __global__ void count_up(int n) { if (n < 0) atomicAdd(&counter, 1); }
    template <typename T> __global__ void fill(T *p) { p[0] = T(1); }
    template __global__ void fill<float>(float *);
""")
KERNEL_NAMES = ("saxpy", "count_up", "_Z4fillIfEvPT_")
GLOBALS = {"scale_by": 4, "coef": 64, "counter": 4}

_NVRTC_SCRIPT = textwrap.dedent("""
    import ctypes, sys
    from pathlib import Path
    lib_dir = Path(sys.argv[1])
    for builtins in sorted(lib_dir.glob("libnvrtc-builtins.so.*")):
        if ".alt." not in builtins.name:
            ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
    nvrtc = ctypes.CDLL(str(lib_dir / "libnvrtc.so.13"))
    source, target, out = Path(sys.argv[2]).read_bytes(), sys.argv[3], Path(sys.argv[4])
    prog = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(prog), source, b"kernels.cu", 0, None, None) == 0
    options = (ctypes.c_char_p * 1)(("--gpu-architecture=" + target).encode())
    if nvrtc.nvrtcCompileProgram(prog, 1, options) != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        raise SystemExit("nvrtc: " + log.value.decode())
    kind = "PTX" if target.startswith("compute_") else "CUBIN"
    size = ctypes.c_size_t()
    getattr(nvrtc, f"nvrtcGet{kind}Size")(prog, ctypes.byref(size))
    buffer = ctypes.create_string_buffer(size.value)
    getattr(nvrtc, f"nvrtcGet{kind}")(prog, buffer)
    out.write_bytes(buffer.raw)
""")


def nvrtc_lib_dir() -> Path | None:
    """Where the nvidia-cuda-nvrtc wheel (CUDA 13) put libnvrtc.so.13, or None when it is not installed."""
    for entry in sys.path:
        candidate = Path(entry) / "nvidia" / "cu13" / "lib"
        if (candidate / "libnvrtc.so.13").exists():
            return candidate
    return None


def nvrtc_compile(lib_dir: Path, directory: Path, target: str) -> Path:
    """KERNELS_CU compiled by NVRTC to PTX (target compute_NN) or a cubin (sm_NN), in a clean process:
    NVRTC loads libcuda.so.1 when it can, and only NVIDIA's may be found then."""
    source = directory / "kernels.cu"
    source.write_text(KERNELS_CU)
    out = directory / (f"kernels-{target}.ptx" if target.startswith("compute_") else f"kernels-{target}.cubin")
    env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED and not k.startswith(_SCRUBBED_PREFIX)}
    subprocess.run([sys.executable, "-c", _NVRTC_SCRIPT, str(lib_dir), str(source), target, str(out)], env=env,
                   check=True, capture_output=True, text=True, timeout=120)
    return out


def _fatbin_entry(kind: int, payload: bytes, arch: int) -> bytes:
    """One uncompressed fatbin entry: its 64-byte header (kind 1 PTX, 2 ELF) and its payload, padded to 8."""
    padded = payload + b"\0" * (-len(payload) % 8)
    minor, major = (0, 9) if kind == 1 else (8, 1)  # PTX ISA 9.0; ELF 1.8
    header = struct.pack("<HHIQIIHHIIIQQQ", kind, 0x0101, 64, len(padded), 0, 64 if kind == 1 else 0, minor, major,
                         arch, 0, 0, 0x11, 0, 0)
    return header + padded


def make_fatbin(ptx: Path, cubin: Path, out: Path) -> Path:
    """A fatbin (magic 0xBA55ED50) of the PTX and the cubin, uncompressed, as fatbinary lays it out."""
    entries = _fatbin_entry(1, ptx.read_bytes(), 90) + _fatbin_entry(2, cubin.read_bytes(), 90)
    out.write_bytes(struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entries)) + entries)
    return out


def nvcc_fatbin(directory: Path, compress: bool) -> Path | None:
    """KERNELS_CU as nvcc builds a fatbin (sm_90 ELF + compute_90 PTX; compressed as asked), or None
    when there is no nvcc."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    if nvcc is None:
        return None
    source = directory / "kernels.cu"
    source.write_text(KERNELS_CU)
    out = directory / ("nvcc-compressed.fatbin" if compress else "nvcc.fatbin")
    flags = ["-Xfatbin", "-compress-all"] if compress else ["-Xfatbin", "--compress=false"]
    result = subprocess.run([nvcc, "-fatbin", "-gencode", "arch=compute_90,code=sm_90", "-gencode",
                             "arch=compute_90,code=compute_90", *flags, "-o", str(out), str(source)],
                            capture_output=True, text=True, timeout=300, check=False)
    return out if result.returncode == 0 else None
