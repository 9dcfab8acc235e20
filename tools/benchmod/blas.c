/* tools/benchmod/blas.c: the raw BLAS baseline of `tessera bench ops` and `bench train`: the
 * same GEMMs straight into OpenBLAS, the floor a backend's step is compared with. */
#include "config.h"

#include "benchmod.h"

#ifdef TS_HAVE_CBLAS
#include <cblas.h>

TSB_EXPORT int tsb_sgemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc, int threads)
{
    if (threads > 0)
        openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
                m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, ldc);
    return 1;
}
#else
TSB_EXPORT int tsb_sgemm(int ta, int tb, int m, int n, int k, const float *a, int lda,
                         const float *b, int ldb, float *c, int ldc, int threads)
{
    (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb;
    (void)c, (void)ldc, (void)threads;
    return 0;
}
#endif
