/* tests/fuzz/fuzz.h: what the libFuzzer targets share. The loaders under test take a path, so
 * each input goes into an anonymous in-memory file (memfd) named /proc/self/fd/N: no disk
 * traffic, nothing left behind. The device comes from ts_init with the environment `make
 * fuzz` sets (the test configuration and the build tree's plugins). */
#ifndef TESSERA_TESTS_FUZZ_H
#define TESSERA_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <tessera/tessera.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Starts the runtime once; a fuzz target without a device is useless, so stop loudly. */
static inline ts_device *fuzz_device(void)
{
    if (!ts_default_device() && ts_init(NULL) != TS_OK) {
        fprintf(stderr, "fuzz: ts_init failed: %s\n", ts_last_error());
        abort();
    }
    return ts_default_device();
}

/* data in a fresh memfd; path gets its /proc name. Returns the fd (close it after). */
static inline int fuzz_file(const uint8_t *data, size_t size, char *path, size_t len)
{
    int fd = memfd_create("fuzz", MFD_CLOEXEC);
    if (fd < 0) {
        perror("fuzz: memfd_create");
        abort();
    }
    for (size_t off = 0; off < size;) {
        ssize_t w = write(fd, data + off, size - off);
        if (w <= 0) {
            perror("fuzz: write");
            abort();
        }
        off += (size_t)w;
    }
    snprintf(path, len, "/proc/self/fd/%d", fd);
    return fd;
}

#endif /* TESSERA_TESTS_FUZZ_H */
