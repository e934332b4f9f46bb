/*
 * entry.c: how calls reach the hook, and the hook's init order.
 *
 * Owns:
 *   - the dlsym override. Programs that load the driver (or NVML) themselves (cudart,
 *     frameworks, pynvml) call dlsym(handle_of_the_library, ...), a lookup LD_PRELOAD never sees;
 *     for the names in hooked_symbols.def the override returns the hook's wrapper when the
 *     handle provides the name. RTLD_NEXT and RTLD_DEFAULT lookups pass straight through as a
 *     tail call, so glibc still sees the caller's return address and RTLD_NEXT keeps meaning
 *     "after the caller" (pitfall 8). The real dlsym comes from dlvsym(RTLD_NEXT, "dlsym",
 *     <glibc version>), called through the real dlvsym (dl_lookup.c reads it from the C library's
 *     symbol table: the name dlvsym is ours too).
 *   - the dlvsym override: the same answers for versioned lookups (a driver or NVML whose
 *     symbols carry a version was reachable past the hook through it), and library-handle
 *     lookups of "dlsym" and "dlvsym" themselves return these overrides.
 *   - the cuGetProcAddress wrappers, both ABIs (legacy 4-argument and _v2). They ask the real
 *     driver, then swap in the hook's wrapper when the row of hooked_symbols.def that the driver's
 *     own rule selects for (base name, cudaVersion, per-thread flag) is one we wrap; for an older
 *     cudaVersion than any wrapped ABI the driver's answer passes through untouched. Asked for
 *     "cuGetProcAddress" itself, they return the wrapper of the matching ABI, so re-resolved
 *     resolvers stay hooked. If a caller asks with a cudaVersion newer than the headers the hook
 *     was built with and the driver hands back a function the hook does not know, the lookup is
 *     refused (fail closed) rather than letting launches or allocations bypass the hook.
 *   - loading the real functions (fgs_load_real from libcuda.so.1, fgs_load_nvml from
 *     libnvidia-ml.so.1): dlopen + the real dlsym on that handle, never our own wrappers
 *     (pitfall 7), with a re-entry guard instead of pthread_once so a library constructor
 *     calling back into us cannot deadlock.
 *   - fgs_init: configuration, log level and the fork handlers, once (also from a constructor).
 */
#define _GNU_SOURCE
#include "entry.h"

#include "config.h"
#include "dl_lookup.h"
#include "gate.h"
#include "log.h"
#include "memory.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define DRIVER_SONAME "libcuda.so.1"
#define NVML_SONAME "libnvidia-ml.so.1"

enum library { LIB_CUDA, LIB_NVML };

struct fgs_real_fns fgs_real;

struct wrap_row {
    const char *symbol; /* exported name; NULL for FGS_REAL rows */
    const char *base;   /* NULL for FGS_NVML rows (never reached through cuGetProcAddress) */
    int since;
    int per_thread;
};

static const struct wrap_row wrap_rows[FGS_SYM_COUNT] = {
#define FGS_WRAP(symbol, base, since, per_thread, pfn_type) [FGS_SYM_##symbol] = {#symbol, #base, since, per_thread},
#define FGS_NVML(symbol, pfn_type) [FGS_SYM_##symbol] = {#symbol, NULL, 0, 0},
#define FGS_REAL(symbol, pfn_type)
#include "hooked_symbols.def"
};

static const char *const real_names[FGS_SYM_COUNT] = {
#define FGS_WRAP(symbol, base, since, per_thread, pfn_type) [FGS_SYM_##symbol] = #symbol,
#define FGS_NVML(symbol, pfn_type) [FGS_SYM_##symbol] = #symbol,
#define FGS_REAL(symbol, pfn_type) [FGS_SYM_##symbol] = #symbol,
#include "hooked_symbols.def"
};

/* The hook's own exported wrappers (the definitions in launch_hooks.c, memory_hooks.c,
 * nvml_hooks.c and below). */
static void *const wrappers[FGS_SYM_COUNT] = {
#define FGS_WRAP(symbol, base, since, per_thread, pfn_type) [FGS_SYM_##symbol] = (void *)symbol,
#define FGS_NVML(symbol, pfn_type) [FGS_SYM_##symbol] = (void *)symbol,
#define FGS_REAL(symbol, pfn_type)
#include "hooked_symbols.def"
};

