/*
 * module_image.c: reads module images (module_image.h): FAKECUBIN, PTX text, ELF cubins, fatbins
 * and the fatbin wrapper, for kernel names, module-scope variables and parameter layouts. Every
 * read is bounds-checked against the image's size (given, or taken from its own headers when
 * cuModuleLoadData passes none).
 *
 * PTX: at brace depth 0, `[.visible|.weak] .entry NAME(params)` is a kernel (its `.param` list
 * gives offsets and sizes); `[.visible|.weak] .global|.const [.align N] [.vN] .TYPE NAME[dims]
 * [= init];` a variable of TYPE size x vector x dims (`[]` counts the initializer); `.extern`
 * declarations own no storage. ELF (EM_CUDA): defined STT_FUNC symbols marked as CUDA entries
 * (st_other 0x10; all defined functions when none is marked; the `.text.NAME` sections when there
 * is no symbol table) are the kernels, defined STT_OBJECT symbols the variables, and a kernel's
 * `.nv.info.NAME` EIATTR_KPARAM_INFO records its parameters. Fatbin: the union of its readable
 * (uncompressed) PTX and ELF entries. The cubin cuLinkComplete returns is cubin_writer.c's.
 */
#include "module_image.h"

#include <stdlib.h>
#include <string.h>

#define FAKE_IMAGE_PREFIX "FAKECUBIN"
#define FATBIN_MAGIC 0xBA55ED50u
#define FATBIN_WRAPPER_MAGIC 0x466243B1u
#define FATBIN_KIND_PTX 1u
#define FATBIN_KIND_ELF 2u
#define FATBIN_COMPRESSED (UINT64_C(0x2000) | UINT64_C(0x8000)) /* LZ4 (older), zstd (CUDA 12.x+) */
#define MAX_IMAGE_BYTES (UINT64_C(1) << 30)
#define MAX_NAME 4096u

/* --- lists ---------------------------------------------------------------------------------- */

static char *copy_name(const char *name, size_t len)
{
    char *copy = malloc(len + 1);
    if (copy != NULL) {
        memcpy(copy, name, len);
        copy[len] = '\0';
    }
    return copy;
}

static int grow(void **items, size_t *capacity, size_t count, size_t item_size)
{
    if (count < *capacity)
        return 0;
    size_t wanted = *capacity ? *capacity * 2 : 8;
    void *bigger = realloc(*items, wanted * item_size);
    if (bigger == NULL)
        return -1;
    *items = bigger;
    *capacity = wanted;
    return 0;
}

static struct image_kernel *find_kernel_n(const struct image_info *info, const char *name, size_t len)
{
    for (size_t i = 0; i < info->kernel_count; i++)
        if (strlen(info->kernels[i].name) == len && memcmp(info->kernels[i].name, name, len) == 0)
            return &info->kernels[i];
    return NULL;
}

/* The kernel `name` (added when new); NULL when out of memory or the name is unusable. */
static struct image_kernel *add_kernel(struct image_info *info, const char *name, size_t len)
{
    if (len == 0 || len >= MAX_NAME)
        return NULL;
    struct image_kernel *known = find_kernel_n(info, name, len);
    if (known != NULL)
        return known;
    if (grow((void **)&info->kernels, &info->kernel_capacity, info->kernel_count, sizeof *info->kernels) != 0)
        return NULL;
    struct image_kernel *k = &info->kernels[info->kernel_count];
    memset(k, 0, sizeof *k);
    if ((k->name = copy_name(name, len)) == NULL)
        return NULL;
    info->kernel_count++;
    return k;
}

static int set_params(struct image_kernel *k, const struct image_param *params, uint32_t count)
{
    if (k->params_known)
        return 0;
    struct image_param *copy = count ? malloc(count * sizeof *copy) : NULL;
    if (count && copy == NULL)
        return -1;
    if (count)
        memcpy(copy, params, count * sizeof *copy);
    k->params = copy;
    k->param_count = count;
    k->params_known = 1;
    return 0;
}

