/* plugins/cpu_blas/conv.c: TS_OP_CONV2D, F32 and F64, as im2col into pool scratch plus one
 * OpenBLAS GEMM per (image, group). x is read through its strides by im2col (1x1, stride 1,
 * unpadded convolutions of a dense image skip im2col); w and y are used in place when their
 * per-group matrices are row-major, else packed / unpacked through scratch. The backward ops
 * reuse the same pieces: BWD_DATA is W^T @ gy then col2im (im2col's adjoint), BWD_WEIGHT sums
 * gy @ im2col(x)^T over the images. */
#include "config.h"

#include <limits.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "blas.h"

int ts_blas_conv_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_CONV2D || op == TS_OP_CONV2D_BWD_DATA || op == TS_OP_CONV2D_BWD_WEIGHT) &&
           hk_op_defined(op, dtype);
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

/* Outputs o in [0, n_out) whose input o * stride + off lies in [0, n_in): [*lo, *hi). */
static void valid_range(int64_t off, int64_t stride, int64_t n_out, int64_t n_in, int64_t *lo,
                        int64_t *hi)
{
    int64_t l = off >= 0 ? 0 : (-off + stride - 1) / stride;
    int64_t h = n_in - 1 - off >= 0 ? (n_in - 1 - off) / stride + 1 : 0;
    if (l > n_out)
        l = n_out;
    if (h > n_out)
        h = n_out;
    *lo = l;
    *hi = h < l ? l : h;
}

/* nbytes from s to d as constant-size moves the compiler inlines: the rows im2col copies are
 * often 10 to 28 floats, where a memcpy call costs more than the copy. */
static inline void copy_short(void *d, const void *s, size_t nbytes)
{
    char *dp = d;
    const char *sp = s;
    if (nbytes > 256) {
        memcpy(dp, sp, nbytes);
        return;
    }
    for (; nbytes >= 32; dp += 32, sp += 32, nbytes -= 32)
        memcpy(dp, sp, 32);
    if (nbytes >= 16)
        memcpy(dp, sp, 16), dp += 16, sp += 16, nbytes -= 16;
    if (nbytes >= 8)
        memcpy(dp, sp, 8), dp += 8, sp += 8, nbytes -= 8;
    if (nbytes >= 4)
        memcpy(dp, sp, 4);
}

/* Where one (c, r, s) row of the columns reads image plane c: output rows [pa, pb) and
 * columns [qa, qb) fall inside it, at input row pp * stride_h + hoff, column
 * q * stride_w + woff. `block`: stride 1 both ways, dense rows, and Q == W, so output row
 * pp + 1 starts where the input's row h + 1 does: [pa, pb) x [qa, qb) is one contiguous run
 * of the plane (plus wrapped-around edge columns, which the callers zero). */
typedef struct col_row {
    int64_t pa, pb, qa, qb, hoff, woff;
} col_row;

static col_row col_row_of(const ts_conv2d_params *p, int64_t r, int64_t s, int64_t H,
                          int64_t W, int64_t P, int64_t Q)
{
    col_row cr;
    cr.hoff = r * p->dilation_h - p->pad_h;
    cr.woff = s * p->dilation_w - p->pad_w;
    valid_range(cr.hoff, p->stride_h, P, H, &cr.pa, &cr.pb);
    valid_range(cr.woff, p->stride_w, Q, W, &cr.qa, &cr.qb);
    return cr;
}

static int col_block(const ts_conv2d_params *p, int64_t sh, int64_t sw, int64_t W, int64_t Q)
{
    return p->stride_h == 1 && p->stride_w == 1 && sw == 1 && sh == W && Q == W;
}

enum { COL_TAB_SMALL = 64 }; /* (r, s) entries kept on the stack: kernels up to 8x8 */

/* tab[r * S + s] = col_row_of(r, s): worked out once per call, not per image and channel.
 * small holds COL_TAB_SMALL entries; larger kernels take pool scratch (*buf, freed by the
 * caller). */
