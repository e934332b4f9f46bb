/*
 * cubin_writer.c: the ELF cubin the simulated linker returns (image_write_cubin, module_image.h):
 * an ELF64 EM_CUDA image that module_image.c reads back to the same kernels, variables, parameter
 * layouts and flags. Sections: .shstrtab, .strtab, .symtab (a kernel is an STT_FUNC symbol marked
 * as a CUDA entry, a variable an STT_OBJECT of its size), .text and .nv.global for those symbols to
 * point into, one empty marker section per flag (IMAGE_MARK_*), and one `.nv.info.NAME` a kernel
 * whose parameter layout is known (EIATTR_KPARAM_INFO records, as NVIDIA's compilers write them).
 * Nothing in it can run: the simulated GPU computes nothing.
 */
#include "module_image.h"

#include <stdlib.h>
#include <string.h>

#define SHT_PROGBITS 1u
#define SHT_SYMTAB 2u
#define SHT_STRTAB 3u
#define SHT_NOBITS 8u
#define SHT_LOPROC 0x70000000u /* NVIDIA's .nv.info sections */
#define STT_OBJECT 1u
#define STT_FUNC 2u

/* --- a growing byte buffer ------------------------------------------------------------------ */

struct buffer {
    unsigned char *p;
    size_t len, capacity;
    int failed;
};

/* Appends len bytes (zeros when data is NULL); returns where they start. */
static size_t put(struct buffer *b, const void *data, size_t len)
{
    size_t at = b->len;
    if (b->failed)
        return at;
    if (b->len + len > b->capacity) {
        size_t wanted = b->capacity ? b->capacity : 1024;
        while (wanted < b->len + len)
            wanted *= 2;
        unsigned char *bigger = realloc(b->p, wanted);
        if (bigger == NULL) {
            b->failed = 1;
            return at;
        }
        b->p = bigger;
        b->capacity = wanted;
    }
    if (data != NULL)
        memcpy(b->p + b->len, data, len);
    else
        memset(b->p + b->len, 0, len);
    b->len += len;
    return at;
}

static void put16(struct buffer *b, uint16_t v)
{
    unsigned char bytes[2] = {(unsigned char)v, (unsigned char)(v >> 8)};
    put(b, bytes, 2);
}

static void put32(struct buffer *b, uint32_t v)
{
    put16(b, (uint16_t)v);
    put16(b, (uint16_t)(v >> 16));
}

static void put64(struct buffer *b, uint64_t v)
{
    put32(b, (uint32_t)v);
    put32(b, (uint32_t)(v >> 32));
}

/* prefix + s + NUL into a string table; its offset there. */
static uint32_t put_string(struct buffer *strings, const char *prefix, const char *s)
{
    uint32_t at = (uint32_t)put(strings, prefix, strlen(prefix));
    put(strings, s, strlen(s) + 1);
    return at;
}

/* --- the parts ------------------------------------------------------------------------------ */

struct section {
    uint32_t name, type, link, info;
    uint64_t offset, size, entsize;
};

struct writer {
    struct buffer shstr, str, sym, nvinfo, out;
    struct section *sections;
    size_t count, capacity;
};

static struct section *add_section(struct writer *w, const char *prefix, const char *name, uint32_t type)
{
    if (w->count == w->capacity) {
        size_t wanted = w->capacity ? w->capacity * 2 : 16;
        struct section *bigger = realloc(w->sections, wanted * sizeof *bigger);
        if (bigger == NULL)
            return NULL;
        w->sections = bigger;
        w->capacity = wanted;
    }
    struct section *s = &w->sections[w->count++];
    memset(s, 0, sizeof *s);
    s->name = name != NULL ? put_string(&w->shstr, prefix, name) : 0;
    s->type = type;
    return s;
}

static void put_symbol(struct buffer *b, uint32_t name, uint8_t type, uint8_t other, uint16_t shndx, uint64_t size)
{
    put32(b, name);
    unsigned char info_other[2] = {(unsigned char)(0x10 | type) /* STB_GLOBAL */, other};
    put(b, info_other, 2);
    put16(b, shndx);
    put64(b, 0);
    put64(b, size);
}

static void put_param_info(struct buffer *b, const struct image_kernel *k)
{
    for (uint32_t i = 0; i < k->param_count; i++) {
        unsigned char head[4] = {IMAGE_EIFMT_SVAL, IMAGE_EIATTR_KPARAM_INFO, 12, 0};
        put(b, head, 4);
        put32(b, 0);
        put16(b, (uint16_t)i);
        put16(b, (uint16_t)k->params[i].offset);
        put32(b, (k->params[i].size & 0x3fffu) << 18 | 0x1f000u);
    }
}

/* The symbol table: kernels point into section `text`, variables into `global`. */
static void write_symbols(struct writer *w, const struct image_info *info, uint16_t text, uint16_t global)
{
    put(&w->str, "", 1);
    put_symbol(&w->sym, 0, 0, 0, 0, 0);
    for (size_t i = 0; i < info->kernel_count; i++)
        put_symbol(&w->sym, put_string(&w->str, "", info->kernels[i].name), STT_FUNC, IMAGE_STO_CUDA_ENTRY, text, 0);
    for (size_t i = 0; i < info->global_count; i++)
        put_symbol(&w->sym, put_string(&w->str, "", info->globals[i].name), STT_OBJECT, 0, global,
                   info->globals[i].size);
}