static int add_global(struct image_info *info, const char *name, size_t len, uint64_t size)
{
    if (len == 0 || len >= MAX_NAME || size == 0 || size > MAX_IMAGE_BYTES)
        return 0; /* nothing a copy could use */
    for (size_t i = 0; i < info->global_count; i++)
        if (strlen(info->globals[i].name) == len && memcmp(info->globals[i].name, name, len) == 0)
            return 0;
    if (grow((void **)&info->globals, &info->global_capacity, info->global_count, sizeof *info->globals) != 0)
        return -1;
    char *copy = copy_name(name, len);
    if (copy == NULL)
        return -1;
    info->globals[info->global_count++] = (struct image_global){copy, size};
    return 0;
}

void image_free(struct image_info *info)
{
    for (size_t i = 0; i < info->kernel_count; i++) {
        free(info->kernels[i].name);
        free(info->kernels[i].params);
    }
    for (size_t i = 0; i < info->global_count; i++)
        free(info->globals[i].name);
    free(info->kernels);
    free(info->globals);
    memset(info, 0, sizeof *info);
}

const struct image_kernel *image_find_kernel(const struct image_info *info, const char *name)
{
    return find_kernel_n(info, name, strlen(name));
}

const struct image_global *image_find_global(const struct image_info *info, const char *name)
{
    for (size_t i = 0; i < info->global_count; i++)
        if (strcmp(info->globals[i].name, name) == 0)
            return &info->globals[i];
    return NULL;
}

enum image_status image_merge(struct image_info *dst, const struct image_info *src)
{
    dst->any_name |= src->any_name;
    dst->spin |= src->spin;
    for (size_t i = 0; i < src->kernel_count; i++) {
        const struct image_kernel *k = &src->kernels[i];
        struct image_kernel *added = add_kernel(dst, k->name, strlen(k->name));
        if (added == NULL || (k->params_known && set_params(added, k->params, k->param_count) != 0))
            return IMAGE_NO_MEMORY;
    }
    for (size_t i = 0; i < src->global_count; i++)
        if (add_global(dst, src->globals[i].name, strlen(src->globals[i].name), src->globals[i].size) != 0)
            return IMAGE_NO_MEMORY;
    return IMAGE_OK;
}

/* --- PTX ------------------------------------------------------------------------------------ */

struct token {
    const char *s;
    size_t len;
    char punct; /* the character of a punctuation token, 0 for a word */
};

struct lexer {
    const char *p, *end;
};

static int word_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '$' ||
           c == '%' || c == '.';
}

static void skip_space_and_comments(struct lexer *lx)
{
    while (lx->p < lx->end) {
        char c = *lx->p;
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
            lx->p++;
        } else if (c == '/' && lx->p + 1 < lx->end && lx->p[1] == '/') {
            while (lx->p < lx->end && *lx->p != '\n')
                lx->p++;
        } else if (c == '/' && lx->p + 1 < lx->end && lx->p[1] == '*') {
            lx->p += 2;
            while (lx->p + 1 < lx->end && !(lx->p[0] == '*' && lx->p[1] == '/'))
                lx->p++;
            lx->p = lx->p + 2 <= lx->end ? lx->p + 2 : lx->end;
        } else {
            return;
        }
    }
}

/* The next token; len 0 at the end. A string literal is one word token. */
static struct token next_token(struct lexer *lx)
{
    skip_space_and_comments(lx);
    struct token t = {lx->p, 0, 0};
    if (lx->p >= lx->end)
        return t;
    if (*lx->p == '"') {
        const char *q = lx->p + 1;
        while (q < lx->end && *q != '"')
            q++;
        lx->p = q < lx->end ? q + 1 : lx->end;
    } else if (word_char(*lx->p)) {
        while (lx->p < lx->end && word_char(*lx->p))
            lx->p++;
    } else {
        t.punct = *lx->p++;
    }
    t.len = (size_t)(lx->p - t.s);
    return t;
}

