/* kernels/host/pool2d.c: TS_OP_MAXPOOL2D (optionally with the TS_I64 argmax of each window
 * within its H*W plane) and TS_OP_AVGPOOL2D on F32/F64, direct loops over any strides, one
 * OpenMP task per (n, c) plane. Padding counts as -inf for max; for avg it is a zero that
 * count_include_pad decides whether to count. Their gradients (MAXPOOL2D_BWD, AVGPOOL2D_BWD)
 * scatter gy back over each plane, again one task per plane, so overlapping windows add up
 * without atomics. */
#include "hostkern.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

int hk_pool2d_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_MAXPOOL2D || op == TS_OP_AVGPOOL2D || op == TS_OP_MAXPOOL2D_BWD ||
            op == TS_OP_AVGPOOL2D_BWD) && hk_op_defined(op, dtype);
}

/* The max of a 2x2 window (a[0], a[1] / b[0], b[1]) in scan order, the first NaN winning,
 * and its index within the plane (top left at base, rows W apart). */
#define MAX4(T)                                                                             \
    static inline void max4_##T(const T *a, const T *b, T *best, int64_t *arg, int64_t base, \
                                int64_t W)                                                  \
    {                                                                                       \
        const T v[4] = {a[0], a[1], b[0], b[1]};                                            \
        const int64_t off[4] = {0, 1, W, W + 1};                                            \
        T m = v[0];                                                                         \
        int k = 0;                                                                          \
        for (int j = 1; j < 4; j++)                                                         \
            if (v[j] > m || (isnan(v[j]) && !isnan(m)))                                     \
                m = v[j], k = j;                                                            \
        *best = m;                                                                          \
        *arg = base + off[k];                                                               \
    }
MAX4(float)
MAX4(double)

#if defined(__GNUC__) && defined(__has_builtin)
#if __has_builtin(__builtin_shufflevector) && __has_builtin(__builtin_convertvector)
#define TS_POOL_VECTOR 1
#endif
#endif

#ifdef TS_POOL_VECTOR
/* Four windows at a time, without branches: on real data each comparison is a coin flip,
 * and the mispredicted branches of the scalar scan made max pooling the slowest kernel of
 * a small CNN's step (3.3 ms of 20 at batch 100). GCC/Clang vector extensions, so any
 * target with 16-byte vectors (SSE2, NEON) gets them. */
typedef float ts_v4f __attribute__((vector_size(16)));
typedef int32_t ts_v4i __attribute__((vector_size(16)));
typedef int64_t ts_v4l __attribute__((vector_size(32)));

static inline ts_v4i blend(ts_v4i take, ts_v4i a, ts_v4i b)
{
    return (take & a) | (~take & b);
}

/* Lanes where v beats the running max m: greater, or the first NaN. */
static inline ts_v4i beats(ts_v4f v, ts_v4f m)
{
    return (v > m) | ((v != v) & (m == m));
}

/* Windows q..q+3 from 8 floats of each input row (a: top, b: bottom). */
static inline void max4x4(const float *a, const float *b, int32_t W, ts_v4f *m, ts_v4i *k)
{
    ts_v4f a0, a1, b0, b1;
    memcpy(&a0, a, 16), memcpy(&a1, a + 4, 16), memcpy(&b0, b, 16), memcpy(&b1, b + 4, 16);
    ts_v4f v0 = __builtin_shufflevector(a0, a1, 0, 2, 4, 6);
    ts_v4f v1 = __builtin_shufflevector(a0, a1, 1, 3, 5, 7);
    ts_v4f v2 = __builtin_shufflevector(b0, b1, 0, 2, 4, 6);
    ts_v4f v3 = __builtin_shufflevector(b0, b1, 1, 3, 5, 7);
    ts_v4i zero = {0, 0, 0, 0};
    ts_v4i t = beats(v1, v0);
    ts_v4f mm = (ts_v4f)blend(t, (ts_v4i)v1, (ts_v4i)v0);
    ts_v4i kk = t & 1;
    t = beats(v2, mm);
    mm = (ts_v4f)blend(t, (ts_v4i)v2, (ts_v4i)mm);
    kk = blend(t, zero + W, kk);
    t = beats(v3, mm);
    *m = (ts_v4f)blend(t, (ts_v4i)v3, (ts_v4i)mm);
    *k = blend(t, zero + (W + 1), kk);
}

