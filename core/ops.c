/* core/ops.c: the elementwise operations. Each checks devices, dtypes and shapes (NumPy
 * broadcasting) with messages naming both sides, resolves broadcasting into stride-0 operand
 * dims, protects outputs that overlap inputs, and runs one kernel; their backward is in
 * grad_fns.c. The other families, each front end beside its backward, are core/op_*.c. */
#include <string.h>

#include "grad_fns.h"

/* ---- checks and helpers shared with op_*.c --------------------------------------------- */

ts_status ts__check_pair(const char *op, const ts_tensor *a, const ts_tensor *b, int same_dtype)
{
    if (!a || !b)
        return ts__fail(TS_EINVAL, "%s: tensor is NULL", op);
    if (a->storage->dev != b->storage->dev)
        return ts__fail(TS_EDEVICE, "%s: tensors on different devices ('%s' and '%s'); move "
                        "one with ts_tensor_to",
                        op, ts_device_name(a->storage->dev), ts_device_name(b->storage->dev));
    if (same_dtype && a->dtype != b->dtype)
        return ts__fail(TS_EDTYPE, "%s: dtypes %s and %s differ; convert one with ts_cast", op,
                        ts_dtype_name(a->dtype), ts_dtype_name(b->dtype));
    return TS_OK;
}

ts_status ts__broadcast(const char *op, int n, const ts_tensor *const *ts, int *nd,
                        int64_t *shape)
{
    int out_nd = 0;
    for (int i = 0; i < n; i++)
        out_nd = ts[i]->ndim > out_nd ? ts[i]->ndim : out_nd;
    for (int d = 0; d < out_nd; d++)
        shape[d] = 1;
    for (int i = 0; i < n; i++) {
        int lead = out_nd - ts[i]->ndim;
        for (int d = 0; d < ts[i]->ndim; d++) {
            int64_t s = ts[i]->shape[d], *o = &shape[d + lead];
            if (*o == 1)
                *o = s;
            else if (s != 1 && s != *o) {
                char b[4][160];
                return ts__fail(TS_ESHAPE, "%s: shapes %s and %s cannot be broadcast together",
                                op, ts__shape_str(ts[0]->ndim, ts[0]->shape, b[0], 160),
                                ts__shape_str(ts[i]->ndim, ts[i]->shape, b[1], 160));
            }
        }
    }
    *nd = out_nd;
    return TS_OK;
}

void ts__operand_bcast(const ts_tensor *t, int nd, const int64_t *shape, ts_operand *op)
{
    ts__operand(t, op);
    int lead = nd - t->ndim;
    op->ndim = nd;
    for (int d = nd - 1; d >= 0; d--) {
        int sd = d - lead;
        op->shape[d] = shape[d];
        op->strides[d] = sd >= 0 && t->shape[sd] == shape[d] ? t->strides[sd] : 0;
    }
}

static int same_layout(const ts_tensor *a, const ts_tensor *b)
{
    if (a->storage != b->storage || a->offset != b->offset || a->ndim != b->ndim)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->shape[d] != b->shape[d] || (a->shape[d] > 1 && a->strides[d] != b->strides[d]))
            return 0;
    return 1;
}

ts_status ts__guard_input(const ts_tensor *in, const ts_tensor *out, int elementwise,
                          ts_tensor **safe)
{
    *safe = NULL;
    if (in->storage != out->storage || (elementwise && same_layout(in, out)))
        return TS_OK;
    return ts_tensor_clone(in, safe);
}

ts_status ts__new(ts_device *dev, int32_t dtype, int nd, const int64_t *shape, ts_tensor **out)
{
    return ts_tensor_empty(dev, dtype, nd, shape, out);
}

static int is_comparison(int fn)
{
    return fn >= TS_BINARY_EQ && fn <= TS_BINARY_GE;
}


/* out= and in-place forms write into existing tensors and record nothing: refuse them where
 * a gradient would silently go missing. */
