/* plugins/common/pool2d.c: TS_OP_MAXPOOL2D (optionally with the TS_I64 argmax of each window
 * within its H*W plane) and TS_OP_AVGPOOL2D on F32/F64, direct loops over any strides, one
 * OpenMP task per (n, c) plane. Padding counts as -inf for max; for avg it is a zero that
 * count_include_pad decides whether to count. */
#include "hostkern.h"

#include <math.h>

int ts_hostkern_pool2d_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_MAXPOOL2D || op == TS_OP_AVGPOOL2D) && (dtype == TS_F32 || dtype == TS_F64);
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
        _Pragma("omp parallel for num_threads(threads) schedule(static) if(par)")           \
        for (int64_t nc = 0; nc < planes; nc++) {                                           \
            int64_t n = nc / C, c = nc % C;                                                 \
            const T *xp = xd + x->offset + n * x->strides[0] + c * x->strides[1];           \
            int64_t yo = y->offset + n * y->strides[0] + c * y->strides[1];                 \
            int64_t io = ix ? ix->offset + n * ix->strides[0] + c * ix->strides[1] : 0;     \
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

ts_status ts_hostkern_pool2d(ts_hostdev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    if (call->op != TS_OP_MAXPOOL2D && call->op != TS_OP_AVGPOOL2D)
        return TS_ENOTSUP;
    int is_max = call->op == TS_OP_MAXPOOL2D;
    const char *name = is_max ? "maxpool2d" : "avgpool2d";
    if (call->ninputs != 1 || call->noutputs < 1 || call->noutputs > (is_max ? 2 : 1))
        return h->fail(h, TS_EINVAL, "%s: expects 1 input and %s output(s), got %d and %d", name,
                       is_max ? "1 or 2" : "1", (int)call->ninputs, (int)call->noutputs);
    if (!call->params || call->params_size < sizeof(ts_pool2d_params))
        return h->fail(h, TS_EINVAL, "%s: missing ts_pool2d_params", name);
    const ts_pool2d_params *p = call->params;
    const ts_operand *x = &call->inputs[0], *y = &call->outputs[0];
    const ts_operand *ix = call->noutputs == 2 ? &call->outputs[1] : NULL;
    if (x->dtype != y->dtype || (ix && ix->dtype != TS_I64))
        return h->fail(h, TS_EINVAL, "%s: x and y need the same dtype, indices TS_I64", name);
    if (x->ndim != 4 || y->ndim != 4 || (ix && ix->ndim != 4))
        return h->fail(h, TS_ESHAPE, "%s: operands must be 4-D (N, C, H, W)", name);
    if (p->kernel_h < 1 || p->kernel_w < 1 || p->stride_h < 1 || p->stride_w < 1 ||
        p->pad_h < 0 || p->pad_w < 0 || p->pad_h > p->kernel_h / 2 || p->pad_w > p->kernel_w / 2)
        return h->fail(h, TS_EINVAL, "%s: kernel (%d, %d) and stride (%d, %d) must be >= 1 and "
                       "padding (%d, %d) between 0 and half the kernel", name, (int)p->kernel_h,
                       (int)p->kernel_w, (int)p->stride_h, (int)p->stride_w, (int)p->pad_h,
                       (int)p->pad_w);
    int64_t H = x->shape[2], W = x->shape[3];
    int64_t hspan = H + 2 * (int64_t)p->pad_h - p->kernel_h;
    int64_t wspan = W + 2 * (int64_t)p->pad_w - p->kernel_w;
    if (hspan < 0 || wspan < 0)
        return h->fail(h, TS_EINVAL, "%s: kernel %dx%d is larger than the padded %lldx%lld input",
                       name, (int)p->kernel_h, (int)p->kernel_w, (long long)H, (long long)W);
    int64_t P = hspan / p->stride_h + 1, Q = wspan / p->stride_w + 1;
    int bad = y->shape[0] != x->shape[0] || y->shape[1] != x->shape[1] || y->shape[2] != P ||
              y->shape[3] != Q;
    for (int d = 0; ix && d < 4; d++)
        bad |= ix->shape[d] != y->shape[d];
    if (bad)
        return h->fail(h, TS_ESHAPE, "%s: y is (%lld, %lld, %lld, %lld), expected (%lld, %lld, "
                       "%lld, %lld)", name, (long long)y->shape[0], (long long)y->shape[1],
                       (long long)y->shape[2], (long long)y->shape[3], (long long)x->shape[0],
                       (long long)x->shape[1], (long long)P, (long long)Q);
    if (x->dtype == TS_F32)
        pool_float(x, y, ix, p, is_max, hd->threads);
    else
        pool_double(x, y, ix, p, is_max, hd->threads);
    return TS_OK;
}
