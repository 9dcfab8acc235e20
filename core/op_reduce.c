/* core/op_reduce.c: the reductions (sum, mean, max, min, argmax, argmin over any dims) and
 * softmax / log-softmax, each front end followed by its backward. */
#include <math.h>
#include <string.h>

#include "grad_fns.h"

/* ---- reductions ------------------------------------------------------------------------ */

static ts_status reduce(const char *name, int fn, const ts_tensor *x, int ndims, const int *dims,
                        int keepdim, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "%s: out is NULL", name);
    *out = NULL;
    if (!x)
        return ts__fail(TS_EINVAL, "%s: tensor is NULL", name);
    if (fn == TS_REDUCE_MEAN && !ts__dtype_is_float(x->dtype))
        return ts__fail(TS_EDTYPE, "%s: %s tensor; cast to float first", name,
                        ts_dtype_name(x->dtype));
    if (x->dtype == TS_U8)
        return ts__fail(TS_EDTYPE, "%s: uint8 tensor; cast to an integer or float first", name);
    int reduced[TS_MAX_DIMS] = {0};
    if (ndims < 0 || ndims > TS_MAX_DIMS || (ndims > 0 && !dims))
        return ts__fail(TS_EINVAL, "%s: bad dims list", name);
    for (int i = 0; i < ndims; i++) {
        int d = ts__dim(dims[i], x->ndim);
        if (d < 0 || x->ndim == 0)
            return ts__fail(TS_EINVAL, "%s: dim %d is out of range for a %d-d tensor", name,
                            dims[i], x->ndim);
        if (reduced[d])
            return ts__fail(TS_EINVAL, "%s: dim %d listed twice", name, dims[i]);
        reduced[d] = 1;
    }
    int64_t keep[TS_MAX_DIMS], squeezed[TS_MAX_DIMS];
    int nsq = 0;
    for (int d = 0; d < x->ndim; d++) {
        int r = ndims == 0 || reduced[d];
        keep[d] = r ? 1 : x->shape[d];
        if (!r)
            squeezed[nsq++] = x->shape[d];
    }
    int32_t odt = fn == TS_REDUCE_ARGMAX || fn == TS_REDUCE_ARGMIN ? TS_I64 : x->dtype;
    ts_tensor *o;
    ts_status s = ts__new(x->storage->dev, odt, x->ndim, keep, &o);
    if (s)
        return s;
    ts_operand in, op;
    ts__operand(x, &in);
    ts__operand(o, &op);
    ts_reduce_params p = {fn, ndims == 1 ? ts__dim(dims[0], x->ndim) : 0};
    if ((s = ts__run(o->storage->dev, TS_OP_REDUCE, &in, 1, &op, 1, &p, sizeof p))) {
        ts_tensor_unref(o);
        return s;
    }
    int64_t mask = 0;
    for (int d = 0; d < x->ndim; d++)
        if (ndims == 0 || reduced[d])
            mask |= (int64_t)1 << d;
    ts_tensor *r = o;
    if (!keepdim) { /* an internal view: the reduction's node goes on the final result */
        int64_t strides[TS_MAX_DIMS];
        ts__contiguous_strides(nsq, squeezed, strides);
        s = ts__view(o, nsq, squeezed, strides, 0, &r);
        ts_tensor_unref(o);
        if (s)
            return s;
    }
    TS__RECORD(ts__ag_reduce(fn, x, mask, r), r);
    *out = r;
    return TS_OK;
}

TS_API ts_status ts_sum(const ts_tensor *x, int ndims, const int *dims, int keepdim,
                        ts_tensor **out)
{
    TS__AUTOCAST(TS__AC_FLOAT32, 1, &x, ts_sum(ac_[0], ndims, dims, keepdim, out));
    return reduce("sum", TS_REDUCE_SUM, x, ndims, dims, keepdim, out);
}

