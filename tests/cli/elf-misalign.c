/* tests/cli/elf-misalign.c: `elf-misalign IN.so OUT.so` copies a shared object and moves its
 * section header table and its dynamic symbol table to odd offsets at the end of the copy.
 * The dynamic loader reads neither (it follows the program headers), so the copy still loads
 * as a plugin, but a reader that casts file offsets to Elf64_Shdr * or Elf64_Sym * reads
 * misaligned structs: UndefinedBehaviorSanitizer's alignment check stops it. For
 * test-plugin-check.sh. */
#include <elf.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int die(const char *what)
{
    fprintf(stderr, "elf-misalign: %s\n", what);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return die("usage: elf-misalign IN.so OUT.so");
    FILE *f = fopen(argv[1], "rb");
    if (!f)
        return die("cannot open the input");
    static unsigned char buf[64 << 20];
    size_t n = fread(buf, 1, sizeof buf / 2, f);
    fclose(f);
    Elf64_Ehdr eh;
    if (n < sizeof eh)
        return die("the input is no ELF object");
    memcpy(&eh, buf, sizeof eh);
    if (memcmp(eh.e_ident, ELFMAG, SELFMAG) || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > n ||
        (n - eh.e_shoff) / sizeof(Elf64_Shdr) < eh.e_shnum)
        return die("the input is no 64-bit ELF object with section headers");
    size_t shsize = (size_t)eh.e_shnum * sizeof(Elf64_Shdr);
    unsigned char *sh = malloc(shsize);
    if (!sh)
        return die("out of memory");
    memcpy(sh, buf + eh.e_shoff, shsize);
    int found = 0;
    for (unsigned i = 0; i < eh.e_shnum; i++) {
        Elf64_Shdr s;
        memcpy(&s, sh + i * sizeof s, sizeof s);
        if (s.sh_type != SHT_DYNSYM || s.sh_offset > n || s.sh_size > n - s.sh_offset)
            continue;
        while (n % 8 != 1) /* the symbols at 1 mod 8 */
            buf[n++] = 0;
        memcpy(buf + n, buf + s.sh_offset, s.sh_size);
        s.sh_offset = n;
        n += s.sh_size;
        memcpy(sh + i * sizeof s, &s, sizeof s);
        found = 1;
    }
    if (!found)
        return die("the input has no dynamic symbol table");
    while (n % 8 != 3) /* the section headers at 3 mod 8 */
        buf[n++] = 0;
    memcpy(buf + n, sh, shsize);
    eh.e_shoff = n;
    n += shsize;
    memcpy(buf, &eh, sizeof eh);
    free(sh);
    if (!(f = fopen(argv[2], "wb")) || fwrite(buf, 1, n, f) != n || fclose(f) != 0)
        return die("cannot write the output");
    return 0;
}