/* One .nv.info.NAME section a kernel with a known layout; offsets relative to w->nvinfo for now. */
static int write_param_sections(struct writer *w, const struct image_info *info)
{
    for (size_t i = 0; i < info->kernel_count; i++) {
        if (!info->kernels[i].params_known)
            continue;
        struct section *s = add_section(w, ".nv.info.", info->kernels[i].name, SHT_LOPROC);
        if (s == NULL)
            return -1;
        s->offset = w->nvinfo.len;
        put_param_info(&w->nvinfo, &info->kernels[i]);
        s->size = w->nvinfo.len - s->offset;
    }
    return 0;
}

static void put_section_header(struct buffer *b, const struct section *s)
{
    put32(b, s->name);
    put32(b, s->type);
    put64(b, 0); /* flags */
    put64(b, 0); /* address */
    put64(b, s->offset);
    put64(b, s->size);
    put32(b, s->link);
    put32(b, s->info);
    put64(b, 8); /* alignment */
    put64(b, s->entsize);
}

static void put_elf_header(struct buffer *b, uint64_t shoff, uint16_t shnum)
{
    put(b, "\177ELF\2\1\1\101\10", 9); /* 64-bit, LE, version 1, NVIDIA's OS/ABI 0x41, ABI version 8 */
    put(b, NULL, 7);
    put16(b, 2);              /* ET_EXEC */
    put16(b, IMAGE_EM_CUDA);  /* e_machine */
    put32(b, 1);              /* e_version */
    put64(b, 0);              /* e_entry */
    put64(b, 0);              /* e_phoff */
    put64(b, shoff);          /* e_shoff */
    put32(b, 0x5a05a);        /* e_flags: sm_90-like */
    put16(b, 64);             /* e_ehsize */
    put16(b, 56);             /* e_phentsize */
    put16(b, 0);              /* e_phnum */
    put16(b, 64);             /* e_shentsize */
    put16(b, shnum);
    put16(b, 1);              /* e_shstrndx: .shstrtab is section 1 */
}

enum { SEC_NULL, SEC_SHSTRTAB, SEC_STRTAB, SEC_SYMTAB, SEC_TEXT, SEC_GLOBAL, SEC_FIRST_OPTIONAL };

/* The section headers of every part, then the parts' bytes placed after a blank ELF header. */
static int lay_out(struct writer *w, const struct image_info *info)
{
    put(&w->shstr, "", 1);
    if (add_section(w, NULL, NULL, 0) == NULL || add_section(w, "", ".shstrtab", SHT_STRTAB) == NULL ||
        add_section(w, "", ".strtab", SHT_STRTAB) == NULL || add_section(w, "", ".symtab", SHT_SYMTAB) == NULL ||
        add_section(w, "", ".text", SHT_PROGBITS) == NULL || add_section(w, "", ".nv.global", SHT_NOBITS) == NULL)
        return -1;
    if ((info->any_name && add_section(w, "", IMAGE_MARK_ANY_NAME, SHT_PROGBITS) == NULL) ||
        (info->spin && add_section(w, "", IMAGE_MARK_SPIN, SHT_PROGBITS) == NULL))
        return -1;
    size_t first_info = w->count;
    write_symbols(w, info, SEC_TEXT, SEC_GLOBAL);
    if (write_param_sections(w, info) != 0)
        return -1;
    put(&w->out, NULL, 64); /* the ELF header, written last */
    struct section *s = w->sections;
    s[SEC_SHSTRTAB].offset = put(&w->out, w->shstr.p, w->shstr.len);
    s[SEC_SHSTRTAB].size = w->shstr.len;
    s[SEC_STRTAB].offset = put(&w->out, w->str.p, w->str.len);
    s[SEC_STRTAB].size = w->str.len;
    s[SEC_SYMTAB].offset = put(&w->out, w->sym.p, w->sym.len);
    s[SEC_SYMTAB].size = w->sym.len;
    s[SEC_SYMTAB].link = SEC_STRTAB;
    s[SEC_SYMTAB].info = 1; /* the first non-local symbol */
    s[SEC_SYMTAB].entsize = 24;
    for (size_t i = SEC_TEXT; i < first_info; i++)
        s[i].offset = w->out.len; /* empty */
    size_t nvinfo_at = put(&w->out, w->nvinfo.p, w->nvinfo.len);
    for (size_t i = first_info; i < w->count; i++)
        s[i].offset += nvinfo_at;
    return 0;
}

static void writer_free(struct writer *w)
{
    free(w->shstr.p);
    free(w->str.p);
    free(w->sym.p);
    free(w->nvinfo.p);
    free(w->sections);
}

void *image_write_cubin(const struct image_info *info, size_t *size)
{
    struct writer w = {0};
    int failed = lay_out(&w, info) != 0 || w.count > 0xff00;
    put(&w.out, NULL, (8 - w.out.len % 8) % 8);
    size_t shoff = w.out.len;
    for (size_t i = 0; !failed && i < w.count; i++)
        put_section_header(&w.out, &w.sections[i]);
    struct buffer header = {0};
    put_elf_header(&header, shoff, (uint16_t)w.count);
    failed |= w.out.failed || w.shstr.failed || w.str.failed || w.sym.failed || w.nvinfo.failed || header.failed;
    if (!failed)
        memcpy(w.out.p, header.p, 64);
    free(header.p);
    writer_free(&w);
    if (failed) {
        free(w.out.p);
        return NULL;
    }
    *size = w.out.len;
    return w.out.p;
}
