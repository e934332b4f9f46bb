/*
 * proc_table.h: a row of the cuGetProcAddress table (proc_address.c), and the generated rows of the
 * entry points the simulated driver answers CUDA_ERROR_NOT_SUPPORTED (build/gen/entry_stubs.c,
 * written by gen_entry_points.py). Free of cuda.h, so that the generated file can declare each stub
 * as int name(void).
 */
#ifndef SIMGPU_PROC_TABLE_H
#define SIMGPU_PROC_TABLE_H

#include <stddef.h>

#define FAKE_NOT_SUPPORTED 801 /* CUDA_ERROR_NOT_SUPPORTED */

struct proc_entry {
    const char *base;
    int since;      /* first CUDA version (1000 * major + 10 * minor) with this ABI */
    int per_thread; /* 1: the _ptsz/_ptds variant chosen by the per-thread flag */
    void *fn;
};

/* The rows of every base name that no proc_rows_*.def row implements: not-supported stubs. */
extern const struct proc_entry fake_stub_rows[];
extern const size_t fake_stub_row_count;

#endif
