/* core/losses.c: the losses: cross-entropy (one kernel and its backward, at the end) and
 * those built from recorded ops (so their gradients are autograd's), and the conveniences a
 * user reaches for first: a scalar's value and a PyTorch-like printout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grad_fns.h"

/* The per-element loss reduced per reduction, in the current scope. */
static ts_tensor *s_reduce(ts_tensor *per, int reduction)
{
    return reduction == TS_REDUCTION_NONE   ? per
           : reduction == TS_REDUCTION_MEAN ? ts_s_mean(per, 0, NULL, 0)
                                            : ts_s_sum(per, 0, NULL, 0);
}

/* Ends a loss's scope with r in *out; a failure is named by the loss. */
static ts_status loss_return(const char *what, ts_scope *sc, ts_tensor *r, ts_tensor **out)
{
    ts_status s = ts_scope_return(sc, r, out);
    return s ? ts__fail_prefix(s, "%s: ", what) : TS_OK;
}

/* Both float, the same dtype, device and shape. */
static ts_status same_float_pair(const char *what, const ts_tensor *a, const ts_tensor *b,
                                 int reduction)
{
    char s1[160], s2[160];
    if (!a || !b)
        return ts__fail(TS_EINVAL, "%s: tensor is NULL", what);
    if (reduction < TS_REDUCTION_MEAN || reduction > TS_REDUCTION_NONE)
        return ts__fail(TS_EINVAL, "%s: unknown reduction %d", what, reduction);
    if ((a->dtype != TS_F32 && a->dtype != TS_F64) || a->dtype != b->dtype)
        return ts__fail(TS_EDTYPE, "%s: input %s and target %s: both must be float32 or both "
                        "float64", what, ts_dtype_name(a->dtype), ts_dtype_name(b->dtype));
    if (a->storage->dev != b->storage->dev)
        return ts__fail(TS_EINVAL, "%s: input and target are on different devices", what);
    if (a->ndim != b->ndim ||
        memcmp(a->shape, b->shape, sizeof a->shape[0] * (size_t)a->ndim) != 0)
        return ts__fail(TS_ESHAPE, "%s: input %s and target %s must have the same shape", what,
                        ts__shape_str(a->ndim, a->shape, s1, sizeof s1),
                        ts__shape_str(b->ndim, b->shape, s2, sizeof s2));
    return TS_OK;
}

TS_API ts_status ts_mse_loss(const ts_tensor *input, const ts_tensor *target, int reduction,
                             ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "mse_loss: out is NULL");
    *out = NULL;
    TS__AUTOCAST(TS__AC_FLOAT32, 2, ((const ts_tensor *const[]){input, target}),
                 ts_mse_loss(ac_[0], ac_[1], reduction, out));
    ts_status s = same_float_pair("mse_loss", input, target, reduction);
    if (s)
        return s;
    ts_scope *sc = ts_scope_begin();
    ts_tensor *d = ts_s_sub(input, target); /* (input - target)^2 */
    return loss_return("mse_loss", sc, s_reduce(ts_s_mul(d, d), reduction), out);
}

TS_API ts_status ts_bce_with_logits(const ts_tensor *logits, const ts_tensor *target,
                                    int reduction, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "bce_with_logits: out is NULL");
    *out = NULL;
    ts_status s = same_float_pair("bce_with_logits", logits, target, reduction);
    if (s)
        return s;
    /* softplus(x) - x y, softplus(x) = max(x, 0) + log(1 + exp(-|x|)); one statement per use
     * of x, so its gradients accumulate in a fixed order; out of place throughout (exp's
     * backward reads its output) */
    ts_scope *sc = ts_scope_begin();
    ts_tensor *pos = ts_s_binary_scalar(TS_BINARY_MAXIMUM, logits, 0.0, 0);
    ts_tensor *l = ts_s_log(ts_s_add_scalar(ts_s_exp(ts_s_neg(ts_s_abs(logits))), 1.0));
    ts_tensor *sp = ts_s_add(pos, l);
    ts_tensor *per = ts_s_sub(sp, ts_s_mul(logits, target));
    return loss_return("bce_with_logits", sc, s_reduce(per, reduction), out);
}

