/* core/op_norm.c: layer norm (one kernel where the device runs it, composed otherwise),
 * RMS norm (composed), and layer norm's backward. */
#include <math.h>
#include <string.h>

#include "grad_fns.h"

/* ---- layer norm ------------------------------------------------------------------------ */

/* A norm's weight or bias t: x's dtype and device, the shape of x's last ndim dims. */
static ts_status check_affine(const char *op, const char *what, const ts_tensor *x,
                              const ts_tensor *t, int ndim)
{
    char b1[160], b2[160];
    int same = t->ndim == ndim && t->dtype == x->dtype;
    for (int d = 0; same && d < ndim; d++)
        same = t->shape[d] == x->shape[x->ndim - ndim + d];
    ts_status s = ts__check_pair(op, x, t, 1);
    if (s || same)
        return s;
    return ts__fail(TS_ESHAPE, "%s: %s %s (%s) must be %s, x's last %d dims (%s)", op, what,
                    ts__shape_str(t->ndim, t->shape, b1, sizeof b1), ts_dtype_name(t->dtype),
                    ts__shape_str(ndim, x->shape + x->ndim - ndim, b2, sizeof b2), ndim,
                    ts_dtype_name(x->dtype));
}

/* The checks every norm makes of x, ndim and eps. */
static ts_status check_norm(const char *op, const ts_tensor *x, int ndim, double eps,
                            ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "%s: out is NULL", op);
    *out = NULL;
    if (!x)
        return ts__fail(TS_EINVAL, "%s: tensor is NULL", op);
    ts_status s = ts__need_float(op, x);
    if (s)
        return s;
    if (ndim < 1 || ndim > x->ndim || !(eps > 0) || !isfinite(eps))
        return ts__fail(TS_EINVAL, "%s: ndim %d must be in [1, %d] (x's dims) and eps %g finite "
                        "and > 0", op, ndim, (int)x->ndim, eps);
    return TS_OK;
}

