/* plugins/common/pool2d.c: TS_OP_MAXPOOL2D (optionally with the TS_I64 argmax of each window
 * within its H*W plane) and TS_OP_AVGPOOL2D on F32/F64, direct loops over any strides, one
 * OpenMP task per (n, c) plane. Padding counts as -inf for max; for avg it is a zero that
 * count_include_pad decides whether to count. Their gradients (MAXPOOL2D_BWD, AVGPOOL2D_BWD)
 * scatter gy back over each plane, again one task per plane, so overlapping windows add up
 * without atomics. */
#include "hostkern.h"

#include <math.h>

int ts_hostkern_pool2d_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_MAXPOOL2D || op == TS_OP_AVGPOOL2D || op == TS_OP_MAXPOOL2D_BWD ||
            op == TS_OP_AVGPOOL2D_BWD) && (dtype == TS_F32 || dtype == TS_F64);
}

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
                    for (int64_t q = 0; q < Q; q++) {                                       \
                        const T v[4] = {r0[2 * q], r0[2 * q + 1], r1[2 * q], r1[2 * q + 1]}; \
                        T best = (T)-INFINITY;                                              \
                        int k = 0;                                                          \
                        for (int j = 0; j < 4; j++)                                         \
                            if (v[j] > best || (isnan(v[j]) && !isnan(best)))               \
                                best = v[j], k = j;                                         \
                        yr[q * y->strides[3]] = best;                                       \
                        if (ir)                                                             \
                            ir[q * ix->strides[3]] = (2 * pp + k / 2) * W + 2 * q + k % 2;  \
                    }                                                                       \
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
        _Pragma("omp parallel for num_threads(threads) schedule(static) if(par)")           \
        for (int64_t nc = 0; nc < planes; nc++) {                                           \
            int64_t n = nc / C, c = nc % C;                                                 \
            T *xp = gxd + gx->offset + n * gx->strides[0] + c * gx->strides[1];             \
            const T *gp = gyd + gy->offset + n * gy->strides[0] + c * gy->strides[1];       \
            int64_t io = ix ? ix->offset + n * ix->strides[0] + c * ix->strides[1] : 0;     \
            for (int64_t hh = 0; hh < H; hh++)                                              \
                for (int64_t ww = 0; ww < W; ww++)                                          \
                    xp[hh * sh + ww * sw] = 0;                                              \
            for (int64_t pp = 0; pp < P; pp++)                                              \
                for (int64_t q = 0; q < Q; q++) {                                           \
                    T g = gp[pp * gy->strides[2] + q * gy->strides[3]];                     \
                    if (id) {                                                               \
                        int64_t a = id[io + pp * ix->strides[2] + q * ix->strides[3]];      \
                        xp[a / W * sh + a % W * sw] += g;                                   \
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
static ts_status unalias(ts_hostdev *hd, const ts_operand *in, const ts_operand *out,
                         const char *tag, ts_operand *copy, void **buf)
{
    *copy = *in;
    if (!ts_hostkern_overlaps(in, out))
        return TS_OK;
    int64_t acc = 1;
    for (int d = in->ndim - 1; d >= 0; d--) {
        copy->strides[d] = acc;
        acc *= in->shape[d];
    }
    ts_status s = hd->host->pool->alloc(hd->pool, (size_t)acc * ts_hostdev_dtype_size(in->dtype),
                                        tag, buf);
    if (s)
        return s;
    copy->data = *buf;
    copy->offset = 0;
    return ts_hostdev_copy_strided(copy, in);
}

/* gy (N, C, P, Q) [, idx (N, C, P, Q) TS_I64] -> gx (N, C, H, W). */
static ts_status pool2d_bwd(ts_hostdev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    int is_max = call->op == TS_OP_MAXPOOL2D_BWD;
    const char *name = is_max ? "maxpool2d_bwd" : "avgpool2d_bwd";
    ts_status s = ts_hostkern_pool2d_check(h, 0, call);
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
        pool_bwd_float(&gyc, ix ? &ixc : NULL, gx, p, hd->threads);
    else
        pool_bwd_double(&gyc, ix ? &ixc : NULL, gx, p, hd->threads);
done:
    h->pool->free(hd->pool, ixbuf);
    h->pool->free(hd->pool, gybuf);
    return s;
}

ts_status ts_hostkern_pool2d(ts_hostdev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    if (call->op == TS_OP_MAXPOOL2D_BWD || call->op == TS_OP_AVGPOOL2D_BWD)
        return pool2d_bwd(hd, call);
    if (call->op != TS_OP_MAXPOOL2D && call->op != TS_OP_AVGPOOL2D)
        return TS_ENOTSUP;
    int is_max = call->op == TS_OP_MAXPOOL2D;
    ts_status s = ts_hostkern_pool2d_check(h, 0, call);
    if (s)
        return s;
    const ts_pool2d_params *p = call->params;
    const ts_operand *x = &call->inputs[0], *y = &call->outputs[0];
    const ts_operand *ix = call->noutputs == 2 ? &call->outputs[1] : NULL;
    if (x->dtype == TS_F32)
        pool_float(x, y, ix, p, is_max, hd->threads);
    else
        pool_double(x, y, ix, p, is_max, hd->threads);
    return TS_OK;
}
