/*
 * The one fake GPU shared by every process that names the same device directory: attaching to
 * its state file, SM units for kernels, the memory pool and the per-process accounting.
 * Layout of the file: fake_gpu_state.h. No CUDA types here; fake_cuda.c maps results to CUresult.
 */
#ifndef FASTGSHARE_FAKE_GPU_H
#define FASTGSHARE_FAKE_GPU_H

#include <stddef.h>
#include <stdint.h>

#define FGPU_ENV_DIR "FASTGSHARE_FAKE_GPU_DIR"
#define FGPU_ENV_MEMORY "FASTGSHARE_FAKE_GPU_MEMORY"
#define FGPU_ENV_SM "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
#define FGPU_DEFAULT_MEMORY (UINT64_C(16) << 30)

enum fgpu_status {
    FGPU_OK = 0,
    FGPU_NO_DEVICE,     /* FASTGSHARE_FAKE_GPU_DIR unset, or its state file unusable */
    FGPU_BAD_CONFIG,    /* an env value could not be parsed */
    FGPU_NO_SLOT,       /* every process slot is taken by a live process */
    FGPU_OUT_OF_MEMORY, /* the pool cannot hold the allocation */
};

/* Maps the device named by the environment and takes a process slot. Call once per process;
 * on failure writes one line (no newline) into err. */
enum fgpu_status fgpu_attach(char *err, size_t err_len);

/* CLOCK_MONOTONIC in nanoseconds. */
uint64_t fgpu_now_ns(void);

/* Runs one kernel (or a whole graph) of duration_ns on the calling thread (a stream's worker,
 * stream_engine.c): waits in FIFO order across processes until this process runs no other kernel
 * and its SM units are free, holds them for the duration (sleeping), releases them and accounts
 * the time. -1 without running it once the process has begun to exit (its slot is given back). */
int fgpu_run_kernel(uint64_t duration_ns, int is_graph);

/* Takes bytes from the shared pool (FGPU_OUT_OF_MEMORY when it does not fit) or returns them. */
enum fgpu_status fgpu_mem_reserve(uint64_t bytes);
void fgpu_mem_release(uint64_t bytes);
void fgpu_mem_info(uint64_t *free_bytes, uint64_t *total_bytes);

void fgpu_count_ctx_sync(void);

/* For the IPC table (ipc_memory.c), which lives in the lock file beside the slot bytes: the state
 * lock (guards the table as it guards the state), and the lock file's descriptor (-1 before
 * fgpu_attach). The descriptor must never be closed: that would drop this process's slot lock. */
void fgpu_state_lock(void);
void fgpu_state_unlock(void);
int fgpu_lock_file(void);
void fgpu_uuid(uint8_t out[16]);

/* Called in the child after fork(): the child is not attached (like the real driver, CUDA
 * cannot be used in a child forked after initialisation). */
void fgpu_forget_after_fork(void);

#endif