static int is_word(struct token t, const char *word)
{
    return t.punct == 0 && t.len == strlen(word) && memcmp(t.s, word, t.len) == 0;
}

static uint64_t parse_uint(struct token t)
{
    uint64_t value = 0;
    for (size_t i = 0; i < t.len; i++) {
        if (t.s[i] < '0' || t.s[i] > '9' || value > MAX_IMAGE_BYTES)
            return 0;
        value = value * 10 + (uint64_t)(t.s[i] - '0');
    }
    return value;
}

/* Bytes of a PTX fundamental type directive (".u32"), 0 when t is none. */
static uint32_t type_size(struct token t)
{
    static const struct { const char *name; uint32_t size; } types[] = {
        {".b8", 1},     {".u8", 1},      {".s8", 1},   {".pred", 1}, {".b16", 2},  {".u16", 2},   {".s16", 2},
        {".f16", 2},    {".bf16", 2},    {".b32", 4},  {".u32", 4},  {".s32", 4},  {".f32", 4},   {".f16x2", 4},
        {".bf16x2", 4}, {".tf32", 4},    {".b64", 8},  {".u64", 8},  {".s64", 8},  {".f64", 8},   {".b128", 16},
        {".texref", 8}, {".samplerref", 8}, {".surfref", 8},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (is_word(t, types[i].name))
            return types[i].size;
    return 0;
}

static uint32_t vector_width(struct token t)
{
    return is_word(t, ".v2") ? 2 : is_word(t, ".v4") ? 4 : is_word(t, ".v8") ? 8 : 0;
}

/* A declarator's parts: [.align N] [.vN] .TYPE NAME [dims]. */
struct declarator {
    uint32_t align, vector, type;
    int pointer; /* .ptr seen: a later .align is the pointee's */
    struct token name;
    uint64_t count; /* product of the dimensions; 0 for `[]` */
    int open_dim;
};

static void declarator_word(struct declarator *d, struct token t, struct lexer *lx)
{
    uint32_t size;
    if (is_word(t, ".align")) {
        uint64_t align = parse_uint(next_token(lx));
        if (!d->pointer)
            d->align = (uint32_t)(align > 4096 ? 4096 : align);
    } else if (is_word(t, ".ptr")) {
        d->pointer = 1;
    } else if ((size = vector_width(t)) != 0) {
        d->vector = size;
    } else if ((size = type_size(t)) != 0) {
        d->type = size;
    } else if (t.s[0] != '.' && d->name.len == 0) {
        d->name = t;
    }
}

static void declarator_dim(struct declarator *d, struct lexer *lx)
{
    struct token t = next_token(lx);
    if (t.punct == ']') {
        d->open_dim = 1;
        d->count = 0;
        return;
    }
    uint64_t n = parse_uint(t);
    d->count = d->count * n > MAX_IMAGE_BYTES ? MAX_IMAGE_BYTES : d->count * n;
    while (t.len > 0 && t.punct != ']')
        t = next_token(lx);
}

static uint64_t declarator_bytes(const struct declarator *d)
{
    uint64_t element = (uint64_t)(d->type ? d->type : 1) * (d->vector ? d->vector : 1);
    uint64_t bytes = element * d->count;
    return bytes > MAX_IMAGE_BYTES ? MAX_IMAGE_BYTES : bytes;
}

/* Counts the top-level elements of an initializer `{a, {b, c}, d}` (or 1 for a scalar) up to the
 * statement's ';'. Nested braces count as the elements of the outermost level's members. */
static uint64_t initializer_elements(struct lexer *lx)
{
    uint64_t elements = 0, depth = 0;
    int in_element = 0;
    for (struct token t = next_token(lx); t.len > 0 && !(t.punct == ';' && depth == 0); t = next_token(lx)) {
        if (t.punct == '{') {
            depth++;
        } else if (t.punct == '}') {
            depth -= depth > 0;
        } else if (t.punct == ',' && depth <= 1) {
            in_element = 0;
        } else if (!in_element) {
            in_element = 1;
            elements++;
        }
    }
    return elements;
}

/* After `.global`/`.const`: the variable's declarator up to ';'. */
static enum image_status ptx_variable(struct image_info *info, struct lexer *lx, int external)
{
    struct declarator d = {.count = 1};
    struct token t = next_token(lx);
    if (t.punct == '[') /* .const[bank] */
        while (t.len > 0 && t.punct != ']')
            t = next_token(lx);
    uint64_t initialised = 0;
    int has_init = 0;
    for (; t.len > 0 && t.punct != ';'; t = next_token(lx)) {
        if (t.punct == '[' && d.name.len > 0) {
            declarator_dim(&d, lx);
        } else if (t.punct == '=') {
            has_init = 1;
            initialised = initializer_elements(lx);
            break;
        } else if (t.punct == 0) {
            declarator_word(&d, t, lx);
        } else if (t.punct == '(') { /* .attribute(...) */
            while (t.len > 0 && t.punct != ')')
                t = next_token(lx);
        }
    }
    if (d.open_dim)
        d.count = has_init ? initialised : 0;
    if (external || d.name.len == 0)
        return IMAGE_OK;
    return add_global(info, d.name.s, d.name.len, declarator_bytes(&d)) == 0 ? IMAGE_OK : IMAGE_NO_MEMORY;
}

/* One `.param` of an entry's list; its layout appended at *offset. */
static void ptx_param(struct lexer *lx, struct token *t, struct image_param *params, uint32_t *count,
                      uint32_t *offset)
{
    struct declarator d = {.count = 1};
    for (*t = next_token(lx); t->len > 0 && t->punct != ',' && t->punct != ')'; *t = next_token(lx)) {
        if (t->punct == '[')
            declarator_dim(&d, lx);
        else if (t->punct == 0)
            declarator_word(&d, *t, lx);
    }
    uint64_t bytes = declarator_bytes(&d);
    uint32_t align = d.align ? d.align : (d.type ? d.type * (d.vector ? d.vector : 1) : 1);
    uint64_t at = ((uint64_t)*offset + align - 1) / align * align;
    if (*count < IMAGE_MAX_PARAMS && at + bytes <= UINT32_MAX) {
        params[*count] = (struct image_param){(uint32_t)at, (uint32_t)bytes};
        (*count)++;
        *offset = (uint32_t)(at + bytes);
    }
}

/* After `.entry`: the kernel's name and its parameter list. */
static enum image_status ptx_entry(struct image_info *info, struct lexer *lx)
{
    struct token name = next_token(lx);
    if (name.punct != 0 || name.s[0] == '.')
        return IMAGE_INVALID;
    struct image_kernel *k = add_kernel(info, name.s, name.len);
    if (k == NULL)
        return IMAGE_NO_MEMORY;
    struct lexer peek = *lx;
    struct token t = next_token(&peek);
    if (t.punct != '(')
        return set_params(k, NULL, 0) == 0 ? IMAGE_OK : IMAGE_NO_MEMORY;
    *lx = peek;
    static __thread struct image_param params[IMAGE_MAX_PARAMS];
    uint32_t count = 0, offset = 0;
    t = next_token(lx);
    while (t.len > 0 && t.punct != ')') {
        if (is_word(t, ".param"))
            ptx_param(lx, &t, params, &count, &offset);
        else
            t = next_token(lx);
        if (t.punct == ',')
            t = next_token(lx);
    }
    return set_params(k, params, count) == 0 ? IMAGE_OK : IMAGE_NO_MEMORY;
}

/* Skips a function body: the lexer is past its '{'. */
static void skip_body(struct lexer *lx)
{
    int depth = 1;
    for (struct token t = next_token(lx); t.len > 0; t = next_token(lx)) {
        if (t.punct == '{')
            depth++;
        else if (t.punct == '}' && --depth == 0)
            return;
    }
}

/* Text a PTX module can be: no control characters other than white space. */
static int ptx_text(const char *text, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r' && c != '\f' && c != '\v')
            return 0;
    }
    return 1;
}