static ts_status col_tab_make(hk_dev *hd, const char *name, const ts_conv2d_params *p,
                              int64_t R, int64_t S, int64_t H, int64_t W, int64_t P, int64_t Q,
                              col_row *small, col_row **tab, void **buf)
{
    *tab = small;
    if (R * S > COL_TAB_SMALL) {
        ts_status s = hd->host->scratch_alloc(hd->host, (size_t)(R * S) * sizeof(col_row), name,
                                            buf);
        if (s)
            return s;
        *tab = *buf;
    }
    for (int64_t r = 0; r < R; r++)
        for (int64_t s = 0; s < S; s++)
            (*tab)[r * S + s] = col_row_of(p, r, s, H, W, P, Q);
    return TS_OK;
}

/* col (C*R*S, P*Q) dense <- the receptive fields of image n of x (N, C, H, W). */
#define IM2COL(T)                                                                           \
    static void im2col_##T(const ts_operand *x, int64_t n, const ts_conv2d_params *p,      \
                           const col_row *tab, int64_t R, int64_t S, int64_t P, int64_t Q,  \
                           T *col, int threads)                                             \
    {                                                                                       \
        const T *xd = (const T *)x->data;                                                   \
        int64_t C = x->shape[1], W = x->shape[3];                                           \
        int64_t xn = x->offset + n * x->strides[0], sc = x->strides[1];                     \
        int64_t sh = x->strides[2], sw = x->strides[3], rows = C * R * S;                   \
        int block = col_block(p, sh, sw, W, Q);                                             \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if(rows * P * Q > 32768)") \
        for (int64_t row = 0; row < rows; row++) {                                          \
            int64_t c = row / (R * S);                                                      \
            T *dst = col + row * P * Q;                                                     \
            const T *plane = xd + xn + c * sc;                                              \
            col_row cr = tab[row - c * R * S];                                              \
            for (int64_t i = 0; i < cr.pa * Q; i++)                                         \
                dst[i] = 0;                                                                 \
            for (int64_t i = cr.pb * Q; i < P * Q; i++)                                     \
                dst[i] = 0;                                                                 \
            if (block && cr.pb > cr.pa && cr.qb > cr.qa)                                    \
                memcpy(dst + cr.pa * Q + cr.qa,                                             \
                       plane + (cr.pa + cr.hoff) * W + cr.woff + cr.qa,                     \
                       (size_t)((cr.pb - cr.pa - 1) * Q + cr.qb - cr.qa) * sizeof(T));      \
            for (int64_t pp = cr.pa; pp < cr.pb; pp++) {                                    \
                T *d = dst + pp * Q;                                                        \
                for (int64_t q = 0; q < cr.qa; q++)                                         \
                    d[q] = 0;                                                               \
                for (int64_t q = cr.qb; q < Q; q++)                                         \
                    d[q] = 0;                                                               \
                if (block)                                                                  \
                    continue;                                                               \
                const T *src = plane + (pp * p->stride_h + cr.hoff) * sh;                   \
                if (p->stride_w == 1 && sw == 1)                                            \
                    copy_short(d + cr.qa, src + cr.qa + cr.woff,                            \
                               (size_t)(cr.qb - cr.qa) * sizeof(T));                        \
                else                                                                        \
                    for (int64_t q = cr.qa; q < cr.qb; q++)                                 \
                        d[q] = src[(q * p->stride_w + cr.woff) * sw];                       \
            }                                                                               \
        }                                                                                   \
    }
IM2COL(float)
IM2COL(double)

static ts_status conv_bwd(hk_dev *hd, const ts_kernel_call *call);

/* Threads to spread the images over, each running its own im2col and GEMMs single-threaded:
 * when each (image, group) GEMM of m*n*k multiply-adds is below OpenBLAS's own threshold for
 * threading (65536 * GEMM_MULTITHREAD_THRESHOLD 4), one image at a time would use one core.
 * Else 1: image after image, with OpenBLAS threading each GEMM. */
static int image_threads(const hk_dev *hd, int64_t N, double m, double n, double k)
{
    return hd->configured > 1 && N > 1 && m * n * k < 262144.0 ? hd->configured : 1;
}

/* The images of slot t of nt: libgomp's static schedule of N over nt threads. The slots (and
 * their scratch, and BWD_WEIGHT's partial sums) follow the threads setting, not the threads
 * running now (adaptive_threads), so the bits do not depend on the machine's load. */
static void slot_images(int64_t N, int t, int nt, int64_t *lo, int64_t *hi)
{
    int64_t q = N / nt, r = N % nt;
    *lo = q * t + (t < r ? t : r);
    *hi = *lo + q + (t < r);
}

/* fn(job, n, t) for every image n of every slot t of nt, the slots on the threads running
 * now (at most nt). */
static void run_slots(const hk_dev *hd, int64_t N, int nt,
                      void (*fn)(const void *job, int64_t n, int t), const void *job)
{
    int run = hk_threads(hd), nrun = run < nt ? (run > 1 ? run : 1) : nt;
    _Pragma("omp parallel for num_threads(nrun) schedule(static) if(nrun > 1)")
    for (int t = 0; t < nt; t++) {
        int64_t lo, hi;
        slot_images(N, t, nt, &lo, &hi);
        for (int64_t n = lo; n < hi; n++)
            fn(job, n, t);
    }
}

/* What every image of a forward convolution shares: the operands, the (K, CRS) filter matrix,
 * the im2col table and each slot's scratch. */
typedef struct fwd_job {
    const ts_conv2d_params *p;
    const ts_operand *x, *y, *bias;
    const col_row *tab;
    const char *wmat;
    char *colbuf, *ybuf; /* nt slices of (CRSall, PQ) and (K, PQ), or NULL */
    int64_t ldw, C, K, G, R, S, P, Q;
    size_t es;
    int direct_x, direct_y;
    int inner; /* threads for the image's own im2col, GEMMs and bias pass */
    int parts; /* the threads its GEMMs are cut for */
} fwd_job;

/* Image n, with slot tid's scratch. */
static void fwd_image(const fwd_job *j, int64_t n, int tid)
{
    const ts_conv2d_params *p = j->p;
    const ts_operand *x = j->x, *y = j->y, *bias = j->bias;
    const col_row *tab = j->tab;
    const char *wmat = j->wmat;
    char *colbuf = j->colbuf, *ybuf = j->ybuf;
    int64_t ldw = j->ldw, C = j->C, K = j->K, G = j->G, R = j->R, S = j->S, P = j->P, Q = j->Q;
    int64_t Kg = K / G, CRS = C / G * R * S, PQ = P * Q, CRSall = C * R * S;
    size_t es = j->es;
    int direct_x = j->direct_x, direct_y = j->direct_y, inner = j->inner;
    char *col = colbuf ? (char *)colbuf + (size_t)(tid * CRSall * PQ) * es : NULL;
    char *yb = ybuf ? (char *)ybuf + (size_t)(tid * K * PQ) * es : NULL;
    const char *xmat;
    int64_t ldx;
    if (direct_x) {
        xmat = (const char *)x->data + (x->offset + n * x->strides[0]) * (int64_t)es;
        ldx = C == 1 ? PQ : x->strides[1];
    } else {
        if (es == 4)
            im2col_float(x, n, p, tab, R, S, P, Q, (float *)col, inner);
        else
            im2col_double(x, n, p, tab, R, S, P, Q, (double *)col, inner);
        xmat = col;
        ldx = PQ;
    }
    char *ymat = direct_y ? (char *)y->data + (y->offset + n * y->strides[0]) * (int64_t)es
                          : yb;
    int64_t ldy = direct_y ? (K == 1 ? PQ : y->strides[1]) : PQ;
    /* Group g: y[n, g*Kg:(g+1)*Kg] (Kg, PQ) = w[g*Kg:...] (Kg, CRS) @ col[g*CRS:...] */
    for (int64_t g = 0; g < G; g++)
        ts_blas_gemm(j->parts, inner, es, 0, 0, Kg, PQ, CRS, 1.0, wmat + g * Kg * ldw * (int64_t)es,
                     ldw, xmat + g * CRS * ldx * (int64_t)es, ldx, 0.0,
                     ymat + g * Kg * ldy * (int64_t)es, ldy);
    /* Bias and, for a scattered y, the copy out: one pass over the (K, P, Q) planes. */
    if (bias && direct_y && es == 4) { /* the common case: one vector loop per plane */
        for (int64_t k = 0; k < K; k++) {
            float b = ((const float *)bias->data)[bias->offset + k * bias->strides[0]];
            float *yr = (float *)ymat + k * ldy;
            for (int64_t i = 0; i < PQ; i++)
                yr[i] += b;
        }
    } else if (bias || !direct_y) {
        int64_t yn = y->offset + n * y->strides[0];
        _Pragma("omp parallel for num_threads(inner) schedule(static) if(K * PQ > 32768)")
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

static void fwd_image_any(const void *j, int64_t n, int tid)
{
    fwd_image(j, n, tid);
}

/* x: (N, C, H, W), w: (K, C/groups, R, S), bias: (K) optional, y: (N, K, P, Q). */
ts_status ts_blas_conv(hk_dev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    if (call->op == TS_OP_CONV2D_BWD_DATA || call->op == TS_OP_CONV2D_BWD_WEIGHT)
        return conv_bwd(hd, call);
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
    hk_conv_dims d;
    ts_status s = hk_conv_check(h, "conv2d", p, x, w, y, bias, "y", &d);
    if (s)
        return s;
    int64_t N = d.N, C = d.C, H = d.H, W = d.W, K = d.K, R = d.R, S = d.S, P = d.P, Q = d.Q;
    int64_t G = d.G;
    if (N == 0 || K == 0)
        return TS_OK;

    size_t es = dt == TS_F32 ? 4 : 8;
    int64_t Cg = C / G, Kg = K / G, CRS = Cg * R * S, PQ = P * Q, CRSall = C * R * S;
    if (CRSall > INT_MAX || PQ > INT_MAX || K > INT_MAX)
        return h->fail(h, TS_EINVAL, "conv2d: GEMM dims exceed BLAS's int range");
    void *wbuf = NULL, *colbuf = NULL, *ybuf = NULL, *tabbuf = NULL;
    col_row tabsmall[COL_TAB_SMALL], *tab = tabsmall;

    /* w as (K, Cg*R*S) row-major: in place when its (Cg, R, S) dims are dense. */
    const char *wmat;
    int64_t ldw;
    if (w->strides[3] == 1 && (R == 1 || w->strides[2] == S) && (Cg == 1 || w->strides[1] == R * S)
        && (K == 1 || w->strides[0] >= CRS)) {
        wmat = (const char *)w->data + w->offset * (int64_t)es;
        ldw = K == 1 ? CRS : w->strides[0];
    } else {
        if ((s = h->scratch_alloc(h, (size_t)(K * CRS) * es, "conv2d", &wbuf)))
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
    /* Scratch per slot: columns (CRSall, PQ) and, for a scattered y, (K, PQ). */
    int nt = hk_overlaps(x, y) ? 1 : image_threads(hd, N, (double)Kg, (double)PQ,
                                                             (double)CRS);
    int inner = nt > 1 ? 1 : hk_threads(hd), parts = nt > 1 ? 1 : hd->configured;
    if (!direct_x && ((s = col_tab_make(hd, "conv2d", p, R, S, H, W, P, Q, tabsmall, &tab,
                                        &tabbuf)) ||
                      (s = h->scratch_alloc(h, (size_t)(nt * CRSall * PQ) * es, "conv2d",
                                          &colbuf))))
        goto done;
    int direct_y = y->strides[3] == 1 && (P == 1 || y->strides[2] == Q) &&
                   (K == 1 || y->strides[1] >= PQ) && y->strides[1] <= INT_MAX;
    if (!direct_y &&
        (s = h->scratch_alloc(h, (size_t)(nt * K * PQ) * es, "conv2d", &ybuf)))
        goto done;

    fwd_job job = {.p = p, .x = x, .y = y, .bias = bias, .tab = tab, .wmat = wmat,
                   .colbuf = colbuf, .ybuf = ybuf, .ldw = ldw, .C = C, .K = K, .G = G, .R = R,
                   .S = S, .P = P, .Q = Q, .es = es, .direct_x = direct_x,
                   .direct_y = direct_y, .inner = inner, .parts = parts};
    /* One image at a time runs outside any parallel region, so that the GEMMs' and im2col's
     * own regions are top-level ones on the plugin's one OpenMP pool: inside even an inactive
     * team of one they would be nested, and libgomp starts fresh threads for every nested
     * team (a thread per GEMM, 96 per training step of the default cnn). */
    if (nt > 1) {
        run_slots(hd, N, nt, fwd_image_any, &job);
    } else {
        for (int64_t n = 0; n < N; n++)
            fwd_image(&job, n, 0);
    }
done:
    h->scratch_free(h, tabbuf);
    h->scratch_free(h, ybuf);
    h->scratch_free(h, colbuf);
    h->scratch_free(h, wbuf);
    return s;
}

/* ---------------------------------------------------------------------------------------- */
/* Backward.                                                                                 */

/* Image n of x (N, C, H, W) <- col (C*R*S, P*Q) dense summed back onto the pixels each column
 * entry was gathered from: the adjoint of im2col. Overwrites the image (padding drops out).
 * One thread per channel, so no two threads touch the same pixel. In the contiguous case
 * (col_block) the wrapped-around edge entries of col are zeroed first, so that each (c, r, s)
 * row adds back in one run. */
#define COL2IM(T)                                                                           \
    static void col2im_##T(T *col, const ts_operand *x, int64_t n,                          \
                           const ts_conv2d_params *p, const col_row *tab, int64_t R,        \
                           int64_t S, int64_t P, int64_t Q, int threads)                    \
    {                                                                                       \
        T *xd = (T *)x->data;                                                               \
        int64_t C = x->shape[1], H = x->shape[2], W = x->shape[3];                          \
        int64_t xn = x->offset + n * x->strides[0], sc = x->strides[1];                     \
        int64_t sh = x->strides[2], sw = x->strides[3];                                     \
        int block = col_block(p, sh, sw, W, Q);                                             \
        int par = C * R * S * P * Q > 32768;                                                \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if(par)")           \
        for (int64_t c = 0; c < C; c++) {                                                   \
            T *xp = xd + xn + c * sc;                                                       \
            if (block || (sw == 1 && sh == W))                                              \
                memset(xp, 0, (size_t)(H * W) * sizeof(T));                                 \
            else                                                                            \
                for (int64_t h = 0; h < H; h++)                                             \
                    for (int64_t w = 0; w < W; w++)                                         \
                        xp[h * sh + w * sw] = 0;                                            \
            for (int64_t r = 0; r < R; r++)                                                 \
                for (int64_t s = 0; s < S; s++) {                                           \
                    T *src = col + ((c * R + r) * S + s) * P * Q;                           \
                    col_row cr = tab[r * S + s];                                            \
                    if (block) {                                                            \
                        if (cr.pb <= cr.pa || cr.qb <= cr.qa)                               \
                            continue;                                                       \
                        for (int64_t pp = cr.pa; pp < cr.pb; pp++) {                        \
                            for (int64_t q = 0; q < cr.qa; q++)                             \
                                src[pp * Q + q] = 0;                                        \
                            for (int64_t q = cr.qb; q < Q; q++)                             \
                                src[pp * Q + q] = 0;                                        \
                        }                                                                   \
                        T *d = xp + (cr.pa + cr.hoff) * W + cr.woff + cr.qa;                \
                        const T *a = src + cr.pa * Q + cr.qa;                               \
                        int64_t len = (cr.pb - cr.pa - 1) * Q + cr.qb - cr.qa;              \
                        for (int64_t i = 0; i < len; i++)                                   \
                            d[i] += a[i];                                                   \
                        continue;                                                           \
                    }                                                                       \
                    for (int64_t pp = cr.pa; pp < cr.pb; pp++) {                            \
                        T *xrow = xp + (pp * p->stride_h + cr.hoff) * sh;                   \
                        const T *a = src + pp * Q;                                          \
                        if (p->stride_w == 1 && sw == 1)                                    \
                            for (int64_t q = cr.qa; q < cr.qb; q++)                         \
                                xrow[q + cr.woff] += a[q];                                  \
                        else                                                                \
                            for (int64_t q = cr.qa; q < cr.qb; q++)                         \
                                xrow[(q * p->stride_w + cr.woff) * sw] += a[q];             \
                    }                                                                       \
                }                                                                           \
        }                                                                                   \
    }
COL2IM(float)
COL2IM(double)

/* Image n of t (N, K, P, Q) as a (K, P*Q) matrix: its leading dimension when the (P, Q) planes
 * are dense and do not interleave, else 0. */
static int64_t planes_ld(const ts_operand *t)
{
    int64_t K = t->shape[1], P = t->shape[2], Q = t->shape[3], PQ = P * Q;
    if (t->strides[3] == 1 && (P == 1 || t->strides[2] == Q) && (K == 1 || t->strides[1] >= PQ)
        && t->strides[1] <= INT_MAX)
        return K == 1 ? PQ : t->strides[1];
    return 0;
}

/* w (K, Cg, R, S) as a (K, Cg*R*S) matrix: its leading dimension when dense, else 0. */
static int64_t filter_ld(const ts_operand *w)
{
    int64_t K = w->shape[0], Cg = w->shape[1], R = w->shape[2], S = w->shape[3];
    int64_t CRS = Cg * R * S;
    if (w->strides[3] == 1 && (R == 1 || w->strides[2] == S) && (Cg == 1 || w->strides[1] == R * S)
        && (K == 1 || w->strides[0] >= CRS) && w->strides[0] <= INT_MAX)
        return K == 1 ? CRS : w->strides[0];
    return 0;
}

/* Image n of t (N, K, P, Q) copied into buf as a dense (K, P*Q) matrix. */
static void pack_image(const ts_operand *t, int64_t n, void *buf)
{
    ts_operand src = *t, dst;
    src.offset += n * t->strides[0];
    src.shape[0] = 1;
    dst = hk_dense_like(&src, buf);
    hk_dev_copy_strided(&dst, &src);
}

/* Out-of-place zeroing of a whole operand through its strides. */
static void zero_operand(const ts_operand *t, size_t es)
{
    int64_t n = 1, idx[TS_MAX_DIMS] = {0};
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t off = t->offset;
        for (int d = 0; d < t->ndim; d++)
            off += idx[d] * t->strides[d];
        st_elem(t->data, off, es, 0.0);
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
}

/* What every image of a backward convolution shares (BWD_DATA or BWD_WEIGHT). */
typedef struct bwd_job {
    const ts_conv2d_params *p;
    const ts_operand *x, *gy; /* x is gx for BWD_DATA */
    const col_row *tab;
    char *wmat; /* w (BWD_DATA) or gw (BWD_WEIGHT) as (K, CRS) */
    char *colbuf, *gybuf, *partbuf; /* nt slices of (C*R*S, PQ), (K, PQ), (K, CRS), or NULL */
    int64_t ldw, ldgy, C, K, G, R, S, P, Q;
    size_t es;
    int is_data, direct_x;
    int inner; /* threads for the image's own GEMMs, im2col and col2im */
    int parts; /* the threads its GEMMs are cut for */
} bwd_job;

/* Image n, with slot tid's scratch. */
static void bwd_image(const bwd_job *j, int64_t n, int tid)
{
    const ts_conv2d_params *p = j->p;
    const ts_operand *x = j->x, *gy = j->gy;
    const col_row *tab = j->tab;
    char *wmat = j->wmat, *colbuf = j->colbuf, *gybuf = j->gybuf, *partbuf = j->partbuf;
    int64_t ldw = j->ldw, ldgy = j->ldgy, C = j->C, K = j->K, G = j->G, R = j->R, S = j->S;
    int64_t P = j->P, Q = j->Q, Kg = K / G, CRS = C / G * R * S, PQ = P * Q;
    size_t es = j->es;
    int is_data = j->is_data, direct_x = j->direct_x, inner = j->inner;
    char *col = colbuf ? (char *)colbuf + (size_t)(tid * C * R * S * PQ) * es : NULL;
    char *gyb = gybuf ? (char *)gybuf + (size_t)(tid * K * PQ) * es : NULL;
    /* gw, or this thread's partial sum of it (K, CRS) */
    char *gwmat = partbuf ? (char *)partbuf + (size_t)(tid * K * CRS) * es : wmat;
    int64_t ldgw = partbuf ? CRS : ldw;
    double beta = partbuf || n ? 1.0 : 0.0;
    const char *gymat = (const char *)gy->data + (gy->offset + n * gy->strides[0]) *
                                                     (int64_t)es;
    if (gyb) {
        pack_image(gy, n, gyb);
        gymat = gyb;
    }
    int64_t ldg = gyb ? PQ : ldgy;
    char *xmat = direct_x ? (char *)x->data + (x->offset + n * x->strides[0]) * (int64_t)es
                          : col;
    int64_t ldx = direct_x ? (C == 1 ? PQ : x->strides[1]) : PQ;
    if (is_data) {
        /* Group g: col[g*CRS:...] (CRS, PQ) = w[g*Kg:...]^T (CRS, Kg) @ gy[g*Kg:...] */
        for (int64_t g = 0; g < G; g++)
            ts_blas_gemm(j->parts, inner, es, 1, 0, CRS, PQ, Kg, 1.0,
                         wmat + g * Kg * ldw * (int64_t)es, ldw,
                         gymat + g * Kg * ldg * (int64_t)es, ldg, 0.0,
                         xmat + g * CRS * ldx * (int64_t)es, ldx);
        if (!direct_x) {
            if (es == 4)
                col2im_float((float *)col, x, n, p, tab, R, S, P, Q, inner);
            else
                col2im_double((double *)col, x, n, p, tab, R, S, P, Q, inner);
        }
    } else {
        if (!direct_x) {
            if (es == 4)
                im2col_float(x, n, p, tab, R, S, P, Q, (float *)col, inner);
            else
                im2col_double(x, n, p, tab, R, S, P, Q, (double *)col, inner);
        }
        /* Group g: gw[g*Kg:...] (Kg, CRS) (+)= gy[g*Kg:...] (Kg, PQ) @ col[g*CRS:...]^T */
        for (int64_t g = 0; g < G; g++)
            ts_blas_gemm(j->parts, inner, es, 0, 1, Kg, CRS, PQ, 1.0,
                         gymat + g * Kg * ldg * (int64_t)es, ldg,
                         xmat + g * CRS * ldx * (int64_t)es, ldx, beta,
                         gwmat + g * Kg * ldgw * (int64_t)es, ldgw);
    }
}

static void bwd_image_any(const void *j, int64_t n, int tid)
{
    bwd_image(j, n, tid);
}

/* BWD_DATA: gy (N, K, P, Q), w (K, C/G, R, S) -> gx (N, C, H, W).
 * BWD_WEIGHT: gy (N, K, P, Q), x (N, C, H, W) -> gw (K, C/G, R, S). */
static ts_status conv_bwd(hk_dev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    int is_data = call->op == TS_OP_CONV2D_BWD_DATA;
    const char *name = is_data ? "conv2d_bwd_data" : "conv2d_bwd_weight";
    if (call->ninputs != 2 || call->noutputs != 1)
        return h->fail(h, TS_EINVAL, "%s: expects 2 inputs and 1 output, got %d and %d", name,
                       (int)call->ninputs, (int)call->noutputs);
    if (!call->params || call->params_size < sizeof(ts_conv2d_params))
        return h->fail(h, TS_EINVAL, "%s: missing ts_conv2d_params", name);
    const ts_conv2d_params *p = call->params;
    const ts_operand *gy = &call->inputs[0], *out = &call->outputs[0];
    const ts_operand *x = is_data ? out : &call->inputs[1]; /* x or gx */
    const ts_operand *w = is_data ? &call->inputs[1] : out; /* w or gw */
    hk_conv_dims d;
    ts_status s = hk_conv_check(h, name, p, x, w, gy, NULL, "gy", &d);
    if (s)
        return s;
    int64_t N = d.N, C = d.C, H = d.H, W = d.W, K = d.K, R = d.R, S = d.S, P = d.P, Q = d.Q;
    int64_t G = d.G, Cg = C / G, Kg = K / G, CRS = Cg * R * S, PQ = P * Q;
    size_t es = out->dtype == TS_F32 ? 4 : 8;
    if (C * R * S > INT_MAX || PQ > INT_MAX || K > INT_MAX)
        return h->fail(h, TS_EINVAL, "%s: GEMM dims exceed BLAS's int range", name);
    /* Empty sums: the gradient is zero (or empty). */
    if (N == 0 || C == 0 || K == 0) {
        zero_operand(out, es);
        return TS_OK;
    }

    void *wbuf = NULL, *colbuf = NULL, *gybuf = NULL, *partbuf = NULL, *tabbuf = NULL;
    col_row tabsmall[COL_TAB_SMALL], *tab = tabsmall;
    /* Images spread over nt threads (see image_threads), each with its own scratch and, for
     * BWD_WEIGHT, its own partial sum of gw, added up at the end. */
    int nt = hk_overlaps(gy, out) || hk_overlaps(x, w) ? 1
             : is_data ? image_threads(hd, N, (double)CRS, (double)PQ, (double)Kg)
                       : image_threads(hd, N, (double)Kg, (double)CRS, (double)PQ);
    int inner = nt > 1 ? 1 : hk_threads(hd), parts = nt > 1 ? 1 : hd->configured;
    /* w / gw as (K, CRS) row-major: in place when dense and clear of the output written image
     * after image (w of gx; gw of gy and x), else through scratch. */
    int64_t ldw = filter_ld(w);
    if (is_data ? hk_overlaps(w, out)
                : hk_overlaps(w, gy) || hk_overlaps(w, x))
        ldw = 0;
    char *wmat = (char *)w->data + w->offset * (int64_t)es;
    if (!ldw) {
        if ((s = h->scratch_alloc(h, (size_t)(K * CRS) * es, name, &wbuf)))
            goto done;
        ts_operand dw = hk_dense_like(w, wbuf);
        if (is_data)
            hk_dev_copy_strided(&dw, w);
        wmat = wbuf;
        ldw = CRS;
    }
    /* gy[n] as (K, PQ): in place when dense and not about to be overwritten by gx. */
    int64_t ldgy = planes_ld(gy);
    if (is_data && hk_overlaps(gy, out))
        ldgy = 0;
    if (!ldgy && (s = h->scratch_alloc(h, (size_t)(nt * K * PQ) * es, name, &gybuf)))
        goto done;
    /* x / gx[n] as (C, H*W) itself for a 1x1 stride-1 unpadded conv of dense planes. */
    int direct_x = R == 1 && S == 1 && p->stride_h == 1 && p->stride_w == 1 && p->pad_h == 0 &&
                   p->pad_w == 0 && x->strides[3] == 1 && (H == 1 || x->strides[2] == W) &&
                   (C == 1 || x->strides[1] >= H * W) && x->strides[1] <= INT_MAX;
    if (!direct_x && ((s = col_tab_make(hd, name, p, R, S, H, W, P, Q, tabsmall, &tab,
                                        &tabbuf)) ||
                      (s = h->scratch_alloc(h, (size_t)(nt * C * R * S * PQ) * es, name,
                                          &colbuf))))
        goto done;
    if (!is_data && nt > 1) {
        if ((s = h->scratch_alloc(h, (size_t)(nt * K * CRS) * es, name, &partbuf)))
            goto done;
        memset(partbuf, 0, (size_t)(nt * K * CRS) * es);
    }

    bwd_job job = {.p = p, .x = x, .gy = gy, .tab = tab, .wmat = wmat, .colbuf = colbuf,
                   .gybuf = gybuf, .partbuf = partbuf, .ldw = ldw, .ldgy = ldgy, .C = C, .K = K,
                   .G = G, .R = R, .S = S, .P = P, .Q = Q, .es = es, .is_data = is_data,
                   .direct_x = direct_x, .inner = inner, .parts = parts};
    /* Outside any parallel region when the images are not spread: see ts_blas_conv. */
    if (nt > 1) {
        run_slots(hd, N, nt, bwd_image_any, &job);
    } else {
        for (int64_t n = 0; n < N; n++)
            bwd_image(&job, n, 0);
    }
    if (partbuf) { /* gw = the threads' partial sums, added in thread order */
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < CRS; j++) {
                double sum = 0;
                for (int t = 0; t < nt; t++)
                    sum += ld_elem(partbuf, (t * K + k) * CRS + j, es);
                st_elem(wmat, k * ldw + j, es, sum);
            }
    }
    if (!is_data && wbuf) {
        ts_operand dw = hk_dense_like(w, wbuf);
        hk_dev_copy_strided(w, &dw);
    }
done:
    h->scratch_free(h, tabbuf);
    h->scratch_free(h, partbuf);
    h->scratch_free(h, colbuf);
    h->scratch_free(h, gybuf);
    h->scratch_free(h, wbuf);
    return s;
}
