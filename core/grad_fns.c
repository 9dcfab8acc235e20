/* core/grad_fns.c: what each differentiable op records and how its backward computes the
 * gradients of its inputs (with the public ops, grad mode off). ts__ag_* are called by the
 * forward ops right after they produce their output. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "grad_fns.h"

/* ---- helpers --------------------------------------------------------------------------- */

/* Reduces g to input i's shape (broadcast dims summed). (transfer full) */
static ts_status to_input(const ts_node *n, int i, ts_tensor *g, ts_tensor **out)
{
    return ts__sum_to(g, n->in_ndim[i], n->in_shape[i], out);
}

/* *out = a * b, then reduced to input i's shape. */
static ts_status mul_to(const ts_node *n, int i, const ts_tensor *a, const ts_tensor *b,
                        ts_tensor **out)
{
    ts_tensor *m;
    ts_status s = ts_mul(a, b, &m);
    if (s)
        return s;
    s = to_input(n, i, m, out);
    ts_tensor_unref(m);
    return s;
}

/* The float mask (x OP y) as x's dtype. */
static ts_status mask(int fn, const ts_tensor *x, const ts_tensor *y, ts_tensor **out)
{
    ts_tensor *m;
    ts_status s = ts_binary(fn, x, y, &m);
    if (s)
        return s;
    s = ts_cast(m, ts_tensor_dtype(x), out);
    ts_tensor_unref(m);
    return s;
}

static ts_status mask_scalar(int fn, const ts_tensor *x, double v, ts_tensor **out)
{
    ts_tensor *m;
    ts_status s = ts_binary_scalar(fn, x, v, 0, &m);
    if (s)
        return s;
    s = ts_cast(m, ts_tensor_dtype(x), out);
    ts_tensor_unref(m);
    return s;
}

/* ReLU's gradient g * (x > 0): one TS_OP_RELU_BACKWARD pass where the device runs it (a
 * select: 0 where x <= 0 even for an infinite g), else composed as g * cast(x > 0). */
static ts_status relu_backward(ts_tensor *g, const ts_tensor *x, ts_tensor **out)
{
    ts_device *dev = x->storage->dev;
    int same = g->storage->dev == dev && g->dtype == x->dtype && g->ndim == x->ndim;
    for (int d = 0; same && d < x->ndim; d++)
        same = g->shape[d] == x->shape[d];
    if (!same || !ts__device_runs(dev, TS_OP_RELU_BACKWARD, x->dtype)) {
        ts_tensor *m;
        ts_status s = mask_scalar(TS_BINARY_GT, x, 0, &m);
        if (s == TS_OK)
            s = ts_mul(g, m, out);
        ts_tensor_unref(m);
        return s;
    }
    ts_tensor *o;
    ts_status s = ts__new(dev, x->dtype, x->ndim, x->shape, &o);
    if (s)
        return s;
    ts_operand in[2], op;
    ts__operand(g, &in[0]);
    ts__operand(x, &in[1]);
    ts__operand(o, &op);
    if ((s = ts__run(dev, TS_OP_RELU_BACKWARD, in, 2, &op, 1, NULL, 0))) {
        ts_tensor_unref(o);
        return s;
    }
    *out = o;
    return TS_OK;
}

#define TRY(expr)                                                                           \
    do {                                                                                    \
        if ((s = (expr)))                                                                   \
            goto out;                                                                       \
    } while (0)

/* ---- binary ---------------------------------------------------------------------------- */