/* One output row of a 2x2 stride-2 max pool over dense input rows r0, r1 into dense yr and,
 * unless NULL, ir (indices from base). Rows of 4 windows or more end with a vector that
 * overlaps the previous one (recomputing a window gives the same result); shorter rows, and
 * planes too wide for 32-bit lane offsets, take the scalar scan. */
static void max2x2_float(const float *r0, const float *r1, int64_t Q, float *yr, int64_t *ir,
                         int64_t base, int64_t W)
{
    if (Q < 4 || W >= INT32_MAX / 4) {
        for (int64_t q = 0; q < Q; q++) {
            int64_t arg;
            max4_float(r0 + 2 * q, r1 + 2 * q, &yr[q], &arg, base + 2 * q, W);
            if (ir)
                ir[q] = arg;
        }
        return;
    }
    const ts_v4i lane = {0, 2, 4, 6};
    for (int64_t q = 0;; q += 4) {
        if (q > Q - 4)
            q = Q - 4;
        ts_v4f m;
        ts_v4i k;
        max4x4(r0 + 2 * q, r1 + 2 * q, (int32_t)W, &m, &k);
        memcpy(yr + q, &m, 16);
        if (ir) {
            ts_v4l at = __builtin_convertvector(k + lane + (int32_t)(2 * q), ts_v4l) + base;
            memcpy(ir + q, &at, 32);
        }
        if (q == Q - 4)
            break;
    }
}
#endif

/* The scalar row, for double (and float without vector extensions). */
#define MAX2X2_SCALAR(T)                                                                    \
    static void max2x2_scalar_##T(const T *r0, const T *r1, int64_t Q, T *yr, int64_t *ir,  \
                                  int64_t base, int64_t W)                                  \
    {                                                                                       \
        for (int64_t q = 0; q < Q; q++) {                                                   \
            int64_t arg;                                                                    \
            max4_##T(r0 + 2 * q, r1 + 2 * q, &yr[q], &arg, base + 2 * q, W);                \
            if (ir)                                                                         \
                ir[q] = arg;                                                                \
        }                                                                                   \
    }
#ifndef TS_POOL_VECTOR
MAX2X2_SCALAR(float)
#define max2x2_float max2x2_scalar_float
#endif
MAX2X2_SCALAR(double)
#define max2x2_double max2x2_scalar_double

