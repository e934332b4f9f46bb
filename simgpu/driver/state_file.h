/*
 * state_file.h: the fake GPU's state file (layout: fake_gpu_state.h): opening or creating it,
 * and the environment values a new one is made from.
 */
#ifndef FASTGSHARE_FAKE_STATE_FILE_H
#define FASTGSHARE_FAKE_STATE_FILE_H

#include "fake_gpu_state.h"

#include <stddef.h>
#include <stdint.h>

/* CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: NULL or "" means 100; (0, 100], fractions round up. 0 or -1. */
int fgpu_parse_units(const char *text, uint32_t *units);

/* FASTGSHARE_FAKE_GPU_MEMORY: NULL or "" means 16 GiB; bytes with an optional K/M/G/T(iB)
 * binary suffix. 0 or -1. */
int fgpu_parse_bytes(const char *text, uint64_t *bytes);

/* Maps <dir>/fake_gpu.state, creating and initialising it (with mem_total) if this process is
 * first. NULL with err set when it cannot. Never unmapped. */
struct fake_gpu_state *fgpu_open_state(const char *dir, uint64_t mem_total, char *err, size_t err_len);

#endif