static enum image_status parse_ptx(const char *text, size_t len, struct image_info *info)
{
    if (!ptx_text(text, len))
        return IMAGE_INVALID;
    struct lexer lx = {text, text + len};
    int version = 0, external = 0, parens = 0;
    enum image_status status = IMAGE_OK;
    for (struct token t = next_token(&lx); t.len > 0 && status == IMAGE_OK; t = next_token(&lx)) {
        if (is_word(t, ".extern")) {
            external = 1;
            continue;
        }
        if (is_word(t, ".version"))
            version = 1;
        else if (is_word(t, ".entry"))
            status = ptx_entry(info, &lx);
        else if (parens == 0 && (is_word(t, ".global") || is_word(t, ".const")))
            status = ptx_variable(info, &lx, external);
        else if (t.punct == '(')
            parens++;
        else if (t.punct == ')')
            parens -= parens > 0;
        else if (t.punct == '{')
            skip_body(&lx);
        if (t.punct == ';' || t.punct == '{' || is_word(t, ".entry") || is_word(t, ".global") ||
            is_word(t, ".const") || is_word(t, ".func"))
            external = 0;
    }
    return status == IMAGE_OK && !version ? IMAGE_INVALID : status;
}

/* --- ELF cubins ----------------------------------------------------------------------------- */

