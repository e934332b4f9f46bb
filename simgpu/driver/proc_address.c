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
 * Every ABI the fake implements has a row, the 32-bit v1 memory calls included (cuMemAlloc
 * @2000 is the v1 ABI, @3020 the _v2 one). Asking with a cudaVersion older than every row of a
 * base name yields CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT.
 */
#include "fake_internal.h"

#include <string.h>

struct proc_entry {
    const char *base;
    int since;      /* first CUDA version (1000 * major + 10 * minor) with this ABI */
    int per_thread; /* 1: the _ptsz/_ptds variant chosen by the per-thread flag */
    void *fn;
};

#define ROW(base, since, per_thread, fn) {#base, since, per_thread, (void *)(fn)}

static const struct proc_entry table[] = {
#include "proc_rows_core.def"
#include "proc_rows_exec.def"
};

/* The newest row for base with since <= version and the given per_thread; sets *known when the
 * base name exists at all. */
static const struct proc_entry *newest(const char *base, int version, int per_thread, int *known)
{
    const struct proc_entry *best = NULL;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        const struct proc_entry *e = &table[i];
        if (strcmp(e->base, base) != 0)
            continue;
        *known = 1;
        if (e->per_thread == per_thread && e->since <= version && (best == NULL || e->since > best->since))
            best = e;
    }
    return best;
}

static CUresult resolve(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                        CUdriverProcAddressQueryResult *status)
{
    const cuuint64_t known_flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if (symbol == NULL || pfn == NULL || (flags & ~known_flags) != 0 || flags == known_flags)
        return CUDA_ERROR_INVALID_VALUE;
    int known = 0;
    const struct proc_entry *e = NULL;
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        e = newest(symbol, cudaVersion, 1, &known);
    if (e == NULL)
        e = newest(symbol, cudaVersion, 0, &known);
    *pfn = e != NULL ? e->fn : NULL;
    if (status != NULL)
        *status = e != NULL ? CU_GET_PROC_ADDRESS_SUCCESS
                  : known   ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                            : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
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