TS_API ts_status ts_nll_loss(const ts_tensor *logp, const ts_tensor *targets, int reduction,
                             ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "nll_loss: out is NULL");
    *out = NULL;
    char b1[160], b2[160];
    if (!logp || !targets)
        return ts__fail(TS_EINVAL, "nll_loss: tensor is NULL");
    if (reduction < TS_REDUCTION_MEAN || reduction > TS_REDUCTION_NONE)
        return ts__fail(TS_EINVAL, "nll_loss: unknown reduction %d", reduction);
    if (logp->dtype != TS_F32 && logp->dtype != TS_F64)
        return ts__fail(TS_EDTYPE, "nll_loss: log-probabilities are %s; they must be float",
                        ts_dtype_name(logp->dtype));
    if (targets->dtype != TS_I64 && targets->dtype != TS_I32)
        return ts__fail(TS_EDTYPE, "nll_loss: targets are %s; they must be int64 or int32 "
                        "class indices", ts_dtype_name(targets->dtype));
    if (logp->ndim != 2 || targets->ndim != 1 || targets->shape[0] != logp->shape[0])
        return ts__fail(TS_ESHAPE, "nll_loss: log-probabilities %s must be (N, C) and targets "
                        "%s (N)", ts__shape_str(logp->ndim, logp->shape, b1, sizeof b1),
                        ts__shape_str(targets->ndim, targets->shape, b2, sizeof b2));
    const int64_t n = logp->shape[0], c = logp->shape[1];
    /* every target a class: checked on the host (N indices) before anything is computed */
    int64_t *tv = malloc(sizeof *tv * (size_t)(n ? n : 1));
    if (!tv)
        return ts__fail(TS_ENOMEM, "nll_loss: out of host memory");
    ts_scope *sc = ts_scope_begin();
    ts_tensor *t64 = ts_s_cast(targets, TS_I64), *t;
    if (t64)
        ts_scope_adopt(ts_tensor_to_host(t64, tv, sizeof *tv * (size_t)n), NULL);
    for (int64_t i = 0; ts_scope_status(sc) == TS_OK && i < n; i++)
        if (tv[i] < 0 || tv[i] >= c)
            ts_scope_adopt(ts__fail(TS_EINVAL, "target %lld of row %lld is not a class in [0, "
                                    "%lld)", (long long)tv[i], (long long)i, (long long)c),
                           NULL);
    free(tv);
    /* -logp[i, t_i]: the row sums of logp masked by one-hot rows */
    ts_tensor *cls = TS_SCOPED(ts_tensor_arange(logp->storage->dev, TS_I64, 0, (double)c, 1, &t),
                               t);
    ts_tensor *hit = TS_SCOPED(ts_eq(ts_s_unsqueeze(t64, 1), cls, &t), t);
    ts_tensor *row = ts_s_sum(ts_s_mul(logp, ts_s_cast(hit, logp->dtype)), 1, (const int[]){1}, 0);
    return loss_return("nll_loss", sc, s_reduce(ts_s_neg(row), reduction), out);
}

TS_API ts_status ts_tensor_item(const ts_tensor *t, double *value)
{
    if (!t || !value)
        return ts__fail(TS_EINVAL, "ts_tensor_item: NULL argument");
    char b[160];
    if (ts_tensor_numel(t) != 1)
        return ts__fail(TS_ESHAPE, "ts_tensor_item: the tensor %s has %lld elements, not one",
                        ts__shape_str(t->ndim, t->shape, b, sizeof b),
                        (long long)ts_tensor_numel(t));
    ts_tensor *d = NULL;
    ts_status s = ts_cast(t, TS_F64, &d);
    if (s == TS_OK)
        s = ts_tensor_to_host(d, value, sizeof *value);
    ts_tensor_unref(d);
    return s;
}

TS_API ts_status ts_accuracy(const ts_tensor *logits, const ts_tensor *labels, double *acc)
{
    if (!logits || !labels || !acc)
        return ts__fail(TS_EINVAL, "ts_accuracy: NULL argument");
    char b1[160], b2[160];
    if (logits->ndim != 2 || labels->ndim != 1 || labels->shape[0] != logits->shape[0])
        return ts__fail(TS_ESHAPE, "ts_accuracy: logits %s must be (N, C) and labels %s (N)",
                        ts__shape_str(logits->ndim, logits->shape, b1, sizeof b1),
                        ts__shape_str(labels->ndim, labels->shape, b2, sizeof b2));
    ts_tensor *pred = NULL, *hit = NULL, *f = NULL, *m = NULL;
    ts_status s = TS_OK;
    ts_no_grad_enter();
    if (!(s = ts_argmax(logits, 1, 0, &pred)) && !(s = ts_eq(pred, labels, &hit)) &&
        !(s = ts_cast(hit, TS_F64, &f)) && !(s = ts_mean(f, 0, NULL, 0, &m)))
        s = ts_tensor_item(m, acc);
    ts_no_grad_exit();
    ts_tensor_unref(pred), ts_tensor_unref(hit), ts_tensor_unref(f), ts_tensor_unref(m);
    return s;
}

