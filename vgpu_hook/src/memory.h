/*
 * memory.h: the process's reservations in its pod's memory ledger, kept by the arbiter.
 *
 * Every allocation wrapper (memory_hooks.c) reserves before it calls the driver and every free
 * releases after; all processes of a pod share the pod's limit (fastgshare/gpu_mem). The
 * arbiter keeps what each connection holds and gives it all back when the connection closes,
 * so a process that exits or is killed frees its share of the ledger at once.
 *
 * Its own connection: memory requests use a second connection to the arbiter, not the gate's
 * (gate.c). A TOKEN request can wait a whole window for its reply, and the protocol answers
 * one request at a time per client; allocations must not queue behind it (allocation is not
 * GPU time). The connection is opened on the first memory call, with its own HELLO (same pid,
 * pod and GPU), and serialised by its own lock.
 *
 * Fail closed, like the gate: when the arbiter cannot be used the hook prints ONE line
 * "fastgshare-hook: <what failed>; refusing GPU memory allocations of process N (fail closed:
 * CUDA_ERROR_NOT_PERMITTED)" and every later reservation and ledger read fails with
 * FGS_MEMORY_REFUSED. Releases after a failure are no-ops: the arbiter dropped everything this
 * connection held when it went away.
 */
#ifndef FASTGSHARE_HOOK_MEMORY_H
#define FASTGSHARE_HOOK_MEMORY_H

#include "config.h"
#include "entry.h"

#include <stdint.h>

#define FGS_MEMORY_REFUSED CUDA_ERROR_NOT_PERMITTED

/* Gives the memory link its settings; called once from fgs_init. */
void fgs_memory_configure(const struct fgs_config *cfg);

/* Reserves `bytes` for this process in the pod's ledger: CUDA_SUCCESS; CUDA_ERROR_OUT_OF_MEMORY
 * when that would pass the pod's limit; FGS_MEMORY_REFUSED when the arbiter cannot be used.
 * 0 bytes is always CUDA_SUCCESS without a request. `what` names the driver call for the log. */
CUresult fgs_memory_reserve(uint64_t bytes, const char *what);

/* Gives back `bytes` reserved earlier (a free, or an undone reservation). 0 bytes: nothing. */
void fgs_memory_release(uint64_t bytes, const char *what);

/* The pod's ledger now (a 0-byte reservation reads it): CUDA_SUCCESS with *used and *limit set,
 * or FGS_MEMORY_REFUSED. */
CUresult fgs_memory_ledger(uint64_t *used, uint64_t *limit);

/* The gate reconnected to a restarted arbiter: if this process has a memory link, make sure it
 * is connected to the new arbiter and has reported what it holds (a process that allocated
 * once at start and never again would otherwise not report it). */
void fgs_memory_relink(void);

/* fork() child handler: the child opens its own connection on its first memory call. */
void fgs_memory_after_fork_child(void);

/* fork() child handler of memory_hooks.c: the parent's allocations are not the child's. */
void fgs_memory_hooks_after_fork_child(void);

#endif
