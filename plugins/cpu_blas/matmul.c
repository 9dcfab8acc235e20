/* plugins/cpu_blas/matmul.c: placeholder until the matmul kernels land; supports nothing. */
#include "blas.h"

int ts_blas_matmul_supports(int32_t op, int32_t dtype)
{
    (void)op;
    (void)dtype;
    return 0;
}

ts_status ts_blas_matmul(ts_hostdev *hd, const ts_kernel_call *call)
{
    (void)hd;
    (void)call;
    return TS_ENOTSUP;
}
