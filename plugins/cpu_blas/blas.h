/* plugins/cpu_blas/blas.h: the cpu_blas kernels that use OpenBLAS (matmul.c, conv.c). Same
 * contract as the hostkern families: TS_ENOTSUP with no message for ops they do not run. */
#ifndef TESSERA_PLUGINS_CPU_BLAS_H
#define TESSERA_PLUGINS_CPU_BLAS_H

#include "hostkern.h" /* kernels/host */

int ts_blas_matmul_supports(int32_t op, int32_t dtype);
ts_status ts_blas_matmul(hk_dev *hd, const ts_kernel_call *call);
int ts_blas_conv_supports(int32_t op, int32_t dtype);
ts_status ts_blas_conv(hk_dev *hd, const ts_kernel_call *call);

/* gemm.c: c (m, n) = alpha * op(a) @ op(b) + beta * c, row-major, es 4 (sgemm) or 8 (dgemm),
 * op transposing when ta / tb is set. Cut into bands for up to `parts` threads when large and
 * not already inside a parallel region, the bands run on `run` of them (fewer while
 * adaptive_threads gives cores away: the same bands, so the same bits); OpenBLAS itself always
 * runs single-threaded. */
void ts_blas_gemm(int parts, int run, size_t es, int ta, int tb, int64_t m, int64_t n, int64_t k,
                  double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
                  double beta, void *c, int64_t ldc);
/* Sets OpenBLAS's (process-wide) thread count to 1 if something changed it. */
void ts_blas_single_thread(void);

#endif
