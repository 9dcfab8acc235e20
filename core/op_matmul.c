/* core/op_matmul.c: matmul with NumPy's semantics (batched, broadcast, 1-d operands
 * promoted) and its backward, side by side: the shape check with both shapes in the
 * message, one kernel, then what backward computes from it. */
#include <math.h>
#include <string.h>

#include "grad_fns.h"

/* ---- matmul ---------------------------------------------------------------------------- */

/* Shapes of a @ b: operands a (batch..., M, K) and b (batch..., K, N) as the kernel sees
 * them, the result's full shape (batch..., M, N) and its user-facing shape (1-D promotions
 * removed). */
typedef struct mm_plan {
    ts_operand a, b;
    int nd;                       /* full result dims */
    int64_t shape[TS_MAX_DIMS];   /* full result shape */
    int ond;                      /* user-facing result dims */
    int64_t oshape[TS_MAX_DIMS];
    int a_vec, b_vec;             /* a / b were 1-D: the M / N dim is promoted */
} mm_plan;

static ts_status mm_plan_make(const ts_tensor *a, const ts_tensor *b, mm_plan *p)
{
    char b1[160], b2[160];
    ts_status s = ts__check_pair("matmul", a, b, 1);
    if (s || (s = ts__need_float("matmul", a)))
        return s;
    if (a->ndim == 0 || b->ndim == 0)
        return ts__fail(TS_ESHAPE, "matmul: operands must have at least 1 dim, got %s and %s",
                        ts__shape_str(a->ndim, a->shape, b1, sizeof b1),
                        ts__shape_str(b->ndim, b->shape, b2, sizeof b2));
    ts_operand oa, ob;
    ts__operand(a, &oa);
    ts__operand(b, &ob);
    if (a->ndim == 1) { /* (K) -> (1, K) */
        oa.ndim = 2;
        oa.shape[1] = a->shape[0];
        oa.strides[1] = a->strides[0];
        oa.shape[0] = 1;
        oa.strides[0] = a->shape[0] * a->strides[0];
    }
    if (b->ndim == 1) { /* (K) -> (K, 1) */
        ob.ndim = 2;
        ob.shape[0] = b->shape[0];
        ob.strides[0] = b->strides[0];
        ob.shape[1] = 1;
        ob.strides[1] = 1;
    }
    int64_t M = oa.shape[oa.ndim - 2], K = oa.shape[oa.ndim - 1];
    int64_t K2 = ob.shape[ob.ndim - 2], N = ob.shape[ob.ndim - 1];
    if (K != K2)
        return ts__fail(TS_ESHAPE, "matmul: %s @ %s: inner dims %lld and %lld differ",
                        ts__shape_str(a->ndim, a->shape, b1, sizeof b1),
                        ts__shape_str(b->ndim, b->shape, b2, sizeof b2), (long long)K,
                        (long long)K2);
    /* Broadcast the batch dims. */
    int ba = oa.ndim - 2, bb = ob.ndim - 2, bn = ba > bb ? ba : bb;
    if (bn + 2 > TS_MAX_DIMS)
        return ts__fail(TS_ESHAPE, "matmul: too many dims");
    int64_t batch[TS_MAX_DIMS];
    for (int d = 0; d < bn; d++) {
        int da = d - (bn - ba), db = d - (bn - bb);
        int64_t sa = da >= 0 ? oa.shape[da] : 1, sb = db >= 0 ? ob.shape[db] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return ts__fail(TS_ESHAPE, "matmul: batch dims of %s and %s cannot be broadcast",
                            ts__shape_str(a->ndim, a->shape, b1, sizeof b1),
                            ts__shape_str(b->ndim, b->shape, b2, sizeof b2));
        batch[d] = sa == 1 ? sb : sa;
    }
    /* Expand both operands to batch + their matrix dims (stride 0 where broadcast). */
    ts_operand *ops[2] = {&oa, &ob};
    int64_t mat[2][2] = {{M, K}, {K, N}};
    for (int i = 0; i < 2; i++) {
        ts_operand src = *ops[i], *o = ops[i];
        int lead = bn - (src.ndim - 2);
        o->ndim = bn + 2;
        for (int d = 0; d < bn; d++) {
            int sd = d - lead;
            o->shape[d] = batch[d];
            o->strides[d] = sd >= 0 && src.shape[sd] == batch[d] ? src.strides[sd] : 0;
        }
        for (int j = 0; j < 2; j++) {
            o->shape[bn + j] = mat[i][j];
            o->strides[bn + j] = src.strides[src.ndim - 2 + j];
        }
    }
    p->a = oa;
    p->b = ob;
    p->a_vec = a->ndim == 1;
    p->b_vec = b->ndim == 1;
    p->nd = bn + 2;
    memcpy(p->shape, batch, sizeof(int64_t) * (size_t)bn);
    p->shape[bn] = M;
    p->shape[bn + 1] = N;
    p->ond = 0;
    for (int d = 0; d < bn; d++)
        p->oshape[p->ond++] = batch[d];
    if (a->ndim > 1)
        p->oshape[p->ond++] = M;
    if (b->ndim > 1)
        p->oshape[p->ond++] = N;
    return TS_OK;
}

