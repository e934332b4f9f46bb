/*
 * gate.h: the time-token gate every launch passes before it reaches the driver.
 *
 * fgs_gate_enter returns CUDA_SUCCESS when the process may launch now; every such launch must
 * call fgs_gate_leave when its driver call returns. While the token is valid that is one vDSO
 * clock read, one atomic load and two atomic adds (the count of launches in flight): no lock, no
 * syscall. When it has expired (or was never granted) the calling thread takes the gate lock,
 * connects and says HELLO on first use, waits for the launches in flight (other threads' calls
 * that passed the gate under the old token), synchronises the context (unless
 * FASTGSHARE_SYNC_AT_TOKEN_END=0), returns the old token with its used time and blocks until the
 * arbiter grants a new one.
 *
 * Fail closed: when the arbiter cannot be used (socket unset or unreachable, connection closed,
 * no reply within the timeout, an ERROR reply, the driver cannot be loaded, a bad setting) the
 * hook prints ONE line "fastgshare-hook: <what failed>; ..." to stderr and this and every later
 * launch of the process returns FGS_GATE_REFUSED (CUDA_ERROR_NOT_PERMITTED). It never launches
 * without a token and never waits longer than the reply timeout.
 */
#ifndef FASTGSHARE_HOOK_GATE_H
#define FASTGSHARE_HOOK_GATE_H

#include "config.h"
#include "entry.h"

#define FGS_GATE_REFUSED CUDA_ERROR_NOT_PERMITTED

/* Gives the gate its settings; called once from fgs_init before any launch can pass. */
void fgs_gate_configure(const struct fgs_config *cfg);

/* CUDA_SUCCESS when the caller holds a valid token (getting one if needed), else FGS_GATE_REFUSED. */
CUresult fgs_gate_enter(void);

/* A launch that passed the gate has returned from the driver: its time counts as used. */
void fgs_gate_leave(void);

/* fork() child handler: the child gets its own connection and token on its first launch. */
void fgs_gate_after_fork_child(void);

#endif
