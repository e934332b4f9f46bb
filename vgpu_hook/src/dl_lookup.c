/*
 * dl_lookup.c: find a function of the C library's dl API by reading its ELF dynamic symbol table.
 *
 * The hook exports dlsym and dlvsym, and every call the hook itself makes to either name binds to
 * its own override (LD_PRELOAD puts it first in the global scope, and an unversioned definition
 * satisfies the C library's versioned references). So the real dlvsym is found here: the loaded
 * object that contains dlopen (which the hook does not override), its PT_DYNAMIC, its symbol and
 * string tables, the symbol count from DT_HASH or DT_GNU_HASH, and the definition of the name
 * whose version is the default one (the hidden bit of its .gnu.version entry clear).
 */
#define _GNU_SOURCE
#include "dl_lookup.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

struct search {
    uintptr_t inside; /* an address in the object searched */
    const char *name;
    void *found;
};

/* Dynamic-section addresses are relocated in place on most targets, not on all. */
static uintptr_t relocated(uintptr_t value, uintptr_t base)
{
    return value < base ? value + base : value;
}

static uint32_t gnu_hash_symbols(const uint32_t *table)
{
    uint32_t nbuckets = table[0], symoffset = table[1], bloom_words = table[2];
    const ElfW(Addr) *bloom = (const ElfW(Addr) *)(const void *)&table[4];
    const uint32_t *buckets = (const uint32_t *)(const void *)&bloom[bloom_words];
    const uint32_t *chain = &buckets[nbuckets];
    uint32_t last = 0;
    for (uint32_t i = 0; i < nbuckets; i++)
        if (buckets[i] > last)
            last = buckets[i];
    if (last < symoffset)
        return symoffset;
    while (!(chain[last - symoffset] & 1))
        last++;
    return last + 1;
}

static int contains(const struct dl_phdr_info *info, uintptr_t address)
{
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && address >= start && address - start < ph->p_memsz)
            return 1;
    }
    return 0;
}

static int visit(struct dl_phdr_info *info, size_t size, void *data)
{
    struct search *search = data;
    (void)size;
    if (!contains(info, search->inside))
        return 0;
    const ElfW(Dyn) *dyn = NULL;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (dyn == NULL)
        return 1;
    uintptr_t base = info->dlpi_addr;
    const ElfW(Sym) *symbols = NULL;
    const char *strings = NULL;
    const uint32_t *hash = NULL, *gnu_hash = NULL;
    const ElfW(Half) *versions = NULL;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        uintptr_t value = relocated(dyn->d_un.d_ptr, base);
        switch (dyn->d_tag) {
        case DT_SYMTAB: symbols = (const ElfW(Sym) *)value; break;
        case DT_STRTAB: strings = (const char *)value; break;
        case DT_HASH: hash = (const uint32_t *)value; break;
        case DT_GNU_HASH: gnu_hash = (const uint32_t *)value; break;
        case DT_VERSYM: versions = (const ElfW(Half) *)value; break;
        default: break;
        }
    }
    if (symbols == NULL || strings == NULL || (hash == NULL && gnu_hash == NULL))
        return 1;
    uint32_t count = hash != NULL ? hash[1] : gnu_hash_symbols(gnu_hash);
    for (uint32_t i = 1; i < count; i++) {
        const ElfW(Sym) *sym = &symbols[i];
        /* ELF32_ST_TYPE and ELF64_ST_TYPE are the same (the low 4 bits) */
        if (sym->st_shndx == SHN_UNDEF || ELF64_ST_TYPE(sym->st_info) != STT_FUNC)
            continue;
        if (versions != NULL && (versions[i] & 0x8000)) /* a hidden (non-default) version */
            continue;
        if (strcmp(strings + sym->st_name, search->name) == 0) {
            search->found = (void *)(base + sym->st_value);
            break;
        }
    }
    return 1;
}

void *fgs_libdl_symbol(const char *name)
{
    struct search search = {(uintptr_t)(void *)dlopen, name, NULL};
    dl_iterate_phdr(visit, &search);
    return search.found;
}
