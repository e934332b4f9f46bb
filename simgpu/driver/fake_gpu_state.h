/*
 * The fake GPU's shared state file: its exact binary layout, for the fake driver and for readers.
 *
 * One fake GPU is one directory (env FASTGSHARE_FAKE_GPU_DIR). Every process that loads the fake
 * libcuda.so.1 with the same directory maps <dir>/fake_gpu.state (FAKE_GPU_STATE_SIZE bytes,
 * MAP_SHARED) and coordinates through it: SM units, the memory pool, and per-process accounting.
 * The file outlives the processes, so a test or benchmark reads the final numbers after its
 * tenants exit (the Python reader: fastgshare_cli/fake_gpu.py).
 *
 * Liveness: a process holds its slot i through a POSIX record lock (fcntl F_SETLK, F_WRLCK; not an
 * OFD lock) on byte i of <dir>/fake_gpu.lock (FAKE_GPU_LOCK_FILE; those bytes' contents are unused,
 * and the file may be empty until a process exports IPC memory, below), taken under the state lock when the slot is marked ALIVE. The kernel releases it when
 * the process exits (also on SIGKILL, before it is a zombie) in whatever PID namespace it runs, so
 * a slot that is ALIVE but whose byte nobody holds (F_GETLK answers F_UNLCK) belongs to a dead
 * process and is reaped. Tenants of one fake GPU may therefore each have their own PID namespace.
 * F_GETLK also names the holder, translated into the asker's PID namespace (l_pid; 0 when not
 * visible there): that is how a host-side tool maps a slot to a host pid. A reader must only ask
 * (F_GETLK), never lock, and must not be a process that holds a slot: closing any descriptor of
 * the lock file drops all of the closing process's locks on it.
 *
 * The lock file also holds the GPU's IPC memory (ipc_memory.c), so that processes in containers,
 * which get just these two files bind-mounted, share it too. Its layout (no reader outside the
 * driver; contents beyond the IPC table are the shared allocations' bytes, sparse):
 *   [0, 256)                 slot lock bytes (above); their contents are unused
 *   [4096, 4096 + 1024)      exporter lock bytes: the exporter of IPC entry i holds a write lock on
 *                            byte 4096 + i while the allocation lives (the kernel drops it when the
 *                            process dies: the handle is refused from then on)
 *   [8192, 8192 + 1024)      importer lock bytes: every process that has entry i open holds a read
 *                            lock on byte 8192 + i (shared), so the bytes outlive the exporter until
 *                            the last importer closes or dies
 *   [65536, 65536 + 32768)   the IPC table: 1024 entries of 32 bytes, guarded by the state lock:
 *                            off 0 u32 state (0 free, 1 exported, 2 retired: freed by its exporter,
 *                            still mapped by importers), 4 u32 generation (counts the entry's uses,
 *                            so a stale handle is refused), 8 u64 offset of the bytes in this file,
 *                            16 u64 span (bytes reserved there, 2 MiB granular), 24 u64 reserved
 *   [2 MiB, ...)             the bytes of exported allocations, each at its entry's offset; an
 *                            entry's range is punched out (FALLOC_FL_PUNCH_HOLE) when it is reused
 *                            or its last user is gone
 *
 * Byte order is the host's (little-endian on every platform this runs on); all offsets below are
 * fixed and checked by _Static_assert, so a reader may use them directly.
 *
 * Header (FAKE_GPU_HEADER_SIZE = 1024 bytes):
 *   off  size  field
 *   0    8     magic            "FGSFAKEG" (FAKE_GPU_MAGIC); 0 while the creator initialises
 *   8    4     layout_version   FAKE_GPU_LAYOUT_VERSION
 *   12   4     header_size      byte offset of procs[0] (1024)
 *   16   4     proc_size        bytes per process slot (128)
 *   20   4     max_procs        number of slots (256)
 *   24   8     seq              seqlock: odd while a writer changes any field below, even otherwise
 *   32   4     sm_total         100
 *   36   4     sm_free          SM units not held by a running kernel
 *   40   8     mem_total        bytes in the memory pool (env FASTGSHARE_FAKE_GPU_MEMORY of the creator)
 *   48   8     mem_used         bytes allocated by all live processes
 *   56   4     running_kernels  kernels running now, all processes
 *   60   4     procs_used       slots ever used (readers scan procs[0 .. procs_used))
 *   64   8     busy_since_ns    CLOCK_MONOTONIC when running_kernels last went 0 -> 1
 *   72   8     device_busy_ns   total time with at least one kernel running (closed intervals only)
 *   80   16    uuid             the device UUID (random, fixed when the file is created)
 *   96   160   reserved         zero
 *   256  128   lock             process-shared robust pthread mutex (opaque; guards everything)
 *   384  128   cond             process-shared pthread condvar on CLOCK_MONOTONIC (opaque)
 *   512  512   reserved         zero
 *
 * Process slot i at offset 1024 + 128 * i:
 *   off  size  field
 *   0    4     pid              the process's pid in its own PID namespace (int32; informational,
 *                               never used for liveness: see above); 0 in a never-used slot
 *   4    4     status           FAKE_GPU_PROC_FREE / _ALIVE / _EXITED
 *   8    4     sm_units         CUDA_MPS_ACTIVE_THREAD_PERCENTAGE of the process (1..100)
 *   12   4     waiting_threads  threads of the process waiting for SM units now
 *   16   4     running          kernels of the process running now
 *   20   4     reserved
 *   24   8     wait_since_ns    when the process joined the SM queue (0: not waiting)
 *   32   8     sm_held          SM units held by the process's running kernels
 *   40   8     kernels          kernels (and graphs) completed
 *   48   8     busy_ns          sum of their run times (the time the process held SM units)
 *   56   8     wait_ns          sum of the time its launches waited for SM units
 *   64   8     first_start_ns   CLOCK_MONOTONIC start of its first kernel (0: none yet)
 *   72   8     last_end_ns      CLOCK_MONOTONIC end of its latest kernel
 *   80   8     mem_used         bytes it has allocated now
 *   88   8     ctx_syncs        cuCtxSynchronize calls
 *   96   8     graph_launches   cuGraphLaunch calls (also counted in kernels)
 *   104  24    reserved
 *
 * Reading while tenants run (seqlock): read seq; if odd, retry; copy the fields; read seq again;
 * if it changed, retry. Writers hold the lock and make seq odd around every change, so a copy
 * taken between two equal even values is consistent. Timestamps are CLOCK_MONOTONIC nanoseconds,
 * the clock of Python's time.monotonic_ns() on Linux.
 */
