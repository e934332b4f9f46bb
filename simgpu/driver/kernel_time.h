/*
 * kernel_time.h: how long a simulated kernel runs, and how many launches a stream queues
 * (kernel_time.c). Read once from the environment at cuInit; no CUDA types here.
 *
 * FASTGSHARE_FAKE_GPU_KERNEL_TIME: comma-separated KEY=DURATION, KEY one of
 *   default     the run time of a kernel not named otherwise (default 100us)
 *   per_block   added for every block of the grid (default 0)
 *   NAME        the run time of the kernel NAME (its name in the image: a mangled name for C++)
 * DURATION: a decimal number and a unit, ns, us, ms or s (e.g. 2.5ms), at most 60 s; 0 alone is 0.
 * A kernel runs (its NAME's time, else default) + per_block x blocks, at most 60 s. Kernels of
 * "FAKECUBIN" images are the simulated GPU's spin kernel: they run their first parameter in us.
 *
 * FASTGSHARE_FAKE_GPU_QUEUE_DEPTH: launches (and other stream work) one stream holds before the
 * next one blocks, 1..1048576 (default 1024, like the real driver's push buffer).
 */
#ifndef SIMGPU_KERNEL_TIME_H
#define SIMGPU_KERNEL_TIME_H

#include <stddef.h>
#include <stdint.h>

#define FAKE_ENV_KERNEL_TIME "FASTGSHARE_FAKE_GPU_KERNEL_TIME"
#define FAKE_ENV_QUEUE_DEPTH "FASTGSHARE_FAKE_GPU_QUEUE_DEPTH"
#define FAKE_MAX_KERNEL_NS (UINT64_C(60) * 1000 * 1000 * 1000)

/* Reads both settings. 0, or -1 with one line in err naming the setting, the value and what is
 * allowed. */
int fake_timing_configure(char *err, size_t err_len);

/* The configured run time of kernel `name` (before the per-block part). */
uint64_t fake_kernel_base_ns(const char *name);

/* The per-block part of every kernel's run time. */
uint64_t fake_kernel_per_block_ns(void);

/* base + per_block x blocks, at most FAKE_MAX_KERNEL_NS. */
uint64_t fake_kernel_duration_ns(uint64_t base_ns, uint64_t per_block_ns, uint64_t blocks);

/* FASTGSHARE_FAKE_GPU_QUEUE_DEPTH. */
uint32_t fake_queue_depth(void);

#endif