TS_API ts_status ts_mean(const ts_tensor *x, int ndims, const int *dims, int keepdim,
                         ts_tensor **out)
{
    TS__AUTOCAST(TS__AC_FLOAT32, 1, &x, ts_mean(ac_[0], ndims, dims, keepdim, out));
    return reduce("mean", TS_REDUCE_MEAN, x, ndims, dims, keepdim, out);
}

TS_API ts_status ts_max(const ts_tensor *x, int ndims, const int *dims, int keepdim,
                        ts_tensor **out)
{
    return reduce("max", TS_REDUCE_MAX, x, ndims, dims, keepdim, out);
}

TS_API ts_status ts_min(const ts_tensor *x, int ndims, const int *dims, int keepdim,
                        ts_tensor **out)
{
    return reduce("min", TS_REDUCE_MIN, x, ndims, dims, keepdim, out);
}

TS_API ts_status ts_argmax(const ts_tensor *x, int dim, int keepdim, ts_tensor **out)
{
    return reduce("argmax", TS_REDUCE_ARGMAX, x, 1, &dim, keepdim, out);
}

TS_API ts_status ts_argmin(const ts_tensor *x, int dim, int keepdim, ts_tensor **out)
{
    return reduce("argmin", TS_REDUCE_ARGMIN, x, 1, &dim, keepdim, out);
}

/* ---- softmax --------------------------------------------------------------------------- */

static ts_status softmax_op(const char *name, int32_t op, const ts_tensor *x, int dim,
                            ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "%s: out is NULL", name);
    *out = NULL;
    if (!x)
        return ts__fail(TS_EINVAL, "%s: tensor is NULL", name);
    ts_status s = ts__need_float(name, x);
    if (s)
        return s;
    int d = ts__dim(dim, x->ndim);
    if (d < 0 || x->ndim == 0)
        return ts__fail(TS_EINVAL, "%s: dim %d is out of range for a %d-d tensor", name, dim,
                        x->ndim);
    ts_tensor *o;
    if ((s = ts__new(x->storage->dev, x->dtype, x->ndim, x->shape, &o)))
        return s;
    ts_operand in, op_;
    ts__operand(x, &in);
    ts__operand(o, &op_);
    ts_dim_params p = {d};
    if ((s = ts__run(o->storage->dev, op, &in, 1, &op_, 1, &p, sizeof p))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_softmax(op == TS_OP_LOG_SOFTMAX, x, d, o), o);
    *out = o;
    return TS_OK;
}

TS_API ts_status ts_softmax(const ts_tensor *x, int dim, ts_tensor **out)
{
    TS__AUTOCAST(TS__AC_FLOAT32, 1, &x, ts_softmax(ac_[0], dim, out));
    return softmax_op("softmax", TS_OP_SOFTMAX, x, dim, out);
}

TS_API ts_status ts_log_softmax(const ts_tensor *x, int dim, ts_tensor **out)
{
    TS__AUTOCAST(TS__AC_FLOAT32, 1, &x, ts_log_softmax(ac_[0], dim, out));
    return softmax_op("log_softmax", TS_OP_LOG_SOFTMAX, x, dim, out);
}

/* ---- reductions ------------------------------------------------------------------------ */

static ts_status reduce_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int fn = (int)n->p.i[0];
    int64_t reduced = n->p.i[1]; /* bit d: dim d was reduced */
    const int nd_in = n->in_ndim[0];
    int64_t keep[TS_MAX_DIMS];
    int dims[TS_MAX_DIMS], nd = 0;
    double count = 1;
    for (int d = 0; d < nd_in; d++) {
        int r = (reduced >> d) & 1;
        keep[d] = r ? 1 : n->in_shape[0][d];
        if (r) {
            dims[nd++] = d;
            count *= (double)n->in_shape[0][d];
        }
    }
    ts_scope *sc = ts_scope_begin();
    /* g has the result's shape: viewed with the reduced dims kept (size 1), broadcast back. */
    ts_tensor *ge = ts_s_expand(ts_s_reshape(g, nd_in, keep), nd_in, n->in_shape[0]), *r;
    if (fn == TS_REDUCE_SUM) {
        r = ts_s_contiguous(ge);
    } else if (fn == TS_REDUCE_MEAN) {
        r = ts_s_mul_scalar(ge, 1.0 / count);
    } else { /* max/min: to every element equal to the result, split among ties */
        ts_tensor *hit = ts__s_mask(TS_BINARY_EQ, n->saved[0], ts_s_reshape(n->saved[1], nd_in, keep));
        r = ts_s_mul(ts_s_div(ge, ts_s_sum(hit, nd, dims, 1)), hit);
    }
    return ts_scope_return(sc, r, &gin[0]);
}

