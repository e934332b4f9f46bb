/* log.c: one-line stderr messages for the hook (see log.h). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

#define LOG_PREFIX "fastgshare-hook: "

int fgs_log_threshold = FGS_LOG_ERROR;

void fgs_log_set_level(enum fgs_log_level level)
{
    __atomic_store_n(&fgs_log_threshold, (int)level, __ATOMIC_RELAXED);
}

void fgs_log_write(const char *fmt, ...)
{
    int saved_errno = errno;
    char line[768] = LOG_PREFIX;
    size_t used = sizeof LOG_PREFIX - 1;
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(line + used, sizeof line - used - 1, fmt, args);
    va_end(args);
    if (n < 0)
        n = 0;
    used += (size_t)n < sizeof line - used - 1 ? (size_t)n : sizeof line - used - 2;
    line[used++] = '\n';
    for (size_t done = 0; done < used;) {
        ssize_t k = write(STDERR_FILENO, line + done, used - done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        done += (size_t)k;
    }
    errno = saved_errno;
}
