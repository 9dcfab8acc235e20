/* tools/elf_exports.c: which symbols a plugin's shared object exports, read from its ELF
 * section headers and dynamic symbol table. The bytes are outside input: every header, section
 * header and symbol is copied into an aligned local struct (an offset in the file need not be
 * aligned for its type) after checking that it lies inside the image. */
#include "config.h"

#include <elf.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <tessera/plugin.h>

#include "elf_exports.h"

/* Copies n bytes at off into dst if they lie inside the image; 0 if they do not. */
static int get(const unsigned char *m, size_t size, uint64_t off, void *dst, size_t n)
{
    if (off > size || n > size - off)
        return 0;
    memcpy(dst, m + off, n);
    return 1;
}

int pc_elf_exports(const unsigned char *m, size_t size, char *out, size_t len, const char **why)
{
    static const char *const linker[] = {TS_PLUGIN_ENTRY_SYMBOL, "_init", "_fini", "_edata",
                                         "_end", "__bss_start"};
    *why = "";
    if (len)
        out[0] = 0;
    Elf64_Ehdr eh;
    if (!get(m, size, 0, &eh, sizeof eh)) {
        *why = "the file is shorter than an ELF header: a truncated file, rebuild the plugin";
        return -1;
    }
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) {
        *why = "not a 64-bit ELF object: rebuild the plugin for this machine";
        return -1;
    }
    if (eh.e_ident[EI_DATA] != (__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB
                                                                           : ELFDATA2MSB)) {
        *why = "an ELF object of the other byte order: rebuild the plugin for this machine";
        return -1;
    }
    if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > size ||
        (size - eh.e_shoff) / sizeof(Elf64_Shdr) < eh.e_shnum) {
        *why = "the section headers lie outside the file or have a foreign size (a truncated "
               "or damaged file: rebuild the plugin)";
        return -1;
    }
    int n = -1;
    for (unsigned i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr sh, strs;
        get(m, size, eh.e_shoff + (uint64_t)i * sizeof sh, &sh, sizeof sh); /* checked above */
        if (sh.sh_type != SHT_DYNSYM)
            continue;
        if (sh.sh_link >= eh.e_shnum || sh.sh_entsize != sizeof(Elf64_Sym) ||
            sh.sh_offset > size || sh.sh_size > size - sh.sh_offset)
            break;
        get(m, size, eh.e_shoff + (uint64_t)sh.sh_link * sizeof strs, &strs, sizeof strs);
        if (strs.sh_offset > size || strs.sh_size > size - strs.sh_offset)
            break;
        const char *names = (const char *)m + strs.sh_offset; /* bytes: any alignment */
        size_t nsym = sh.sh_size / sizeof(Elf64_Sym), used = 0;
        n = 0;
        for (size_t k = 1; k < nsym; k++) {
            Elf64_Sym sym;
            get(m, size, sh.sh_offset + k * sizeof sym, &sym, sizeof sym); /* inside sh_size */
            int bind = ELF64_ST_BIND(sym.st_info), vis = ELF64_ST_VISIBILITY(sym.st_other);
            if (sym.st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK) ||
                (vis != STV_DEFAULT && vis != STV_PROTECTED) || sym.st_name >= strs.sh_size)
                continue;
            const char *name = names + sym.st_name;
            if (!memchr(name, 0, strs.sh_size - sym.st_name))
                continue; /* runs off the end of its string table */
            int known = 0;
            for (size_t j = 0; j < sizeof linker / sizeof linker[0]; j++)
                known |= strcmp(name, linker[j]) == 0;
            if (known)
                continue;
            if (n++ < 8 && used < len)
                used += (size_t)snprintf(out + used, len - used, "%s%s", n > 1 ? ", " : "", name);
        }
        break;
    }
    if (n < 0)
        *why = "no readable dynamic symbol table (.dynsym inside the file with 24-byte entries "
               "and a string table inside the file): a damaged file, or not a shared object";
    return n;
}