/* x: (N, C, H, W) -> y: (N, C, P, Q), idx: (N, C, P, Q) TS_I64 or NULL. */
#define POOL(T)                                                                             \
    static void pool_##T(const ts_operand *x, const ts_operand *y, const ts_operand *ix,     \
                         const ts_pool2d_params *p, int is_max, int threads)                \
    {                                                                                       \
        int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];         \
        int64_t P = y->shape[2], Q = y->shape[3], planes = N * C;                           \
        const T *xd = (const T *)x->data;                                                   \
        T *yd = (T *)y->data;                                                               \
        int64_t *id = ix ? (int64_t *)ix->data : NULL;                                      \
        int par = planes * P * Q * p->kernel_h * p->kernel_w > 32768;                       \
        (void)par;                                                                          \
        int fast2x2 = is_max && p->kernel_h == 2 && p->kernel_w == 2 && p->stride_h == 2 &&  \
                      p->stride_w == 2 && p->pad_h == 0 && p->pad_w == 0 &&                 \
                      x->strides[3] == 1;                                                   \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if(par)")           \
        for (int64_t nc = 0; nc < planes; nc++) {                                           \
            int64_t n = nc / C, c = nc % C;                                                 \
            const T *xp = xd + x->offset + n * x->strides[0] + c * x->strides[1];           \
            int64_t yo = y->offset + n * y->strides[0] + c * y->strides[1];                 \
            int64_t io = ix ? ix->offset + n * ix->strides[0] + c * ix->strides[1] : 0;     \
            if (fast2x2) { /* 2x2, stride 2, no padding, dense rows: the same scan order */ \
                for (int64_t pp = 0; pp < P; pp++) {                                        \
                    const T *r0 = xp + 2 * pp * x->strides[2], *r1 = r0 + x->strides[2];    \
                    T *yr = yd + yo + pp * y->strides[2];                                   \
                    int64_t *ir = id ? id + io + pp * ix->strides[2] : NULL;                \
                    int64_t base = 2 * pp * W;                                              \
                    if (ir && y->strides[3] == 1 && ix->strides[3] == 1)                    \
                        max2x2_##T(r0, r1, Q, yr, ir, base, W);                             \
                    else if (!ir && y->strides[3] == 1)                                     \
                        max2x2_##T(r0, r1, Q, yr, NULL, 0, 0);                              \
                    else                                                                    \
                        for (int64_t q = 0; q < Q; q++) {                                   \
                            T best;                                                         \
                            int64_t arg;                                                    \
                            max4_##T(r0 + 2 * q, r1 + 2 * q, &best, &arg, base + 2 * q, W); \
                            yr[q * y->strides[3]] = best;                                   \
                            if (ir)                                                         \
                                ir[q * ix->strides[3]] = arg;                               \
                        }                                                                   \
                }                                                                           \
                continue;                                                                   \
            }                                                                               \
            for (int64_t pp = 0; pp < P; pp++) {                                            \
                int64_t h0 = pp * p->stride_h - p->pad_h, h1 = h0 + p->kernel_h;            \
                int64_t hs = h0 < 0 ? 0 : h0, he = h1 > H ? H : h1;                         \
                for (int64_t q = 0; q < Q; q++) {                                           \
                    int64_t w0 = q * p->stride_w - p->pad_w, w1 = w0 + p->kernel_w;         \
                    int64_t ws = w0 < 0 ? 0 : w0, we = w1 > W ? W : w1;                     \
                    T out;                                                                  \
                    if (is_max) {                                                           \
                        T best = (T)-INFINITY;                                              \
                        int64_t arg = hs * W + ws;                                          \
                        for (int64_t hh = hs; hh < he; hh++)                                \
                            for (int64_t ww = ws; ww < we; ww++) {                          \
                                T v = xp[hh * x->strides[2] + ww * x->strides[3]];          \
                                if (v > best || (isnan(v) && !isnan(best))) {               \
                                    best = v;                                               \
                                    arg = hh * W + ww;                                      \
                                }                                                           \
                            }                                                               \
                        out = best;                                                         \
                        if (id)                                                             \
                            id[io + pp * ix->strides[2] + q * ix->strides[3]] = arg;        \
                    } else {                                                                \
                        double sum = 0.0;                                                   \
                        for (int64_t hh = hs; hh < he; hh++)                                \
                            for (int64_t ww = ws; ww < we; ww++)                            \
                                sum += xp[hh * x->strides[2] + ww * x->strides[3]];         \
                        int64_t cnt = p->count_include_pad                                  \
                                          ? (int64_t)p->kernel_h * p->kernel_w              \
                                          : (he - hs) * (we - ws);                          \
                        out = (T)(sum / (double)cnt);                                       \
                    }                                                                       \
                    yd[yo + pp * y->strides[2] + q * y->strides[3]] = out;                  \
                }                                                                           \
            }                                                                               \
        }                                                                                   \
    }
POOL(float)
POOL(double)

/* gy: (N, C, P, Q), idx: (N, C, P, Q) TS_I64 for max or NULL for avg -> gx: (N, C, H, W),
 * overwritten. Indices are already range-checked. */