#ifndef FASTGSHARE_FAKE_GPU_STATE_H
#define FASTGSHARE_FAKE_GPU_STATE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define FAKE_GPU_STATE_FILE "fake_gpu.state"
#define FAKE_GPU_LOCK_FILE "fake_gpu.lock"
#define FAKE_GPU_MAGIC UINT64_C(0x47454B4146534746) /* "FGSFAKEG" in little-endian bytes */
#define FAKE_GPU_LAYOUT_VERSION 1u
#define FAKE_GPU_HEADER_SIZE 1024u
#define FAKE_GPU_PROC_SIZE 128u
#define FAKE_GPU_MAX_PROCS 256u
#define FAKE_GPU_SM_UNITS 100u
#define FAKE_GPU_STATE_SIZE (FAKE_GPU_HEADER_SIZE + FAKE_GPU_PROC_SIZE * FAKE_GPU_MAX_PROCS)

/* The lock file's IPC layout (above). */
#define FAKE_GPU_IPC_ENTRIES 1024u
#define FAKE_GPU_IPC_EXPORTER_LOCKS 4096u
#define FAKE_GPU_IPC_IMPORTER_LOCKS 8192u
#define FAKE_GPU_IPC_TABLE 65536u
#define FAKE_GPU_IPC_DATA (UINT64_C(2) << 20)
#define FAKE_GPU_IPC_FREE 0u
#define FAKE_GPU_IPC_EXPORTED 1u
#define FAKE_GPU_IPC_RETIRED 2u

struct fake_gpu_ipc_entry {
    uint32_t state;
    uint32_t generation;
    uint64_t offset;
    uint64_t span;
    uint64_t reserved;
};

#define FAKE_GPU_PROC_FREE 0u
#define FAKE_GPU_PROC_ALIVE 1u
#define FAKE_GPU_PROC_EXITED 2u

struct fake_gpu_proc {
    int32_t pid;
    uint32_t status;
    uint32_t sm_units;
    uint32_t waiting_threads;
    uint32_t running;
    uint32_t reserved0;
    uint64_t wait_since_ns;
    uint64_t sm_held;
    uint64_t kernels;
    uint64_t busy_ns;
    uint64_t wait_ns;
    uint64_t first_start_ns;
    uint64_t last_end_ns;
    uint64_t mem_used;
    uint64_t ctx_syncs;
    uint64_t graph_launches;
    uint64_t reserved1[3];
};

struct fake_gpu_state {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t header_size;
    uint32_t proc_size;
    uint32_t max_procs;
    uint64_t seq;
    uint32_t sm_total;
    uint32_t sm_free;
    uint64_t mem_total;
    uint64_t mem_used;
    uint32_t running_kernels;
    uint32_t procs_used;
    uint64_t busy_since_ns;
    uint64_t device_busy_ns;
    uint8_t uuid[16];
    uint8_t reserved0[160];
    union {
        pthread_mutex_t mutex;
        uint8_t space[128];
    } lock;
    union {
        pthread_cond_t cond;
        uint8_t space[128];
    } cond;
    uint8_t reserved1[512];
    struct fake_gpu_proc procs[FAKE_GPU_MAX_PROCS];
};

_Static_assert(sizeof(struct fake_gpu_ipc_entry) == 32, "IPC entry size");
_Static_assert(FAKE_GPU_MAX_PROCS <= FAKE_GPU_IPC_EXPORTER_LOCKS, "slot bytes before the IPC bytes");
_Static_assert(FAKE_GPU_IPC_TABLE + 32 * FAKE_GPU_IPC_ENTRIES <= FAKE_GPU_IPC_DATA, "IPC table before data");
_Static_assert(sizeof(struct fake_gpu_proc) == FAKE_GPU_PROC_SIZE, "process slot size");
_Static_assert(offsetof(struct fake_gpu_proc, wait_since_ns) == 24, "slot layout");
_Static_assert(offsetof(struct fake_gpu_proc, kernels) == 40, "slot layout");
_Static_assert(offsetof(struct fake_gpu_proc, graph_launches) == 96, "slot layout");
_Static_assert(offsetof(struct fake_gpu_state, seq) == 24, "header layout");
_Static_assert(offsetof(struct fake_gpu_state, running_kernels) == 56, "header layout");
_Static_assert(offsetof(struct fake_gpu_state, uuid) == 80, "header layout");
_Static_assert(offsetof(struct fake_gpu_state, lock) == 256, "header layout");
_Static_assert(offsetof(struct fake_gpu_state, cond) == 384, "header layout");
_Static_assert(offsetof(struct fake_gpu_state, procs) == FAKE_GPU_HEADER_SIZE, "header layout");
_Static_assert(sizeof(struct fake_gpu_state) == FAKE_GPU_STATE_SIZE, "state size");

#endif