static ts_status binary_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int fn = (int)n->p.i[0];
    ts_tensor *a = n->saved[0], *b = n->saved[1]; /* NULL for add and sub */
    ts_tensor *t1 = NULL, *t2 = NULL, *t3 = NULL;
    ts_status s = TS_OK;
    switch (fn) {
    case TS_BINARY_ADD:
    case TS_BINARY_SUB:
        if (n->needs[0])
            TRY(to_input(n, 0, g, &gin[0]));
        if (n->needs[1]) {
            if (fn == TS_BINARY_SUB) {
                TRY(ts_neg(g, &t1));
                TRY(to_input(n, 1, t1, &gin[1]));
            } else {
                TRY(to_input(n, 1, g, &gin[1]));
            }
        }
        break;
    case TS_BINARY_MUL:
        if (n->needs[0])
            TRY(mul_to(n, 0, g, b, &gin[0]));
        if (n->needs[1])
            TRY(mul_to(n, 1, g, a, &gin[1]));
        break;
    case TS_BINARY_DIV: /* d(a/b) = da / b - a db / b^2 */
        TRY(ts_div(g, b, &t1));
        if (n->needs[0])
            TRY(to_input(n, 0, t1, &gin[0]));
        if (n->needs[1]) {
            TRY(ts_div(t1, b, &t2));
            TRY(ts_mul(t2, a, &t3));
            ts_tensor_unref(t2);
            TRY(ts_neg(t3, &t2));
            TRY(to_input(n, 1, t2, &gin[1]));
        }
        break;
    case TS_BINARY_POW: /* d(a^b) = b a^(b-1) da + a^b ln(a) db */
        if (n->needs[0]) {
            TRY(ts_binary_scalar(TS_BINARY_SUB, b, 1, 0, &t1));
            TRY(ts_pow(a, t1, &t2));
            ts_tensor_unref(t1);
            TRY(ts_mul(t2, b, &t1));
            TRY(mul_to(n, 0, g, t1, &gin[0]));
            ts_tensor_unref(t1);
            ts_tensor_unref(t2);
            t1 = t2 = NULL;
        }
        if (n->needs[1]) {
            TRY(ts_log(a, &t1));
            TRY(ts_mul(t1, n->saved[2], &t2));
            TRY(mul_to(n, 1, g, t2, &gin[1]));
        }
        break;
    case TS_BINARY_MAXIMUM:
    case TS_BINARY_MINIMUM: { /* the gradient goes to the winner; ties split it evenly */
        int win = fn == TS_BINARY_MAXIMUM ? TS_BINARY_GT : TS_BINARY_LT;
        TRY(mask(win, a, b, &t1));
        TRY(mask(TS_BINARY_EQ, a, b, &t2));
        TRY(ts_mul_scalar_(t2, 0.5));
        TRY(ts_add(t1, t2, &t3)); /* a's share */
        if (n->needs[0])
            TRY(mul_to(n, 0, g, t3, &gin[0]));
        if (n->needs[1]) {
            ts_tensor *rest;
            TRY(ts_binary_scalar(TS_BINARY_SUB, t3, 1, 1, &rest));
            s = mul_to(n, 1, g, rest, &gin[1]);
            ts_tensor_unref(rest);
        }
        break;
    }
    default:
        s = ts__fail(TS_ESTATE, "backward: %s has no gradient", n->name);
    }
out:
    ts_tensor_unref(t1);
    ts_tensor_unref(t2);
    ts_tensor_unref(t3);
    return s;
}

ts_status ts__ag_binary(int fn, const ts_tensor *a, const ts_tensor *b, ts_tensor *out)
{
    const ts_tensor *in[2] = {a, b};
    if (!ts__grad_needed(2, in) || fn > TS_BINARY_MINIMUM)
        return TS_OK;
    /* add and sub need only the shapes; the rest need both operands (pow its output too). */
    const ts_tensor *save[3] = {a, b, out};
    int nsave = fn <= TS_BINARY_SUB ? 0 : fn == TS_BINARY_POW ? 3 : 2;
    int64_t p = fn;
    return ts__record(ts_fn_name(TS_OP_BINARY, fn), binary_backward, out, 2, in, nsave, save,
                      &p, sizeof p, NULL);
}

/* ---- scalar ---------------------------------------------------------------------------- */