struct bytes {
    const unsigned char *p;
    size_t size;
};

static int in_bounds(struct bytes b, uint64_t offset, uint64_t len)
{
    return offset <= b.size && len <= b.size - offset;
}

static uint16_t read16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static uint32_t read32(const unsigned char *p)
{
    return (uint32_t)read16(p) | (uint32_t)read16(p + 2) << 16;
}

static uint64_t read64(const unsigned char *p)
{
    return (uint64_t)read32(p) | (uint64_t)read32(p + 4) << 32;
}

struct elf_section {
    uint32_t name, type, link;
    uint64_t offset, size, entsize;
};

struct elf {
    struct bytes b;
    uint64_t shoff;
    uint16_t shnum, shstrndx;
};

static int elf_header(const unsigned char *p)
{
    return memcmp(p, "\177ELF", 4) == 0 && p[4] == 2 /* 64-bit */ && p[5] == 1 /* little-endian */ &&
           read16(p + 18) == IMAGE_EM_CUDA;
}

static struct elf_section elf_section(const struct elf *e, uint16_t i)
{
    const unsigned char *h = e->b.p + e->shoff + (uint64_t)i * 64;
    return (struct elf_section){read32(h), read32(h + 4), read32(h + 40), read64(h + 24), read64(h + 32),
                                read64(h + 56)};
}

/* A NUL-terminated name at offset in the string table section; NULL when out of bounds. */
static const char *elf_string(const struct elf *e, struct elf_section strtab, uint64_t offset)
{
    if (offset >= strtab.size || !in_bounds(e->b, strtab.offset, strtab.size))
        return NULL;
    const char *s = (const char *)e->b.p + strtab.offset + offset;
    return memchr(s, '\0', strtab.size - offset) != NULL ? s : NULL;
}

