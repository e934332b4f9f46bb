/*
 * raw_syscalls.h: fstat and getrandom as system calls, for the libraries mounted into containers.
 *
 * glibc 2.17 has neither symbol (getrandom came in 2.25; fstat was an inline over __fxstat until
 * 2.33 made it a function), so calling them would need a newer glibc in every tenant image (see
 * ../../abi/glibc_2_17.h). syscall() is GLIBC_2.2.5; the kernel's struct stat is
 * glibc's on x86_64 and aarch64. Both return -1 and set errno on failure, as the functions do.
 */
#ifndef FGPU_RAW_SYSCALLS_H
#define FGPU_RAW_SYSCALLS_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static inline int fgpu_fstat(int fd, struct stat *st)
{
    return (int)syscall(SYS_fstat, fd, st);
}

static inline ssize_t fgpu_getrandom(void *buf, size_t len)
{
    return (ssize_t)syscall(SYS_getrandom, buf, len, 0U);
}

#endif /* FGPU_RAW_SYSCALLS_H */
