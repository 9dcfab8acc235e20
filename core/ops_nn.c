/* core/ops_nn.c: matmul (NumPy semantics), softmax, index_select / embedding / index_add,
 * conv2d and pooling: shape checks with both shapes in the message, then one kernel. */
#include <math.h>
#include <string.h>

#include "grad_fns.h"

static ts_status need_float(const char *op, const ts_tensor *t)
{
    if (!ts_plugin_dtype_is_float(t->dtype))
        return ts__fail(TS_EDTYPE, "%s: %s tensor; this op needs float32 or float64", op,
                        ts_dtype_name(t->dtype));
    return TS_OK;
}

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
    if (s || (s = need_float("matmul", a)))
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

/* ---- softmax --------------------------------------------------------------------------- */

static ts_status softmax_op(const char *name, int32_t op, const ts_tensor *x, int dim,
                            ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "%s: out is NULL", name);
    *out = NULL;
    if (!x)
        return ts__fail(TS_EINVAL, "%s: tensor is NULL", name);
    ts_status s = need_float(name, x);
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
    return softmax_op("softmax", TS_OP_SOFTMAX, x, dim, out);
}

TS_API ts_status ts_log_softmax(const ts_tensor *x, int dim, ts_tensor **out)
{
    return softmax_op("log_softmax", TS_OP_LOG_SOFTMAX, x, dim, out);
}

/* ---- indexing -------------------------------------------------------------------------- */

static ts_status check_index(const char *name, const ts_tensor *x, const ts_tensor *index,
                             int dim, int *d)
{
    ts_status s = ts__check_pair(name, x, index, 0);
    if (s)
        return s;
    if (index->dtype != TS_I64 && index->dtype != TS_I32)
        return ts__fail(TS_EDTYPE, "%s: index is %s; it must be int64 or int32", name,
                        ts_dtype_name(index->dtype));
    if (index->ndim != 1) {
        char b[160];
        return ts__fail(TS_ESHAPE, "%s: index must be 1-D, got %s", name,
                        ts__shape_str(index->ndim, index->shape, b, sizeof b));
    }
    *d = ts__dim(dim, x->ndim);
    if (*d < 0 || x->ndim == 0)
        return ts__fail(TS_EINVAL, "%s: dim %d is out of range for a %d-d tensor", name, dim,
                        x->ndim);
    return TS_OK;
}

TS_API ts_status ts_index_select(const ts_tensor *x, int dim, const ts_tensor *index,
                                 ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "index_select: out is NULL");
    *out = NULL;
    if (!x || !index)
        return ts__fail(TS_EINVAL, "index_select: tensor is NULL");
    int d;
    ts_status s = check_index("index_select", x, index, dim, &d);
    if (s)
        return s;
    int64_t shape[TS_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[d] = index->shape[0];
    ts_tensor *o;
    if ((s = ts__new(x->storage->dev, x->dtype, x->ndim, shape, &o)))
        return s;
    ts_operand in[2], op;
    ts__operand(x, &in[0]);
    ts__operand(index, &in[1]);
    ts__operand(o, &op);
    ts_dim_params p = {d};
    if ((s = ts__run(o->storage->dev, TS_OP_INDEX_SELECT, in, 2, &op, 1, &p, sizeof p))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_index_select(x, d, index, o), o);
    *out = o;
    return TS_OK;
}

TS_API ts_status ts_embedding(const ts_tensor *weight, const ts_tensor *index, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "embedding: out is NULL");
    *out = NULL;
    if (!weight || !index)
        return ts__fail(TS_EINVAL, "embedding: tensor is NULL");
    if (index->ndim + weight->ndim - 1 > TS_MAX_DIMS)
        return ts__fail(TS_ESHAPE, "embedding: too many dims");
    ts_tensor *flat, *rows;
    int64_t n = ts_tensor_numel(index);
    ts_status s = ts_tensor_reshape((ts_tensor *)index, 1, &n, &flat);
    if (s)
        return s;
    s = ts_index_select(weight, 0, flat, &rows);
    ts_tensor_unref(flat);
    if (s)
        return s;
    int64_t shape[TS_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < index->ndim; d++)
        shape[nd++] = index->shape[d];
    for (int d = 1; d < weight->ndim; d++)
        shape[nd++] = weight->shape[d];
    s = ts_tensor_view(rows, nd, shape, out);
    ts_tensor_unref(rows);
    return s;
}

TS_API ts_status ts_index_add_(ts_tensor *x, int dim, const ts_tensor *index,
                               const ts_tensor *src)
{
    if (!x || !index || !src)
        return ts__fail(TS_EINVAL, "index_add_: tensor is NULL");
    int d;
    ts_status s = check_index("index_add_", x, index, dim, &d);
    if (s || (s = ts__check_pair("index_add_", x, src, 1)))
        return s;
    int same = src->ndim == x->ndim;
    for (int i = 0; same && i < x->ndim; i++)
        same = src->shape[i] == (i == d ? index->shape[0] : x->shape[i]);
    if (!same) {
        char b1[160], b2[160];
        return ts__fail(TS_ESHAPE, "index_add_: source %s must be %s with dim %d of size %lld",
                        ts__shape_str(src->ndim, src->shape, b1, sizeof b1),
                        ts__shape_str(x->ndim, x->shape, b2, sizeof b2), d,
                        (long long)index->shape[0]);
    }
    if ((s = ts__check_inplace("index_add_", x)))
        return s;
    if (ts__grad_needed(1, &src))
        return ts__fail(TS_ESTATE, "index_add_: the source requires grad, but the in-place form "
                        "records no gradient; use ts_no_grad_enter()");
    ts_tensor *safe_src, *safe_idx;
    if ((s = ts__guard_input(src, x, 0, &safe_src)))
        return s;
    if ((s = ts__guard_input(index, x, 0, &safe_idx))) {
        ts_tensor_unref(safe_src);
        return s;
    }
    ts_operand in[2], op;
    ts__operand(safe_src ? safe_src : src, &in[0]);
    ts__operand(safe_idx ? safe_idx : index, &in[1]);
    ts__operand(x, &op);
    ts_dim_params p = {d};
    s = ts__run(x->storage->dev, TS_OP_INDEX_ADD, in, 2, &op, 1, &p, sizeof p);
    if (s == TS_OK)
        ts__bump_version(x);
    ts_tensor_unref(safe_src);
    ts_tensor_unref(safe_idx);
    return s;
}

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
    char b1[160], b2[160];
    ts_status s = ts__check_pair("conv2d", x, w, 1);
    if (s || (s = need_float("conv2d", x)))
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
    ts_status s = need_float(name, x);
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
    ts_status s = need_float(op, x);
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

/* ---- cross-entropy --------------------------------------------------------------------- */

TS_API ts_status ts_cross_entropy(const ts_tensor *logits, const ts_tensor *targets,
                                  int reduction, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "cross_entropy: out is NULL");
    *out = NULL;
    if (!logits || !targets)
        return ts__fail(TS_EINVAL, "cross_entropy: tensor is NULL");
    char b1[160], b2[160];
    ts_status s = ts__check_pair("cross_entropy", logits, targets, 0);
    if (s || (s = need_float("cross_entropy", logits)))
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

/* ---- RMS norm --------------------------------------------------------------------------- */

TS_API ts_status ts_rms_norm(const ts_tensor *x, const ts_tensor *weight, int ndim, double eps,
                             ts_tensor **out)
{
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