static ts_status no_grad_write(const char *op, const ts_tensor *out, int n,
                               const ts_tensor *const *in)
{
    ts_status s = ts__check_inplace(op, out);
    if (s == TS_OK && ts__grad_needed(n, in))
        s = ts__fail(TS_ESTATE, "%s: an input requires grad, but the out=/in-place form records "
                     "no gradient; use the form that returns a new tensor, or ts_no_grad_enter()",
                     op);
    return s;
}

/* ---- binary ---------------------------------------------------------------------------- */

/* Runs fn(a, b) into out (whose shape is the broadcast shape). */
static ts_status binary_run(int fn, const ts_tensor *a, const ts_tensor *b, ts_tensor *out)
{
    ts_tensor *sa, *sb;
    ts_status s = ts__guard_input(a, out, 1, &sa);
    if (s)
        return s;
    if ((s = ts__guard_input(b, out, 1, &sb))) {
        ts_tensor_unref(sa);
        return s;
    }
    ts_operand in[2], o;
    ts__operand(out, &o);
    ts__operand_bcast(sa ? sa : a, out->ndim, out->shape, &in[0]);
    ts__operand_bcast(sb ? sb : b, out->ndim, out->shape, &in[1]);
    ts_binary_params p = {fn};
    s = ts__run(out->storage->dev, TS_OP_BINARY, in, 2, &o, 1, &p, sizeof p);
    ts_tensor_unref(sa);
    ts_tensor_unref(sb);
    return s;
}

static ts_status binary_check(int fn, const ts_tensor *a, const ts_tensor *b, int *nd,
                              int64_t *shape)
{
    if (fn < 0 || fn >= TS_BINARY_COUNT)
        return ts__fail(TS_EINVAL, "binary: unknown function %d", fn);
    ts_status s = ts__check_pair(ts_fn_name(TS_OP_BINARY, fn), a, b, 1);
    if (s)
        return s;
    const ts_tensor *const pair[2] = {a, b};
    return ts__broadcast(ts_fn_name(TS_OP_BINARY, fn), 2, pair, nd, shape);
}

/* A 16-bit float beside another float dtype: the dtype both are computed in (the other; float32
 * for bfloat16 beside float16), as PyTorch promotes them. -1 for any other pair. */
static int32_t half_promotion(const ts_tensor *a, const ts_tensor *b)
{
    if (!a || !b || a->dtype == b->dtype || !ts__dtype_is_float(a->dtype) ||
        !ts__dtype_is_float(b->dtype))
        return -1;
    int ha = ts_plugin_dtype_is_half(a->dtype), hb = ts_plugin_dtype_is_half(b->dtype);
    return ha && hb ? TS_F32 : ha ? b->dtype : hb ? a->dtype : -1;
}

/* t in dtype dt: t itself when it is (a new reference), else its cast. */
static ts_status as_dtype(const ts_tensor *t, int32_t dt, ts_tensor **out)
{
    if (t->dtype != dt)
        return ts_cast(t, dt, out);
    *out = ts_tensor_ref((ts_tensor *)t);
    return TS_OK;
}

/* The pair in dtype dt (each a new reference; the one already in dt not copied); the op runs on
 * it. */
static ts_status promote_pair(const ts_tensor *a, const ts_tensor *b, int32_t dt,
                              ts_tensor **pa, ts_tensor **pb)
{
    *pa = *pb = NULL;
    ts_status s = as_dtype(a, dt, pa);
    if (s == TS_OK && (s = as_dtype(b, dt, pb)) != TS_OK) {
        ts_tensor_unref(*pa);
        *pa = NULL;
    }
    return s;
}

TS_API ts_status ts_binary(int fn, const ts_tensor *a, const ts_tensor *b, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "binary: out is NULL");
    *out = NULL;
    int32_t pd = half_promotion(a, b);
    if (pd >= 0) {
        ts_tensor *pa, *pb;
        ts_status s = promote_pair(a, b, pd, &pa, &pb);
        if (s == TS_OK)
            s = ts_binary(fn, pa, pb, out);
        ts_tensor_unref(pa);
        ts_tensor_unref(pb);
        return s;
    }
    int nd = 0;
    int64_t shape[TS_MAX_DIMS];
    ts_status s = binary_check(fn, a, b, &nd, shape);
    if (s)
        return s;
    ts_tensor *o;
    if ((s = ts__new(a->storage->dev, is_comparison(fn) ? TS_U8 : a->dtype, nd, shape, &o)))
        return s;
    if ((s = binary_run(fn, a, b, o))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_binary(fn, a, b, o), o);
    *out = o;
    return TS_OK;
}