/* The same arithmetic from plain ops, for a device that does not run the fused kernels. */
static ts_status layer_norm_composed(const ts_tensor *x, const ts_tensor *w, const ts_tensor *b,
                                     int ndim, double eps, ts_tensor **out)
{
    int dims[TS_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        dims[i] = x->ndim - ndim + i;
    ts_tensor *mu = NULL, *d = NULL, *sq = NULL, *var = NULL, *rs = NULL, *y = NULL, *t = NULL;
    ts_status s;
    if ((s = ts_mean(x, ndim, dims, 1, &mu)) || (s = ts_sub(x, mu, &d)) ||
        (s = ts_mul(d, d, &sq)) || (s = ts_mean(sq, ndim, dims, 1, &var)) ||
        (s = ts_add_scalar(var, eps, &t)) || (s = ts_rsqrt(t, &rs)) || (s = ts_mul(d, rs, &y)))
        goto out;
    if (w) {
        ts_tensor *yw = NULL;
        if ((s = ts_mul(y, w, &yw)) == TS_OK)
            s = ts_add(yw, b, out);
        ts_tensor_unref(yw);
    } else {
        *out = y;
        y = NULL;
    }
out:
    ts_tensor_unref(mu), ts_tensor_unref(d), ts_tensor_unref(sq), ts_tensor_unref(var);
    ts_tensor_unref(rs), ts_tensor_unref(y), ts_tensor_unref(t);
    return s;
}

TS_API ts_status ts_layer_norm(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                               int ndim, double eps, ts_tensor **out)
{
    TS__AUTOCAST(TS__AC_FLOAT32, 3, ((const ts_tensor *const[]){x, weight, bias}),
                 ts_layer_norm(ac_[0], ac_[1], ac_[2], ndim, eps, out));
    ts_status s = check_norm("layer_norm", x, ndim, eps, out);
    if (s)
        return s;
    if (!weight != !bias)
        return ts__fail(TS_EINVAL, "layer_norm: give weight and bias, or neither");
    if ((weight && (s = check_affine("layer_norm", "weight", x, weight, ndim))) ||
        (bias && (s = check_affine("layer_norm", "bias", x, bias, ndim))))
        return s;
    ts_device *dev = x->storage->dev;
    if (!ts__device_runs(dev, TS_OP_LAYER_NORM, x->dtype) ||
        !ts__device_runs(dev, TS_OP_LAYER_NORM_BWD, x->dtype))
        return layer_norm_composed(x, weight, bias, ndim, eps, out);
    ts_tensor *xc = NULL, *wc = NULL, *bc = NULL, *y = NULL, *mean = NULL, *rstd = NULL;
    ts_layer_norm_params p = {eps, ndim};
    if ((s = ts_tensor_contiguous((ts_tensor *)x, &xc)) ||
        (weight && ((s = ts_tensor_contiguous((ts_tensor *)weight, &wc)) ||
                    (s = ts_tensor_contiguous((ts_tensor *)bias, &bc)))) ||
        (s = ts__new(dev, x->dtype, x->ndim, x->shape, &y)) ||
        (s = ts__new(dev, x->dtype, x->ndim - ndim, x->shape, &mean)) ||
        (s = ts__new(dev, x->dtype, x->ndim - ndim, x->shape, &rstd)))
        goto out;
    ts_operand in[3], o[3];
    ts__operand(xc, &in[0]);
    if (weight) {
        ts__operand(wc, &in[1]);
        ts__operand(bc, &in[2]);
    }
    ts__operand(y, &o[0]);
    ts__operand(mean, &o[1]);
    ts__operand(rstd, &o[2]);
    if ((s = ts__run(dev, TS_OP_LAYER_NORM, in, weight ? 3 : 1, o, 3, &p, sizeof p)))
        goto out;
    if ((s = ts__ag_layer_norm(x, weight, bias, xc, mean, rstd, &p, y)))
        goto out;
    *out = y;
    y = NULL;
out:
    ts_tensor_unref(xc), ts_tensor_unref(wc), ts_tensor_unref(bc), ts_tensor_unref(y);
    ts_tensor_unref(mean), ts_tensor_unref(rstd);
    return s;
}

/* ---- RMS norm --------------------------------------------------------------------------- */

TS_API ts_status ts_rms_norm(const ts_tensor *x, const ts_tensor *weight, int ndim, double eps,
                             ts_tensor **out)
{
    TS__AUTOCAST(TS__AC_FLOAT32, 2, ((const ts_tensor *const[]){x, weight}),
                 ts_rms_norm(ac_[0], ac_[1], ndim, eps, out));
    ts_status s = check_norm("rms_norm", x, ndim, eps, out);
    if (s || (weight && (s = check_affine("rms_norm", "weight", x, weight, ndim))))
        return s;
    int dims[TS_MAX_DIMS];
    for (int i = 0; i < ndim; i++)
        dims[i] = x->ndim - ndim + i;
    /* x / sqrt(mean(x^2) + eps) * weight, from plain ops: every device runs it, and its
     * gradient is theirs */
    ts_scope *sc = ts_scope_begin();
    ts_tensor *ms = ts_s_mean(ts_s_mul(x, x), ndim, dims, 1);
    ts_tensor *y = ts_s_mul(x, ts_s_rsqrt(ts_s_add_scalar(ms, eps)));
    return ts_scope_return(sc, weight ? ts_s_mul(y, weight) : y, out);
}

/* ---- layer norm ------------------------------------------------------------------------ */

static ts_status layer_norm_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    const ts_layer_norm_params *p = (const ts_layer_norm_params *)&n->p;
    int affine = n->nin == 3;
    ts_tensor *gc = NULL, *o[3] = {NULL, NULL, NULL};
    ts_status s = TS_OK;
    TRY(ts_tensor_contiguous(g, &gc));
    for (int i = 0; i < (affine ? 3 : 1); i++)
        TRY(ts_tensor_empty(n->in_device[i], n->in_dtype[i], n->in_ndim[i], n->in_shape[i],
                            &o[i]));
    ts_operand in[5], out_[3];
    ts__operand(gc, &in[0]);
    for (int i = 0; i < (affine ? 4 : 3); i++)
        ts__operand(n->saved[i], &in[1 + i]);
    for (int i = 0; i < (affine ? 3 : 1); i++)
        ts__operand(o[i], &out_[i]);
    TRY(ts__run(n->in_device[0], TS_OP_LAYER_NORM_BWD, in, affine ? 5 : 4, out_, affine ? 3 : 1,
                p, sizeof *p));
    for (int i = 0; i < (affine ? 3 : 1); i++)
        if (n->needs[i]) {
            gin[i] = o[i];
            o[i] = NULL;
        }
out:
    ts_tensor_unref(gc);
    for (int i = 0; i < 3; i++)
        ts_tensor_unref(o[i]);
    return s;
}

ts_status ts__ag_layer_norm(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                            const ts_tensor *xc, const ts_tensor *mean, const ts_tensor *rstd,
                            const ts_layer_norm_params *p, ts_tensor *out)
{
    const ts_tensor *in[3] = {x, weight, bias};
    int nin = weight ? 3 : 1;
    if (!ts__grad_needed(nin, in))
        return TS_OK;
    const ts_tensor *save[4] = {xc, mean, rstd, weight};
    return ts__record("layer_norm", layer_norm_backward, out, nin, in, weight ? 4 : 3, save, p,
                      sizeof *p, NULL);
}