static ts_status scalar_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int fn = (int)n->p.i[0], first = (int)n->p.i[1];
    double c = n->p.d[2];
    ts_tensor *x = n->saved[0], *t1 = NULL, *t2 = NULL; /* x, or the output for c^x */
    ts_status s = TS_OK;
    switch (fn) {
    case TS_BINARY_ADD:
        s = ts_tensor_detach(g, &gin[0]);
        break;
    case TS_BINARY_SUB:
        s = first ? ts_neg(g, &gin[0]) : ts_tensor_detach(g, &gin[0]);
        break;
    case TS_BINARY_MUL:
        s = ts_mul_scalar(g, c, &gin[0]);
        break;
    case TS_BINARY_DIV:
        if (!first) {
            s = ts_mul_scalar(g, 1.0 / c, &gin[0]);
        } else { /* d(c / x) = -c / x^2 */
            TRY(ts_mul(x, x, &t1));
            TRY(ts_div(g, t1, &t2));
            s = ts_mul_scalar(t2, -c, &gin[0]);
        }
        break;
    case TS_BINARY_POW:
        if (!first) { /* d(x^c) = c x^(c-1) */
            TRY(ts_pow_scalar(x, c - 1, &t1));
            TRY(ts_mul_scalar_(t1, c));
            s = ts_mul(g, t1, &gin[0]);
        } else { /* d(c^x) = c^x ln c */
            TRY(ts_mul_scalar(x, log(c), &t1)); /* saved[0] is the output here */
            s = ts_mul(g, t1, &gin[0]);
        }
        break;
    case TS_BINARY_MAXIMUM:
    case TS_BINARY_MINIMUM:
        TRY(mask_scalar(fn == TS_BINARY_MAXIMUM ? TS_BINARY_GT : TS_BINARY_LT, x, c, &t1));
        TRY(mask_scalar(TS_BINARY_EQ, x, c, &t2));
        TRY(ts_mul_scalar_(t2, 0.5));
        TRY(ts_add_(t1, t2));
        s = ts_mul(g, t1, &gin[0]);
        break;
    default:
        s = ts__fail(TS_ESTATE, "backward: %s has no gradient", n->name);
    }
out:
    ts_tensor_unref(t1);
    ts_tensor_unref(t2);
    return s;
}

ts_status ts__ag_scalar(int fn, const ts_tensor *x, double c, int first, ts_tensor *out)
{
    const ts_tensor *in[1] = {x};
    if (!ts__grad_needed(1, in) || fn > TS_BINARY_MINIMUM)
        return TS_OK;
    /* Save only what the gradient reads: x, the output (for c^x), or nothing. */
    int nsave = 1;
    const ts_tensor *save[1] = {x};
    if (fn == TS_BINARY_POW && first)
        save[0] = out;
    else if (fn == TS_BINARY_ADD || fn == TS_BINARY_SUB || fn == TS_BINARY_MUL ||
             (fn == TS_BINARY_DIV && !first))
        nsave = 0;
    union {
        int64_t i[3];
        double d[3];
    } p;
    p.i[0] = fn;
    p.i[1] = first != 0;
    p.d[2] = c;
    return ts__record(ts_fn_name(TS_OP_BINARY, fn), scalar_backward, out, 1, in, nsave, save,
                      &p, sizeof p, NULL);
}

/* ---- unary ----------------------------------------------------------------------------- */