static ts_status check_out(const char *op, const ts_tensor *out, ts_device *dev, int32_t dtype,
                           int nd, const int64_t *shape)
{
    char b1[160], b2[160];
    if (!out)
        return ts__fail(TS_EINVAL, "%s: out is NULL", op);
    if (out->storage->dev != dev)
        return ts__fail(TS_EDEVICE, "%s: out is on '%s', the inputs on '%s'", op,
                        ts_device_name(out->storage->dev), ts_device_name(dev));
    if (out->dtype != dtype)
        return ts__fail(TS_EDTYPE, "%s: out is %s, the result is %s", op,
                        ts_dtype_name(out->dtype), ts_dtype_name(dtype));
    int same = out->ndim == nd;
    for (int d = 0; same && d < nd; d++)
        same = out->shape[d] == shape[d];
    if (!same)
        return ts__fail(TS_ESHAPE, "%s: out has shape %s, the result %s", op,
                        ts__shape_str(out->ndim, out->shape, b1, sizeof b1),
                        ts__shape_str(nd, shape, b2, sizeof b2));
    return TS_OK;
}

TS_API ts_status ts_binary_out(int fn, const ts_tensor *a, const ts_tensor *b, ts_tensor *out)
{
    int nd = 0;
    int64_t shape[TS_MAX_DIMS];
    ts_status s = binary_check(fn, a, b, &nd, shape);
    const ts_tensor *const ins[2] = {a, b};
    if (s || (s = check_out(ts_fn_name(TS_OP_BINARY, fn), out, a->storage->dev,
                            is_comparison(fn) ? TS_U8 : a->dtype, nd, shape)) ||
        (s = no_grad_write(ts_fn_name(TS_OP_BINARY, fn), out, 2, ins)))
        return s;
    if ((s = binary_run(fn, a, b, out)) == TS_OK)
        ts__bump_version(out);
    return s;
}

TS_API ts_status ts_binary_(int fn, ts_tensor *a, const ts_tensor *b)
{
    if (fn >= 0 && fn < TS_BINARY_COUNT && is_comparison(fn))
        return ts__fail(TS_EDTYPE, "%s_: a comparison gives uint8 and cannot be done in place",
                        ts_fn_name(TS_OP_BINARY, fn));
    return ts_binary_out(fn, a, b, a);
}

/* ---- scalar ---------------------------------------------------------------------------- */

static ts_status scalar_run(int fn, const ts_tensor *x, double scalar, int first, ts_tensor *out)
{
    ts_operand in, o;
    ts__operand(x, &in);
    ts__operand(out, &o);
    ts_scalar_params p = {fn, first != 0, scalar};
    return ts__run(out->storage->dev, TS_OP_BINARY_SCALAR, &in, 1, &o, 1, &p, sizeof p);
}

TS_API ts_status ts_binary_scalar(int fn, const ts_tensor *x, double scalar, int scalar_first,
                                  ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "binary_scalar: out is NULL");
    *out = NULL;
    if (!x)
        return ts__fail(TS_EINVAL, "binary_scalar: tensor is NULL");
    if (fn < 0 || fn >= TS_BINARY_COUNT)
        return ts__fail(TS_EINVAL, "binary_scalar: unknown function %d", fn);
    ts_tensor *o;
    ts_status s = ts__new(x->storage->dev, is_comparison(fn) ? TS_U8 : x->dtype, x->ndim,
                          x->shape, &o);
    if (s)
        return s;
    if ((s = scalar_run(fn, x, scalar, scalar_first, o))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_scalar(fn, x, scalar, scalar_first, o), o);
    *out = o;
    return TS_OK;
}

