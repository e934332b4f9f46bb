/*
 * state_file.c: creating or opening the fake GPU's state file (layout: fake_gpu_state.h), and
 * parsing the environment values it is made from. The first process initialises the file
 * (process-shared robust mutex, condvar on CLOCK_MONOTONIC, totals, a random UUID) while
 * holding flock() on it, so concurrent first users cannot race; later ones only validate it.
 */
#define _GNU_SOURCE
#include "state_file.h"

#include "gpu_state.h"
#include "raw_syscalls.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* CUDA_MPS_ACTIVE_THREAD_PERCENTAGE: unset or empty means 100; fractions round up. */
int fgpu_parse_units(const char *text, uint32_t *units)
{
    if (text == NULL || *text == '\0') {
        *units = FAKE_GPU_SM_UNITS;
        return 0;
    }
    char *end;
    errno = 0;
    double value = strtod(text, &end);
    if (errno != 0 || end == text || *end != '\0' || !(value > 0.0) || value > 100.0)
        return -1;
    uint32_t whole = (uint32_t)value;
    *units = (double)whole < value ? whole + 1 : whole;
    return 0;
}

/* FASTGSHARE_FAKE_GPU_MEMORY: bytes, optionally with a binary suffix K, M, G or T (KiB...). */
int fgpu_parse_bytes(const char *text, uint64_t *bytes)
{
    if (text == NULL || *text == '\0') {
        *bytes = FGPU_DEFAULT_MEMORY;
        return 0;
    }
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text || text[0] == '-')
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'K': shift = 10; end++; break;
    case 'M': shift = 20; end++; break;
    case 'G': shift = 30; end++; break;
    case 'T': shift = 40; end++; break;
    default: break;
    }
    if (shift != 0 && strcmp(end, "iB") == 0)
        end += 2;
    if (*end != '\0' || value == 0 || value > (UINT64_MAX >> shift))
        return -1;
    *bytes = (uint64_t)value << shift;
    return 0;
}

static void init_state(struct fake_gpu_state *s, uint64_t mem_total)
{
    pthread_mutexattr_t mutex_attr;
    pthread_mutexattr_init(&mutex_attr);
    pthread_mutexattr_setpshared(&mutex_attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&mutex_attr, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&s->lock.mutex, &mutex_attr);
    pthread_mutexattr_destroy(&mutex_attr);

    pthread_condattr_t cond_attr;
    pthread_condattr_init(&cond_attr);
    pthread_condattr_setpshared(&cond_attr, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&cond_attr, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond.cond, &cond_attr);
    pthread_condattr_destroy(&cond_attr);

    s->layout_version = FAKE_GPU_LAYOUT_VERSION;
    s->header_size = FAKE_GPU_HEADER_SIZE;
    s->proc_size = FAKE_GPU_PROC_SIZE;
    s->max_procs = FAKE_GPU_MAX_PROCS;
    s->sm_total = FAKE_GPU_SM_UNITS;
    s->sm_free = FAKE_GPU_SM_UNITS;
    s->mem_total = mem_total;
    if (fgpu_getrandom(s->uuid, sizeof s->uuid) != (ssize_t)sizeof s->uuid) {
        uint64_t seed = fgpu_now_ns() ^ ((uint64_t)getpid() << 32);
        memcpy(s->uuid, &seed, sizeof seed);
    }
    s->uuid[6] = (uint8_t)((s->uuid[6] & 0x0f) | 0x40); /* an RFC 4122 version-4 UUID */
    s->uuid[8] = (uint8_t)((s->uuid[8] & 0x3f) | 0x80);
    __atomic_store_n(&s->magic, FAKE_GPU_MAGIC, __ATOMIC_RELEASE);
}

/* Maps the state file, creating and initialising it if this process is first. The caller
 * holds flock(fd) so creators do not race. */
static struct fake_gpu_state *map_state(int fd, const char *path, uint64_t mem_total, char *err,
                                        size_t err_len)
{
    struct stat st;
    if (fgpu_fstat(fd, &st) != 0) {
        snprintf(err, err_len, "cannot stat %s: %s", path, strerror(errno));
        return NULL;
    }
    if (st.st_size == 0 && ftruncate(fd, FAKE_GPU_STATE_SIZE) != 0) {
        snprintf(err, err_len, "cannot size %s: %s", path, strerror(errno));
        return NULL;
    }
    if (st.st_size != 0 && st.st_size != (off_t)FAKE_GPU_STATE_SIZE) {
        snprintf(err, err_len, "%s has %lld bytes, expected %u (a state file of another layout?)",
                 path, (long long)st.st_size, FAKE_GPU_STATE_SIZE);
        return NULL;
    }
    void *map = mmap(NULL, FAKE_GPU_STATE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        snprintf(err, err_len, "cannot map %s: %s", path, strerror(errno));
        return NULL;
    }
    struct fake_gpu_state *s = map;
    uint64_t magic = __atomic_load_n(&s->magic, __ATOMIC_ACQUIRE);
    if (magic == 0) {
        init_state(s, mem_total);
    } else if (magic != FAKE_GPU_MAGIC || s->layout_version != FAKE_GPU_LAYOUT_VERSION) {
        snprintf(err, err_len, "%s is not a fake GPU state file of layout %u", path,
                 FAKE_GPU_LAYOUT_VERSION);
        munmap(map, FAKE_GPU_STATE_SIZE);
        return NULL;
    }
    return s;
}

struct fake_gpu_state *fgpu_open_state(const char *dir, uint64_t mem_total, char *err, size_t err_len)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, FAKE_GPU_STATE_FILE) >= sizeof path) {
        snprintf(err, err_len, FGPU_ENV_DIR " is too long");
        return NULL;
    }
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
    if (fd < 0) {
        snprintf(err, err_len, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            snprintf(err, err_len, "cannot lock %s: %s", path, strerror(errno));
            close(fd);
            return NULL;
        }
    }
    struct fake_gpu_state *s = map_state(fd, path, mem_total, err, err_len);
    /* Unlock explicitly: the mapping keeps the open file (and so a flock on it) alive after close. */
    flock(fd, LOCK_UN);
    close(fd);
    return s;
}