static ts_status unary_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int fn = (int)n->p.i[0];
    /* One saved tensor: the input or the output, whichever the formula reads. */
    ts_tensor *x = n->saved[0], *y = n->saved[0], *t1 = NULL, *t2 = NULL;
    ts_status s = TS_OK;
    switch (fn) {
    case TS_UNARY_NEG:
        s = ts_neg(g, &gin[0]);
        break;
    case TS_UNARY_ABS: /* sign(x), 0 at 0 */
        TRY(mask_scalar(TS_BINARY_GT, x, 0, &t1));
        TRY(mask_scalar(TS_BINARY_LT, x, 0, &t2));
        TRY(ts_sub_(t1, t2));
        s = ts_mul(g, t1, &gin[0]);
        break;
    case TS_UNARY_EXP:
        s = ts_mul(g, y, &gin[0]);
        break;
    case TS_UNARY_LOG:
        s = ts_div(g, x, &gin[0]);
        break;
    case TS_UNARY_SQRT: /* 0.5 / sqrt(x) */
        TRY(ts_div(g, y, &t1));
        s = ts_mul_scalar(t1, 0.5, &gin[0]);
        break;
    case TS_UNARY_RSQRT: /* -0.5 x^-1.5 = -0.5 y^3 */
        TRY(ts_pow_scalar(y, 3, &t1));
        TRY(ts_mul_scalar_(t1, -0.5));
        s = ts_mul(g, t1, &gin[0]);
        break;
    case TS_UNARY_TANH: /* 1 - y^2 */
        TRY(ts_mul(y, y, &t1));
        TRY(ts_binary_scalar(TS_BINARY_SUB, t1, 1, 1, &t2));
        s = ts_mul(g, t2, &gin[0]);
        break;
    case TS_UNARY_SIGMOID: /* y (1 - y) */
        TRY(ts_binary_scalar(TS_BINARY_SUB, y, 1, 1, &t1));
        TRY(ts_mul(t1, y, &t2));
        s = ts_mul(g, t2, &gin[0]);
        break;
    case TS_UNARY_RELU:
        s = relu_backward(g, x, &gin[0]);
        break;
    case TS_UNARY_GELU: { /* Phi(x) + x phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2 */
        ts_tensor *t3 = NULL;
        TRY(ts_mul_scalar(x, M_SQRT1_2, &t1));
        TRY(ts_unary(TS_UNARY_ERF, t1, &t2));
        ts_tensor_unref(t1);
        t1 = NULL;
        TRY(ts_add_scalar_(t2, 1));
        TRY(ts_mul_scalar_(t2, 0.5)); /* Phi */
        TRY(ts_mul(x, x, &t1));
        TRY(ts_mul_scalar_(t1, -0.5));
        s = ts_exp(t1, &t3); /* exp(-x^2/2) */
        if (s == TS_OK)
            s = ts_mul_scalar_(t3, 0.3989422804014327); /* phi = that / sqrt(2 pi) */
        if (s == TS_OK)
            s = ts_mul_(t3, x);
        if (s == TS_OK)
            s = ts_add_(t2, t3);
        ts_tensor_unref(t3);
        if (s == TS_OK)
            s = ts_mul(g, t2, &gin[0]);
        break;
    }
    case TS_UNARY_GELU_TANH: {
        /* y = x/2 (1 + t), t = tanh(u), u = c (x + k x^3): dy/dx = (1 + t)/2 +
         * x/2 (1 - t^2) c (1 + 3 k x^2), c = sqrt(2 / pi), k = 0.044715. One pass of the
         * derivative (ABI 2.2) where the device runs it, else composed from plain ops. */
        if (ts__device_runs_unary(x->storage->dev, TS_UNARY_GELU_TANH_DERIV, x->dtype)) {
            TRY(ts_unary(TS_UNARY_GELU_TANH_DERIV, x, &t1));
            s = ts_mul(g, t1, &gin[0]);
            break;
        }
        const double c = 0.7978845608028654, k = 0.044715;
        ts_tensor *d = NULL, *t = NULL, *t2sq = NULL, *om = NULL;
        TRY(ts_mul(x, x, &t1));                     /* x^2 */
        TRY(ts_mul_scalar(t1, 3 * k, &d));          /* d = 3 k x^2 ... */
        s = ts_add_scalar_(d, 1);                   /*   ... + 1 */
        if (s == TS_OK)
            s = ts_mul_scalar_(t1, k);              /* t1 = k x^2 */
        if (s == TS_OK)
            s = ts_add_scalar_(t1, 1);              /*      1 + k x^2 */
        if (s == TS_OK)
            s = ts_mul_(t1, x);                     /*      x + k x^3 */
        if (s == TS_OK)
            s = ts_mul_scalar_(t1, c);              /* u */
        if (s == TS_OK)
            s = ts_tanh(t1, &t);                    /* t */
        if (s == TS_OK)
            s = ts_mul(t, t, &t2sq);                /* t^2 */
        if (s == TS_OK)
            s = ts_binary_scalar(TS_BINARY_SUB, t2sq, 1, 1, &om); /* 1 - t^2 */
        if (s == TS_OK)
            s = ts_mul_(om, d);
        if (s == TS_OK)
            s = ts_mul_(om, x);
        if (s == TS_OK)
            s = ts_mul_scalar_(om, 0.5 * c);        /* x/2 (1 - t^2) c (1 + 3 k x^2) */
        if (s == TS_OK)
            s = ts_add_scalar_(t, 1);
        if (s == TS_OK)
            s = ts_mul_scalar_(t, 0.5);             /* (1 + t)/2 */
        if (s == TS_OK)
            s = ts_add_(t, om);
        if (s == TS_OK)
            s = ts_mul(g, t, &gin[0]);
        ts_tensor_unref(d);
        ts_tensor_unref(t);
        ts_tensor_unref(t2sq);
        ts_tensor_unref(om);
        break;
    }
    default:
        s = ts__fail(TS_ESTATE, "backward: unary function %d has no gradient", fn);
    }