TS_API ts_status ts_binary_scalar_(int fn, ts_tensor *x, double scalar)
{
    if (!x)
        return ts__fail(TS_EINVAL, "binary_scalar_: tensor is NULL");
    if (fn < 0 || fn >= TS_BINARY_COUNT || is_comparison(fn))
        return ts__fail(TS_EINVAL, "binary_scalar_: function %d cannot be done in place", fn);
    ts_status s = ts__check_inplace(ts_fn_name(TS_OP_BINARY, fn), x);
    if (s == TS_OK)
        s = scalar_run(fn, x, scalar, 0, x);
    if (s == TS_OK)
        ts__bump_version(x);
    return s;
}

/* ---- unary ----------------------------------------------------------------------------- */

static ts_status unary_run(int fn, const ts_tensor *x, ts_tensor *out)
{
    ts_tensor *sx;
    ts_status s = ts__guard_input(x, out, 1, &sx);
    if (s)
        return s;
    ts_operand in, o;
    ts__operand(sx ? sx : x, &in);
    ts__operand(out, &o);
    ts_unary_params p = {fn};
    s = ts__run(out->storage->dev, TS_OP_UNARY, &in, 1, &o, 1, &p, sizeof p);
    ts_tensor_unref(sx);
    return s;
}

TS_API ts_status ts_unary(int fn, const ts_tensor *x, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "unary: out is NULL");
    *out = NULL;
    if (!x)
        return ts__fail(TS_EINVAL, "unary: tensor is NULL");
    if (fn < 0 || fn >= TS_UNARY_COUNT)
        return ts__fail(TS_EINVAL, "unary: unknown function %d", fn);
    ts_tensor *o;
    ts_status s = ts__new(x->storage->dev, x->dtype, x->ndim, x->shape, &o);
    if (s)
        return s;
    if ((s = unary_run(fn, x, o))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_unary(fn, x, o), o);
    *out = o;
    return TS_OK;
}

TS_API ts_status ts_unary_out(int fn, const ts_tensor *x, ts_tensor *out)
{
    if (!x)
        return ts__fail(TS_EINVAL, "unary: tensor is NULL");
    if (fn < 0 || fn >= TS_UNARY_COUNT)
        return ts__fail(TS_EINVAL, "unary: unknown function %d", fn);
    ts_status s = check_out(ts_fn_name(TS_OP_UNARY, fn), out, x->storage->dev, x->dtype,
                            x->ndim, x->shape);
    if (s == TS_OK)
        s = no_grad_write(ts_fn_name(TS_OP_UNARY, fn), out, 1, &x);
    if (s == TS_OK && (s = unary_run(fn, x, out)) == TS_OK)
        ts__bump_version(out);
    return s;
}

TS_API ts_status ts_unary_(int fn, ts_tensor *x)
{
    return ts_unary_out(fn, x, x);
}

/* ---- named wrappers -------------------------------------------------------------------- */

#define BINARY_WRAPPER(name, fn)                                                            \
    TS_API ts_status ts_##name(const ts_tensor *a, const ts_tensor *b, ts_tensor **out)    \
    {                                                                                       \
        return ts_binary(fn, a, b, out);                                                    \
    }
BINARY_WRAPPER(add, TS_BINARY_ADD)
BINARY_WRAPPER(sub, TS_BINARY_SUB)
BINARY_WRAPPER(mul, TS_BINARY_MUL)
BINARY_WRAPPER(div, TS_BINARY_DIV)
BINARY_WRAPPER(pow, TS_BINARY_POW)
BINARY_WRAPPER(maximum, TS_BINARY_MAXIMUM)
BINARY_WRAPPER(minimum, TS_BINARY_MINIMUM)
BINARY_WRAPPER(eq, TS_BINARY_EQ)
BINARY_WRAPPER(ne, TS_BINARY_NE)
BINARY_WRAPPER(lt, TS_BINARY_LT)
BINARY_WRAPPER(le, TS_BINARY_LE)
BINARY_WRAPPER(gt, TS_BINARY_GT)
BINARY_WRAPPER(ge, TS_BINARY_GE)

