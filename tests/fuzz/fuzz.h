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

/* One input for a loader of a single tensor (ts_idx_load, ts_npy_load): a tensor whose
 * bytes all read back, or an error with a message and no tensor; anything else aborts. */
static inline int fuzz_tensor_loader(const uint8_t *data, size_t size, ts_device *dev,
                                     ts_status (*load)(const char *, ts_device *, ts_tensor **))
{
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    ts_tensor *t = NULL;
    ts_status s = load(path, dev, &t);
    close(fd);
    if (s != TS_OK) {
        if (t != NULL || !ts_last_error()[0])
            abort();
        return 0;
    }
    size_t n = (size_t)ts_tensor_numel(t) * ts_dtype_size(ts_tensor_dtype(t));
    void *buf = malloc(n ? n : 1);
    if (buf && ts_tensor_to_host(t, buf, n) != TS_OK)
        abort();
    free(buf);
    ts_tensor_unref(t);
    return 0;
}

#endif /* TESSERA_TESTS_FUZZ_H */