out:
    ts_tensor_unref(t1);
    ts_tensor_unref(t2);
    return s;
}

ts_status ts__ag_unary(int fn, const ts_tensor *x, ts_tensor *out)
{
    const ts_tensor *in[1] = {x};
    if (!ts__grad_needed(1, in))
        return TS_OK;
    if (fn == TS_UNARY_ERF)
        return ts__fail(TS_ENOTSUP, "erf has no gradient in this version");
    int uses_out = fn == TS_UNARY_EXP || fn == TS_UNARY_SQRT || fn == TS_UNARY_RSQRT ||
                   fn == TS_UNARY_TANH || fn == TS_UNARY_SIGMOID;
    const ts_tensor *save[1] = {uses_out ? out : x};
    int64_t p = fn;
    return ts__record(ts_fn_name(TS_OP_UNARY, fn), unary_backward, out, 1, in,
                      fn == TS_UNARY_NEG ? 0 : 1, save, &p, sizeof p, NULL);
}

/* ---- where, cast, identity, to --------------------------------------------------------- */

static ts_status where_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    ts_tensor *zero = NULL, *t = NULL;
    ts_status s = ts_tensor_zeros(ts_tensor_device(g), ts_tensor_dtype(g), 0, NULL, &zero);
    if (s)
        return s;
    if (n->needs[1]) {
        TRY(ts_where(n->saved[0], g, zero, &t));
        TRY(to_input(n, 1, t, &gin[1]));
        ts_tensor_unref(t);
        t = NULL;
    }
    if (n->needs[2]) {
        TRY(ts_where(n->saved[0], zero, g, &t));
        TRY(to_input(n, 2, t, &gin[2]));
    }
out:
    ts_tensor_unref(zero);
    ts_tensor_unref(t);
    return s;
}

ts_status ts__ag_where(const ts_tensor *c, const ts_tensor *a, const ts_tensor *b, ts_tensor *out)
{
    const ts_tensor *in[3] = {c, a, b};
    if (!ts__grad_needed(3, in))
        return TS_OK;
    const ts_tensor *save[1] = {c};
    return ts__record("where", where_backward, out, 3, in, 1, save, NULL, 0, NULL);
}

static ts_status cast_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    return ts_cast(g, n->in_dtype[0], &gin[0]);
}

ts_status ts__ag_cast(const ts_tensor *x, ts_tensor *out)
{
    const ts_tensor *in[1] = {x};
    return ts__record("cast", cast_backward, out, 1, in, 0, NULL, NULL, 0, NULL);
}

static ts_status identity_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    (void)n;
    return ts_tensor_detach(g, &gin[0]);
}

ts_status ts__ag_identity(const char *name, const ts_tensor *x, ts_tensor *out)
{
    const ts_tensor *in[1] = {x};
    return ts__record(name, identity_backward, out, 1, in, 0, NULL, NULL, 0, NULL);
}