#define INPLACE_WRAPPER(name, fn)                                                           \
    TS_API ts_status ts_##name##_(ts_tensor *a, const ts_tensor *b)                        \
    {                                                                                       \
        return ts_binary_(fn, a, b);                                                        \
    }
INPLACE_WRAPPER(add, TS_BINARY_ADD)
INPLACE_WRAPPER(sub, TS_BINARY_SUB)
INPLACE_WRAPPER(mul, TS_BINARY_MUL)
INPLACE_WRAPPER(div, TS_BINARY_DIV)

TS_API ts_status ts_add_out(const ts_tensor *a, const ts_tensor *b, ts_tensor *out)
{
    return ts_binary_out(TS_BINARY_ADD, a, b, out);
}

TS_API ts_status ts_mul_out(const ts_tensor *a, const ts_tensor *b, ts_tensor *out)
{
    return ts_binary_out(TS_BINARY_MUL, a, b, out);
}

TS_API ts_status ts_add_scalar(const ts_tensor *x, double s, ts_tensor **out)
{
    return ts_binary_scalar(TS_BINARY_ADD, x, s, 0, out);
}

TS_API ts_status ts_mul_scalar(const ts_tensor *x, double s, ts_tensor **out)
{
    return ts_binary_scalar(TS_BINARY_MUL, x, s, 0, out);
}

TS_API ts_status ts_pow_scalar(const ts_tensor *x, double s, ts_tensor **out)
{
    return ts_binary_scalar(TS_BINARY_POW, x, s, 0, out);
}

TS_API ts_status ts_add_scalar_(ts_tensor *x, double s)
{
    return ts_binary_scalar_(TS_BINARY_ADD, x, s);
}

TS_API ts_status ts_mul_scalar_(ts_tensor *x, double s)
{
    return ts_binary_scalar_(TS_BINARY_MUL, x, s);
}

#define UNARY_WRAPPER(name, fn)                                                             \
    TS_API ts_status ts_##name(const ts_tensor *x, ts_tensor **out)                        \
    {                                                                                       \
        return ts_unary(fn, x, out);                                                        \
    }
UNARY_WRAPPER(neg, TS_UNARY_NEG)
UNARY_WRAPPER(abs, TS_UNARY_ABS)
UNARY_WRAPPER(exp, TS_UNARY_EXP)
UNARY_WRAPPER(log, TS_UNARY_LOG)
UNARY_WRAPPER(sqrt, TS_UNARY_SQRT)
UNARY_WRAPPER(rsqrt, TS_UNARY_RSQRT)
UNARY_WRAPPER(tanh, TS_UNARY_TANH)
UNARY_WRAPPER(sigmoid, TS_UNARY_SIGMOID)
UNARY_WRAPPER(relu, TS_UNARY_RELU)
UNARY_WRAPPER(gelu, TS_UNARY_GELU)
UNARY_WRAPPER(gelu_tanh, TS_UNARY_GELU_TANH)
UNARY_WRAPPER(silu, TS_UNARY_SILU)

/* ---- where, cast, fill, copy ----------------------------------------------------------- */

TS_API ts_status ts_where(const ts_tensor *cond, const ts_tensor *a, const ts_tensor *b,
                          ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "where: out is NULL");
    *out = NULL;
    int32_t pd = half_promotion(a, b);
    if (pd >= 0) {
        ts_tensor *pa, *pb;
        ts_status s = promote_pair(a, b, pd, &pa, &pb);
        if (s == TS_OK)
            s = ts_where(cond, pa, pb, out);
        ts_tensor_unref(pa);
        ts_tensor_unref(pb);
        return s;
    }
    ts_status s;
    if ((s = ts__check_pair("where", a, b, 1)) || (s = ts__check_pair("where", cond, a, 0)))
        return s;
    if (cond->dtype != TS_U8)
        return ts__fail(TS_EDTYPE, "where: the condition is %s; it must be uint8 (a mask from "
                        "a comparison)",
                        ts_dtype_name(cond->dtype));
    const ts_tensor *const three[3] = {cond, a, b};
    int nd;
    int64_t shape[TS_MAX_DIMS];
    if ((s = ts__broadcast("where", 3, three, &nd, shape)))
        return s;
    ts_tensor *o;
    if ((s = ts__new(a->storage->dev, a->dtype, nd, shape, &o)))
        return s;
    ts_operand in[3], op;
    for (int i = 0; i < 3; i++)
        ts__operand_bcast(three[i], nd, shape, &in[i]);
    ts__operand(o, &op);
    if ((s = ts__run(o->storage->dev, TS_OP_WHERE, in, 3, &op, 1, NULL, 0))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_where(cond, a, b, o), o);
    *out = o;
    return TS_OK;
}

