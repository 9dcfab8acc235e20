/* plugins/cpu_blas/conv.c: TS_OP_CONV2D, F32 and F64, as im2col into pool scratch plus one
 * OpenBLAS GEMM per (image, group). x is read through its strides by im2col (1x1, stride 1,
 * unpadded convolutions of a dense image skip im2col); w and y are used in place when their
 * per-group matrices are row-major, else packed / unpacked through scratch. */
#include "config.h"

#include <limits.h>

#include <cblas.h>

#include "blas.h"

int ts_blas_conv_supports(int32_t op, int32_t dtype)
{
    return op == TS_OP_CONV2D && (dtype == TS_F32 || dtype == TS_F64);
}

static double ld_elem(const char *base, int64_t off, size_t es)
{
    return es == 4 ? (double)((const float *)base)[off] : ((const double *)base)[off];
}

static void st_elem(char *base, int64_t off, size_t es, double v)
{
    if (es == 4)
        ((float *)base)[off] = (float)v;
    else
        ((double *)base)[off] = v;
}

/* col (C*R*S, P*Q) dense <- the receptive fields of image n of x (N, C, H, W). */
#define IM2COL(T)                                                                           \
    static void im2col_##T(const ts_operand *x, int64_t n, const ts_conv2d_params *p,      \
                           int64_t R, int64_t S, int64_t P, int64_t Q, T *col, int threads) \
    {                                                                                       \
        const T *xd = (const T *)x->data;                                                   \
        int64_t C = x->shape[1], H = x->shape[2], W = x->shape[3];                          \
        int64_t xn = x->offset + n * x->strides[0], sc = x->strides[1];                     \
        int64_t sh = x->strides[2], sw = x->strides[3], rows = C * R * S;                   \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if(rows * P * Q > 32768)") \
        for (int64_t row = 0; row < rows; row++) {                                          \
            int64_t c = row / (R * S), r = row / S % R, s = row % S;                        \
            T *dst = col + row * P * Q;                                                     \
            for (int64_t pp = 0; pp < P; pp++) {                                            \
                int64_t h = pp * p->stride_h - p->pad_h + r * p->dilation_h;                \
                if (h < 0 || h >= H) {                                                      \
                    for (int64_t q = 0; q < Q; q++)                                         \
                        dst[pp * Q + q] = 0;                                                \
                    continue;                                                               \
                }                                                                           \
                const T *src = xd + xn + c * sc + h * sh;                                   \
                for (int64_t q = 0; q < Q; q++) {                                           \
                    int64_t w = q * p->stride_w - p->pad_w + s * p->dilation_w;             \
                    dst[pp * Q + q] = w >= 0 && w < W ? src[w * sw] : (T)0;                 \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
    }
IM2COL(float)
IM2COL(double)

static void gemm(size_t es, int64_t m, int64_t n, int64_t k, const void *a, int64_t lda,
                 const void *b, int64_t ldb, void *c, int64_t ldc)
{
    if (es == 4)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n,
                    (blasint)k, 1.0f, a, (blasint)lda, b, (blasint)ldb, 0.0f, c, (blasint)ldc);
    else
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n,
                    (blasint)k, 1.0, a, (blasint)lda, b, (blasint)ldb, 0.0, c, (blasint)ldc);
}

