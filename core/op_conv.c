/* core/op_conv.c: conv2d (bias, stride, padding, dilation, groups) and max / average
 * pooling, then their backward (the kernels' backward-data and backward-weight passes). */
#include <math.h>
#include <string.h>

#include "grad_fns.h"

/* ---- convolution and pooling ----------------------------------------------------------- */

static int64_t out_size(int64_t in, int pad, int dil, int k, int stride)
{
    int64_t span = (int64_t)dil * (k - 1) + 1;
    int64_t num = in + 2 * (int64_t)pad - span;
    return num < 0 ? 0 : num / stride + 1;
}

TS_API ts_status ts_conv2d(const ts_tensor *x, const ts_tensor *w, const ts_tensor *bias,
                           const ts_conv2d_params *p, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "conv2d: out is NULL");
    *out = NULL;
    if (!x || !w || !p)
        return ts__fail(TS_EINVAL, "conv2d: NULL argument");
    TS__AUTOCAST(TS__AC_LOW, 3, ((const ts_tensor *const[]){x, w, bias}),
                 ts_conv2d(ac_[0], ac_[1], ac_[2], p, out));
    char b1[160], b2[160];
    ts_status s = ts__check_pair("conv2d", x, w, 1);
    if (s || (s = ts__need_float("conv2d", x)))
        return s;
    if (x->ndim != 4 || w->ndim != 4)
        return ts__fail(TS_ESHAPE, "conv2d: x %s must be (N, C, H, W) and w %s (K, C/groups, R, S)",
                        ts__shape_str(x->ndim, x->shape, b1, sizeof b1),
                        ts__shape_str(w->ndim, w->shape, b2, sizeof b2));
    if (p->stride_h < 1 || p->stride_w < 1 || p->dilation_h < 1 || p->dilation_w < 1 ||
        p->pad_h < 0 || p->pad_w < 0 || p->groups < 1)
        return ts__fail(TS_EINVAL, "conv2d: stride and dilation must be >= 1, padding >= 0, "
                        "groups >= 1");
    int64_t N = x->shape[0], C = x->shape[1], K = w->shape[0];
    if (C != w->shape[1] * p->groups || K % p->groups)
        return ts__fail(TS_ESHAPE, "conv2d: x %s and w %s do not fit groups = %d (need C = "
                        "w.shape[1] * groups and K divisible by groups)",
                        ts__shape_str(x->ndim, x->shape, b1, sizeof b1),
                        ts__shape_str(w->ndim, w->shape, b2, sizeof b2), p->groups);
    if (bias) {
        if ((s = ts__check_pair("conv2d", x, bias, 1)))
            return s;
        if (bias->ndim != 1 || bias->shape[0] != K)
            return ts__fail(TS_ESHAPE, "conv2d: bias %s must be (%lld)",
                            ts__shape_str(bias->ndim, bias->shape, b1, sizeof b1), (long long)K);
    }
    int64_t P = out_size(x->shape[2], p->pad_h, p->dilation_h, (int)w->shape[2], p->stride_h);
    int64_t Q = out_size(x->shape[3], p->pad_w, p->dilation_w, (int)w->shape[3], p->stride_w);
    if (P < 1 || Q < 1)
        return ts__fail(TS_ESHAPE, "conv2d: the %lldx%lld kernel does not fit the input %s with "
                        "this padding and dilation",
                        (long long)w->shape[2], (long long)w->shape[3],
                        ts__shape_str(x->ndim, x->shape, b1, sizeof b1));
    int64_t shape[4] = {N, K, P, Q};
    ts_tensor *o;
    if ((s = ts__new(x->storage->dev, x->dtype, 4, shape, &o)))
        return s;
    ts_operand in[3], op;
    ts__operand(x, &in[0]);
    ts__operand(w, &in[1]);
    if (bias)
        ts__operand(bias, &in[2]);
    ts__operand(o, &op);
    if ((s = ts__run(o->storage->dev, TS_OP_CONV2D, in, bias ? 3 : 2, &op, 1, p, sizeof *p))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_conv2d(x, w, bias, p, o), o);
    *out = o;
    return TS_OK;
}

