/* plugins/cpu_blas/matmul.c: TS_OP_MATMUL on OpenBLAS, F32 (sgemm) and F64 (dgemm). Each
 * batch entry is one GEMM; a matrix whose rows or columns are unit-stride goes to BLAS as it
 * lies (a column-major one as its transpose), anything else is packed into pool scratch. */
#include "config.h"

#include <limits.h>
#include <string.h>

#include <cblas.h>

#include "blas.h"

/* How one (rows, cols) matrix reaches BLAS: a row-major base pointer and leading dimension,
 * transposed when the memory holds it column-major. */
typedef struct gemm_mat {
    char *base;                  /* first element */
    int64_t ld;                  /* leading dimension, elements */
    enum CBLAS_TRANSPOSE trans;  /* CblasTrans: the memory is (cols, rows) row-major */
} gemm_mat;

/* A (rows, cols) view inside an operand: its first element and its two strides. */
typedef struct mat_view {
    char *p;
    int64_t rows, cols, rs, cs; /* strides in elements */
} mat_view;

/* Fills *g if v can be handed to BLAS without copying; returns 0 if it cannot. */
static int map_direct(const mat_view *v, gemm_mat *g)
{
    int64_t r = v->rows, c = v->cols;
    if ((c == 1 || v->cs == 1) && (r == 1 || v->rs >= (c > 1 ? c : 1))) {
        g->base = v->p;
        g->ld = r == 1 ? (c > 1 ? c : 1) : v->rs;
        g->trans = CblasNoTrans;
        return g->ld <= INT_MAX;
    }
    if ((r == 1 || v->rs == 1) && (c == 1 || v->cs >= (r > 1 ? r : 1))) {
        g->base = v->p;
        g->ld = c == 1 ? (r > 1 ? r : 1) : v->cs;
        g->trans = CblasTrans;
        return g->ld <= INT_MAX;
    }
    return 0;
}

/* dst (rows, cols) dense row-major <- v, or v <- dst when to_view. */
static void copy_mat(const mat_view *v, void *dense, size_t es, int to_view)
{
    for (int64_t i = 0; i < v->rows; i++) {
        for (int64_t j = 0; j < v->cols; j++) {
            char *m = v->p + (i * v->rs + j * v->cs) * (int64_t)es;
            char *d = (char *)dense + (i * v->cols + j) * (int64_t)es;
            if (es == 4) {
                if (to_view)
                    *(float *)m = *(const float *)d;
                else
                    *(float *)d = *(const float *)m;
            } else {
                if (to_view)
                    *(double *)m = *(const double *)d;
                else
                    *(double *)d = *(const double *)m;
            }
        }
    }
}

static void gemm(const hk_dev *hd, int32_t dtype, enum CBLAS_TRANSPOSE ta,
                 enum CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, double alpha,
                 const gemm_mat *a, const gemm_mat *b, double beta, char *c, int64_t ldc)
{
    ts_blas_gemm(hd->configured, hk_threads(hd), dtype == TS_F32 ? 4 : 8, ta == CblasTrans, tb == CblasTrans, m, n,
                 k, alpha, a->base, a->ld, b->base, b->ld, beta, c, ldc);
}

static enum CBLAS_TRANSPOSE flip(enum CBLAS_TRANSPOSE t)
{
    return t == CblasNoTrans ? CblasTrans : CblasNoTrans;
}

int ts_blas_matmul_supports(int32_t op, int32_t dtype)
{
    return op == TS_OP_MATMUL && hk_op_defined(op, dtype);
}

