/* plugins/cpu_blas/blas.h: the cpu_blas kernels that use OpenBLAS (matmul.c, conv.c). Same
 * contract as the hostkern families: TS_ENOTSUP with no message for ops they do not run. */
#ifndef TESSERA_PLUGINS_CPU_BLAS_H
#define TESSERA_PLUGINS_CPU_BLAS_H

#include "../common/hostkern.h"

int ts_blas_matmul_supports(int32_t op, int32_t dtype);
ts_status ts_blas_matmul(ts_hostdev *hd, const ts_kernel_call *call);
int ts_blas_conv_supports(int32_t op, int32_t dtype);
ts_status ts_blas_conv(ts_hostdev *hd, const ts_kernel_call *call);

#endif