static ts_status to_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    return ts_tensor_to(g, n->in_device[0], &gin[0]);
}

ts_status ts__ag_to(const ts_tensor *x, ts_tensor *out)
{
    const ts_tensor *in[1] = {x};
    return ts__record("to", to_backward, out, 1, in, 0, NULL, NULL, 0, NULL);
}

/* ---- reductions ------------------------------------------------------------------------ */

static ts_status reduce_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int fn = (int)n->p.i[0];
    int64_t reduced = n->p.i[1]; /* bit d: dim d was reduced */
    ts_tensor *x = n->saved[0], *gk = NULL, *ge = NULL, *t1 = NULL, *t2 = NULL, *cnt = NULL;
    ts_status s;
    /* g has the result's shape: view it with the reduced dims kept (size 1), then broadcast
     * it back over them. */
    int64_t keep[TS_MAX_DIMS];
    int dims[TS_MAX_DIMS], nd = 0;
    double count = 1;
    for (int d = 0; d < n->in_ndim[0]; d++) {
        int r = (reduced >> d) & 1;
        keep[d] = r ? 1 : n->in_shape[0][d];
        if (r) {
            dims[nd++] = d;
            count *= (double)n->in_shape[0][d];
        }
    }
    TRY(ts_tensor_reshape(g, n->in_ndim[0], keep, &gk));
    TRY(ts_tensor_expand(gk, n->in_ndim[0], n->in_shape[0], &ge));
    if (fn == TS_REDUCE_SUM) {
        s = ts_tensor_contiguous(ge, &gin[0]);
    } else if (fn == TS_REDUCE_MEAN) {
        s = ts_mul_scalar(ge, 1.0 / count, &gin[0]);
    } else { /* max/min: to every element equal to the result, split among ties */
        ts_tensor *rk;
        TRY(ts_tensor_reshape(n->saved[1], n->in_ndim[0], keep, &rk));
        s = mask(TS_BINARY_EQ, x, rk, &t1);
        ts_tensor_unref(rk);
        if (s)
            goto out;
        TRY(ts_sum(t1, nd, dims, 1, &cnt));
        TRY(ts_div(ge, cnt, &t2));
        s = ts_mul(t2, t1, &gin[0]);
    }
out:
    ts_tensor_unref(gk);
    ts_tensor_unref(ge);
    ts_tensor_unref(t1);
    ts_tensor_unref(t2);
    ts_tensor_unref(cnt);
    return s;
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

/* ---- matmul ---------------------------------------------------------------------------- */

/* t with its last two dims swapped (a view). */
static ts_status mT(const ts_tensor *t, ts_tensor **out)
{
    return ts_tensor_transpose((ts_tensor *)t, -1, -2, out);
}

/* Promotes a 1-D operand as matmul did: (K) -> (1, K) for a, (K, 1) for b. */
static ts_status promote(const ts_tensor *t, int as_b, ts_tensor **out)
{
    if (ts_tensor_ndim(t) != 1)
        return ts_tensor_detach((ts_tensor *)t, out);
    return ts_tensor_unsqueeze((ts_tensor *)t, as_b ? 1 : 0, out);
}