/* ---- printing ---------------------------------------------------------------------------- */

#define EDGE 3           /* elements shown at each end of an elided dimension */
#define ELIDE_ABOVE 1000 /* tensors with more elements than this are elided */

typedef struct printer {
    FILE *f;
    const double *v;
    const int64_t *shape;
    int ndim, is_float, elide, width, prec, sci;
} printer;

static void put_value(const printer *p, double x)
{
    if (!p->is_float)
        fprintf(p->f, "%*lld", p->width, (long long)x);
    else if (isnan(x) || isinf(x))
        fprintf(p->f, "%*s", p->width, isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
    else if (p->sci)
        fprintf(p->f, "%*.*e", p->width, p->prec, x);
    else
        fprintf(p->f, "%*.*f", p->width, p->prec, x);
}

/* The sub-tensor at dimension d starting at flat offset off (row-major); indent: columns. */
static void put_dim(const printer *p, int d, int64_t off, int indent)
{
    int64_t n = p->shape[d], inner = 1;
    for (int k = d + 1; k < p->ndim; k++)
        inner *= p->shape[k];
    fputc('[', p->f);
    for (int64_t i = 0; i < n; i++) {
        if (p->elide && n > 2 * EDGE && i == EDGE) {
            if (d == p->ndim - 1)
                fputs("..., ", p->f);
            else
                fprintf(p->f, "...,%s%*s", d < p->ndim - 2 ? "\n\n" : "\n", indent + 1, "");
            i = n - EDGE - 1;
            continue;
        }
        if (d == p->ndim - 1)
            put_value(p, p->v[off + i]);
        else
            put_dim(p, d + 1, off + i * inner, indent + 1);
        if (i + 1 < n) {
            fputc(',', p->f);
            if (d == p->ndim - 1)
                fputc(' ', p->f);
            else
                fprintf(p->f, "%s%*s", d < p->ndim - 2 ? "\n\n" : "\n", indent + 1, "");
        }
    }
    fputc(']', p->f);
}

TS_API ts_status ts_tensor_print(const ts_tensor *t, FILE *f)
{
    if (!t || !f)
        return ts__fail(TS_EINVAL, "ts_tensor_print: NULL argument");
    int64_t n = ts_tensor_numel(t);
    double *v = malloc(sizeof *v * (size_t)(n ? n : 1));
    ts_tensor *d = NULL;
    ts_status s = v ? ts_cast(t, TS_F64, &d) : ts__fail(TS_ENOMEM, "ts_tensor_print: out of "
                                                         "host memory for %lld values",
                                                         (long long)n);
    if (s == TS_OK)
        s = ts_tensor_to_host(d, v, sizeof *v * (size_t)n);
    ts_tensor_unref(d);
    if (s) {
        free(v);
        return s;
    }
    printer p = {.f = f, .v = v, .shape = t->shape, .ndim = t->ndim,
                 .is_float = ts_plugin_dtype_is_float(t->dtype) ||
                             ts_plugin_dtype_is_half(t->dtype),
                 .elide = n > ELIDE_ABOVE, .prec = 4};
    /* one width for every value, from the largest magnitude, as PyTorch does */
    double big = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(v[i]) && fabs(v[i]) > big)
            big = fabs(v[i]);
    if (p.is_float && (big >= 1e8 || (big > 0 && big < 1e-4)))
        p.sci = 1;
    char buf[64];
    int w = 1;
    for (int64_t i = 0; i < n; i++) {
        int len = !isfinite(v[i]) ? 4
                  : p.is_float ? p.sci ? snprintf(buf, sizeof buf, "%.4e", v[i])
                                       : snprintf(buf, sizeof buf, "%.4f", v[i])
                               : snprintf(buf, sizeof buf, "%lld", (long long)v[i]);
        w = len > w ? len : w;
    }
    p.width = w;
    fputs("tensor(", f);
    if (t->ndim == 0) {
        put_value(&p, v[0]);
    } else {
        put_dim(&p, 0, 0, 7);
    }
    char sh[160];
    fprintf(f, ", dtype=%s, device=%s", ts_dtype_name(t->dtype), ts_device_name(t->storage->dev));
    if (p.elide)
        fprintf(f, ", shape=%s", ts__shape_str(t->ndim, t->shape, sh, sizeof sh));
    fputs(")\n", f);
    free(v);
    return TS_OK;
}