static void *real_pointer(int index)
{
    switch (index) {
#define FGS_WRAP(symbol, base, since, per_thread, pfn_type)                                        \
    case FGS_SYM_##symbol: return (void *)fgs_real.symbol;
#define FGS_NVML(symbol, pfn_type)                                                                 \
    case FGS_SYM_##symbol: return (void *)fgs_real.symbol;
#define FGS_REAL(symbol, pfn_type)                                                                 \
    case FGS_SYM_##symbol: return (void *)fgs_real.symbol;
#include "hooked_symbols.def"
    default: return NULL;
    }
}

/* --- the real dlvsym and dlsym ------------------------------------------------------------ */

typedef void *(*dlsym_fn)(void *, const char *);
typedef void *(*dlvsym_fn)(void *, const char *, const char *);

static dlvsym_fn real_dlvsym_cache; /* atomic */
static dlsym_fn real_dlsym_cache;   /* atomic */

/* The C library's dlvsym: calling dlvsym here would call our own override (dl_lookup.c). */
static dlvsym_fn real_dlvsym(void)
{
    dlvsym_fn fn = __atomic_load_n(&real_dlvsym_cache, __ATOMIC_ACQUIRE);
    if (fn != NULL)
        return fn;
    fn = (dlvsym_fn)fgs_libdl_symbol("dlvsym");
    if (fn == NULL) {
        FGS_ERROR("cannot find the C library's dlvsym in the object that defines dlopen; aborting");
        abort();
    }
    __atomic_store_n(&real_dlvsym_cache, fn, __ATOMIC_RELEASE);
    return fn;
}

static dlsym_fn real_dlsym(void)
{
    dlsym_fn fn = __atomic_load_n(&real_dlsym_cache, __ATOMIC_ACQUIRE);
    if (fn != NULL)
        return fn;
    static const char *const glibc_versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
    for (size_t i = 0; i < sizeof glibc_versions / sizeof glibc_versions[0] && fn == NULL; i++)
        fn = (dlsym_fn)real_dlvsym()(RTLD_NEXT, "dlsym", glibc_versions[i]);
    if (fn == NULL) {
        FGS_ERROR("cannot find the C library's dlsym (tried GLIBC_2.34, GLIBC_2.2.5, GLIBC_2.17); aborting");
        abort();
    }
    __atomic_store_n(&real_dlsym_cache, fn, __ATOMIC_RELEASE);
    return fn;
}

/* --- loading the real driver and NVML ----------------------------------------------------- */

enum load_state { LOAD_NOT_YET, LOAD_DONE, LOAD_FAILED };

struct loader {
    const char *soname;
    const char *what; /* for the log */
    enum library library;
    pthread_mutex_t lock;
    int state; /* atomic enum load_state */
};

static struct loader driver_loader = {DRIVER_SONAME, "the CUDA driver", LIB_CUDA, PTHREAD_MUTEX_INITIALIZER,
                                     LOAD_NOT_YET};
static struct loader nvml_loader = {NVML_SONAME, "NVML", LIB_NVML, PTHREAD_MUTEX_INITIALIZER, LOAD_NOT_YET};
static __thread int loading_on_this_thread;

static void *load_one(void *handle, int index, const char *soname)
{
    void *fn = real_dlsym()(handle, real_names[index]);
    if (fn != NULL && fn == wrappers[index]) { /* never record ourselves as the real function */
        FGS_ERROR("%s of %s resolved to the hook itself; treating it as missing", real_names[index], soname);
        return NULL;
    }
    if (fn == NULL)
        FGS_DEBUG("%s has no %s", soname, real_names[index]);
    return fn;
}

