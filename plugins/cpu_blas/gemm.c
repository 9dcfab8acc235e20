/* plugins/cpu_blas/gemm.c: every GEMM of cpu_blas goes through ts_blas_gemm, which keeps the
 * plugin on one thread pool. OpenBLAS is held at one thread and a large GEMM is split over
 * the plugin's OpenMP threads instead, in bands of C's rows or columns, one single-threaded
 * OpenBLAS call per band.
 *
 * Why: Debian's default OpenBLAS runs its own pthread pool whose idle workers spin on
 * sched_yield for about 2^28 cycles (0.1 s) after every threaded call, and the plugin's
 * elementwise, im2col and pooling kernels run on OpenMP. Two pools on the same cores took a
 * third of a LeNet-5 step in sched_yield (perf; docs/backends.md). With one pool the OpenMP
 * threads that ran the last kernel run the next GEMM. Each band sums over k as the whole call
 * would (for bench train's shapes, results at 1 and 2 threads were bitwise equal). An OpenMP
 * build of OpenBLAS would share libgomp's pool anyway; held at one thread, it changes nothing. */
#include "config.h"
#include <pthread.h>

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "blas.h"

/* Below this many multiply-adds per thread a band is not worth a parallel region (OpenBLAS's
 * own threshold is 4 * 65536 for the whole GEMM). */
#define BAND_MIN_MACS 131072.0
/* Bands start on multiples of this many rows or columns (the SkylakeX and Haswell sgemm
 * kernels' widest unroll), so each band's edge handling matches a whole-matrix call. */
#define BAND_ALIGN 16

/* openblas_set_num_threads is not safe to call from two threads at once (it resizes
 * OpenBLAS's thread pool); run calls come from any host thread, so the check and the set are
 * one locked step. Uncontended, the lock costs a few nanoseconds per GEMM. */
static pthread_mutex_t single_lock = PTHREAD_MUTEX_INITIALIZER;

void ts_blas_single_thread(void)
{
    pthread_mutex_lock(&single_lock);
    if (openblas_get_num_threads() != 1)
        openblas_set_num_threads(1);
    pthread_mutex_unlock(&single_lock);
}

static void call(size_t es, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const char *a, int64_t lda, const char *b, int64_t ldb, double beta, char *c,
                 int64_t ldc)
{
    enum CBLAS_TRANSPOSE oa = ta ? CblasTrans : CblasNoTrans, ob = tb ? CblasTrans : CblasNoTrans;
    if (es == 4)
        cblas_sgemm(CblasRowMajor, oa, ob, (blasint)m, (blasint)n, (blasint)k, (float)alpha,
                    (const float *)a, (blasint)lda, (const float *)b, (blasint)ldb,
                    (float)beta, (float *)c, (blasint)ldc);
    else
        cblas_dgemm(CblasRowMajor, oa, ob, (blasint)m, (blasint)n, (blasint)k, alpha,
                    (const double *)a, (blasint)lda, (const double *)b, (blasint)ldb, beta,
                    (double *)c, (blasint)ldc);
}

/* Threads worth using for an (m, n, k) GEMM split along a dimension of length len. Inside any
 * parallel region, active or not (an `if(0)` team of one), 1: a region opened there would be
 * nested, and libgomp starts a fresh team of threads for every nested region instead of
 * using its pool. */
static int band_threads(int threads, int64_t len, double macs)
{
#ifdef _OPENMP
    if (threads <= 1 || omp_get_level() > 0)
        return 1;
    int64_t by_len = len / BAND_ALIGN;
    int64_t by_work = (int64_t)(macs / BAND_MIN_MACS);
    int64_t nt = threads;
    if (nt > by_len)
        nt = by_len;
    if (nt > by_work)
        nt = by_work;
    return nt > 1 ? (int)nt : 1;
#else
    (void)threads, (void)len, (void)macs;
    return 1;
#endif
}

/* Start of band t of nt over [0, len), aligned down to BAND_ALIGN (band nt ends at len). */
static int64_t band_start(int64_t len, int t, int nt)
{
    if (t >= nt)
        return len;
    return len * t / nt / BAND_ALIGN * BAND_ALIGN;
}

void ts_blas_gemm(int parts, int run, size_t es, int ta, int tb, int64_t m, int64_t n,
                  int64_t k, double alpha, const void *a, int64_t lda, const void *b,
                  int64_t ldb, double beta, void *c, int64_t ldc)
{
    const char *ap = a, *bp = b;
    char *cp = c;
    ts_blas_single_thread();
    int by_cols = n >= m;
    /* the bands from `parts` alone, so that running them on fewer threads changes nothing */
    int nt = band_threads(parts, by_cols ? n : m, (double)m * (double)n * (double)k);
    if (nt == 1) {
        call(es, ta, tb, m, n, k, alpha, ap, lda, bp, ldb, beta, cp, ldc);
        return;
    }
    int nrun = run < nt ? (run > 1 ? run : 1) : nt;
    _Pragma("omp parallel for num_threads(nrun) schedule(static) if(nrun > 1)")
    for (int t = 0; t < nt; t++) {
        int64_t len = by_cols ? n : m;
        int64_t lo = band_start(len, t, nt), hi = band_start(len, t + 1, nt);
        if (hi <= lo)
            continue;
        if (by_cols) /* C[:, lo:hi] = op(A) op(B)[:, lo:hi] */
            call(es, ta, tb, m, hi - lo, k, alpha, ap, lda,
                 bp + (tb ? lo * ldb : lo) * (int64_t)es, ldb, beta, cp + lo * (int64_t)es, ldc);
        else /* C[lo:hi, :] = op(A)[lo:hi, :] op(B) */
            call(es, ta, tb, hi - lo, n, k, alpha, ap + (ta ? lo : lo * lda) * (int64_t)es, lda,
                 bp, ldb, beta, cp + lo * ldc * (int64_t)es, ldc);
    }
}
