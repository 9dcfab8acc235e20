/* tests/fuzz/fuzz-checkpoint.c: libFuzzer target for the safetensors checkpoint loader
 * (core/checkpoint.c): any bytes must give TS_OK or an error with a message, never a crash,
 * an out-of-bounds read or a leak; a loaded checkpoint's tensors must read back whole. */
#include <string.h>

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
    ts_checkpoint *ck = NULL;
    ts_status s = ts_checkpoint_load(path, dev, &ck);
    close(fd);
    if (s != TS_OK) {
        if (ck != NULL || !ts_last_error()[0])
            abort();
        return 0;
    }
    for (size_t i = 0; i < ts_checkpoint_count(ck); i++) {
        ts_tensor *t = ts_checkpoint_get(ck, ts_checkpoint_name(ck, i));
        if (!t)
            abort(); /* a listed name must be there */
        size_t n = (size_t)ts_tensor_numel(t) * ts_dtype_size(ts_tensor_dtype(t));
        void *buf = malloc(n ? n : 1);
        if (buf && ts_tensor_to_host(t, buf, n) != TS_OK)
            abort();
        free(buf);
    }
    (void)ts_checkpoint_meta(ck, "format");
    ts_checkpoint_free(ck);
    return 0;
}
