/*
 * log.h: the hook's stderr log.
 *
 * Every message is one line starting "fastgshare-hook: ", written with a single write(2) so lines
 * of concurrent threads and processes do not interleave; errno is preserved. The level is set
 * once at init from FASTGSHARE_HOOK_LOG (error | info | debug; default error) and read with a
 * relaxed atomic load, so logging costs one load and a branch when it is off. Errors always print.
 */
#ifndef FASTGSHARE_HOOK_LOG_H
#define FASTGSHARE_HOOK_LOG_H

enum fgs_log_level {
    FGS_LOG_ERROR = 0,
    FGS_LOG_INFO = 1,
    FGS_LOG_DEBUG = 2,
};

extern int fgs_log_threshold; /* an fgs_log_level; written once by fgs_log_set_level */

void fgs_log_set_level(enum fgs_log_level level);
void fgs_log_write(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define FGS_LOG(level, ...)                                                                        \
    do {                                                                                           \
        if ((int)(level) <= __atomic_load_n(&fgs_log_threshold, __ATOMIC_RELAXED))                 \
            fgs_log_write(__VA_ARGS__);                                                            \
    } while (0)

#define FGS_ERROR(...) FGS_LOG(FGS_LOG_ERROR, __VA_ARGS__)
#define FGS_INFO(...) FGS_LOG(FGS_LOG_INFO, __VA_ARGS__)
#define FGS_DEBUG(...) FGS_LOG(FGS_LOG_DEBUG, __VA_ARGS__)

#endif