#define POOL_BWD(T)                                                                         \
    static void pool_bwd_##T(const ts_operand *gy, const ts_operand *ix, const ts_operand *gx, \
                             const ts_pool2d_params *p, int threads)                        \
    {                                                                                       \
        int64_t N = gx->shape[0], C = gx->shape[1], H = gx->shape[2], W = gx->shape[3];     \
        int64_t P = gy->shape[2], Q = gy->shape[3], planes = N * C;                         \
        const T *gyd = (const T *)gy->data;                                                 \
        T *gxd = (T *)gx->data;                                                             \
        const int64_t *id = ix ? (const int64_t *)ix->data : NULL;                          \
        int64_t sh = gx->strides[2], sw = gx->strides[3];                                   \
        int64_t work = ix ? H * W + P * Q : H * W + P * Q * p->kernel_h * p->kernel_w;      \
        int par = planes * work > 32768;                                                    \
        (void)par;                                                                          \
        int dense = sw == 1 && (H == 1 || sh == W);                                         \
        _Pragma("omp parallel for num_threads(threads) schedule(static) if(par)")           \
        for (int64_t nc = 0; nc < planes; nc++) {                                           \
            int64_t n = nc / C, c = nc % C;                                                 \
            T *xp = gxd + gx->offset + n * gx->strides[0] + c * gx->strides[1];             \
            const T *gp = gyd + gy->offset + n * gy->strides[0] + c * gy->strides[1];       \
            int64_t io = ix ? ix->offset + n * ix->strides[0] + c * ix->strides[1] : 0;     \
            if (dense) /* a plane index is then the offset itself: no division */          \
                memset(xp, 0, (size_t)(H * W) * sizeof(T));                                 \
            else                                                                            \
                for (int64_t hh = 0; hh < H; hh++)                                          \
                    for (int64_t ww = 0; ww < W; ww++)                                      \
                        xp[hh * sh + ww * sw] = 0;                                          \
            for (int64_t pp = 0; pp < P; pp++)                                              \
                for (int64_t q = 0; q < Q; q++) {                                           \
                    T g = gp[pp * gy->strides[2] + q * gy->strides[3]];                     \
                    if (id) {                                                               \
                        int64_t a = id[io + pp * ix->strides[2] + q * ix->strides[3]];      \
                        xp[dense ? a : a / W * sh + a % W * sw] += g;                       \
                        continue;                                                           \
                    }                                                                       \
                    int64_t h0 = pp * p->stride_h - p->pad_h, h1 = h0 + p->kernel_h;        \
                    int64_t hs = h0 < 0 ? 0 : h0, he = h1 > H ? H : h1;                     \
                    int64_t w0 = q * p->stride_w - p->pad_w, w1 = w0 + p->kernel_w;         \
                    int64_t ws = w0 < 0 ? 0 : w0, we = w1 > W ? W : w1;                     \
                    int64_t cnt = p->count_include_pad ? (int64_t)p->kernel_h * p->kernel_w \
                                                       : (he - hs) * (we - ws);             \
                    T share = (T)((double)g / (double)cnt);                                 \
                    for (int64_t hh = hs; hh < he; hh++)                                    \
                        for (int64_t ww = ws; ww < we; ww++)                                \
                            xp[hh * sh + ww * sw] += share;                                 \
                }                                                                           \
        }                                                                                   \
    }
POOL_BWD(float)
POOL_BWD(double)

/* in, when it shares memory with out, copied into dense pool scratch (*buf, freed by the
 * caller); else in itself. */
static ts_status unalias(hk_dev *hd, const ts_operand *in, const ts_operand *out,
                         const char *tag, ts_operand *copy, void **buf)
{
    *copy = *in;
    if (!hk_overlaps(in, out))
        return TS_OK;
    int64_t acc = 1;
    for (int d = in->ndim - 1; d >= 0; d--) {
        copy->strides[d] = acc;
        acc *= in->shape[d];
    }
    ts_status s = hd->host->scratch_alloc(hd->host, (size_t)acc * ts_plugin_dtype_size(in->dtype),
                                        tag, buf);
    if (s)
        return s;
    copy->data = *buf;
    copy->offset = 0;
    return hk_dev_copy_strided(copy, in);
}