static ts_status pool_op(const char *name, int32_t kop, const ts_tensor *x,
                         const ts_pool2d_params *p, ts_tensor **out, ts_tensor **indices)
{
    if (!out)
        return ts__fail(TS_EINVAL, "%s: out is NULL", name);
    *out = NULL;
    if (indices)
        *indices = NULL;
    if (!x || !p)
        return ts__fail(TS_EINVAL, "%s: NULL argument", name);
    char b1[160];
    ts_status s = ts__need_float(name, x);
    if (s)
        return s;
    if (x->ndim != 4)
        return ts__fail(TS_ESHAPE, "%s: x %s must be (N, C, H, W)", name,
                        ts__shape_str(x->ndim, x->shape, b1, sizeof b1));
    if (p->kernel_h < 1 || p->kernel_w < 1 || p->stride_h < 1 || p->stride_w < 1 ||
        p->pad_h < 0 || p->pad_w < 0 || 2 * p->pad_h > p->kernel_h || 2 * p->pad_w > p->kernel_w)
        return ts__fail(TS_EINVAL, "%s: kernel and stride must be >= 1 and padding at most half "
                        "the kernel", name);
    int64_t P = out_size(x->shape[2], p->pad_h, 1, p->kernel_h, p->stride_h);
    int64_t Q = out_size(x->shape[3], p->pad_w, 1, p->kernel_w, p->stride_w);
    if (P < 1 || Q < 1)
        return ts__fail(TS_ESHAPE, "%s: the %dx%d window does not fit the input %s", name,
                        p->kernel_h, p->kernel_w, ts__shape_str(x->ndim, x->shape, b1, sizeof b1));
    int64_t shape[4] = {x->shape[0], x->shape[1], P, Q};
    ts_tensor *o, *idx = NULL;
    /* Backward of max pooling needs the indices even when the caller does not. */
    int want_idx = kop == TS_OP_MAXPOOL2D && (indices || ts__grad_needed(1, &x));
    if ((s = ts__new(x->storage->dev, x->dtype, 4, shape, &o)))
        return s;
    if (want_idx && (s = ts__new(x->storage->dev, TS_I64, 4, shape, &idx))) {
        ts_tensor_unref(o);
        return s;
    }
    ts_operand in, ops[2];
    ts__operand(x, &in);
    ts__operand(o, &ops[0]);
    if (idx)
        ts__operand(idx, &ops[1]);
    if ((s = ts__run(o->storage->dev, kop, &in, 1, ops, idx ? 2 : 1, p, sizeof *p))) {
        ts_tensor_unref(o);
        ts_tensor_unref(idx);
        return s;
    }
    if ((s = ts__ag_pool2d(x, p, idx, o))) {
        ts_tensor_unref(o);
        ts_tensor_unref(idx);
        return s;
    }
    *out = o;
    if (indices)
        *indices = idx;
    else
        ts_tensor_unref(idx);
    return TS_OK;
}

TS_API ts_status ts_max_pool2d(const ts_tensor *x, const ts_pool2d_params *p, ts_tensor **out,
                               ts_tensor **indices)
{
    return pool_op("max_pool2d", TS_OP_MAXPOOL2D, x, p, out, indices);
}

TS_API ts_status ts_avg_pool2d(const ts_tensor *x, const ts_pool2d_params *p, ts_tensor **out)
{
    return pool_op("avg_pool2d", TS_OP_AVGPOOL2D, x, p, out, NULL);
}

/* ---- conv and pooling ------------------------------------------------------------------ */

/* Runs a backward kernel into a new tensor of input i's shape. */
static ts_status run_into_input(const ts_node *n, int i, int32_t op, const ts_tensor *a,
                                const ts_tensor *b, const void *p, size_t psize,
                                ts_tensor **out)
{
    ts_tensor *o;
    ts_status s = ts_tensor_empty(n->in_device[i], n->in_dtype[i], n->in_ndim[i], n->in_shape[i],
                                  &o);
    if (s)
        return s;
    ts_operand in[2], op_;
    ts__operand(a, &in[0]);
    if (b)
        ts__operand(b, &in[1]);
    ts__operand(o, &op_);
    if ((s = ts__run(n->in_device[i], op, in, b ? 2 : 1, &op_, 1, p, psize))) {
        ts_tensor_unref(o);
        return s;
    }
    *out = o;
    return TS_OK;
}

static ts_status conv2d_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    ts_status s = TS_OK;
    ts_tensor *gc = NULL;
    TRY(ts_tensor_contiguous(g, &gc));
    if (n->needs[0])
        TRY(run_into_input(n, 0, TS_OP_CONV2D_BWD_DATA, gc, n->saved[1], &n->p.conv,
                           sizeof n->p.conv, &gin[0]));
    if (n->needs[1])
        TRY(run_into_input(n, 1, TS_OP_CONV2D_BWD_WEIGHT, gc, n->saved[0], &n->p.conv,
                           sizeof n->p.conv, &gin[1]));
    if (n->nin > 2 && n->needs[2])
        TRY(ts_sum(gc, 3, (const int[]){0, 2, 3}, 0, &gin[2]));
out:
    ts_tensor_unref(gc);
    return s;
}

ts_status ts__ag_conv2d(const ts_tensor *x, const ts_tensor *w, const ts_tensor *bias,
                        const ts_conv2d_params *p, ts_tensor *out)
{
    const ts_tensor *in[3] = {x, w, bias};
    int nin = bias ? 3 : 2;
    if (!ts__grad_needed(nin, in))
        return TS_OK;
    return ts__record("conv2d", conv2d_backward, out, nin, in, 2, in, p, sizeof *p, NULL);
}

static ts_status pool_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    ts_tensor *gc;
    ts_status s = ts_tensor_contiguous(g, &gc);
    if (s)
        return s;
    if (n->nsaved > 0) /* max: the indices from the forward */
        s = run_into_input(n, 0, TS_OP_MAXPOOL2D_BWD, gc, n->saved[0], &n->p.pool,
                           sizeof n->p.pool, &gin[0]);
    else
        s = run_into_input(n, 0, TS_OP_AVGPOOL2D_BWD, gc, NULL, &n->p.pool, sizeof n->p.pool,
                           &gin[0]);
    ts_tensor_unref(gc);
    return s;
}

ts_status ts__ag_pool2d(const ts_tensor *x, const ts_pool2d_params *p, const ts_tensor *indices,
                        ts_tensor *out)
{
    const ts_tensor *in[1] = {x};
    if (!ts__grad_needed(1, in))
        return TS_OK;
    const ts_tensor *save[1] = {indices};
    return ts__record(indices ? "max_pool2d" : "avg_pool2d", pool_backward, out, 1, in,
                      indices ? 1 : 0, save, p, sizeof *p, NULL);
}
