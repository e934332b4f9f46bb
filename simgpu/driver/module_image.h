/*
 * module_image.h: what the simulated driver reads from a module image (module_image.c): the kernel
 * names, the module-scope variables with their sizes, and each kernel's parameter layout where
 * the image states it. No CUDA types here: the entry points (modules.c, library.c) map results
 * to CUresult.
 *
 * Formats: the simulated GPU's own "FAKECUBIN" images (any name; the spin kernel), PTX text, an
 * ELF cubin (EM_CUDA), a fatbin (magic 0xBA55ED50) of PTX and ELF entries, and the fatbin
 * wrapper struct of cuModuleLoadFatBinary (magic 0x466243B1). A compressed fatbin entry cannot
 * be read: when no entry of a fatbin is readable, every name is accepted (documented in
 * simgpu/README.md).
 */
#ifndef SIMGPU_MODULE_IMAGE_H
#define SIMGPU_MODULE_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#define IMAGE_MAX_PARAMS 256

/* What module_image.c reads in an ELF cubin and cubin_writer.c writes. */
#define IMAGE_EM_CUDA 190u               /* e_machine of NVIDIA's cubins */
#define IMAGE_STO_CUDA_ENTRY 0x10u       /* st_other of a kernel's STT_FUNC symbol */
#define IMAGE_EIFMT_SVAL 4u              /* an .nv.info record with a u16 size and that many bytes */
#define IMAGE_EIATTR_KPARAM_INFO 0x17u   /* .nv.info: u32 0, u16 ordinal, u16 offset, u32 size << 18 */
#define IMAGE_MARK_ANY_NAME ".simgpu.any_name" /* our linker's output: every kernel name resolves */
#define IMAGE_MARK_SPIN ".simgpu.spin"         /* our linker's output: FAKECUBIN spin kernels */

enum image_status {
    IMAGE_OK = 0,
    IMAGE_INVALID, /* not an image of any known format, or a malformed one */
    IMAGE_NO_MEMORY,
};

struct image_param {
    uint32_t offset;
    uint32_t size;
};

struct image_kernel {
    char *name;
    int params_known;   /* the image states the parameter layout (PTX, or the cubin's .nv.info) */
    uint32_t param_count;
    struct image_param *params;
};

struct image_global {
    char *name;
    uint64_t size;
};

struct image_info {
    int any_name;       /* every kernel name resolves (FAKECUBIN, or an unreadable fatbin) */
    int spin;           /* FAKECUBIN: a kernel's run time is its first parameter (microseconds) */
    size_t kernel_count, kernel_capacity;
    struct image_kernel *kernels;
    size_t global_count, global_capacity;
    struct image_global *globals;
};

/* Parses an image from memory. size 0: unknown (cuModuleLoadData), taken from the image's own
 * headers (ELF, fatbin) or its terminating NUL (PTX, FAKECUBIN). On success *out owns its
 * names (image_free); on failure *out is empty. */
enum image_status image_parse(const void *image, size_t size, struct image_info *out);

/* Adds every kernel and global of src not yet in dst (the linker's union); src is unchanged. */
enum image_status image_merge(struct image_info *dst, const struct image_info *src);

/* The kernel named `name`, or NULL. */
const struct image_kernel *image_find_kernel(const struct image_info *info, const char *name);

/* The module-scope variable named `name`, or NULL. */
const struct image_global *image_find_global(const struct image_info *info, const char *name);

void image_free(struct image_info *info);

/* Serialises info as an ELF cubin that image_parse reads back to the same names, globals,
 * parameter layouts and flags (cuLinkComplete's output; cubin_writer.c). NULL when out of
 * memory; *size set on success. */
void *image_write_cubin(const struct image_info *info, size_t *size);

#endif