/* gy (N, C, P, Q) [, idx (N, C, P, Q) TS_I64] -> gx (N, C, H, W). */
static ts_status pool2d_bwd(hk_dev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    int is_max = call->op == TS_OP_MAXPOOL2D_BWD;
    const char *name = is_max ? "maxpool2d_bwd" : "avgpool2d_bwd";
    ts_status s = hk_pool2d_check(h, 0, call);
    if (s)
        return s;
    const ts_pool2d_params *p = call->params;
    const ts_operand *gy = &call->inputs[0], *gx = &call->outputs[0];
    const ts_operand *ix = is_max ? &call->inputs[1] : NULL;
    if (gx->shape[0] * gx->shape[1] * gx->shape[2] * gx->shape[3] == 0)
        return TS_OK; /* an empty gx has nothing to receive */
    int64_t H = gx->shape[2], W = gx->shape[3], HW = H * W;
    /* Indices come from the caller: range-check them all before writing anything (nested
     * loops: no division per element, which made this check cost more than the scatter). */
    for (int64_t i0 = 0; ix && i0 < ix->shape[0]; i0++)
        for (int64_t i1 = 0; i1 < ix->shape[1]; i1++)
            for (int64_t i2 = 0; i2 < ix->shape[2]; i2++) {
                const int64_t *row = (const int64_t *)ix->data + ix->offset +
                                     i0 * ix->strides[0] + i1 * ix->strides[1] +
                                     i2 * ix->strides[2];
                int bad = 0;
                for (int64_t i3 = 0; i3 < ix->shape[3]; i3++)
                    bad |= row[i3 * ix->strides[3]] < 0 || row[i3 * ix->strides[3]] >= HW;
                for (int64_t i3 = 0; bad && i3 < ix->shape[3]; i3++) {
                    int64_t a = row[i3 * ix->strides[3]];
                    if (a < 0 || a >= HW)
                        return h->fail(h, TS_EINVAL, "%s: index %lld at (%lld, %lld, %lld, "
                                       "%lld) is outside the %lldx%lld plane", name,
                                       (long long)a, (long long)i0, (long long)i1,
                                       (long long)i2, (long long)i3, (long long)H,
                                       (long long)W);
                }
            }
    /* gx is zeroed before gy is read: an input sharing its memory is read from a copy. */
    ts_operand gyc, ixc;
    void *gybuf = NULL, *ixbuf = NULL;
    if ((s = unalias(hd, gy, gx, name, &gyc, &gybuf)))
        goto done;
    if (ix && (s = unalias(hd, ix, gx, name, &ixc, &ixbuf)))
        goto done;
    if (gx->dtype == TS_F32)
        pool_bwd_float(&gyc, ix ? &ixc : NULL, gx, p, hk_threads(hd));
    else
        pool_bwd_double(&gyc, ix ? &ixc : NULL, gx, p, hk_threads(hd));
done:
    h->scratch_free(h, ixbuf);
    h->scratch_free(h, gybuf);
    return s;
}

ts_status hk_pool2d(hk_dev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    if (call->op == TS_OP_MAXPOOL2D_BWD || call->op == TS_OP_AVGPOOL2D_BWD)
        return pool2d_bwd(hd, call);
    if (call->op != TS_OP_MAXPOOL2D && call->op != TS_OP_AVGPOOL2D)
        return TS_ENOTSUP;
    int is_max = call->op == TS_OP_MAXPOOL2D;
    ts_status s = hk_pool2d_check(h, 0, call);
    if (s)
        return s;
    const ts_pool2d_params *p = call->params;
    const ts_operand *x = &call->inputs[0], *y = &call->outputs[0];
    const ts_operand *ix = call->noutputs == 2 ? &call->outputs[1] : NULL;
    if (x->dtype == TS_F32)
        pool_float(x, y, ix, p, is_max, hk_threads(hd));
    else
        pool_double(x, y, ix, p, is_max, hk_threads(hd));
    return TS_OK;
}
