/* plugins/cuda/gemm.c: TS_OP_MATMUL and the three convolutions through cuBLAS, float32
 * (Sgemm) and float64 (Dgemm).
 *
 * Matmul: every matrix whose rows or columns are unit-stride goes to cuBLAS as it lies, its
 * layout expressed as a transpose flag and a leading dimension (cuBLAS is column-major: a
 * row-major C is computed as C^T = B^T A^T); anything else is packed into contiguous pool
 * scratch by the strided copy kernel. Batch dims are collapsed where every operand steps
 * evenly; the innermost collapsed one becomes one cublas?gemmStridedBatched call (stride 0
 * for a broadcast operand), the others are looped over.
 *
 * Convolution: im2col of a chunk of images into pool scratch, then per group one strided-
 * batched GEMM over the images of the chunk (the filter with batch stride 0). BWD_DATA is
 * W^T @ gy followed by col2im (a gather: no atomics); BWD_WEIGHT lays the chunk's columns out
 * side by side (CRS, nb * P * Q) and packs gy to (K, nb * P * Q), so each group's gradient is
 * one GEMM per chunk accumulating over the chunks (beta 1). */
#include "config.h"

#include <limits.h>
#include <string.h>

#include "cuda_plugin.h"

/* Most bytes of im2col scratch one chunk of images uses. */
#define CONV_COL_BYTES ((size_t)256 << 20)

#define FAIL(c, code, ...) ((c)->host->fail((c)->host, (code), __VA_ARGS__))

int cuda_gemm_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_MATMUL || op == TS_OP_CONV2D || op == TS_OP_CONV2D_BWD_DATA ||
            op == TS_OP_CONV2D_BWD_WEIGHT) &&
           hk_op_defined(op, dtype);
}