static ts_status matmul_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    ts_tensor *a = NULL, *b = NULL, *g2 = NULL, *t = NULL, *u = NULL, *r = NULL;
    ts_status s;
    TRY(promote(n->saved[0], 0, &a));
    TRY(promote(n->saved[1], 1, &b));
    /* g with the promoted dims put back: (batch..., M, N). */
    TRY(ts_tensor_detach(g, &g2));
    if (n->in_ndim[0] == 1) {
        TRY(ts_tensor_unsqueeze(g2, ts_tensor_ndim(g2) - (n->in_ndim[1] == 1 ? 0 : 1), &t));
        ts_tensor_unref(g2);
        g2 = t;
        t = NULL;
    }
    if (n->in_ndim[1] == 1) {
        TRY(ts_tensor_unsqueeze(g2, -1, &t));
        ts_tensor_unref(g2);
        g2 = t;
        t = NULL;
    }
    if (n->needs[0]) { /* ga = g @ b^T, summed over broadcast batch dims */
        TRY(mT(b, &t));
        TRY(ts_matmul(g2, t, &u));
        TRY(ts__sum_to(u, ts_tensor_ndim(a), ts_tensor_shape(a), &r));
        TRY(ts_tensor_reshape(r, n->in_ndim[0], n->in_shape[0], &gin[0]));
        ts_tensor_unref(t), ts_tensor_unref(u), ts_tensor_unref(r);
        t = u = r = NULL;
    }
    const int64_t *bs = ts_tensor_strides(b);
    if (n->needs[1] && n->in_ndim[1] == 2 && ts_tensor_ndim(a) > 2) {
        /* b is one matrix broadcast over a's batch dims (a linear layer on (B, T, in)): fold
         * the batch into the rows, (B*T, K) and (B*T, N), and make gb with one GEMM instead
         * of a (B, K, N) stack of them summed over B afterwards. */
        const int64_t K = ts_tensor_shape(a)[ts_tensor_ndim(a) - 1];
        const int64_t N = ts_tensor_shape(g2)[ts_tensor_ndim(g2) - 1];
        ts_tensor *af = NULL, *gf = NULL;
        s = ts_tensor_reshape(a, 2, (const int64_t[]){ts_tensor_numel(a) / K, K}, &af);
        if (!s)
            s = ts_tensor_reshape(g2, 2, (const int64_t[]){ts_tensor_numel(g2) / N, N}, &gf);
        ts_tensor_unref(a), ts_tensor_unref(g2);
        a = af, g2 = gf;
        if (s)
            goto out;
    }
    if (n->needs[1] && ts_tensor_ndim(a) == 2 && n->in_ndim[1] == 2 && bs[0] == 1 &&
        bs[1] == ts_tensor_shape(b)[0] && ts_tensor_shape(b)[1] > 1) {
        /* b is a transposed view of a dense matrix (linear's W^T): gb^T = g^T @ a is made
         * dense, so the transpose's backward hands the weight a dense gradient (no copy). */
        TRY(mT(g2, &t));
        TRY(ts_matmul(t, a, &u));
        TRY(mT(u, &gin[1]));
    } else if (n->needs[1]) { /* gb = a^T @ g */
        TRY(mT(a, &t));
        TRY(ts_matmul(t, g2, &u));
        TRY(ts__sum_to(u, ts_tensor_ndim(b), ts_tensor_shape(b), &r));
        TRY(ts_tensor_reshape(r, n->in_ndim[1], n->in_shape[1], &gin[1]));
    }
out:
    ts_tensor_unref(a), ts_tensor_unref(b), ts_tensor_unref(g2);
    ts_tensor_unref(t), ts_tensor_unref(u), ts_tensor_unref(r);
    return s;
}

ts_status ts__ag_matmul(const ts_tensor *a, const ts_tensor *b, ts_tensor *out)
{
    const ts_tensor *in[2] = {a, b};
    if (!ts__grad_needed(2, in))
        return TS_OK;
    return ts__record("matmul", matmul_backward, out, 2, in, 2, in, NULL, 0, NULL);
}

/* ---- softmax --------------------------------------------------------------------------- */

static ts_status softmax_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int dim = (int)n->p.i[0], log_form = (int)n->p.i[1];
    ts_tensor *y = n->saved[0], *t1 = NULL, *t2 = NULL, *t3 = NULL;
    ts_status s;
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

/* ---- indexing -------------------------------------------------------------------------- */

static ts_status index_select_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    ts_tensor *gx;
    ts_status s = ts_tensor_zeros(n->in_device[0], n->in_dtype[0], n->in_ndim[0], n->in_shape[0],
                                  &gx);
    if (s)
        return s;
    if ((s = ts_index_add_(gx, (int)n->p.i[0], n->saved[0], g))) {
        ts_tensor_unref(gx);
        return s;
    }
    gin[0] = gx;
    return TS_OK;
}

