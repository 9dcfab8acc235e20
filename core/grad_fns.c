/* core/grad_fns.c: what the elementwise ops (ops.c) record and how their backward computes
 * the gradients of their inputs (with the public ops, grad mode off); the other families
 * keep their backward beside their front end (core/op_*.c, view.c, losses.c). ts__ag_* are
 * called by the forward ops right after they produce their output. */
#include <math.h>
#include <string.h>

#include "grad_fns.h"

/* ---- helpers --------------------------------------------------------------------------- */

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

/* ---- binary ----------------------------------------------------------------------------
 * Each formula builds the gradients of both inputs in a scope; give() reduces each to its
 * input's shape (broadcast dims summed) and hands out those the inputs need. */

static ts_tensor *s_mask_scalar(int fn, const ts_tensor *x, double v)
{
    return x ? ts_s_cast(ts_s_binary_scalar(fn, x, v, 0), ts_tensor_dtype(x)) : NULL;
}

/* Ends a formula's scope: r[i] reduced to input i's shape goes to gin[i] where input i needs
 * a gradient (r[i] may be NULL where it does not). */
static ts_status give(ts_node *n, ts_scope *sc, int nin, ts_tensor *const *r, ts_tensor **gin)
{
    for (int i = 0; i < nin; i++) {
        if (!n->needs[i])
            continue;
        ts_tensor *t = NULL;
        ts_tensor *red = r[i] ? ts_scope_adopt(ts__grad_to_input(n, i, r[i], &t), &t) : NULL;
        if (!red && ts_scope_status(sc) == TS_OK)
            ts_scope_adopt(ts__fail(TS_ESTATE, "backward: %s computed no gradient for input "
                                    "%d", n->name, i), NULL);
        gin[i] = ts_scope_keep(red);
    }
    ts_status s = ts_scope_end(sc);
    for (int i = 0; s && i < nin; i++) {
        ts_tensor_unref(gin[i]);
        gin[i] = NULL;
    }
    return s;
}

