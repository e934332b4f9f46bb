/*
 * entry.h: the hook's view of the driver: cuda.h with every ABI declared (the driver-internal
 * view, so each wrapper is type-checked against exactly the ABI it implements), the NVML subset,
 * the symbol enum and the table of real driver and NVML functions, both expanded from
 * hooked_symbols.def.
 */
#ifndef FASTGSHARE_HOOK_ENTRY_H
#define FASTGSHARE_HOOK_ENTRY_H

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>

#include "nvml_subset.h"

/* Marks the few symbols the hook exports; everything else is hidden (-fvisibility=hidden). */
#define FGS_EXPORT __attribute__((visibility("default")))

enum fgs_symbol {
#define FGS_WRAP(symbol, base, since, per_thread, pfn_type) FGS_SYM_##symbol,
#define FGS_NVML(symbol, pfn_type) FGS_SYM_##symbol,
#define FGS_REAL(symbol, pfn_type) FGS_SYM_##symbol,
#include "hooked_symbols.def"
    FGS_SYM_COUNT
};

/* The real driver's functions, loaded once by fgs_load_real(), and NVML's, loaded once by
 * fgs_load_nvml(); NULL where the library lacks one. */
struct fgs_real_fns {
#define FGS_WRAP(symbol, base, since, per_thread, pfn_type) pfn_type symbol;
#define FGS_NVML(symbol, pfn_type) pfn_type symbol;
#define FGS_REAL(symbol, pfn_type) pfn_type symbol;
#include "hooked_symbols.def"
};

extern struct fgs_real_fns fgs_real;

/* Loads fgs_real from libcuda.so.1 on first use (not from a library constructor, and never
 * re-entered from inside its own dlopen: pitfall 7). 0 when loaded; -1 after logging why not.
 * A successful return happens-before any read of fgs_real by the same thread. */
int fgs_load_real(void);

/* The same for the NVML rows, from libnvidia-ml.so.1 (only NVML wrappers call it). */
int fgs_load_nvml(void);

/* Reads the configuration and sets the log level, once per process (idempotent, cheap). */
void fgs_init(void);

#endif