/* out has the user-facing shape; the kernel sees it with the promoted dims put back (size 1,
 * so their stride does not matter). */
static ts_status mm_run(const mm_plan *p, ts_tensor *out)
{
    ts_operand o;
    ts__operand(out, &o);
    int bn = p->nd - 2, j = bn;
    o.ndim = p->nd;
    for (int d = 0; d < bn; d++) {
        o.shape[d] = p->shape[d];
        o.strides[d] = out->strides[d];
    }
    /* Promoted dims get the strides a dense matrix would have, so BLAS sees a proper
     * leading dimension. */
    o.shape[bn] = p->shape[bn];
    o.shape[bn + 1] = p->shape[bn + 1];
    o.strides[bn] = p->a_vec ? 0 : out->strides[j++];
    o.strides[bn + 1] = p->b_vec ? 1 : out->strides[j++];
    if (p->a_vec)
        o.strides[bn] = o.strides[bn + 1] * (p->shape[bn + 1] > 1 ? p->shape[bn + 1] : 1);
    ts_operand in[2] = {p->a, p->b};
    ts_matmul_params mp = {1.0, 0.0};
    return ts__run(out->storage->dev, TS_OP_MATMUL, in, 2, &o, 1, &mp, sizeof mp);
}

TS_API ts_status ts_matmul(const ts_tensor *a, const ts_tensor *b, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "matmul: out is NULL");
    *out = NULL;
    if (!a || !b)
        return ts__fail(TS_EINVAL, "matmul: tensor is NULL");
    TS__AUTOCAST(TS__AC_LOW, 2, ((const ts_tensor *const[]){a, b}),
                 ts_matmul(ac_[0], ac_[1], out));
    mm_plan p;
    ts_status s = mm_plan_make(a, b, &p);
    if (s)
        return s;
    ts_tensor *o;
    if ((s = ts__new(a->storage->dev, a->dtype, p.ond, p.oshape, &o)))
        return s;
    if ((s = mm_run(&p, o))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_matmul(a, b, o), o);
    *out = o;
    return TS_OK;
}

TS_API ts_status ts_matmul_out(const ts_tensor *a, const ts_tensor *b, ts_tensor *out)
{
    if (!a || !b || !out)
        return ts__fail(TS_EINVAL, "matmul_out: tensor is NULL");
    mm_plan p;
    ts_status s = mm_plan_make(a, b, &p);
    if (s)
        return s;
    char b1[160], b2[160];
    int same = out->ndim == p.ond && out->dtype == a->dtype && out->storage->dev == a->storage->dev;
    for (int d = 0; same && d < p.ond; d++)
        same = out->shape[d] == p.oshape[d];
    if (!same)
        return ts__fail(TS_ESHAPE, "matmul_out: out is %s %s on '%s', the result %s %s on '%s'",
                        ts_dtype_name(out->dtype), ts__shape_str(out->ndim, out->shape, b1, 160),
                        ts_device_name(out->storage->dev), ts_dtype_name(a->dtype),
                        ts__shape_str(p.ond, p.oshape, b2, 160), ts_device_name(a->storage->dev));
    const ts_tensor *const ins[2] = {a, b};
    if ((s = ts__check_inplace("matmul_out", out)))
        return s;
    if (ts__grad_needed(2, ins))
        return ts__fail(TS_ESTATE, "matmul_out: an input requires grad, but out= records no "
                        "gradient; use ts_matmul");
    if (ts_tensor_shares_storage(a, out) || ts_tensor_shares_storage(b, out)) {
        ts_tensor *tmp;
        if ((s = ts_matmul(a, b, &tmp)))
            return s;
        s = ts_copy_(out, tmp);
        ts_tensor_unref(tmp);
        return s;
    }
    if ((s = mm_run(&p, out)) == TS_OK)
        ts__bump_version(out);
    return s;
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

/* Whether b (a matmul's second operand, promoted) is a transposed view, its rows adjacent
 * (stride 1 down a column), and broadcast over no batch dim of the product g (a, b's partner,
 * already folded to 2-D when b is one matrix): then b's gradient can be made in b's own
 * layout. */
static int transposed_unbroadcast(const ts_tensor *a, const ts_tensor *b, const ts_tensor *g)
{
    if (!b)
        return 0;
    const int nd = ts_tensor_ndim(b);
    const int64_t *bs = ts_tensor_strides(b), *bsh = ts_tensor_shape(b);
    if (nd < 2 || bs[nd - 2] != 1 || bsh[nd - 2] < 2 || bsh[nd - 1] < 2 ||
        bs[nd - 1] < bsh[nd - 2] || ts_tensor_ndim(g) != nd || ts_tensor_ndim(a) != nd)
        return 0;
    for (int d = 0; d < nd - 2; d++)
        if (bsh[d] != ts_tensor_shape(g)[d])
            return 0;
    return 1;
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
    if (n->needs[1] && a && g2 && transposed_unbroadcast(a, b, g2))
        /* b is a transposed view (linear's W^T, attention's k^T): gb^T = g^T @ a is made
         * dense, so the transpose's backward hands b's own tensor a dense gradient (no copy,
         * and no strided pass where it is added up). */
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