static ts_status binary_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int fn = (int)n->p.i[0];
    ts_tensor *a = n->saved[0], *b = n->saved[1]; /* NULL for add and sub */
    ts_scope *sc = ts_scope_begin();
    ts_tensor *r[2] = {NULL, NULL};
    switch (fn) {
    case TS_BINARY_ADD: /* g, g */
        r[0] = r[1] = g;
        break;
    case TS_BINARY_SUB: /* g, -g */
        r[0] = g;
        r[1] = n->needs[1] ? ts_s_neg(g) : NULL;
        break;
    case TS_BINARY_MUL: /* g b, g a */
        r[0] = n->needs[0] ? ts_s_mul(g, b) : NULL;
        r[1] = n->needs[1] ? ts_s_mul(g, a) : NULL;
        break;
    case TS_BINARY_DIV: /* g / b, -(g / b) / b a */
        r[0] = ts_s_div(g, b);
        r[1] = n->needs[1] ? ts_s_neg(ts_s_mul(ts_s_div(r[0], b), a)) : NULL;
        break;
    case TS_BINARY_POW: /* g b a^(b-1), g a^b ln a */
        r[0] = n->needs[0] ? ts_s_mul(g, ts_s_mul(ts_s_pow(a, ts_s_binary_scalar(TS_BINARY_SUB, b,
                                                                             1, 0)), b))
                           : NULL;
        r[1] = n->needs[1] ? ts_s_mul(g, ts_s_mul(ts_s_log(a), n->saved[2])) : NULL;
        break;
    case TS_BINARY_MAXIMUM:
    case TS_BINARY_MINIMUM: { /* to the winner; ties split evenly */
        ts_tensor *share = ts_s_add(ts__s_mask(fn == TS_BINARY_MAXIMUM ? TS_BINARY_GT : TS_BINARY_LT,
                                           a, b),
                                    ts_s_mul_scalar(ts__s_mask(TS_BINARY_EQ, a, b), 0.5));
        r[0] = n->needs[0] ? ts_s_mul(g, share) : NULL;
        r[1] = n->needs[1] ? ts_s_mul(g, ts_s_binary_scalar(TS_BINARY_SUB, share, 1, 1)) : NULL;
        break;
    }
    default:
        ts_scope_adopt(ts__fail(TS_ESTATE, "backward: %s has no gradient", n->name), NULL);
    }
    return give(n, sc, 2, r, gin);
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
    ts_tensor *x = n->saved[0]; /* x, or the output for c^x */
    ts_scope *sc = ts_scope_begin();
    ts_tensor *r = NULL, *t = NULL;
    switch (fn) {
    case TS_BINARY_ADD: /* g */
        r = TS_SCOPED(ts_tensor_detach(g, &t), t);
        break;
    case TS_BINARY_SUB: /* g, or -g for c - x */
        r = first ? ts_s_neg(g) : TS_SCOPED(ts_tensor_detach(g, &t), t);
        break;
    case TS_BINARY_MUL:
        r = ts_s_mul_scalar(g, c);
        break;
    case TS_BINARY_DIV: /* g / c, or -c g / x^2 for c / x */
        r = !first ? ts_s_mul_scalar(g, 1.0 / c) : ts_s_mul_scalar(ts_s_div(g, ts_s_mul(x, x)), -c);
        break;
    case TS_BINARY_POW: /* g c x^(c-1), or g c^x ln c */
        r = !first ? ts_s_mul(g, ts_s_mul_scalar(ts_s_pow_scalar(x, c - 1), c))
                   : ts_s_mul(g, ts_s_mul_scalar(x, log(c)));
        break;
    case TS_BINARY_MAXIMUM:
    case TS_BINARY_MINIMUM: { /* where x wins; ties split evenly */
        int win = fn == TS_BINARY_MAXIMUM ? TS_BINARY_GT : TS_BINARY_LT;
        r = ts_s_mul(g, ts_s_add(s_mask_scalar(win, x, c),
                                 ts_s_mul_scalar(s_mask_scalar(TS_BINARY_EQ, x, c), 0.5)));
        break;
    }
    default:
        ts_scope_adopt(ts__fail(TS_ESTATE, "backward: %s has no gradient", n->name), NULL);
    }
    return ts_scope_return(sc, r, &gin[0]);
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

/* GELU's tanh form: y = x/2 (1 + t), t = tanh(c (x + k x^3)), c = sqrt(2 / pi), k = 0.044715:
 * dy/dx = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 k x^2). One pass (ABI 2.2) where the device runs
 * it, else composed. */
static ts_tensor *gelu_tanh_deriv(const ts_tensor *x)
{
    if (ts__device_runs_unary(x->storage->dev, TS_UNARY_GELU_TANH_DERIV, x->dtype))
        return ts_s_unary(TS_UNARY_GELU_TANH_DERIV, x);
    const double c = 0.7978845608028654, k = 0.044715;
    ts_tensor *x2 = ts_s_mul(x, x);
    ts_tensor *d = ts_s_add_scalar(ts_s_mul_scalar(x2, 3 * k), 1);                   /* 1 + 3k x^2 */
    ts_tensor *u = ts_s_mul_scalar(ts_s_mul(ts_s_add_scalar(ts_s_mul_scalar(x2, k), 1), x), c);
    ts_tensor *t = ts_s_tanh(u);
    ts_tensor *om = ts_s_binary_scalar(TS_BINARY_SUB, ts_s_mul(t, t), 1, 1);         /* 1 - t^2 */
    om = ts_s_mul_scalar(ts_s_mul(ts_s_mul(om, d), x), 0.5 * c);
    return ts_s_add(ts_s_mul_scalar(ts_s_add_scalar(t, 1), 0.5), om);
}