/* x: (N, C, H, W), w: (K, C/groups, R, S), bias: (K) optional, y: (N, K, P, Q). */
ts_status ts_blas_conv(ts_hostdev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    if (call->op != TS_OP_CONV2D)
        return TS_ENOTSUP;
    if ((call->ninputs != 2 && call->ninputs != 3) || call->noutputs != 1)
        return h->fail(h, TS_EINVAL, "conv2d: expects 2 or 3 inputs and 1 output, got %d and %d",
                       (int)call->ninputs, (int)call->noutputs);
    if (!call->params || call->params_size < sizeof(ts_conv2d_params))
        return h->fail(h, TS_EINVAL, "conv2d: missing ts_conv2d_params");
    const ts_conv2d_params *p = call->params;
    const ts_operand *x = &call->inputs[0], *w = &call->inputs[1], *y = &call->outputs[0];
    const ts_operand *bias = call->ninputs == 3 ? &call->inputs[2] : NULL;
    int32_t dt = y->dtype;
    if (x->dtype != dt || w->dtype != dt || (bias && bias->dtype != dt))
        return h->fail(h, TS_EINVAL, "conv2d: operand dtypes differ");
    if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4 || (bias && bias->ndim != 1))
        return h->fail(h, TS_ESHAPE, "conv2d: x, w, y must be 4-D and bias 1-D");
    if (p->stride_h < 1 || p->stride_w < 1 || p->dilation_h < 1 || p->dilation_w < 1 ||
        p->pad_h < 0 || p->pad_w < 0 || p->groups < 1)
        return h->fail(h, TS_EINVAL, "conv2d: stride (%d, %d) and dilation (%d, %d) must be >= 1, "
                       "padding (%d, %d) >= 0 and groups (%d) >= 1", (int)p->stride_h,
                       (int)p->stride_w, (int)p->dilation_h, (int)p->dilation_w, (int)p->pad_h,
                       (int)p->pad_w, (int)p->groups);
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t K = w->shape[0], R = w->shape[2], S = w->shape[3], G = p->groups;
    if (C % G || K % G || w->shape[1] != C / G)
        return h->fail(h, TS_EINVAL, "conv2d: groups %lld must divide C %lld and K %lld, and w "
                       "needs C/groups input channels (has %lld)", (long long)G, (long long)C,
                       (long long)K, (long long)w->shape[1]);
    int64_t hspan = H + 2 * (int64_t)p->pad_h - (int64_t)p->dilation_h * (R - 1) - 1;
    int64_t wspan = W + 2 * (int64_t)p->pad_w - (int64_t)p->dilation_w * (S - 1) - 1;
    if (R < 1 || S < 1 || hspan < 0 || wspan < 0)
        return h->fail(h, TS_EINVAL, "conv2d: kernel %lldx%lld (dilation %d, %d) does not fit "
                       "the padded %lldx%lld input", (long long)R, (long long)S,
                       (int)p->dilation_h, (int)p->dilation_w, (long long)H, (long long)W);
    int64_t P = hspan / p->stride_h + 1, Q = wspan / p->stride_w + 1;
    if (y->shape[0] != N || y->shape[1] != K || y->shape[2] != P || y->shape[3] != Q ||
        (bias && bias->shape[0] != K))
        return h->fail(h, TS_ESHAPE, "conv2d: y is (%lld, %lld, %lld, %lld), expected (%lld, "
                       "%lld, %lld, %lld)%s", (long long)y->shape[0], (long long)y->shape[1],
                       (long long)y->shape[2], (long long)y->shape[3], (long long)N,
                       (long long)K, (long long)P, (long long)Q,
                       bias && bias->shape[0] != K ? "; bias length differs from K" : "");
    if (N == 0 || K == 0)
        return TS_OK;

    size_t es = dt == TS_F32 ? 4 : 8;
    int64_t Cg = C / G, Kg = K / G, CRS = Cg * R * S, PQ = P * Q, CRSall = C * R * S;
    if (CRSall > INT_MAX || PQ > INT_MAX || K > INT_MAX)
        return h->fail(h, TS_EINVAL, "conv2d: GEMM dims exceed BLAS's int range");
    ts_status s = TS_OK;
    void *wbuf = NULL, *colbuf = NULL, *ybuf = NULL;

    /* w as (K, Cg*R*S) row-major: in place when its (Cg, R, S) dims are dense. */
    const char *wmat;
    int64_t ldw;
    if (w->strides[3] == 1 && (R == 1 || w->strides[2] == S) && (Cg == 1 || w->strides[1] == R * S)
        && (K == 1 || w->strides[0] >= CRS)) {
        wmat = (const char *)w->data + w->offset * (int64_t)es;
        ldw = K == 1 ? CRS : w->strides[0];
    } else {
        if ((s = h->pool->alloc(hd->pool, (size_t)(K * CRS) * es, "conv2d", &wbuf)))
            goto done;
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < CRS; j++) {
                int64_t c = j / (R * S), r = j / S % R, ss = j % S;
                int64_t off = w->offset + k * w->strides[0] + c * w->strides[1] +
                              r * w->strides[2] + ss * w->strides[3];
                st_elem(wbuf, k * CRS + j, es, ld_elem(w->data, off, es));
            }
        wmat = wbuf;
        ldw = CRS;
    }

    /* A 1x1 stride-1 unpadded conv of dense (H, W) planes needs no im2col: x[n] is the
     * (C, H*W) matrix itself, with leading dimension the channel stride. */
    int direct_x = R == 1 && S == 1 && p->stride_h == 1 && p->stride_w == 1 && p->pad_h == 0 &&
                   p->pad_w == 0 && x->strides[3] == 1 && (H == 1 || x->strides[2] == W) &&
                   (C == 1 || x->strides[1] >= H * W) && x->strides[1] <= INT_MAX;
    if (!direct_x && (s = h->pool->alloc(hd->pool, (size_t)(CRSall * PQ) * es, "conv2d",
                                         &colbuf)))
        goto done;
    int direct_y = y->strides[3] == 1 && (P == 1 || y->strides[2] == Q) &&
                   (K == 1 || y->strides[1] >= PQ) && y->strides[1] <= INT_MAX;
    if (!direct_y && (s = h->pool->alloc(hd->pool, (size_t)(K * PQ) * es, "conv2d", &ybuf)))
        goto done;

    for (int64_t n = 0; n < N; n++) {
        const char *xmat;
        int64_t ldx;
        if (direct_x) {
            xmat = (const char *)x->data + (x->offset + n * x->strides[0]) * (int64_t)es;
            ldx = C == 1 ? PQ : x->strides[1];
        } else {
            if (es == 4)
                im2col_float(x, n, p, R, S, P, Q, colbuf, hd->threads);
            else
                im2col_double(x, n, p, R, S, P, Q, colbuf, hd->threads);
            xmat = colbuf;
            ldx = PQ;
        }
        char *ymat = direct_y ? (char *)y->data + (y->offset + n * y->strides[0]) * (int64_t)es
                              : ybuf;
        int64_t ldy = direct_y ? (K == 1 ? PQ : y->strides[1]) : PQ;
        /* Group g: y[n, g*Kg:(g+1)*Kg] (Kg, PQ) = w[g*Kg:...] (Kg, CRS) @ col[g*CRS:...] */
        for (int64_t g = 0; g < G; g++)
            gemm(es, Kg, PQ, CRS, wmat + g * Kg * ldw * (int64_t)es, ldw,
                 xmat + g * CRS * ldx * (int64_t)es, ldx, ymat + g * Kg * ldy * (int64_t)es,
                 ldy);
        /* Bias and, for a scattered y, the copy out: one pass over the (K, P, Q) planes. */
        if (bias || !direct_y) {
            int64_t yn = y->offset + n * y->strides[0];
            _Pragma("omp parallel for num_threads(hd->threads) schedule(static) if(K * PQ > 32768)")
            for (int64_t k = 0; k < K; k++) {
                double b = bias ? ld_elem(bias->data, bias->offset + k * bias->strides[0], es)
                                : 0.0;
                for (int64_t pp = 0; pp < P; pp++)
                    for (int64_t q = 0; q < Q; q++) {
                        int64_t src = k * ldy + pp * Q + q;
                        double v = ld_elem(ymat, src, es) + b;
                        if (direct_y)
                            st_elem(ymat, src, es, v);
                        else
                            st_elem(y->data, yn + k * y->strides[1] + pp * y->strides[2] +
                                    q * y->strides[3], es, v);
                    }
            }
        }
    }
done:
    h->pool->free(hd->pool, ybuf);
    h->pool->free(hd->pool, colbuf);
    h->pool->free(hd->pool, wbuf);
    return s;
}
