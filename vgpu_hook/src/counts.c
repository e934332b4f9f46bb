/*
 * counts.c: the table behind counts.h (what the hook forwarded to the driver, per hooked
 * symbol) and its one writer: at process exit, when FASTGSHARE_HOOK_COUNTS_DIR was set at load,
 * the nonzero counts as one JSON object in <dir>/hook-<pid>.json, written under a temporary name
 * and renamed, so a reader never sees half a file. Nothing is written otherwise. A forked child
 * inherits its parent's counts (as the driver's served counts are inherited too) and writes them
 * under its own pid if it exits through exit().
 */
#define _GNU_SOURCE
#include "counts.h"

#include "log.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENV_COUNTS_DIR "FASTGSHARE_HOOK_COUNTS_DIR"

unsigned long fgs_forward_counts[FGS_SYM_COUNT] __attribute__((aligned(64)));

static const char *const count_names[FGS_SYM_COUNT] = {
#define FGS_WRAP(symbol, base, since, per_thread, pfn_type) [FGS_SYM_##symbol] = #symbol,
#define FGS_NVML(symbol, pfn_type) [FGS_SYM_##symbol] = #symbol,
#define FGS_REAL(symbol, pfn_type) [FGS_SYM_##symbol] = #symbol,
#include "hooked_symbols.def"
};

/* Read at load, so a program that changes its environment later still gets its file. */
static char counts_dir[PATH_MAX];

__attribute__((constructor)) static void read_counts_dir(void)
{
    const char *dir = getenv(ENV_COUNTS_DIR);
    if (dir == NULL || *dir == '\0')
        return;
    if (strlen(dir) >= sizeof counts_dir - 32) {
        FGS_ERROR(ENV_COUNTS_DIR "=%.64s... is longer than %zu bytes; no call counts will be written", dir,
                  sizeof counts_dir - 32);
        return;
    }
    strcpy(counts_dir, dir);
}

/* {"name": count, ...} for the nonzero rows; 0, or -1 when a write failed. */
static int write_json(FILE *out)
{
    const char *separator = "";
    if (fputc('{', out) == EOF)
        return -1;
    for (int i = 0; i < FGS_SYM_COUNT; i++) {
        unsigned long count = __atomic_load_n(&fgs_forward_counts[i], __ATOMIC_RELAXED);
        if (count == 0)
            continue;
        if (fprintf(out, "%s\"%s\": %lu", separator, count_names[i], count) < 0)
            return -1;
        separator = ", ";
    }
    return fputs("}\n", out) == EOF ? -1 : 0;
}

__attribute__((destructor)) static void write_counts(void)
{
    if (counts_dir[0] == '\0')
        return;
    int saved_errno = errno;
    char path[sizeof counts_dir + 64], temporary[sizeof counts_dir + 64];
    long pid = (long)getpid();
    snprintf(path, sizeof path, "%s/hook-%ld.json", counts_dir, pid); /* fits: checked at load */
    snprintf(temporary, sizeof temporary, "%s/.hook-%ld.json.tmp", counts_dir, pid);
    FILE *out = fopen(temporary, "w");
    if (out == NULL) {
        FGS_ERROR(ENV_COUNTS_DIR ": cannot write %s: %s", temporary, strerror(errno));
        errno = saved_errno;
        return;
    }
    int failed = write_json(out);
    failed |= fclose(out);
    if (failed != 0 || rename(temporary, path) != 0) {
        FGS_ERROR(ENV_COUNTS_DIR ": cannot write %s: %s", path, strerror(errno));
        unlink(temporary);
    }
    errno = saved_errno;
}