static int load_library(const struct loader *loader)
{
    void *handle = dlopen(loader->soname, RTLD_LAZY | RTLD_NOLOAD);
    if (handle == NULL)
        handle = dlopen(loader->soname, RTLD_LAZY | RTLD_LOCAL);
    if (handle == NULL) {
        const char *why = dlerror();
        FGS_ERROR("cannot load %s %s: %s", loader->what, loader->soname, why != NULL ? why : "unknown error");
        return -1;
    }
    if (loader->library == LIB_CUDA) {
#define FGS_WRAP(symbol, base, since, per_thread, pfn_type)                                        \
        fgs_real.symbol = (pfn_type)load_one(handle, FGS_SYM_##symbol, loader->soname);
#define FGS_NVML(symbol, pfn_type)
#define FGS_REAL(symbol, pfn_type) fgs_real.symbol = (pfn_type)load_one(handle, FGS_SYM_##symbol, loader->soname);
#include "hooked_symbols.def"
    } else {
#define FGS_WRAP(symbol, base, since, per_thread, pfn_type)
#define FGS_NVML(symbol, pfn_type) fgs_real.symbol = (pfn_type)load_one(handle, FGS_SYM_##symbol, loader->soname);
#define FGS_REAL(symbol, pfn_type)
#include "hooked_symbols.def"
    }
    return 0;
}

static int load(struct loader *loader)
{
    int state = __atomic_load_n(&loader->state, __ATOMIC_ACQUIRE);
    if (state != LOAD_NOT_YET)
        return state == LOAD_DONE ? 0 : -1;
    if (loading_on_this_thread)
        return -1; /* called back from inside our own dlopen of a library */
    pthread_mutex_lock(&loader->lock);
    loading_on_this_thread = 1;
    if (__atomic_load_n(&loader->state, __ATOMIC_ACQUIRE) == LOAD_NOT_YET)
        __atomic_store_n(&loader->state, load_library(loader) == 0 ? LOAD_DONE : LOAD_FAILED, __ATOMIC_RELEASE);
    loading_on_this_thread = 0;
    pthread_mutex_unlock(&loader->lock);
    return __atomic_load_n(&loader->state, __ATOMIC_ACQUIRE) == LOAD_DONE ? 0 : -1;
}

int fgs_load_real(void)
{
    return load(&driver_loader);
}

int fgs_load_nvml(void)
{
    return load(&nvml_loader);
}

/* --- dlsym -------------------------------------------------------------------------------- */

static int wrapped_index(const char *symbol)
{
    if (symbol == NULL || (strncmp(symbol, "cu", 2) != 0 && strncmp(symbol, "nvml", 4) != 0))
        return -1;
    for (int i = 0; i < FGS_SYM_COUNT; i++)
        if (wrap_rows[i].symbol != NULL && strcmp(wrap_rows[i].symbol, symbol) == 0)
            return i;
    return -1;
}

static void *wrapper_if_provided(dlsym_fn real, void *handle, int index)
{
    if (real(handle, real_names[index]) == NULL)
        return NULL; /* dlerror() is set by that lookup, as without the hook */
    FGS_DEBUG("dlsym(%s): returning the hook's wrapper", real_names[index]);
    return wrappers[index];
}

/* Our own dlsym or dlvsym when a library handle is asked for either by name (the C library's
 * would get past the hook), else NULL. */
static void *own_resolver(const char *symbol)
{
    if (symbol == NULL || strncmp(symbol, "dl", 2) != 0)
        return NULL;
    if (strcmp(symbol, "dlsym") == 0)
        return (void *)dlsym;
    if (strcmp(symbol, "dlvsym") == 0)
        return (void *)dlvsym;
    return NULL;
}

FGS_EXPORT void *dlsym(void *handle, const char *symbol)
{
    dlsym_fn real = real_dlsym();
    if (handle != RTLD_NEXT && handle != RTLD_DEFAULT) {
        int index = wrapped_index(symbol);
        if (index >= 0)
            return wrapper_if_provided(real, handle, index);
        void *own = own_resolver(symbol);
        if (own != NULL && real(handle, symbol) != NULL)
            return own;
    }
    /* A tail call (the Makefile pins -O2 for this file): glibc's dlsym then sees our caller's
     * return address, which is what RTLD_NEXT is relative to. */
    return real(handle, symbol);
}

/* --- dlvsym ------------------------------------------------------------------------------- */

/* dlvsym(handle, "cuMemAlloc_v2", version) reached the driver's function past the hook whenever
 * the library defines the name under that version (issue 15, defect 10): it is answered like
 * dlsym, with the wrapper. A versioned lookup never matches the hook's own unversioned exports,
 * so for RTLD_DEFAULT and RTLD_NEXT too a wrapped name that the real dlvsym finds (in the driver,
 * further down the scope) is answered with the wrapper. Other names pass straight through as a
 * tail call, so RTLD_NEXT keeps meaning "after the caller". */
FGS_EXPORT void *dlvsym(void *handle, const char *symbol, const char *version)
{
    dlvsym_fn real = real_dlvsym();
    int index = wrapped_index(symbol);
    if (index >= 0) {
        if (real(handle, real_names[index], version) == NULL)
            return NULL; /* dlerror() is set by that lookup, as without the hook */
        FGS_DEBUG("dlvsym(%s, %s): returning the hook's wrapper", real_names[index], version);
        return wrappers[index];
    }
    if (handle != RTLD_NEXT && handle != RTLD_DEFAULT) {
        void *own = own_resolver(symbol);
        if (own != NULL && real(handle, symbol, version) != NULL)
            return own;
    }
    return real(handle, symbol, version);
}

/* --- cuGetProcAddress --------------------------------------------------------------------- */

/* The wrapped row the driver's rule selects for (base, version, per-thread), or -1. */
static int select_wrapper(const char *base, int version, int per_thread)
{
    int best = -1;
    for (int pass = per_thread ? 1 : 0; pass >= 0 && best < 0; pass--) {
        for (int i = 0; i < FGS_SYM_COUNT; i++) {
            const struct wrap_row *row = &wrap_rows[i];
            if (row->symbol == NULL || row->base == NULL || row->per_thread != pass || row->since > version ||
                strcmp(row->base, base) != 0)
                continue;
            if (best < 0 || row->since > wrap_rows[best].since)
                best = i;
        }
    }
    return best;
}

/* After a successful real lookup: swap in our wrapper where one applies. CUDA_SUCCESS, or
 * CUDA_ERROR_NOT_FOUND when the driver returned an entry point we cannot vouch for. */
static CUresult substitute(const char *symbol, void **pfn, int version, cuuint64_t flags,
                           CUdriverProcAddressQueryResult *status)
{
    if (symbol == NULL || pfn == NULL || *pfn == NULL)
        return CUDA_SUCCESS;
    int per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
    int index = select_wrapper(symbol, version, per_thread);
    if (index < 0)
        return CUDA_SUCCESS;
    if (version > CUDA_VERSION && *pfn != real_pointer(index) && *pfn != wrappers[index]) {
        FGS_ERROR("cuGetProcAddress(\"%s\", %d) returned an entry point this hook (built with CUDA %d "
                  "headers) does not know; refusing it so launches cannot bypass the hook",
                  symbol, version, CUDA_VERSION);
        *pfn = NULL;
        if (status != NULL)
            *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        return CUDA_ERROR_NOT_FOUND;
    }
    FGS_DEBUG("cuGetProcAddress(\"%s\", %d, flags %llu): returning the wrapper of %s", symbol, version,
              (unsigned long long)flags, wrap_rows[index].symbol);
    *pfn = wrappers[index];
    return CUDA_SUCCESS;
}

FGS_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                        CUdriverProcAddressQueryResult *symbolStatus)
{
    if (fgs_load_real() != 0 || fgs_real.cuGetProcAddress_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = fgs_real.cuGetProcAddress_v2(symbol, pfn, cudaVersion, flags, symbolStatus);
    return r == CUDA_SUCCESS ? substitute(symbol, pfn, cudaVersion, flags, symbolStatus) : r;
}

FGS_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    if (fgs_load_real() != 0 || fgs_real.cuGetProcAddress == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult r = fgs_real.cuGetProcAddress(symbol, pfn, cudaVersion, flags);
    return r == CUDA_SUCCESS ? substitute(symbol, pfn, cudaVersion, flags, NULL) : r;
}

/* --- init --------------------------------------------------------------------------------- */

static pthread_once_t init_once = PTHREAD_ONCE_INIT;
static struct fgs_config config; /* written once in init_routine, read-only afterwards */

static void after_fork_child(void)
{
    fgs_gate_after_fork_child();
    fgs_memory_after_fork_child();
    fgs_memory_hooks_after_fork_child();
}

static void init_routine(void)
{
    fgs_config_from_env(&config);
    fgs_log_set_level(config.log_level);
    if (config.warning[0] != '\0')
        FGS_ERROR("%s", config.warning);
    fgs_gate_configure(&config);
    fgs_memory_configure(&config);
    pthread_atfork(NULL, NULL, after_fork_child);
}

void fgs_init(void)
{
    pthread_once(&init_once, init_routine); /* reads the environment only: cannot re-enter */
}

__attribute__((constructor)) static void hook_constructor(void)
{
    fgs_init();
}