/* One strided-batched GEMM, column-major, in dtype: C = alpha op(A) op(B) + beta C. */
static ts_status gemm(cuda_ctx *c, int32_t dtype, cublasOperation_t ta, cublasOperation_t tb,
                      int64_t m, int64_t n, int64_t k, double alpha, const void *A, int64_t lda,
                      int64_t sa, const void *B, int64_t ldb, int64_t sb, double beta, void *C,
                      int64_t ldc, int64_t sc, int64_t batch)
{
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
        ldc > INT_MAX || batch > INT_MAX)
        return FAIL(c, TS_EINVAL,
                    "GEMM of (%lld, %lld, %lld) x %lld (leading dims %lld, %lld, %lld) exceeds "
                    "cuBLAS's int range",
                    (long long)m, (long long)n, (long long)k, (long long)batch, (long long)lda,
                    (long long)ldb, (long long)ldc);
    if (m == 0 || n == 0 || batch == 0)
        return TS_OK;
    if (dtype == TS_F32) {
        float fa = (float)alpha, fb = (float)beta;
        if (batch == 1)
            CUBLAS_CHECK(c, cublasSgemm(c->blas, ta, tb, (int)m, (int)n, (int)k, &fa, A, (int)lda,
                                        B, (int)ldb, &fb, C, (int)ldc));
        else
            CUBLAS_CHECK(c, cublasSgemmStridedBatched(c->blas, ta, tb, (int)m, (int)n, (int)k,
                                                      &fa, A, (int)lda, sa, B, (int)ldb, sb, &fb,
                                                      C, (int)ldc, sc, (int)batch));
    } else if (ts_plugin_dtype_is_half(dtype)) {
        /* bfloat16 / float16 operands, float32 accumulation (the tensor cores' path), the
         * result rounded once */
        float fa = (float)alpha, fb = (float)beta;
        cudaDataType_t t = dtype == TS_BF16 ? CUDA_R_16BF : CUDA_R_16F;
        if (batch == 1)
            CUBLAS_CHECK(c, cublasGemmEx(c->blas, ta, tb, (int)m, (int)n, (int)k, &fa, A, t,
                                         (int)lda, B, t, (int)ldb, &fb, C, t, (int)ldc,
                                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        else
            CUBLAS_CHECK(c, cublasGemmStridedBatchedEx(
                                c->blas, ta, tb, (int)m, (int)n, (int)k, &fa, A, t, (int)lda, sa,
                                B, t, (int)ldb, sb, &fb, C, t, (int)ldc, sc, (int)batch,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        if (batch == 1)
            CUBLAS_CHECK(c, cublasDgemm(c->blas, ta, tb, (int)m, (int)n, (int)k, &alpha, A,
                                        (int)lda, B, (int)ldb, &beta, C, (int)ldc));
        else
            CUBLAS_CHECK(c, cublasDgemmStridedBatched(c->blas, ta, tb, (int)m, (int)n, (int)k,
                                                      &alpha, A, (int)lda, sa, B, (int)ldb, sb,
                                                      &beta, C, (int)ldc, sc, (int)batch));
    }
    return TS_OK;
}

/* ---- matmul ---------------------------------------------------------------------------- */

/* A (rows, cols) matrix with strides (rs, cs) as a column-major cuBLAS operand: op N when its
 * columns are unit-stride-in-rows (column-major), op T when it is row-major (the memory holds
 * X^T column-major). Returns 0 if neither (the caller packs it). */
typedef struct colmat {
    cublasOperation_t op;
    int64_t ld;
} colmat;

static int map_colmajor(int64_t rows, int64_t cols, int64_t rs, int64_t cs, colmat *m)
{
    int64_t r1 = rows > 1 ? rows : 1, c1 = cols > 1 ? cols : 1;
    if ((rows == 1 || rs == 1) && (cols == 1 || cs >= r1)) {
        m->op = CUBLAS_OP_N;
        m->ld = cols == 1 ? r1 : cs;
    } else if ((cols == 1 || cs == 1) && (rows == 1 || rs >= c1)) {
        m->op = CUBLAS_OP_T;
        m->ld = rows == 1 ? c1 : rs;
    } else {
        return 0;
    }
    return m->ld >= 1 && m->ld <= INT_MAX;
}

static cublasOperation_t flip(cublasOperation_t o)
{
    return o == CUBLAS_OP_N ? CUBLAS_OP_T : CUBLAS_OP_N;
}

/* A dense row-major copy of op in pool scratch (*buf): the operand describing it. */
static ts_status pack(cuda_ctx *c, const ts_operand *op, const char *tag, void **buf,
                      ts_operand *dense, int copy_in)
{
    int64_t n = 1;
    for (int d = 0; d < op->ndim; d++)
        n *= op->shape[d];
    ts_status s = cuda_scratch(c, (size_t)n * ts_plugin_dtype_size(op->dtype), tag, buf);
    if (s)
        return s;
    *dense = hk_dense_like(op, *buf);
    return copy_in ? cuda_copy_strided(c, dense, op) : TS_OK;
}

static ts_status run_matmul(cuda_ctx *c, const ts_kernel_call *call)
{
    hk_matmul_dims md;
    ts_status s = hk_matmul_check(c->host, call, &md);
    if (s)
        return s;
    double alpha = 1.0, beta = 0.0;
    if (call->params && call->params_size >= sizeof(ts_matmul_params)) {
        const ts_matmul_params *p = call->params;
        alpha = p->alpha;
        beta = p->beta;
    }
    const ts_operand *Ain = &call->inputs[0], *Bin = &call->inputs[1], *Cout = &call->outputs[0];
    int nd = md.nd;
    int64_t M = md.M, K = md.K, N = md.N;
    for (int i = 0; i < 3; i++) {
        const ts_operand *o = i == 0 ? Ain : i == 1 ? Bin : Cout;
        for (int d = 0; d < nd; d++)
            if (o->strides[d] < 0 || o->offset < 0)
                return FAIL(c, TS_EINVAL, "matmul: negative stride or offset");
    }
    if (md.nbatch == 0 || M == 0 || N == 0)
        return TS_OK;
    if (K == 0)
        return cuda_scale_inplace(c, Cout, beta); /* an empty sum: out = beta * out */
    int32_t dt = Cout->dtype;
    size_t es = ts_plugin_dtype_size(dt);
    ts_operand A = *Ain, B = *Bin, C = *Cout;
    void *abuf = NULL, *bbuf = NULL, *cbuf = NULL;
    colmat ma, mb, mc;
    /* C decides the form: column-major C = A B, row-major C^T = B^T A^T. */
    int c_ok = !hk_overlaps(Cout, Ain) && !hk_overlaps(Cout, Bin) &&
               map_colmajor(M, N, C.strides[nd - 2], C.strides[nd - 1], &mc);
    if (!c_ok) {
        if ((s = pack(c, Cout, "matmul", &cbuf, &C, beta != 0.0)))
            goto done;
        map_colmajor(M, N, C.strides[nd - 2], C.strides[nd - 1], &mc);
    }
    if (!map_colmajor(M, K, A.strides[nd - 2], A.strides[nd - 1], &ma)) {
        if ((s = pack(c, Ain, "matmul", &abuf, &A, 1)))
            goto done;
        map_colmajor(M, K, A.strides[nd - 2], A.strides[nd - 1], &ma);
    }
    if (!map_colmajor(K, N, B.strides[nd - 2], B.strides[nd - 1], &mb)) {
        if ((s = pack(c, Bin, "matmul", &bbuf, &B, 1)))
            goto done;
        map_colmajor(K, N, B.strides[nd - 2], B.strides[nd - 1], &mb);
    }
    /* Batch dims: size-1 dropped, mergeable ones merged (outermost first in bs[]). */
    int nb = 0;
    int64_t bshape[TS_MAX_DIMS], bst[3][TS_MAX_DIMS];
    for (int d = 0; d < nd - 2; d++) {
        if (C.shape[d] == 1)
            continue;
        if (nb > 0 && A.strides[d] * C.shape[d] == bst[0][nb - 1] &&
            B.strides[d] * C.shape[d] == bst[1][nb - 1] &&
            C.strides[d] * C.shape[d] == bst[2][nb - 1]) {
            bshape[nb - 1] *= C.shape[d];
            bst[0][nb - 1] = A.strides[d];
            bst[1][nb - 1] = B.strides[d];
            bst[2][nb - 1] = C.strides[d];
            continue;
        }
        bshape[nb] = C.shape[d];
        bst[0][nb] = A.strides[d];
        bst[1][nb] = B.strides[d];
        bst[2][nb] = C.strides[d];
        nb++;
    }
    int64_t inner = nb ? bshape[nb - 1] : 1, outer = 1;
    for (int i = 0; i + 1 < nb; i++)
        outer *= bshape[i];
    int64_t sA = nb ? bst[0][nb - 1] : 0, sB = nb ? bst[1][nb - 1] : 0, sC = nb ? bst[2][nb - 1] : 0;
    const char *a0 = cuda_elem0(&A), *b0 = cuda_elem0(&B);
    char *c0 = cuda_elem0(&C);
    for (int64_t o = 0; o < outer && !s; o++) {
        int64_t rem = o, oa = 0, ob = 0, oc = 0;
        for (int i = nb - 2; i >= 0; i--) {
            int64_t k = rem % bshape[i];
            rem /= bshape[i];
            oa += k * bst[0][i];
            ob += k * bst[1][i];
            oc += k * bst[2][i];
        }
        const char *pa = a0 + oa * (int64_t)es, *pb = b0 + ob * (int64_t)es;
        char *pc = c0 + oc * (int64_t)es;
        if (mc.op == CUBLAS_OP_N) /* C column-major (M, N) = A (M, K) B (K, N) */
            s = gemm(c, dt, ma.op, mb.op, M, N, K, alpha, pa, ma.ld, sA, pb, mb.ld, sB, beta, pc,
                     mc.ld, sC, inner);
        else /* C^T column-major (N, M) = B^T (N, K) A^T (K, M) */
            s = gemm(c, dt, flip(mb.op), flip(ma.op), N, M, K, alpha, pb, mb.ld, sB, pa, ma.ld,
                     sA, beta, pc, mc.ld, sC, inner);
    }
    if (!s && cbuf)
        s = cuda_copy_strided(c, Cout, &C);
done:
    cuda_scratch_free(c, cbuf);
    cuda_scratch_free(c, bbuf);
    cuda_scratch_free(c, abuf);
    return s;
}

/* ---- convolution ----------------------------------------------------------------------- */

static cu_t4 t4(const ts_operand *o)
{
    cu_t4 t;
    t.p = cuda_elem0(o);
    for (int d = 0; d < 4; d++) {
        t.n[d] = o->shape[d];
        t.s[d] = o->strides[d];
    }
    return t;
}

/* Image n of t (N, K, P, Q) as a (K, P*Q) row-major matrix: its leading dimension when the
 * planes are dense and do not interleave, else 0. */
static int64_t planes_ld(const ts_operand *t)
{
    int64_t K = t->shape[1], P = t->shape[2], Q = t->shape[3], PQ = P * Q;
    if (t->strides[3] == 1 && (P == 1 || t->strides[2] == Q) && (K == 1 || t->strides[1] >= PQ) &&
        t->strides[1] <= INT_MAX && PQ >= 1)
        return K == 1 ? PQ : t->strides[1];
    return 0;
}

/* w (K, Cg, R, S) as a (K, Cg*R*S) row-major matrix: its leading dimension when dense. */
static int64_t filter_ld(const ts_operand *w)
{
    int64_t K = w->shape[0], Cg = w->shape[1], R = w->shape[2], S = w->shape[3];
    int64_t CRS = Cg * R * S;
    if (w->strides[3] == 1 && (R == 1 || w->strides[2] == S) && (Cg == 1 || w->strides[1] == R * S) &&
        (K == 1 || w->strides[0] >= CRS) && w->strides[0] <= INT_MAX && CRS >= 1)
        return K == 1 ? CRS : w->strides[0];
    return 0;
}

static int64_t chunk_images(int64_t N, int64_t per_image_bytes)
{
    int64_t nb = per_image_bytes > 0 ? (int64_t)CONV_COL_BYTES / per_image_bytes : N;
    if (nb < 1)
        nb = 1;
    return nb < N ? nb : N;
}

static ts_status conv_fwd(cuda_ctx *c, const ts_kernel_call *call)
{
    if ((call->ninputs != 2 && call->ninputs != 3) || call->noutputs != 1)
        return FAIL(c, TS_EINVAL, "conv2d: expects 2 or 3 inputs and 1 output, got %d and %d",
                    (int)call->ninputs, (int)call->noutputs);
    if (!call->params || call->params_size < sizeof(ts_conv2d_params))
        return FAIL(c, TS_EINVAL, "conv2d: missing ts_conv2d_params");
    const ts_conv2d_params *p = call->params;
    const ts_operand *x = &call->inputs[0], *w = &call->inputs[1], *y = &call->outputs[0];
    const ts_operand *bias = call->ninputs == 3 ? &call->inputs[2] : NULL;
    hk_conv_dims d;
    ts_status s = hk_conv_check(c->host, "conv2d", p, x, w, y, bias, "y", &d);
    if (s)
        return s;
    int32_t dt = y->dtype;
    size_t es = ts_plugin_dtype_size(dt);
    int64_t N = d.N, C = d.C, K = d.K, P = d.P, Q = d.Q, G = d.G, PQ = P * Q;
    int64_t Cg = C / G, Kg = K / G, CRS = Cg * d.R * d.S, CRSall = C * d.R * d.S;
    if (N == 0 || K == 0 || PQ == 0)
        return TS_OK;
    cu_t4 ty = t4(y);
    const void *bp = bias ? cuda_elem0(bias) : NULL;
    int64_t bs = bias ? bias->strides[0] : 0;
    if (C == 0) { /* an empty sum: y = bias */
        if ((s = cuda_scale_inplace(c, y, 0.0)))
            return s;
        CU_CHECK(c, cu_bias_out(c->stream, dt, NULL, 0, bp, bs, &ty, 0, N));
        return TS_OK;
    }
    void *wbuf = NULL, *colbuf = NULL, *ybuf = NULL;
    ts_operand wd;
    int64_t ldw = filter_ld(w);
    const char *wmat = cuda_elem0(w);
    if (!ldw) {
        if ((s = pack(c, w, "conv2d", &wbuf, &wd, 1)))
            goto done;
        wmat = wbuf;
        ldw = CRS;
    }
    int64_t ldy = planes_ld(y);
    int64_t nb = chunk_images(N, CRSall * PQ * (int64_t)es);
    if ((s = cuda_scratch(c, (size_t)(nb * CRSall * PQ) * es, "conv2d", &colbuf)))
        goto done;
    if (!ldy && (s = cuda_scratch(c, (size_t)(nb * K * PQ) * es, "conv2d", &ybuf)))
        goto done;
    cu_t4 tx = t4(x);
    cu_col_layout l = {d.R, d.S, P, Q, CRSall * PQ, PQ};
    for (int64_t n0 = 0; n0 < N && !s; n0 += nb) {
        int64_t cnt = N - n0 < nb ? N - n0 : nb;
        cudaError_t e = cu_im2col(c->stream, dt, &tx, n0, cnt, p, &l, colbuf);
        if (e != cudaSuccess) {
            s = cuda_fail_cu(c, "cu_im2col (launch)", e);
            break;
        }
        char *ymat = ldy ? ty.p + n0 * y->strides[0] * (int64_t)es : ybuf;
        int64_t ld = ldy ? ldy : PQ, ys = ldy ? y->strides[0] : K * PQ;
        /* Group g, image j: y[j, g] (Kg, PQ) = w[g] (Kg, CRS) @ col[j, g] (CRS, PQ), as
         * column-major y^T (PQ, Kg) = col^T (PQ, CRS) w^T (CRS, Kg). */
        for (int64_t g = 0; g < G && !s; g++)
            s = gemm(c, dt, CUBLAS_OP_N, CUBLAS_OP_N, PQ, Kg, CRS, 1.0,
                     (const char *)colbuf + g * CRS * PQ * (int64_t)es, PQ, CRSall * PQ,
                     wmat + g * Kg * ldw * (int64_t)es, ldw, 0, 0.0,
                     ymat + g * Kg * ld * (int64_t)es, ld, ys, cnt);
        if (!s && (bias || !ldy)) {
            e = cu_bias_out(c->stream, dt, ybuf, !ldy, bp, bs, &ty, n0, cnt);
            if (e != cudaSuccess)
                s = cuda_fail_cu(c, "cu_bias_out (launch)", e);
        }
    }
done:
    cuda_scratch_free(c, ybuf);
    cuda_scratch_free(c, colbuf);
    cuda_scratch_free(c, wbuf);
    return s;
}

static ts_status conv_bwd(cuda_ctx *c, const ts_kernel_call *call)
{
    int is_data = call->op == TS_OP_CONV2D_BWD_DATA;
    const char *name = is_data ? "conv2d_bwd_data" : "conv2d_bwd_weight";
    if (call->ninputs != 2 || call->noutputs != 1)
        return FAIL(c, TS_EINVAL, "%s: expects 2 inputs and 1 output, got %d and %d", name,
                    (int)call->ninputs, (int)call->noutputs);
    if (!call->params || call->params_size < sizeof(ts_conv2d_params))
        return FAIL(c, TS_EINVAL, "%s: missing ts_conv2d_params", name);
    const ts_conv2d_params *p = call->params;
    const ts_operand *gy = &call->inputs[0], *out = &call->outputs[0];
    const ts_operand *x = is_data ? out : &call->inputs[1]; /* x or gx */
    const ts_operand *w = is_data ? &call->inputs[1] : out; /* w or gw */
    hk_conv_dims d;
    ts_status s = hk_conv_check(c->host, name, p, x, w, gy, NULL, "gy", &d);
    if (s)
        return s;
    int32_t dt = out->dtype;
    size_t es = ts_plugin_dtype_size(dt);
    int64_t N = d.N, C = d.C, K = d.K, P = d.P, Q = d.Q, G = d.G, PQ = P * Q;
    int64_t Cg = C / G, Kg = K / G, CRS = Cg * d.R * d.S, CRSall = C * d.R * d.S;
    int64_t outn = 1;
    for (int i = 0; i < 4; i++)
        outn *= out->shape[i];
    if (outn == 0)
        return TS_OK;
    if (N == 0 || K == 0 || PQ == 0) /* empty sums: the gradient is zero */
        return cuda_scale_inplace(c, out, 0.0);
    void *wbuf = NULL, *colbuf = NULL, *gybuf = NULL;
    ts_operand dense;
    cu_t4 tx = t4(x);
    if (is_data) {
        int64_t ldw = hk_overlaps(w, out) ? 0 : filter_ld(w);
        const char *wmat = cuda_elem0(w);
        if (!ldw) {
            if ((s = pack(c, w, name, &wbuf, &dense, 1)))
                goto done;
            wmat = wbuf;
            ldw = CRS;
        }
        /* gy whole: gx is written chunk by chunk, so an overlapping gy is copied first. */
        int64_t ldg = hk_overlaps(gy, out) ? 0 : planes_ld(gy);
        const char *gymat = cuda_elem0(gy);
        int64_t gys = gy->strides[0];
        if (!ldg) {
            if ((s = pack(c, gy, name, &gybuf, &dense, 1)))
                goto done;
            gymat = gybuf;
            ldg = PQ;
            gys = K * PQ;
        }
        int64_t nb = chunk_images(N, CRSall * PQ * (int64_t)es);
        if ((s = cuda_scratch(c, (size_t)(nb * CRSall * PQ) * es, name, &colbuf)))
            goto done;
        cu_col_layout l = {d.R, d.S, P, Q, CRSall * PQ, PQ};
        for (int64_t n0 = 0; n0 < N && !s; n0 += nb) {
            int64_t cnt = N - n0 < nb ? N - n0 : nb;
            const char *g0 = gymat + n0 * gys * (int64_t)es;
            /* col[j, g] (CRS, PQ) = w[g]^T (CRS, Kg) @ gy[j, g] (Kg, PQ), as column-major
             * col^T (PQ, CRS) = gy^T (PQ, Kg) w (Kg, CRS). */
            for (int64_t g = 0; g < G && !s; g++)
                s = gemm(c, dt, CUBLAS_OP_N, CUBLAS_OP_T, PQ, CRS, Kg, 1.0,
                         g0 + g * Kg * ldg * (int64_t)es, ldg, gys,
                         wmat + g * Kg * ldw * (int64_t)es, ldw, 0, 0.0,
                         (char *)colbuf + g * CRS * PQ * (int64_t)es, PQ, CRSall * PQ, cnt);
            if (!s) {
                cudaError_t e = cu_col2im(c->stream, dt, colbuf, &l, p, &tx, n0, cnt);
                if (e != cudaSuccess)
                    s = cuda_fail_cu(c, "cu_col2im (launch)", e);
            }
        }
        goto done;
    }
    /* Weight gradient. */
    {
        int64_t ldw = hk_overlaps(w, gy) || hk_overlaps(w, x) ? 0 : filter_ld(w);
        char *wmat = cuda_elem0(w);
        if (!ldw) {
            if ((s = pack(c, w, name, &wbuf, &dense, 0)))
                goto done;
            wmat = wbuf;
            ldw = CRS;
        }
        int64_t nb = chunk_images(N, (CRSall + K) * PQ * (int64_t)es);
        if (nb * PQ > INT_MAX)
            nb = INT_MAX / PQ > 0 ? INT_MAX / PQ : 1;
        if ((s = cuda_scratch(c, (size_t)(nb * CRSall * PQ) * es, name, &colbuf)) ||
            (s = cuda_scratch(c, (size_t)(nb * K * PQ) * es, name, &gybuf)))
            goto done;
        for (int64_t n0 = 0; n0 < N && !s; n0 += nb) {
            int64_t cnt = N - n0 < nb ? N - n0 : nb, L = cnt * PQ;
            cu_col_layout l = {d.R, d.S, P, Q, PQ, L};
            cudaError_t e = cu_im2col(c->stream, dt, &tx, n0, cnt, p, &l, colbuf);
            if (e != cudaSuccess) {
                s = cuda_fail_cu(c, "cu_im2col (launch)", e);
                break;
            }
            /* gy images [n0, n0 + cnt) as (K, cnt, P, Q) -> dense (K, L). */
            ts_operand v = *gy, g2;
            v.offset = gy->offset + n0 * gy->strides[0];
            v.shape[0] = K;
            v.shape[1] = cnt;
            v.strides[0] = gy->strides[1];
            v.strides[1] = gy->strides[0];
            g2 = hk_dense_like(&v, gybuf);
            if ((s = cuda_copy_strided(c, &g2, &v)))
                break;
            /* gw[g] (Kg, CRS) (+)= gy[g] (Kg, L) @ col[g]^T (L, CRS), as column-major
             * gw^T (CRS, Kg) = col (CRS, L) gy^T (L, Kg). */
            for (int64_t g = 0; g < G && !s; g++)
                s = gemm(c, dt, CUBLAS_OP_T, CUBLAS_OP_N, CRS, Kg, L, 1.0,
                         (const char *)colbuf + g * CRS * L * (int64_t)es, L, 0,
                         (const char *)gybuf + g * Kg * L * (int64_t)es, L, 0, n0 ? 1.0 : 0.0,
                         wmat + g * Kg * ldw * (int64_t)es, ldw, 0, 1);
        }
        if (!s && wbuf)
            s = cuda_copy_strided(c, w, &dense);
    }
done:
    cuda_scratch_free(c, gybuf);
    cuda_scratch_free(c, colbuf);
    cuda_scratch_free(c, wbuf);
    return s;
}

ts_status cuda_gemm_run(cuda_ctx *c, const ts_kernel_call *call)
{
    switch (call->op) {
    case TS_OP_MATMUL: return run_matmul(c, call);
    case TS_OP_CONV2D: return conv_fwd(c, call);
    case TS_OP_CONV2D_BWD_DATA:
    case TS_OP_CONV2D_BWD_WEIGHT: return conv_bwd(c, call);
    default: return TS_ENOTSUP;
    }
}