/* ---- cross-entropy --------------------------------------------------------------------- */

TS_API ts_status ts_cross_entropy(const ts_tensor *logits, const ts_tensor *targets,
                                  int reduction, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "cross_entropy: out is NULL");
    *out = NULL;
    if (!logits || !targets)
        return ts__fail(TS_EINVAL, "cross_entropy: tensor is NULL");
    TS__AUTOCAST(TS__AC_FLOAT32, 1, &logits, ts_cross_entropy(ac_[0], targets, reduction, out));
    char b1[160], b2[160];
    ts_status s = ts__check_pair("cross_entropy", logits, targets, 0);
    if (s || (s = ts__need_float("cross_entropy", logits)))
        return s;
    if (targets->dtype != TS_I64 && targets->dtype != TS_I32)
        return ts__fail(TS_EDTYPE, "cross_entropy: targets are %s; they must be int64 or int32 "
                        "class indices", ts_dtype_name(targets->dtype));
    if (logits->ndim != 2 || targets->ndim != 1 || targets->shape[0] != logits->shape[0])
        return ts__fail(TS_ESHAPE, "cross_entropy: logits %s must be (N, C) and targets %s (N)",
                        ts__shape_str(logits->ndim, logits->shape, b1, sizeof b1),
                        ts__shape_str(targets->ndim, targets->shape, b2, sizeof b2));
    if (reduction < TS_REDUCTION_MEAN || reduction > TS_REDUCTION_NONE)
        return ts__fail(TS_EINVAL, "cross_entropy: unknown reduction %d", reduction);
    ts_tensor *per;
    if ((s = ts__new(logits->storage->dev, logits->dtype, 1, targets->shape, &per)))
        return s;
    ts_operand in[2], op;
    ts__operand(logits, &in[0]);
    ts__operand(targets, &in[1]);
    ts__operand(per, &op);
    if ((s = ts__run(per->storage->dev, TS_OP_CROSS_ENTROPY, in, 2, &op, 1, NULL, 0))) {
        ts_tensor_unref(per);
        return s;
    }
    TS__RECORD(ts__ag_cross_entropy(logits, targets, per), per);
    if (reduction == TS_REDUCTION_NONE) {
        *out = per;
        return TS_OK;
    }
    s = reduction == TS_REDUCTION_MEAN ? ts_mean(per, 0, NULL, 0, out) : ts_sum(per, 0, NULL, 0, out);
    ts_tensor_unref(per);
    return s;
}

/* ---- cross-entropy --------------------------------------------------------------------- */

static ts_status cross_entropy_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    ts_tensor *o, *gc;
    ts_status s = ts_tensor_contiguous(g, &gc);
    if (s)
        return s;
    if ((s = ts_tensor_empty(n->in_device[0], n->in_dtype[0], 2, n->in_shape[0], &o))) {
        ts_tensor_unref(gc);
        return s;
    }
    ts_operand in[3], op;
    ts__operand(n->saved[0], &in[0]);
    ts__operand(n->saved[1], &in[1]);
    ts__operand(gc, &in[2]);
    ts__operand(o, &op);
    s = ts__run(n->in_device[0], TS_OP_CROSS_ENTROPY_BWD, in, 3, &op, 1, NULL, 0);
    ts_tensor_unref(gc);
    if (s) {
        ts_tensor_unref(o);
        return s;
    }
    gin[0] = o;
    return TS_OK;
}

ts_status ts__ag_cross_entropy(const ts_tensor *logits, const ts_tensor *targets,
                               ts_tensor *out)
{
    const ts_tensor *in[2] = {logits, targets};
    if (!ts__grad_needed(1, in))
        return TS_OK;
    return ts__record("cross_entropy", cross_entropy_backward, out, 2, in, 2, in, NULL, 0, NULL);
}
