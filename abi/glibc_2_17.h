/*
 * glibc_2_17.h: the glibc floor of the libraries mounted into containers (the hook, the simulated
 * libcuda.so.1 and libnvidia-ml.so.1). Force-included (-include) into each of their objects, it binds
 * every dl and pthread call to the symbol version those functions had in glibc 2.17, so the
 * libraries load in images from glibc 2.17 on, whatever glibc they were built on.
 *
 * Why: glibc 2.34 moved libdl and libpthread into libc.so.6 under new default versions (dlopen,
 * pthread_create... @GLIBC_2.34; pthread_sigmask @GLIBC_2.32), and a build on a new glibc binds to
 * those. The old versions are still exported (compat symbols), so pinning them loses nothing on a new
 * glibc. On an old glibc they live in libdl.so.2 and libpthread.so.0: the Makefiles link those
 * (GLIBC_2_17_LIBS in glibc_2_17.mk) so that they are loaded. A versioned reference binds to whichever loaded object
 * defines that name and version (glibc's elf/dl-lookup.c check_match compares names only), so the
 * version need being recorded under libc.so.6 is harmless: libc.so.6 defines every version node up
 * to its own release.
 *
 * Functions that did not exist in glibc 2.17 (getrandom, 2.25; fstat as a symbol, 2.33) are not
 * called: simgpu/driver/raw_syscalls.h makes the system calls itself. Pinning a name that is never
 * referenced emits nothing. tests/integration/hook/test_glibc_floor.py fails on any version above
 * GLIBC_2.17 and on any symbol that glibc 2.17's libraries do not export.
 *
 * Versions: glibc 2.17's x86_64 abilists (nptl/libpthread.abilist, nptl/libdl.abilist). aarch64
 * began at 2.17, so every name's oldest version there is GLIBC_2.17.
 */
#ifndef FGS_GLIBC_2_17_H
#define FGS_GLIBC_2_17_H

#if defined(__x86_64__) && !defined(__ILP32__)
#define FGS_GLIBC_BASE "GLIBC_2.2.5"
#define FGS_GLIBC_2_3_3 "GLIBC_2.3.3"
#define FGS_GLIBC_2_3_4 "GLIBC_2.3.4"
#define FGS_GLIBC_2_12 "GLIBC_2.12"
#elif defined(__aarch64__)
#define FGS_GLIBC_BASE "GLIBC_2.17"
#define FGS_GLIBC_2_3_3 "GLIBC_2.17"
#define FGS_GLIBC_2_3_4 "GLIBC_2.17"
#define FGS_GLIBC_2_12 "GLIBC_2.17"
#endif

#ifdef FGS_GLIBC_BASE
#define FGS_GLIBC_PIN(name, version) __asm__(".symver " #name "," #name "@" version);

/* libdl.so.2. Not dlsym and dlvsym: the hook defines both (its exported overrides), and .symver on
 * a definition would version the override; the hook reaches the real ones through dl_lookup.c. */
FGS_GLIBC_PIN(dladdr, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(dlclose, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(dlerror, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(dlopen, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(dladdr1, FGS_GLIBC_2_3_3)
FGS_GLIBC_PIN(dlinfo, FGS_GLIBC_2_3_3)
FGS_GLIBC_PIN(dlmopen, FGS_GLIBC_2_3_4)

/* libpthread.so.0: the names that have a newer default version in libc.so.6 since 2.32/2.34 */
FGS_GLIBC_PIN(pthread_attr_getstacksize, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_attr_setstacksize, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_cancel, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_condattr_getpshared, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_condattr_setpshared, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_create, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_detach, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_getattr_np, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_getspecific, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_join, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_key_create, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_key_delete, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_kill, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_mutex_timedlock, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_mutex_trylock, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_mutexattr_destroy, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_mutexattr_getpshared, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_mutexattr_gettype, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_mutexattr_init, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_mutexattr_setpshared, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_mutexattr_settype, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_once, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_rwlock_destroy, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_rwlock_init, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_rwlock_rdlock, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_rwlock_unlock, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_rwlock_wrlock, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_setspecific, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_sigmask, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_spin_destroy, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_spin_init, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_spin_lock, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_spin_unlock, FGS_GLIBC_BASE)
FGS_GLIBC_PIN(pthread_condattr_getclock, FGS_GLIBC_2_3_3)
FGS_GLIBC_PIN(pthread_condattr_setclock, FGS_GLIBC_2_3_3)
FGS_GLIBC_PIN(pthread_mutex_consistent, FGS_GLIBC_2_12)
FGS_GLIBC_PIN(pthread_mutexattr_getrobust, FGS_GLIBC_2_12)
FGS_GLIBC_PIN(pthread_mutexattr_setrobust, FGS_GLIBC_2_12)

#undef FGS_GLIBC_PIN
#endif /* FGS_GLIBC_BASE */

#endif /* FGS_GLIBC_2_17_H */
