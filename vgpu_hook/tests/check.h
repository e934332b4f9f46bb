/*
 * check.h: the assertion macro of the host-only C unit tests (test_quota.c, test_memory.c).
 * CHECK counts every check and reports a failed one with its file, line and expression, then
 * the test goes on; check_report() prints the totals and gives the exit status.
 */
#ifndef FASTGSHARE_HOOK_TEST_CHECK_H
#define FASTGSHARE_HOOK_TEST_CHECK_H

#include <stdio.h>

static int failures, checks;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        checks++;                                                                                  \
        if (!(cond)) {                                                                             \
            failures++;                                                                            \
            fprintf(stderr, "%s:%d: FAILED: %s\n", __FILE__, __LINE__, #cond);                     \
        }                                                                                          \
    } while (0)

/* "<name>: N checks, M failed" on stdout; 0 when nothing failed, else 1. */
static inline int check_report(const char *name)
{
    printf("%s: %d checks, %d failed\n", name, checks, failures);
    return failures == 0 ? 0 : 1;
}

#endif