static int elf_open(struct bytes b, struct elf *e)
{
    if (b.size < 64 || !elf_header(b.p))
        return -1;
    e->b = b;
    e->shoff = read64(b.p + 40);
    e->shnum = read16(b.p + 60);
    e->shstrndx = read16(b.p + 62);
    if (read16(b.p + 58) != 64 || !in_bounds(b, e->shoff, (uint64_t)e->shnum * 64) || e->shstrndx >= e->shnum)
        return -1;
    for (uint16_t i = 0; i < e->shnum; i++) {
        struct elf_section s = elf_section(e, i);
        if (s.type != 8 /* NOBITS */ && !in_bounds(b, s.offset, s.size))
            return -1;
    }
    return 0;
}

static const char *elf_section_name(const struct elf *e, struct elf_section s)
{
    return elf_string(e, elf_section(e, e->shstrndx), s.name);
}

/* The bytes an ELF image spans, from its headers (cuModuleLoadData gives no size); 0 if absurd. */
static size_t elf_extent(const unsigned char *p)
{
    uint64_t shoff = read64(p + 40), phoff = read64(p + 32);
    uint64_t shnum = read16(p + 60), phnum = read16(p + 56), phentsize = read16(p + 54);
    if (read16(p + 58) != 64 || shoff > MAX_IMAGE_BYTES || phoff > MAX_IMAGE_BYTES)
        return 0;
    uint64_t end = shoff + shnum * 64;
    if (phoff + phnum * phentsize > end)
        end = phoff + phnum * phentsize;
    for (uint64_t i = 0; i < shnum; i++) {
        const unsigned char *h = p + shoff + i * 64;
        uint64_t offset = read64(h + 24), size = read64(h + 32);
        if (read32(h + 4) != 8 && offset <= MAX_IMAGE_BYTES && size <= MAX_IMAGE_BYTES && offset + size > end)
            end = offset + size;
    }
    return end > MAX_IMAGE_BYTES ? 0 : (size_t)end;
}

/* The EIATTR_KPARAM_INFO records of .nv.info.<kernel>: parameter i at offset, size bytes. */
static enum image_status elf_params(const struct elf *e, struct elf_section info, struct image_kernel *k)
{
    static __thread struct image_param params[IMAGE_MAX_PARAMS];
    uint32_t count = 0;
    memset(params, 0, sizeof params);
    const unsigned char *p = e->b.p + info.offset, *end = p + info.size;
    while (p + 4 <= end) {
        uint8_t format = p[0], attribute = p[1];
        uint16_t len = format == IMAGE_EIFMT_SVAL ? read16(p + 2) : 0;
        if (format == IMAGE_EIFMT_SVAL && (size_t)(end - p - 4) < len)
            break;
        if (format == IMAGE_EIFMT_SVAL && attribute == IMAGE_EIATTR_KPARAM_INFO && len >= 12) {
            uint16_t ordinal = read16(p + 8), offset = read16(p + 10);
            uint32_t size = (read32(p + 12) >> 18) & 0x3fff;
            if (ordinal < IMAGE_MAX_PARAMS) {
                params[ordinal] = (struct image_param){offset, size};
                if (ordinal + 1u > count)
                    count = ordinal + 1u;
            }
        }
        p += 4 + (format == IMAGE_EIFMT_SVAL ? len : 0);
    }
    return set_params(k, params, count) == 0 ? IMAGE_OK : IMAGE_NO_MEMORY;
}

static enum image_status elf_kernel_params(const struct elf *e, struct image_info *info)
{
    for (uint16_t i = 0; i < e->shnum; i++) {
        struct elf_section s = elf_section(e, i);
        const char *name = elf_section_name(e, s);
        if (name == NULL || strncmp(name, ".nv.info.", 9) != 0)
            continue;
        struct image_kernel *k = find_kernel_n(info, name + 9, strlen(name + 9));
        if (k != NULL && !k->params_known && elf_params(e, s, k) != IMAGE_OK)
            return IMAGE_NO_MEMORY;
    }
    return IMAGE_OK;
}

