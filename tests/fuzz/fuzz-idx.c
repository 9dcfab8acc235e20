/* tests/fuzz/fuzz-idx.c: libFuzzer target for the IDX dataset reader (core/data.c; gzip or
 * plain, through zlib): any bytes must give a tensor whose size matches its header, or an
 * error with a message; never a crash, an overflow or a leak. */
#include "fuzz.h"

static ts_device *dev;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    dev = fuzz_device();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_file(data, size, path, sizeof path);
    ts_tensor *t = NULL;
    ts_status s = ts_idx_load(path, dev, &t);
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
