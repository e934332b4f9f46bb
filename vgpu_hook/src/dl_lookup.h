/*
 * dl_lookup.h: one function of the C library's dynamic-linking API, found without calling it.
 */
#ifndef FGS_DL_LOOKUP_H
#define FGS_DL_LOOKUP_H

/* The default-version definition of the function `name` in the object that defines dlopen
 * (libc.so.6 from glibc 2.34 on, libdl.so.2 before), read from that object's dynamic symbol
 * table; NULL if it has none. The hook overrides dlsym and dlvsym, so it cannot ask either of
 * them for the C library's own: this is how it finds the real dlvsym. */
void *fgs_libdl_symbol(const char *name);

#endif
