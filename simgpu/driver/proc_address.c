/*
 * proc_address.c: cuGetProcAddress of the fake driver, both ABIs (legacy 4-argument
 * cuGetProcAddress from CUDA 11.3, and cuGetProcAddress_v2 from 12.0).
 *
 * Like the real driver it resolves BASE names ("cuMemAlloc", not "cuMemAlloc_v2"): among the
 * table rows for the base name it picks the newest ABI whose `since` is <= the caller's
 * cudaVersion; with CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM it prefers the per-thread
 * (_ptsz) rows and falls back to the others. The pointers are this library's own functions
 * (it is linked with -Bsymbolic), never whatever the global scope binds the names to, so an
 * LD_PRELOAD hook cannot hide here: it must wrap cuGetProcAddress itself.
 *
 * Every ABI the fake implements has a row (proc_rows_core.def, proc_rows_exec.def), the 32-bit v1
 * memory calls included (cuMemAlloc @2000 is the v1 ABI, @3020 the _v2 one). Every other entry
 * point of the driver API, every ABI and per-thread variant of it, has a generated row
 * (fake_stub_rows, build/gen/entry_stubs.c from gen_entry_points.py) whose function answers
 * CUDA_ERROR_NOT_SUPPORTED; so does an ABI older than the oldest one implemented. A name the driver
 * API does not have is CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND, like the real driver; asking with a
 * cudaVersion older than every row of a base name yields CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT.
 * FASTGSHARE_FAKE_GPU_PROC_LOG traces every lookup (below).
 */
#include "fake_internal.h"
#include "proc_table.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROW(base, since, per_thread, fn) {#base, since, per_thread, (void *)(fn)}

static const struct proc_entry table[] = {
#include "proc_rows_core.def"
#include "proc_rows_exec.def"
};

/* The newest row for base with since <= version and the given per_thread; sets *known when the
 * base name exists at all. */
static const struct proc_entry *newest_in(const struct proc_entry *rows, size_t count, const char *base,
                                          int version, int per_thread, int *known)
{
    const struct proc_entry *best = NULL;
    for (size_t i = 0; i < count; i++) {
        const struct proc_entry *e = &rows[i];
        if (strcmp(e->base, base) != 0)
            continue;
        *known = 1;
        if (e->per_thread == per_thread && e->since <= version && (best == NULL || e->since > best->since))
            best = e;
    }
    return best;
}

/* The row answering a lookup: the implemented rows, per-thread first when asked for, then the
 * generated not-supported rows (of base names with no implemented row, and of ABIs older than an
 * implemented base's oldest row) in the same order. */
static const struct proc_entry *lookup(const char *base, int version, int per_thread, int *known)
{
    const size_t count = sizeof table / sizeof table[0];
    const struct proc_entry *e = per_thread ? newest_in(table, count, base, version, 1, known) : NULL;
    if (e == NULL)
        e = newest_in(table, count, base, version, 0, known);
    if (e == NULL && per_thread)
        e = newest_in(fake_stub_rows, fake_stub_row_count, base, version, 1, known);
    if (e == NULL)
        e = newest_in(fake_stub_rows, fake_stub_row_count, base, version, 0, known);
    return e;
}

/* FASTGSHARE_FAKE_GPU_PROC_LOG=<file>: one line a lookup, "symbol cudaVersion flags status" (the
 * CUdriverProcAddressQueryResult: 0 found, 1 symbol not found, 2 version not sufficient), appended
 * with one write so concurrent processes do not interleave. For finding what a program asks. */
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static int log_fd = -1;

static void open_log(void)
{
    const char *path = getenv("FASTGSHARE_FAKE_GPU_PROC_LOG");
    if (path != NULL && *path != '\0')
        log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
}

static void log_lookup(const char *symbol, int cudaVersion, cuuint64_t flags, CUdriverProcAddressQueryResult status)
{
    pthread_once(&log_once, open_log);
    if (log_fd < 0 || symbol == NULL)
        return;
    char line[320];
    int n = snprintf(line, sizeof line, "%.256s %d %llu %d\n", symbol, cudaVersion, (unsigned long long)flags,
                     (int)status);
    if (n > 0 && (size_t)n < sizeof line && write(log_fd, line, (size_t)n) < 0)
        return; /* a log that cannot be written is not the caller's failure */
}

static CUresult resolve(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    const cuuint64_t known_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (symbol == NULL || pfn == NULL || (flags & ~known_flags) != 0 || flags == known_flags)
        return CUDA_ERROR_INVALID_VALUE;
    int known = 0;
    const struct proc_entry *e =
        lookup(symbol, cudaVersion, (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0, &known);
    *pfn = e != NULL ? e->fn : NULL;
    CUdriverProcAddressQueryResult found = e != NULL ? CU_GET_PROC_ADDRESS_SUCCESS
                                           : known   ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                                     : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    log_lookup(symbol, cudaVersion, flags, found);
    if (status != NULL)
        *status = found;
    return e != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus)
{
    return resolve(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    return resolve(symbol, pfn, cudaVersion, flags, NULL);
}
