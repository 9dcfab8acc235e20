/* tools/elf_exports.h: the ELF symbol reader of `tessera plugin-check` (the "exports" check),
 * apart from the CLI so that its fuzz target (tests/fuzz/fuzz-elf.c) and the corpus
 * regression test (tests/unit/test-fuzz-regress.c) build it alone. Depends on libc only. */
#ifndef TESSERA_TOOLS_ELF_EXPORTS_H
#define TESSERA_TOOLS_ELF_EXPORTS_H

#include <stddef.h>

/* The dynamic symbols the ELF image m (size bytes, at any alignment: the file may be hostile
 * and is read through memcpy) defines and exports (global or weak, default or protected
 * visibility), the linker's own and the plugin entry point aside. The first few names go to
 * out (len bytes, always NUL-terminated when len > 0) as a comma-separated list. Returns their
 * count, or -1 with *why set to a sentence saying what is wrong when m is not a 64-bit ELF
 * object of this host's byte order with a dynamic symbol table inside its bytes. Every offset
 * and size is checked against size without overflow. Reentrant; *why is static text. */
int pc_elf_exports(const unsigned char *m, size_t size, char *out, size_t len, const char **why);

#endif /* TESSERA_TOOLS_ELF_EXPORTS_H */
