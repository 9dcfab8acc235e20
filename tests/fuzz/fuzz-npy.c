/* tests/fuzz/fuzz-npy.c: libFuzzer target for the NumPy .npy reader (core/npy.c): any bytes must give a tensor whose
 * size matches its header, or an error with a message; never a crash, an overflow or a
 * leak. */
#include "fuzz.h"

static ts_device *dev;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    dev = fuzz_device();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_tensor_loader(data, size, dev, ts_npy_load);
}