/* Kernels and variables from the symbol table; `entries_only`: functions marked as CUDA entries. */
static enum image_status elf_symbols(const struct elf *e, struct elf_section symtab, int entries_only,
                                     struct image_info *info)
{
    if (symtab.link >= e->shnum || symtab.entsize != 24)
        return IMAGE_INVALID;
    struct elf_section strtab = elf_section(e, symtab.link);
    for (uint64_t at = 0; at + 24 <= symtab.size; at += 24) {
        const unsigned char *sym = e->b.p + symtab.offset + at;
        uint8_t type = sym[4] & 0xf, other = sym[5];
        uint16_t shndx = read16(sym + 6);
        const char *name = elf_string(e, strtab, read32(sym));
        if (name == NULL || shndx == 0 || name[0] == '\0')
            continue;
        if (type == 2 && (!entries_only || (other & IMAGE_STO_CUDA_ENTRY))) {
            if (add_kernel(info, name, strlen(name)) == NULL)
                return IMAGE_NO_MEMORY;
        } else if (type == 1 && add_global(info, name, strlen(name), read64(sym + 16)) != 0) {
            return IMAGE_NO_MEMORY;
        }
    }
    return IMAGE_OK;
}

static int elf_has_entry_marks(const struct elf *e, struct elf_section symtab)
{
    for (uint64_t at = 0; symtab.entsize == 24 && at + 24 <= symtab.size; at += 24) {
        const unsigned char *sym = e->b.p + symtab.offset + at;
        if ((sym[4] & 0xf) == 2 && read16(sym + 6) != 0 && (sym[5] & IMAGE_STO_CUDA_ENTRY))
            return 1;
    }
    return 0;
}

/* No symbol table: the kernels are the `.text.NAME` sections. Also reads our own marks. */
static enum image_status elf_sections(const struct elf *e, int have_symtab, struct image_info *info)
{
    for (uint16_t i = 0; i < e->shnum; i++) {
        const char *name = elf_section_name(e, elf_section(e, i));
        if (name == NULL)
            continue;
        if (strcmp(name, IMAGE_MARK_ANY_NAME) == 0)
            info->any_name = 1;
        else if (strcmp(name, IMAGE_MARK_SPIN) == 0)
            info->spin = 1;
        else if (!have_symtab && strncmp(name, ".text.", 6) == 0 &&
                 add_kernel(info, name + 6, strlen(name + 6)) == NULL)
            return IMAGE_NO_MEMORY;
    }
    return IMAGE_OK;
}

static enum image_status parse_elf(struct bytes b, struct image_info *info)
{
    struct elf e;
    if (elf_open(b, &e) != 0)
        return IMAGE_INVALID;
    int have_symtab = 0;
    enum image_status status = IMAGE_OK;
    for (uint16_t i = 0; i < e.shnum && status == IMAGE_OK; i++) {
        struct elf_section s = elf_section(&e, i);
        if (s.type == 2 /* SYMTAB */) {
            have_symtab = 1;
            status = elf_symbols(&e, s, elf_has_entry_marks(&e, s), info);
        }
    }
    if (status == IMAGE_OK)
        status = elf_sections(&e, have_symtab, info);
    return status == IMAGE_OK ? elf_kernel_params(&e, info) : status;
}

/* --- fatbins -------------------------------------------------------------------------------- */

static enum image_status fatbin_entry(struct bytes entry, uint16_t kind, uint64_t flags, struct image_info *info,
                                      int *readable)
{
    if (flags & FATBIN_COMPRESSED)
        return IMAGE_OK;
    enum image_status status = IMAGE_OK;
    if (kind == FATBIN_KIND_PTX) {
        const char *text = (const char *)entry.p;
        const char *nul = memchr(text, '\0', entry.size);
        status = parse_ptx(text, nul != NULL ? (size_t)(nul - text) : entry.size, info);
    } else if (kind == FATBIN_KIND_ELF) {
        status = parse_elf(entry, info);
    } else {
        return IMAGE_OK;
    }
    *readable += status == IMAGE_OK;
    return status == IMAGE_NO_MEMORY ? status : IMAGE_OK; /* one bad entry does not spoil the rest */
}

