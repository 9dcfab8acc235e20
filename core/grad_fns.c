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

/* ---- binary ----------------------------------------------------------------------------
 * Each formula builds the gradients of both inputs in a scope; give() reduces each to its
 * input's shape (broadcast dims summed) and hands out those the inputs need. */

/* x OP y as a float mask of x's dtype. */
static ts_tensor *s_mask(int fn, const ts_tensor *x, const ts_tensor *y)
{
    ts_tensor *m = NULL;
    m = TS_SCOPED(ts_binary(fn, x, y, &m), m);
    return ts_s_cast(m, x ? ts_tensor_dtype(x) : TS_F32);
}

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
        ts_tensor *red = r[i] ? ts_scope_adopt(to_input(n, i, r[i], &t), &t) : NULL;
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
        ts_tensor *share = ts_s_add(s_mask(fn == TS_BINARY_MAXIMUM ? TS_BINARY_GT : TS_BINARY_LT,
                                           a, b),
                                    ts_s_mul_scalar(s_mask(TS_BINARY_EQ, a, b), 0.5));
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
        ts_tensor *hit = s_mask(TS_BINARY_EQ, n->saved[0], ts_s_reshape(n->saved[1], nd_in, keep));
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

/* ---- matmul ---------------------------------------------------------------------------- */

/* Promotes a 1-D operand as matmul did: (K) -> (1, K) for a, (K, 1) for b. */
static ts_status promote(const ts_tensor *t, int as_b, ts_tensor **out)
{
    if (ts_tensor_ndim(t) != 1)
        return ts_tensor_detach((ts_tensor *)t, out);
    return ts_tensor_unsqueeze((ts_tensor *)t, as_b ? 1 : 0, out);
}

static ts_tensor *s_mT(const ts_tensor *t)
{
    return ts_s_transpose((ts_tensor *)t, -1, -2);
}

/* t summed over the dims broadcast to reach it from `like`'s shape, then given input i's. */
static ts_tensor *s_sum_to(const ts_node *n, int i, ts_tensor *t, const ts_tensor *like)
{
    ts_tensor *r;
    if (!t || !like)
        return NULL;
    r = TS_SCOPED(ts__sum_to(t, ts_tensor_ndim(like), ts_tensor_shape(like), &r), r);
    return ts_s_reshape(r, n->in_ndim[i], n->in_shape[i]);
}

static ts_status matmul_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    ts_tensor *t;
    ts_scope *sc = ts_scope_begin();
    ts_tensor *a = TS_SCOPED(promote(n->saved[0], 0, &t), t);
    ts_tensor *b = TS_SCOPED(promote(n->saved[1], 1, &t), t);
    /* g with the promoted dims put back: (batch..., M, N). */
    ts_tensor *g2 = TS_SCOPED(ts_tensor_detach(g, &t), t);
    if (g2 && n->in_ndim[0] == 1)
        g2 = ts_s_unsqueeze(g2, ts_tensor_ndim(g2) - (n->in_ndim[1] == 1 ? 0 : 1));
    if (g2 && n->in_ndim[1] == 1)
        g2 = ts_s_unsqueeze(g2, -1);
    ts_tensor *ga = NULL, *gb = NULL;
    if (n->needs[0]) /* ga = g @ b^T, summed over broadcast batch dims */
        ga = s_sum_to(n, 0, ts_s_matmul(g2, s_mT(b)), a);
    if (n->needs[1] && a && g2 && n->in_ndim[1] == 2 && ts_tensor_ndim(a) > 2) {
        /* b is one matrix broadcast over a's batch dims (a linear layer on (B, T, in)): fold
         * the batch into the rows, (B*T, K) and (B*T, N), and make gb with one GEMM instead
         * of a (B, K, N) stack of them summed over B afterwards. */
        const int64_t K = ts_tensor_shape(a)[ts_tensor_ndim(a) - 1];
        const int64_t N = ts_tensor_shape(g2)[ts_tensor_ndim(g2) - 1];
        a = ts_s_reshape(a, 2, (const int64_t[]){ts_tensor_numel(a) / K, K});
        g2 = ts_s_reshape(g2, 2, (const int64_t[]){ts_tensor_numel(g2) / N, N});
    }
    const int64_t *bs = b ? ts_tensor_strides(b) : NULL;
    if (n->needs[1] && a && bs && ts_tensor_ndim(a) == 2 && n->in_ndim[1] == 2 && bs[0] == 1 &&
        bs[1] == ts_tensor_shape(b)[0] && ts_tensor_shape(b)[1] > 1)
        /* b is a transposed view of a dense matrix (linear's W^T): gb^T = g^T @ a is made
         * dense, so the transpose's backward hands the weight a dense gradient (no copy). */
        gb = s_mT(ts_s_matmul(s_mT(g2), a));
    else if (n->needs[1]) /* gb = a^T @ g */
        gb = s_sum_to(n, 1, ts_s_matmul(s_mT(a), g2), b);
    if (n->needs[0])
        gin[0] = ts_scope_keep(ga);
    if (n->needs[1])
        gin[1] = ts_scope_keep(gb);
    ts_status s = ts_scope_end(sc);
    for (int i = 0; s && i < 2; i++)
        if (n->needs[i]) {
            ts_tensor_unref(gin[i]);
            gin[i] = NULL;
        }
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