static ts_status unary_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    int fn = (int)n->p.i[0];
    /* One saved tensor: the input or the output, whichever the formula reads. */
    ts_tensor *x = n->saved[0], *y = n->saved[0], *r = NULL, *t = NULL;
    if (fn == TS_UNARY_RELU) /* one fused pass where the device has it */
        return relu_backward(g, x, &gin[0]);
    ts_scope *sc = ts_scope_begin();
    switch (fn) {
    case TS_UNARY_NEG:
        r = ts_s_neg(g);
        break;
    case TS_UNARY_ABS: /* g sign(x), 0 at 0 */
        r = ts_s_mul(g, ts_s_sub(s_mask_scalar(TS_BINARY_GT, x, 0),
                                 s_mask_scalar(TS_BINARY_LT, x, 0)));
        break;
    case TS_UNARY_EXP: /* g y */
        r = ts_s_mul(g, y);
        break;
    case TS_UNARY_LOG: /* g / x */
        r = ts_s_div(g, x);
        break;
    case TS_UNARY_SQRT: /* g 0.5 / y */
        r = ts_s_mul_scalar(ts_s_div(g, y), 0.5);
        break;
    case TS_UNARY_RSQRT: /* g (-0.5 y^3) */
        r = ts_s_mul(g, ts_s_mul_scalar(ts_s_pow_scalar(y, 3), -0.5));
        break;
    case TS_UNARY_TANH: /* g (1 - y^2) */
        r = ts_s_mul(g, ts_s_binary_scalar(TS_BINARY_SUB, ts_s_mul(y, y), 1, 1));
        break;
    case TS_UNARY_SIGMOID: /* g (1 - y) y */
        r = ts_s_mul(g, ts_s_mul(ts_s_binary_scalar(TS_BINARY_SUB, y, 1, 1), y));
        break;
    case TS_UNARY_GELU: { /* g (Phi(x) + x phi(x)), Phi(x) = (1 + erf(x / sqrt 2)) / 2 */
        ts_tensor *phi_cdf = ts_s_mul_scalar(
            ts_s_add_scalar(ts_s_unary(TS_UNARY_ERF, ts_s_mul_scalar(x, M_SQRT1_2)), 1), 0.5);
        ts_tensor *phi = ts_s_mul_scalar(ts_s_exp(ts_s_mul_scalar(ts_s_mul(x, x), -0.5)),
                                         0.3989422804014327); /* exp(-x^2/2) / sqrt(2 pi) */
        r = ts_s_mul(g, ts_s_add(phi_cdf, ts_s_mul(phi, x)));
        break;
    }
    case TS_UNARY_GELU_TANH:
        r = ts_s_mul(g, gelu_tanh_deriv(x));
        break;
    case TS_UNARY_SILU: { /* g s (1 + x (1 - s)), s = sigmoid(x) */
        ts_tensor *sg = ts_s_sigmoid(x);
        r = ts_s_mul(g, ts_s_mul(sg, ts_s_add_scalar(
                                         ts_s_mul(x, ts_s_binary_scalar(TS_BINARY_SUB, sg, 1, 1)),
                                         1)));
        break;
    }
    default:
        ts_scope_adopt(ts__fail(TS_ESTATE, "backward: unary function %d has no gradient", fn),
                       &t);
    }
    return ts_scope_return(sc, r, &gin[0]);
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
    ts_tensor *t, *r[3] = {NULL, NULL, NULL}; /* the condition has none */
    ts_scope *sc = ts_scope_begin();
    ts_tensor *zero = TS_SCOPED(ts_tensor_zeros(ts_tensor_device(g), ts_tensor_dtype(g), 0, NULL, &t), t);
    if (n->needs[1]) /* g where c, else 0 */
        r[1] = TS_SCOPED(ts_where(n->saved[0], g, zero, &t), t);
    if (n->needs[2]) /* 0 where c, else g */
        r[2] = TS_SCOPED(ts_where(n->saved[0], zero, g, &t), t);
    return give(n, sc, 3, r, gin);
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
    if (g->dtype == n->in_dtype[0]) { /* a cast to its own dtype (a copy): g passes through */
        gin[0] = ts_tensor_ref(g);
        return TS_OK;
    }
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