ts_status ts__ag_reduce(int fn, const ts_tensor *x, int64_t reduced_mask, ts_tensor *out)
{
    static const char *const names[] = {"sum", "mean", "max", "min"};
    const ts_tensor *in[1] = {x};
    if (!ts__grad_needed(1, in) || fn > TS_REDUCE_MIN)
        return TS_OK;
    const ts_tensor *save[2] = {x, out};
    int64_t p[2] = {fn, reduced_mask};
    return ts__record(names[fn], reduce_backward, out, 1, in, fn >= TS_REDUCE_MAX ? 2 : 0, save,
                      p, sizeof p, NULL);
}

/* ---- softmax --------------------------------------------------------------------------- */

/* y * (g - sum(g * y)) in one kernel pass (TS_OP_SOFTMAX_BWD), where the device runs it. */
static ts_status softmax_backward_fused(const ts_tensor *y, const ts_tensor *g, int dim,
                                        ts_tensor **out)
{
    ts_tensor *o;
    ts_status s = ts__new(y->storage->dev, y->dtype, y->ndim, y->shape, &o);
    if (s)
        return s;
    ts_operand in[2], op;
    ts__operand(y, &in[0]);
    ts__operand(g, &in[1]);
    ts__operand(o, &op);
    ts_dim_params p = {dim};
    if ((s = ts__run(o->storage->dev, TS_OP_SOFTMAX_BWD, in, 2, &op, 1, &p, sizeof p))) {
        ts_tensor_unref(o);
        return s;
    }
    *out = o;
    return TS_OK;
}

static ts_status softmax_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int dim = (int)n->p.i[0], log_form = (int)n->p.i[1];
    ts_tensor *y = n->saved[0], *t1 = NULL, *t2 = NULL, *t3 = NULL;
    ts_status s;
    if (!log_form && g->dtype == y->dtype && g->storage->dev == y->storage->dev &&
        ts__device_runs(y->storage->dev, TS_OP_SOFTMAX_BWD, y->dtype))
        return softmax_backward_fused(y, g, dim, &gin[0]);
    if (log_form) { /* g - exp(y) * sum(g) */
        TRY(ts_sum(g, 1, &dim, 1, &t1));
        TRY(ts_exp(y, &t2));
        TRY(ts_mul(t2, t1, &t3));
        s = ts_sub(g, t3, &gin[0]);
    } else { /* y * (g - sum(g * y)) */
        TRY(ts_mul(g, y, &t1));
        TRY(ts_sum(t1, 1, &dim, 1, &t2));
        TRY(ts_sub(g, t2, &t3));
        s = ts_mul(y, t3, &gin[0]);
    }
out:
    ts_tensor_unref(t1), ts_tensor_unref(t2), ts_tensor_unref(t3);
    return s;
}

ts_status ts__ag_softmax(int log_form, const ts_tensor *x, int dim, ts_tensor *out)
{
    const ts_tensor *in[1] = {x};
    if (!ts__grad_needed(1, in))
        return TS_OK;
    const ts_tensor *save[1] = {out};
    int64_t p[2] = {dim, log_form};
    return ts__record(log_form ? "log_softmax" : "softmax", softmax_backward, out, 1, in, 1,
                      save, p, sizeof p, NULL);
}