/* a: (B..., M, K), b: (B..., K, N), out: (B..., M, N); out = alpha * a @ b + beta * out. */
ts_status ts_blas_matmul(hk_dev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    if (call->op != TS_OP_MATMUL)
        return TS_ENOTSUP;
    hk_matmul_dims md;
    ts_status chk = hk_matmul_check(h, call, &md);
    if (chk)
        return chk;
    const ts_operand *A = &call->inputs[0], *B = &call->inputs[1], *C = &call->outputs[0];
    int32_t dt = C->dtype;
    int nd = md.nd;
    int64_t M = md.M, K = md.K, N = md.N, nbatch = md.nbatch;
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX)
        return h->fail(h, TS_EINVAL, "matmul: dims (%lld, %lld, %lld) exceed BLAS's int range",
                       (long long)M, (long long)K, (long long)N);
    double alpha = 1.0, beta = 0.0;
    if (call->params && call->params_size >= sizeof(ts_matmul_params)) {
        const ts_matmul_params *p = call->params;
        alpha = p->alpha;
        beta = p->beta;
    }
    if (nbatch == 0 || M == 0 || N == 0)
        return TS_OK;

    size_t es = dt == TS_F32 ? 4 : 8;
    int64_t ars = A->strides[nd - 2], acs = A->strides[nd - 1];
    int64_t brs = B->strides[nd - 2], bcs = B->strides[nd - 1];
    int64_t crs = C->strides[nd - 2], ccs = C->strides[nd - 1];
    int alias = hk_overlaps(C, A) || hk_overlaps(C, B);
    void *abuf = NULL, *bbuf = NULL, *cbuf = NULL;
    ts_status s = TS_OK;
    int64_t idx[TS_MAX_DIMS] = {0};
    for (int64_t bi = 0; bi < nbatch; bi++) {
        int64_t ao = A->offset, bo = B->offset, co = C->offset;
        for (int d = 0; d < nd - 2; d++) {
            ao += idx[d] * A->strides[d];
            bo += idx[d] * B->strides[d];
            co += idx[d] * C->strides[d];
        }
        mat_view cv = {(char *)C->data + co * (int64_t)es, M, N, crs, ccs};
        if (K == 0) {
            /* An empty sum: out = beta * out (beta 0 overwrites, NaN or not). */
            for (int64_t i = 0; i < M; i++)
                for (int64_t j = 0; j < N; j++) {
                    char *q = cv.p + (i * crs + j * ccs) * (int64_t)es;
                    if (es == 4)
                        *(float *)q = beta == 0.0 ? 0.0f : (float)beta * *(float *)q;
                    else
                        *(double *)q = beta == 0.0 ? 0.0 : beta * *(double *)q;
                }
            goto next;
        }
        mat_view av = {(char *)A->data + ao * (int64_t)es, M, K, ars, acs};
        mat_view bv = {(char *)B->data + bo * (int64_t)es, K, N, brs, bcs};
        gemm_mat ga, gb, gc;
        if (!map_direct(&av, &ga)) {
            if (!abuf && (s = h->scratch_alloc(h, (size_t)(M * K) * es, "matmul", &abuf)))
                goto done;
            copy_mat(&av, abuf, es, 0);
            ga = (gemm_mat){abuf, K, CblasNoTrans};
        }
        if (!map_direct(&bv, &gb)) {
            if (!bbuf && (s = h->scratch_alloc(h, (size_t)(K * N) * es, "matmul", &bbuf)))
                goto done;
            copy_mat(&bv, bbuf, es, 0);
            gb = (gemm_mat){bbuf, N, CblasNoTrans};
        }
        if (!alias && map_direct(&cv, &gc)) {
            if (gc.trans == CblasNoTrans)
                gemm(hd, dt, ga.trans, gb.trans, M, N, K, alpha, &ga, &gb, beta, gc.base, gc.ld);
            else /* out is column-major: compute out^T (N, M) = b^T @ a^T in place */
                gemm(hd, dt, flip(gb.trans), flip(ga.trans), N, M, K, alpha, &gb, &ga, beta,
                     gc.base, gc.ld);
        } else {
            if (!cbuf && (s = h->scratch_alloc(h, (size_t)(M * N) * es, "matmul", &cbuf)))
                goto done;
            if (beta != 0.0)
                copy_mat(&cv, cbuf, es, 0);
            gemm(hd, dt, ga.trans, gb.trans, M, N, K, alpha, &ga, &gb, beta, cbuf, N);
            copy_mat(&cv, cbuf, es, 1);
        }
    next:
        for (int d = nd - 3; d >= 0; d--) {
            if (++idx[d] < C->shape[d])
                break;
            idx[d] = 0;
        }
    }
done:
    h->scratch_free(h, cbuf);
    h->scratch_free(h, bbuf);
    h->scratch_free(h, abuf);
    return s;
}
