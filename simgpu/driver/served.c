/*
 * served.c: per-entry-point counts of what the driver served (served.h), so that a test can
 * compare them with what the hook forwarded: equal counts mean nothing reached the driver around
 * the hook.
 *
 * A fixed open-addressing table keyed by the name's pointer (FAKE_SERVED passes __func__, one
 * static string per function): a call costs a hash, a load and, the first time, a CAS, then one
 * relaxed atomic add; no lock. Names that arrive through different pointers merge when written.
 * At process exit (a destructor), when FASTGSHARE_FAKE_GPU_SERVED_DIR was set at load, the
 * nonzero counts are written as one JSON object {"cuMemAlloc_v2": 3, ...} to
 * <dir>/served-<pid>.json (under a temporary name, then renamed); nothing otherwise. A forked
 * child inherits its parent's counts, as the hook's are inherited.
 */
#define _GNU_SOURCE
#include "served.h"

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ENV_SERVED_DIR "FASTGSHARE_FAKE_GPU_SERVED_DIR"
#define SERVED_SLOTS 1024 /* a power of two, well above the driver's entry points */

struct served_slot {
    const char *name; /* set once by CAS */
    unsigned long count;
};

static struct served_slot slots[SERVED_SLOTS];
static unsigned long overflow; /* calls of names that found the table full */
static char served_dir[PATH_MAX];

static size_t slot_of(const char *name)
{
    uint64_t key = (uint64_t)(uintptr_t)name;
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> 54) & (SERVED_SLOTS - 1);
}

void fake_count_served(const char *name)
{
    if (name == NULL)
        return;
    size_t at = slot_of(name);
    for (size_t probe = 0; probe < SERVED_SLOTS; probe++, at = (at + 1) & (SERVED_SLOTS - 1)) {
        const char *held = __atomic_load_n(&slots[at].name, __ATOMIC_ACQUIRE);
        if (held == NULL) {
            const char *expected = NULL;
            if (__atomic_compare_exchange_n(&slots[at].name, &expected, name, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_ACQUIRE))
                held = name;
            else
                held = expected;
        }
        if (held == name) {
            __atomic_fetch_add(&slots[at].count, 1, __ATOMIC_RELAXED);
            return;
        }
    }
    __atomic_fetch_add(&overflow, 1, __ATOMIC_RELAXED);
}

__attribute__((constructor)) static void read_served_dir(void)
{
    const char *dir = getenv(ENV_SERVED_DIR);
    if (dir == NULL || *dir == '\0')
        return;
    if (strlen(dir) >= sizeof served_dir - 32) {
        fprintf(stderr, "fake libcuda: " ENV_SERVED_DIR " is longer than %zu bytes; no served counts written\n",
                sizeof served_dir - 32);
        return;
    }
    strcpy(served_dir, dir);
}

/* The total of every slot whose name equals slots[first].name, from `first` on; 0 when an
 * earlier slot had the same name (it was written with that one). */
static unsigned long merged_count(size_t first)
{
    const char *name = slots[first].name;
    for (size_t i = 0; i < first; i++)
        if (slots[i].name != NULL && strcmp(slots[i].name, name) == 0)
            return 0;
    unsigned long total = 0;
    for (size_t i = first; i < SERVED_SLOTS; i++)
        if (slots[i].name != NULL && strcmp(slots[i].name, name) == 0)
            total += __atomic_load_n(&slots[i].count, __ATOMIC_RELAXED);
    return total;
}

/* {"name": count, ...} for the nonzero names (and "(table full)" if any overflowed); 0 or -1. */
static int write_json(FILE *out)
{
    const char *separator = "";
    if (fputc('{', out) == EOF)
        return -1;
    for (size_t i = 0; i < SERVED_SLOTS; i++) {
        const char *name = __atomic_load_n(&slots[i].name, __ATOMIC_ACQUIRE);
        unsigned long count = name != NULL ? merged_count(i) : 0;
        if (count == 0)
            continue;
        if (fprintf(out, "%s\"%s\": %lu", separator, name, count) < 0)
            return -1;
        separator = ", ";
    }
    unsigned long lost = __atomic_load_n(&overflow, __ATOMIC_RELAXED);
    if (lost != 0 && fprintf(out, "%s\"(table full)\": %lu", separator, lost) < 0)
        return -1;
    return fputs("}\n", out) == EOF ? -1 : 0;
}

__attribute__((destructor)) static void write_served(void)
{
    if (served_dir[0] == '\0')
        return;
    int saved_errno = errno;
    char path[sizeof served_dir + 64], temporary[sizeof served_dir + 64];
    long pid = (long)getpid();
    snprintf(path, sizeof path, "%s/served-%ld.json", served_dir, pid); /* fits: checked at load */
    snprintf(temporary, sizeof temporary, "%s/.served-%ld.json.tmp", served_dir, pid);
    FILE *out = fopen(temporary, "w");
    int failed = out == NULL ? -1 : write_json(out);
    if (out != NULL)
        failed |= fclose(out);
    if (failed != 0 || rename(temporary, path) != 0) {
        fprintf(stderr, "fake libcuda: " ENV_SERVED_DIR ": cannot write %s: %s\n", path, strerror(errno));
        unlink(temporary);
    }
    errno = saved_errno;
}
