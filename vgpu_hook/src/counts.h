/*
 * counts.h: per-entry-point counts of the calls the hook forwarded to the driver, so that a test
 * can compare them with what the driver served (simgpu's served counts): equal counts for every
 * allocation, free and launch entry point mean nothing reached the driver around the hook.
 *
 * A call is counted when the wrapper forwards it to the real driver function, not on entry: an
 * allocation the arbiter refuses, or a launch refused fail-closed, never reaches the driver, so
 * counting it would make the two sides differ for a correct hook. Every forward of an
 * allocation, free or launch goes through FGS_FORWARD (a test greps the wrappers for any other
 * call of those fgs_real rows). Cost: one relaxed atomic add; nothing else on the call path.
 * At process exit (a destructor) the counts are written as one JSON object
 * {"cuMemAlloc_v2": 3, ...} (nonzero rows only) to $FASTGSHARE_HOOK_COUNTS_DIR/hook-<pid>.json
 * when that variable is set, and nowhere otherwise.
 */
#ifndef FASTGSHARE_HOOK_COUNTS_H
#define FASTGSHARE_HOOK_COUNTS_H

#include "entry.h"

/* Indexed by enum fgs_symbol; written with relaxed atomic adds, read at exit. */
extern unsigned long fgs_forward_counts[FGS_SYM_COUNT];

static inline void fgs_count_forward(enum fgs_symbol symbol)
{
    __atomic_fetch_add(&fgs_forward_counts[symbol], 1, __ATOMIC_RELAXED);
}

/* fgs_real.symbol(args...), counted under `symbol`. */
#define FGS_FORWARD(symbol, ...) (fgs_count_forward(FGS_SYM_##symbol), fgs_real.symbol(__VA_ARGS__))

#endif