static enum image_status parse_fatbin(struct bytes b, struct image_info *info)
{
    if (b.size < 16)
        return IMAGE_INVALID;
    uint16_t header_size = read16(b.p + 6);
    uint64_t fat_size = read64(b.p + 8);
    if (header_size < 16 || !in_bounds(b, header_size, fat_size))
        return IMAGE_INVALID;
    uint64_t at = header_size, end = header_size + fat_size;
    int entries = 0, readable = 0;
    while (at + 48 <= end) {
        const unsigned char *h = b.p + at;
        uint32_t entry_header = read32(h + 4);
        uint64_t size = read64(h + 8);
        if (entry_header < 48 || entry_header > end - at || size > end - at - entry_header)
            return IMAGE_INVALID;
        struct bytes entry = {h + entry_header, (size_t)size};
        entries++;
        if (fatbin_entry(entry, read16(h), read64(h + 40), info, &readable) != IMAGE_OK)
            return IMAGE_NO_MEMORY;
        at += entry_header + size;
    }
    if (entries == 0)
        return IMAGE_INVALID;
    if (readable == 0)
        info->any_name = 1; /* only compressed entries: the names cannot be read */
    return IMAGE_OK;
}

static size_t fatbin_extent(const unsigned char *p)
{
    uint64_t size = read16(p + 6) + read64(p + 8);
    return size > MAX_IMAGE_BYTES ? 0 : (size_t)size;
}

/* --- dispatch ------------------------------------------------------------------------------- */

static enum image_status parse_known_size(struct bytes b, struct image_info *info)
{
    if (b.size >= strlen(FAKE_IMAGE_PREFIX) && memcmp(b.p, FAKE_IMAGE_PREFIX, strlen(FAKE_IMAGE_PREFIX)) == 0) {
        info->any_name = 1;
        info->spin = 1;
        return IMAGE_OK;
    }
    if (b.size >= 4 && read32(b.p) == FATBIN_MAGIC)
        return parse_fatbin(b, info);
    if (b.size >= 4 && memcmp(b.p, "\177ELF", 4) == 0)
        return parse_elf(b, info);
    const char *nul = memchr(b.p, '\0', b.size);
    return parse_ptx((const char *)b.p, nul != NULL ? (size_t)(nul - (const char *)b.p) : b.size, info);
}

/* The size of an image given without one, from its own headers or its terminating NUL. */
static size_t unknown_size(const unsigned char *p)
{
    if (read32(p) == FATBIN_WRAPPER_MAGIC)
        return 0; /* handled by the caller */
    if (read32(p) == FATBIN_MAGIC)
        return fatbin_extent(p);
    if (elf_header(p))
        return elf_extent(p);
    const char *nul = memchr(p, '\0', MAX_IMAGE_BYTES); /* text: the caller's string */
    return nul != NULL ? (size_t)(nul - (const char *)p) + 1 : 0;
}

enum image_status image_parse(const void *image, size_t size, struct image_info *out)
{
    memset(out, 0, sizeof *out);
    if (image == NULL)
        return IMAGE_INVALID;
    const unsigned char *p = image;
    if (size == 0 && read32(p) == FATBIN_WRAPPER_MAGIC) {
        const void *data;
        memcpy(&data, p + 8, sizeof data); /* {int magic; int version; const u64 *data; void *filename} */
        return data != NULL && read32(data) == FATBIN_MAGIC ? image_parse(data, 0, out) : IMAGE_INVALID;
    }
    if (size == 0 && (size = unknown_size(p)) == 0)
        return IMAGE_INVALID;
    enum image_status status = parse_known_size((struct bytes){p, size}, out);
    if (status != IMAGE_OK)
        image_free(out);
    return status;
}
