/* tests/fuzz/fuzz-elf.c: libFuzzer target for the ELF symbol reader of `tessera plugin-check`
 * (tools/elf_exports.c, compiled into the target): any bytes, at any alignment, must give a
 * count with a NUL-terminated list or -1 with a reason; never a crash, an out-of-bounds or
 * misaligned read (UBSan's alignment check is on in --enable-fuzzing builds).
 * Makefile.am: own sources (the reader's file compiled in). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../tools/elf_exports.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* An exactly sized copy (so ASan sees a read past the end), at an odd address one time in
     * two: a file's structs need not be aligned in memory either. */
    unsigned char *buf = malloc(size + 1);
    if (!buf)
        return 0;
    unsigned char *m = buf + (size & 1);
    if (size)
        memcpy(m, data, size);
    char out[64];
    const char *why = NULL;
    int n = pc_elf_exports(m, size, out, sizeof out, &why);
    if (!why || (n < 0 && !why[0]) || (n >= 0 && !memchr(out, 0, sizeof out)))
        abort();
    free(buf);
    return 0;
}