TS_API ts_status ts_cast(const ts_tensor *x, int32_t dtype, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "cast: out is NULL");
    *out = NULL;
    if (!x)
        return ts__fail(TS_EINVAL, "cast: tensor is NULL");
    if (ts_dtype_size(dtype) == 0)
        return ts__fail(TS_EDTYPE, "cast: unknown dtype %d", (int)dtype);
    ts_tensor *o;
    ts_status s = ts__new(x->storage->dev, dtype, x->ndim, x->shape, &o);
    if (s)
        return s;
    ts_operand in, op;
    ts__operand(x, &in);
    ts__operand(o, &op);
    if ((s = ts__run(o->storage->dev, x->dtype == dtype ? TS_OP_COPY : TS_OP_CAST, &in, 1, &op,
                     1, NULL, 0))) {
        ts_tensor_unref(o);
        return s;
    }
    TS__RECORD(ts__ag_cast(x, o), o);
    *out = o;
    return TS_OK;
}

TS_API ts_status ts_fill_(ts_tensor *t, double value)
{
    if (!t)
        return ts__fail(TS_EINVAL, "fill_: tensor is NULL");
    ts_status s = ts__check_inplace("fill_", t);
    if (s)
        return s;
    ts_operand o;
    ts__operand(t, &o);
    ts_fill_params p = {value};
    s = ts__run(t->storage->dev, TS_OP_FILL, NULL, 0, &o, 1, &p, sizeof p);
    if (s == TS_OK)
        ts__bump_version(t);
    return s;
}

TS_API ts_status ts_zero_(ts_tensor *t)
{
    return ts_fill_(t, 0.0);
}

TS_API ts_status ts_copy_(ts_tensor *dst, const ts_tensor *src)
{
    if (!dst || !src)
        return ts__fail(TS_EINVAL, "copy_: tensor is NULL");
    ts_tensor *moved = NULL, *safe = NULL;
    ts_status s = no_grad_write("copy_", dst, 1, &src);
    if (s)
        return s;
    if (src->storage->dev != dst->storage->dev) {
        if ((s = ts_tensor_to(src, dst->storage->dev, &moved)))
            return s;
        src = moved;
    }
    const ts_tensor *const pair[2] = {dst, src};
    int nd;
    int64_t shape[TS_MAX_DIMS];
    char b1[160], b2[160];
    if ((s = ts__broadcast("copy_", 2, pair, &nd, shape)))
        goto out;
    if (nd != dst->ndim || memcmp(shape, dst->shape, sizeof(int64_t) * (size_t)nd) != 0) {
        s = ts__fail(TS_ESHAPE, "copy_: source %s does not broadcast to destination %s",
                     ts__shape_str(src->ndim, src->shape, b1, sizeof b1),
                     ts__shape_str(dst->ndim, dst->shape, b2, sizeof b2));
        goto out;
    }
    if ((s = ts__guard_input(src, dst, 1, &safe)))
        goto out;
    ts_operand in, o;
    ts__operand_bcast(safe ? safe : src, nd, shape, &in);
    ts__operand(dst, &o);
    s = ts__run(dst->storage->dev, src->dtype == dst->dtype ? TS_OP_COPY : TS_OP_CAST, &in, 1,
                &o, 1, NULL, 0);
    if (s == TS_OK)
        ts__bump_version(dst);
out:
    ts_tensor_unref(safe);
    ts_tensor_unref(moved);
    return s;
}