ts_status ts__ag_index_select(const ts_tensor *x, int dim, const ts_tensor *index,
                              ts_tensor *out)
{
    const ts_tensor *in[2] = {x, index};
    if (!ts__grad_needed(1, in))
        return TS_OK;
    const ts_tensor *save[1] = {index};
    int64_t p = dim;
    return ts__record("index_select", index_select_backward, out, 2, in, 1, save, &p, sizeof p,
                      NULL);
}

/* ---- views ----------------------------------------------------------------------------- */

static ts_status view_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int kind = (int)n->p.i[0];
    ts_status s;
    switch (kind) {
    case TS__VIEW_RESHAPE:
        return ts_tensor_reshape(g, n->in_ndim[0], n->in_shape[0], &gin[0]);
    case TS__VIEW_PERMUTE: {
        int inv[TS_MAX_DIMS];
        for (int d = 0; d < n->in_ndim[0]; d++)
            inv[(int)((n->p.i[1] >> (4 * d)) & 15)] = d;
        return ts_tensor_permute(g, inv, &gin[0]);
    }
    case TS__VIEW_EXPAND:
        return ts__sum_to(g, n->in_ndim[0], n->in_shape[0], &gin[0]);
    case TS__VIEW_SLICE:
    case TS__VIEW_SELECT: {
        /* Scatter: zeros of the input's shape, the same view of them, g copied in. */
        ts_tensor *gx, *part;
        s = ts_tensor_zeros(n->in_device[0], n->in_dtype[0], n->in_ndim[0], n->in_shape[0], &gx);
        if (s)
            return s;
        if (kind == TS__VIEW_SLICE)
            s = ts_tensor_slice(gx, (int)n->p.i[1], n->p.i[2], n->p.i[3], n->p.i[4], &part);
        else
            s = ts_tensor_select(gx, (int)n->p.i[1], n->p.i[2], &part);
        if (s == TS_OK) {
            s = ts_copy_(part, g);
            ts_tensor_unref(part);
        }
        if (s) {
            ts_tensor_unref(gx);
            return s;
        }
        gin[0] = gx;
        return TS_OK;
    }
    }
    return ts__fail(TS_ESTATE, "backward: unknown view kind %d", kind);
}

int ts__view_backward_into(ts_node *n, ts_tensor *g, ts_tensor *acc, ts_status *s)
{
    int kind = (int)n->p.i[0];
    if (n->backward != view_backward || (kind != TS__VIEW_SLICE && kind != TS__VIEW_SELECT) ||
        !acc || !g || acc->dtype != g->dtype || acc->storage->dev != g->storage->dev ||
        acc->requires_grad || atomic_load(&acc->refcount) != 1 ||
        atomic_load(&acc->storage->refcount) != 1 || !ts_tensor_is_contiguous(acc) ||
        acc->ndim != n->in_ndim[0])
        return 0; /* shared, broadcast (an expanded view) or another layout: the usual way */
    for (int d = 0; d < acc->ndim; d++)
        if (acc->shape[d] != n->in_shape[0][d])
            return 0;
    ts_tensor *part = NULL;
    *s = kind == TS__VIEW_SLICE
             ? ts_tensor_slice(acc, (int)n->p.i[1], n->p.i[2], n->p.i[3], n->p.i[4], &part)
             : ts_tensor_select(acc, (int)n->p.i[1], n->p.i[2], &part);
    if (*s == TS_OK)
        *s = ts_add_(part, g);
    ts_tensor_unref(part);
    return 1;
}

ts_status ts__ag_view(int kind, const ts_tensor *x, ts_tensor *out, const int64_t *params,
                      int nparams)
{
    static const char *const names[] = {"view", "permute", "expand", "slice", "select"};
    const ts_tensor *in[1] = {x};
    if (!ts__grad_needed(1, in))
        return TS_OK;
    int64_t p[8] = {kind};
    for (int i = 0; i < nparams && i < 7; i++)
        p[i + 1] = params[i];
    return ts__record(names[kind], view_backward, out, 1, in, 0, NULL, p, sizeof p, NULL);
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
