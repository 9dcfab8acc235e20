/* kernels/host/opcheck.c: argument checks and operand helpers shared by every plugin's
 * kernels, host or not: convolution and matmul shape checks, the overlap test, dense
 * operands, and each op family's validation (counts, params, operands, dtypes, shapes) that
 * the host kernels and the cuda plugin both call. Uses nothing but the plugin ABI (no host
 * memory, no OpenMP), so the cuda plugin compiles it too. */
#include "hostkern.h"

#include <stdint.h>
#include <math.h>

static int64_t elem_size(int32_t dtype)
{
    return (int64_t)ts_plugin_dtype_size(dtype);
}

ts_status hk_conv_check(const ts_host *h, const char *name, const ts_conv2d_params *p,
                            const ts_operand *x, const ts_operand *w, const ts_operand *y,
                            const ts_operand *bias, const char *yname, hk_conv_dims *d)
{
    int32_t dt = y->dtype;
    if (x->dtype != dt || w->dtype != dt || (bias && bias->dtype != dt))
        return h->fail(h, TS_EINVAL, "%s: operand dtypes differ", name);
    if (x->ndim != 4 || w->ndim != 4 || y->ndim != 4 || (bias && bias->ndim != 1))
        return h->fail(h, TS_ESHAPE, "%s: x, w, y must be 4-D and bias 1-D", name);
    if (p->stride_h < 1 || p->stride_w < 1 || p->dilation_h < 1 || p->dilation_w < 1 ||
        p->pad_h < 0 || p->pad_w < 0 || p->groups < 1)
        return h->fail(h, TS_EINVAL, "%s: stride (%d, %d) and dilation (%d, %d) must be >= 1, "
                       "padding (%d, %d) >= 0 and groups (%d) >= 1", name, (int)p->stride_h,
                       (int)p->stride_w, (int)p->dilation_h, (int)p->dilation_w, (int)p->pad_h,
                       (int)p->pad_w, (int)p->groups);
    int64_t N = x->shape[0], C = x->shape[1], H = x->shape[2], W = x->shape[3];
    int64_t K = w->shape[0], R = w->shape[2], S = w->shape[3], G = p->groups;
    if (C % G || K % G || w->shape[1] != C / G)
        return h->fail(h, TS_EINVAL, "%s: groups %lld must divide C %lld and K %lld, and w "
                       "needs C/groups input channels (has %lld)", name, (long long)G,
                       (long long)C, (long long)K, (long long)w->shape[1]);
    int64_t hspan = H + 2 * (int64_t)p->pad_h - (int64_t)p->dilation_h * (R - 1) - 1;
    int64_t wspan = W + 2 * (int64_t)p->pad_w - (int64_t)p->dilation_w * (S - 1) - 1;
    if (R < 1 || S < 1 || hspan < 0 || wspan < 0)
        return h->fail(h, TS_EINVAL, "%s: kernel %lldx%lld (dilation %d, %d) does not fit "
                       "the padded %lldx%lld input", name, (long long)R, (long long)S,
                       (int)p->dilation_h, (int)p->dilation_w, (long long)H, (long long)W);
    int64_t P = hspan / p->stride_h + 1, Q = wspan / p->stride_w + 1;
    if (y->shape[0] != N || y->shape[1] != K || y->shape[2] != P || y->shape[3] != Q ||
        (bias && bias->shape[0] != K))
        return h->fail(h, TS_ESHAPE, "%s: %s is (%lld, %lld, %lld, %lld), expected (%lld, "
                       "%lld, %lld, %lld)%s", name, yname, (long long)y->shape[0],
                       (long long)y->shape[1], (long long)y->shape[2], (long long)y->shape[3],
                       (long long)N, (long long)K, (long long)P, (long long)Q,
                       bias && bias->shape[0] != K ? "; bias length differs from K" : "");
    *d = (hk_conv_dims){N, C, H, W, K, R, S, P, Q, G};
    return TS_OK;
}

ts_status hk_matmul_check(const ts_host *h, const ts_kernel_call *call,
                                   hk_matmul_dims *md)
{
    if (call->ninputs != 2 || call->noutputs != 1)
        return h->fail(h, TS_EINVAL, "matmul: expects 2 inputs and 1 output, got %d and %d",
                       (int)call->ninputs, (int)call->noutputs);
    const ts_operand *A = &call->inputs[0], *B = &call->inputs[1], *C = &call->outputs[0];
    int32_t dt = C->dtype;
    if (A->dtype != dt || B->dtype != dt)
        return h->fail(h, TS_EINVAL, "matmul: dtypes differ (%d, %d -> %d)", (int)A->dtype,
                       (int)B->dtype, (int)dt);
    int nd = C->ndim;
    if (nd < 2 || A->ndim != nd || B->ndim != nd)
        return h->fail(h, TS_ESHAPE, "matmul: operands need the same ndim >= 2 (%d, %d -> %d)",
                       (int)A->ndim, (int)B->ndim, nd);
    int64_t M = A->shape[nd - 2], K = A->shape[nd - 1], N = B->shape[nd - 1], nbatch = 1;
    int bad = B->shape[nd - 2] != K || C->shape[nd - 2] != M || C->shape[nd - 1] != N;
    for (int d = 0; d < nd - 2; d++) {
        bad |= A->shape[d] != C->shape[d] || B->shape[d] != C->shape[d];
        nbatch *= C->shape[d];
    }
    if (bad)
        return h->fail(h, TS_ESHAPE, "matmul: (..., %lld, %lld) @ (..., %lld, %lld) -> "
                       "(..., %lld, %lld) do not match", (long long)M, (long long)K,
                       (long long)B->shape[nd - 2], (long long)N,
                       (long long)C->shape[nd - 2], (long long)C->shape[nd - 1]);
    *md = (hk_matmul_dims){nd, M, K, N, nbatch};
    return TS_OK;
}

/* [lo, hi): the bytes an operand's elements span; 0 if it has no element. */
static int byte_span(const ts_operand *o, intptr_t *lo, intptr_t *hi)
{
    int64_t mn = o->offset, mx = o->offset, es = elem_size(o->dtype);
    for (int d = 0; d < o->ndim; d++) {
        if (o->shape[d] == 0)
            return 0;
        int64_t ext = (o->shape[d] - 1) * o->strides[d];
        if (ext < 0)
            mn += ext;
        else
            mx += ext;
    }
    *lo = (intptr_t)o->data + (intptr_t)(mn * es);
    *hi = (intptr_t)o->data + (intptr_t)((mx + 1) * es);
    return 1;
}

int hk_op_defined(int32_t op, int32_t dtype)
{
    if (op <= TS_OP_NONE || op >= TS_OP_COUNT || dtype < 0 || dtype >= TS_DTYPE_COUNT)
        return 0;
    if (ts_plugin_dtype_is_half(dtype)) /* copied, cast, filled; the rest in float32 */
        return hk_half_claim(op) && hk_op_defined(op, TS_F32);
    switch (op) {
    case TS_OP_COPY:
    case TS_OP_CAST:
    case TS_OP_FILL:
    case TS_OP_WHERE:
    case TS_OP_BINARY: /* uint8 output: the comparisons */
    case TS_OP_BINARY_SCALAR:
    case TS_OP_INDEX_SELECT:
    case TS_OP_INDEX_ADD:
        return 1;
    case TS_OP_UNARY:
        return dtype != TS_U8;
    case TS_OP_REDUCE: /* int64 output: also argmax / argmin */
        return dtype == TS_F32 || dtype == TS_F64 || dtype == TS_I32 || dtype == TS_I64;
    default:
        return ts_plugin_dtype_is_float(dtype);
    }
}

int hk_half_claim(int32_t op)
{
    return op > TS_OP_NONE && op < TS_OP_COUNT && op != TS_OP_SGD_STEP && op != TS_OP_ADAM_STEP;
}

int hk_call_has_half(const ts_kernel_call *call)
{
    if (call->op == TS_OP_COPY || call->op == TS_OP_CAST || call->op == TS_OP_FILL)
        return 0;
    for (int i = 0; call->inputs && i < call->ninputs; i++)
        if (ts_plugin_dtype_is_half(call->inputs[i].dtype))
            return 1;
    for (int i = 0; call->outputs && i < call->noutputs; i++)
        if (ts_plugin_dtype_is_half(call->outputs[i].dtype))
            return 1;
    return 0;
}

int hk_half_native(int32_t op)
{
    return op == TS_OP_UNARY || op == TS_OP_BINARY || op == TS_OP_BINARY_SCALAR ||
           op == TS_OP_WHERE || op == TS_OP_RELU_BACKWARD;
}

/* A softmax (or its gradient) whose 16-bit operands all run along params.dim with unit
 * strides, in rows of at most HK_HALF_ROW: the host kernels widen each row on the stack. */
static int softmax_half_rows(const ts_kernel_call *call)
{
    if (!call->params || call->params_size < sizeof(ts_dim_params) || call->noutputs != 1 ||
        call->ninputs != (call->op == TS_OP_SOFTMAX_BWD ? 2 : 1) || !call->inputs ||
        !call->outputs)
        return 0;
    const ts_operand *out = &call->outputs[0];
    int dim = out->ndim ? hk_norm_dim(((const ts_dim_params *)call->params)->dim, out->ndim) : -1;
    if (dim < 0 || out->shape[dim] > HK_HALF_ROW || !ts_plugin_dtype_is_half(out->dtype) ||
        (out->shape[dim] > 1 && out->strides[dim] != 1))
        return 0;
    for (int i = 0; i < call->ninputs; i++) {
        const ts_operand *in = &call->inputs[i];
        if (in->dtype != out->dtype || in->ndim != out->ndim || in->shape[dim] != out->shape[dim] ||
            (in->shape[dim] > 1 && in->strides[dim] != 1))
            return 0;
    }
    return 1;
}

int hk_half_native_call(const ts_kernel_call *call)
{
    if (hk_half_native(call->op))
        return 1;
    if (call->op == TS_OP_SOFTMAX || call->op == TS_OP_SOFTMAX_BWD)
        return softmax_half_rows(call);
    if (call->op != TS_OP_REDUCE || !call->params || call->params_size < sizeof(ts_reduce_params))
        return 0;
    int32_t fn = ((const ts_reduce_params *)call->params)->fn;
    return fn == TS_REDUCE_SUM || fn == TS_REDUCE_MEAN;
}

enum { VIA_MAX_IN = 8, VIA_MAX_OUT = 4 };

/* Whether call reads its outputs' values before writing them (the ABI's accumulating ops):
 * only then are they widened before the float32 call. */
static int reads_outputs(const ts_kernel_call *call)
{
    if (call->op == TS_OP_INDEX_ADD || call->op == TS_OP_SGD_STEP || call->op == TS_OP_ADAM_STEP)
        return 1;
    if (call->op == TS_OP_MATMUL) /* beta * out; a call without params has beta 0 */
        return call->params && call->params_size >= sizeof(ts_matmul_params) &&
               ((const ts_matmul_params *)call->params)->beta != 0.0;
    return 0;
}

/* o with each stride-0 (broadcast) dim cut to size 1: what its elements are. */
static ts_operand distinct_elements(const ts_operand *o)
{
    ts_operand c = *o;
    for (int k = 0; k < c.ndim; k++)
        if (c.strides[k] == 0)
            c.shape[k] = 1;
    return c;
}

ts_status hk_via_float32(const ts_host *h, int dev, const ts_kernel_call *call,
                         hk_convert_fn convert, void *cctx, hk_run_fn run, void *rctx)
{
    const char *name = ts_plugin_op_name(call->op);
    name = name ? name : "op";
    if (call->ninputs < 0 || call->noutputs < 0 || call->ninputs > VIA_MAX_IN ||
        call->noutputs > VIA_MAX_OUT || (call->ninputs && !call->inputs) ||
        (call->noutputs && !call->outputs))
        return h->fail(h, TS_EINVAL, "%s: malformed call (%d inputs, %d outputs)", name,
                       (int)call->ninputs, (int)call->noutputs);
    int nin = call->ninputs, n = nin + call->noutputs, widen_out = reads_outputs(call);
    ts_operand ops[VIA_MAX_IN + VIA_MAX_OUT], cut[VIA_MAX_IN + VIA_MAX_OUT];
    void *buf[VIA_MAX_IN + VIA_MAX_OUT] = {NULL};
    int64_t numel[VIA_MAX_IN + VIA_MAX_OUT] = {0};
    int32_t fdt = -1; /* the float dtype every float operand has (the ABI's rule) */
    ts_status s = TS_OK;
    for (int i = 0; i < n; i++) {
        const ts_operand *o = i < nin ? &call->inputs[i] : &call->outputs[i - nin];
        if ((!ts_plugin_dtype_is_float(o->dtype) && !ts_plugin_dtype_is_half(o->dtype)) ||
            (hk_attention_stats(call, i) && o->dtype == TS_F32))
            continue;
        if (fdt >= 0 && o->dtype != fdt)
            return h->fail(h, TS_EINVAL, "%s: operand dtypes differ (%s and %s)", name,
                           ts_plugin_dtype_name(fdt), ts_plugin_dtype_name(o->dtype));
        fdt = o->dtype;
    }
    for (int i = 0; i < n && s == TS_OK; i++) {
        const ts_operand *o = i < nin ? &call->inputs[i] : &call->outputs[i - nin];
        ops[i] = *o;
        if (!ts_plugin_dtype_is_half(o->dtype))
            continue;
        if ((s = hk_check_operand(h, dev, name, i < nin ? "input" : "output", o, NULL)))
            break;
        /* a float32 copy of its distinct elements only: a broadcast dim stays stride 0 */
        cut[i] = distinct_elements(o);
        int64_t cnt = 1;
        for (int k = 0; k < o->ndim; k++) {
            if (cut[i].shape[k] && cnt > INT64_MAX / 4 / cut[i].shape[k]) {
                s = h->fail(h, TS_EINVAL, "%s: operand %d is too large", name, i);
                break;
            }
            cnt *= cut[i].shape[k];
        }
        if (s)
            break;
        numel[i] = cnt;
        if ((s = h->scratch_alloc(h, (size_t)(cnt > 0 ? cnt : 1) * sizeof(float),
                                  "float32 of a 16-bit float", &buf[i])))
            break;
        ops[i] = hk_dense_like(&cut[i], buf[i]);
        ops[i].dtype = TS_F32;
        if (cnt > 0 && (i < nin || widen_out))
            s = convert(cctx, &ops[i], &cut[i]);
        for (int k = 0; k < o->ndim; k++) { /* the operand's shape again */
            ops[i].shape[k] = o->shape[k];
            if (o->strides[k] == 0)
                ops[i].strides[k] = 0;
        }
    }
    if (s == TS_OK) {
        ts_kernel_call c = *call;
        c.inputs = ops;
        c.outputs = ops + nin;
        s = run(rctx, &c);
        for (int i = nin; i < n && s == TS_OK; i++)
            if (buf[i] && numel[i] > 0) {
                ts_operand from = hk_dense_like(&cut[i], buf[i]);
                from.dtype = TS_F32;
                s = convert(cctx, &cut[i], &from);
            }
    }
    for (int i = 0; i < n; i++)
        if (buf[i])
            h->scratch_free(h, buf[i]);
    return s;
}

int hk_overlaps(const ts_operand *a, const ts_operand *b)
{
    intptr_t alo, ahi, blo, bhi;
    return byte_span(a, &alo, &ahi) && byte_span(b, &blo, &bhi) && alo < bhi && blo < ahi;
}

ts_operand hk_dense_like(const ts_operand *op, void *buf)
{
    ts_operand d = *op;
    d.data = buf;
    d.offset = 0;
    int64_t acc = 1;
    for (int k = op->ndim - 1; k >= 0; k--) {
        d.strides[k] = acc;
        acc *= op->shape[k];
    }
    return d;
}

/* ---- per-op operand validation shared by the host kernels and the cuda plugin ------------ */

static const char *dtype_name(int32_t dtype)
{
    return ts_plugin_dtype_name(dtype);
}

static int is_numeric(int32_t dt)
{
    return ts_plugin_dtype_is_float(dt) || dt == TS_I32 || dt == TS_I64;
}

int hk_norm_dim(int32_t dim, int ndim)
{
    int n = ndim > 0 ? ndim : 1;
    if (dim < -n || dim >= n)
        return -1;
    return dim < 0 ? dim + n : dim;
}

/* nin inputs and nout outputs, both arrays present; dev words the message as the cuda plugin
 * always has. */
ts_status hk_check_counts(const ts_host *h, int dev, const ts_kernel_call *call,
                                   const char *what, int nin, int nout)
{
    if (call->ninputs != nin || call->noutputs != nout) {
        if (dev)
            return h->fail(h, TS_EINVAL, "%s: expected %d input(s) and %d output(s), got %d "
                           "and %d", what, nin, nout, (int)call->ninputs, (int)call->noutputs);
        return h->fail(h, TS_EINVAL, "%s: expected %d input(s) and 1 output, got %d and %d",
                       what, nin, (int)call->ninputs, (int)call->noutputs);
    }
    if ((nin > 0 && !call->inputs) || !call->outputs)
        return h->fail(h, TS_EINVAL, "%s: NULL operand array", what);
    return TS_OK;
}

/* dtype known, 0..TS_MAX_DIMS dims, no negative size or stride; with ref, ref's shape. dev:
 * also a non-negative offset and a data pointer unless the operand is empty. */
ts_status hk_check_operand(const ts_host *h, int dev, const char *what,
                                    const char *role, const ts_operand *op,
                                    const ts_operand *ref)
{
    if (!elem_size(op->dtype))
        return h->fail(h, TS_EINVAL, "%s: %s has unknown dtype %d", what, role, (int)op->dtype);
    if (op->ndim < 0 || op->ndim > TS_MAX_DIMS)
        return h->fail(h, TS_EINVAL, "%s: %s has %d dims (0 to %d allowed)", what, role,
                       (int)op->ndim, TS_MAX_DIMS);
    for (int d = 0; d < op->ndim; d++)
        if (op->shape[d] < 0 || op->strides[d] < 0)
            return h->fail(h, TS_EINVAL, "%s: %s has size %lld / stride %lld at dim %d", what,
                           role, (long long)op->shape[d], (long long)op->strides[d], d);
    if (dev && op->offset < 0)
        return h->fail(h, TS_EINVAL, "%s: %s has a negative offset", what, role);
    if (ref) {
        int same = op->ndim == ref->ndim;
        for (int d = 0; same && d < op->ndim; d++)
            same = op->shape[d] == ref->shape[d];
        if (!same)
            return h->fail(h, TS_ESHAPE, "%s: %s has %d dims / a shape other than the output's",
                           what, role, (int)op->ndim);
    }
    int64_t n = 1;
    for (int d = 0; dev && !op->data && d < op->ndim; d++)
        n *= op->shape[d];
    if (dev && !op->data && n > 0)
        return h->fail(h, TS_EINVAL, "%s: %s has no data pointer", what, role);
    return TS_OK;
}

static ts_status check_dtype(const ts_host *h, const char *what, const char *role,
                             const ts_operand *op, int32_t dtype)
{
    if (op->dtype != dtype)
        return h->fail(h, TS_EINVAL, "%s: %s is %s, expected %s", what, role,
                       dtype_name(op->dtype), dtype_name(dtype));
    return TS_OK;
}

static ts_status get_params(const ts_host *h, const ts_kernel_call *call, const char *what,
                            size_t need, const void **params)
{
    if (!call->params || call->params_size < need)
        return h->fail(h, TS_EINVAL, "%s: params missing or too small (%u < %zu bytes)", what,
                       (unsigned)call->params_size, need);
    *params = call->params;
    return TS_OK;
}

ts_status hk_ew_check(const ts_host *h, int dev, const ts_kernel_call *call,
                               const void **params)
{
    const ts_operand *in = call->inputs, *out = call->outputs;
    ts_status s;
    *params = NULL;
    switch (call->op) {
    case TS_OP_COPY:
    case TS_OP_CAST: {
        const char *what = call->op == TS_OP_COPY ? "copy" : "cast";
        if ((s = hk_check_counts(h, dev, call, what, 1, 1)) ||
            (s = hk_check_operand(h, dev, what, "output", out, NULL)) ||
            (s = hk_check_operand(h, dev, what, "input", &in[0], out)))
            return s;
        return call->op == TS_OP_COPY ? check_dtype(h, what, "input", &in[0], out->dtype) : TS_OK;
    }
    case TS_OP_FILL:
        if ((s = hk_check_counts(h, dev, call, "fill", 0, 1)) ||
            (s = hk_check_operand(h, dev, "fill", "output", out, NULL)))
            return s;
        return get_params(h, call, "fill", sizeof(ts_fill_params), params);
    case TS_OP_UNARY:
        if ((s = hk_check_counts(h, dev, call, "unary", 1, 1)) ||
            (s = hk_check_operand(h, dev, "unary", "output", out, NULL)) ||
            (s = hk_check_operand(h, dev, "unary", "input", &in[0], out)) ||
            (s = check_dtype(h, "unary", "input", &in[0], out->dtype)))
            return s;
        return get_params(h, call, "unary", sizeof(ts_unary_params), params);
    case TS_OP_BINARY:
        if ((s = hk_check_counts(h, dev, call, "binary", 2, 1)) ||
            (s = hk_check_operand(h, dev, "binary", "output", out, NULL)) ||
            (s = hk_check_operand(h, dev, "binary", "first input", &in[0], out)) ||
            (s = hk_check_operand(h, dev, "binary", "second input", &in[1], out)))
            return s;
        return get_params(h, call, "binary", sizeof(ts_binary_params), params);
    case TS_OP_BINARY_SCALAR:
        if ((s = hk_check_counts(h, dev, call, "binary_scalar", 1, 1)) ||
            (s = hk_check_operand(h, dev, "binary_scalar", "output", out, NULL)) ||
            (s = hk_check_operand(h, dev, "binary_scalar", "input", &in[0], out)))
            return s;
        return get_params(h, call, "binary_scalar", sizeof(ts_scalar_params), params);
    case TS_OP_WHERE:
        if ((s = hk_check_counts(h, dev, call, "where", 3, 1)) ||
            (s = hk_check_operand(h, dev, "where", "output", out, NULL)) ||
            (s = hk_check_operand(h, dev, "where", "mask", &in[0], out)) ||
            (s = hk_check_operand(h, dev, "where", "second input", &in[1], out)) ||
            (s = hk_check_operand(h, dev, "where", "third input", &in[2], out)) ||
            (s = check_dtype(h, "where", "mask", &in[0], TS_U8)) ||
            (s = check_dtype(h, "where", "second input", &in[1], out->dtype)))
            return s;
        return check_dtype(h, "where", "third input", &in[2], out->dtype);
    case TS_OP_RELU_BACKWARD:
        if ((s = hk_check_counts(h, dev, call, "relu_backward", 2, 1)) ||
            (s = hk_check_operand(h, dev, "relu_backward", "output", out, NULL)) ||
            (s = hk_check_operand(h, dev, "relu_backward", "gradient", &in[0], out)) ||
            (s = hk_check_operand(h, dev, "relu_backward", "input", &in[1], out)) ||
            (s = check_dtype(h, "relu_backward", "gradient", &in[0], out->dtype)))
            return s;
        return check_dtype(h, "relu_backward", "input", &in[1], out->dtype);
    default:
        return TS_ENOTSUP;
    }
}

ts_status hk_binary_dtype_check(const ts_host *h, const char *what, int32_t fn,
                                         const ts_operand *out, const ts_operand *a,
                                         const ts_operand *b)
{
    if (fn < 0 || fn >= TS_BINARY_COUNT)
        return h->fail(h, TS_EINVAL, "%s: unknown function %d", what, (int)fn);
    ts_status s = b ? check_dtype(h, what, "second input", b, a->dtype) : TS_OK;
    return s ? s : check_dtype(h, what, "output", out,
                               fn >= TS_BINARY_EQ && fn <= TS_BINARY_GE ? TS_U8 : a->dtype);
}

/* One input and one output with the same ndim (reduce keeps dims), and params. */
static ts_status check_1in1out(const ts_host *h, int dev, const ts_kernel_call *call,
                               const char *what, size_t params_need)
{
    if (call->ninputs != 1 || call->noutputs != 1 || !call->inputs || !call->outputs)
        return dev ? h->fail(h, TS_EINVAL, "%s: expected %d input(s) and %d output(s), got %d "
                             "and %d", what, 1, 1, (int)call->ninputs, (int)call->noutputs)
                   : h->fail(h, TS_EINVAL, "%s: expected 1 input and 1 output, got %d and %d",
                             what, (int)call->ninputs, (int)call->noutputs);
    if (!call->params || call->params_size < params_need)
        return h->fail(h, TS_EINVAL, "%s: params missing or too small (%u < %zu)", what,
                       (unsigned)call->params_size, params_need);
    ts_status s = hk_check_operand(h, dev, what, "input", &call->inputs[0], NULL);
    if (!s)
        s = hk_check_operand(h, dev, what, "output", &call->outputs[0], NULL);
    if (!s && call->inputs[0].ndim != call->outputs[0].ndim)
        return h->fail(h, TS_ESHAPE, "%s: input has %d dims, output %d (keepdim)", what,
                       (int)call->inputs[0].ndim, (int)call->outputs[0].ndim);
    return s;
}

ts_status hk_reduce_check(const ts_host *h, int dev, const ts_kernel_call *call,
                                   int *dim)
{
    ts_status s = check_1in1out(h, dev, call, "reduce", sizeof(ts_reduce_params));
    if (s)
        return s;
    const ts_reduce_params *prm = call->params;
    const ts_operand *in = &call->inputs[0], *out = &call->outputs[0];
    int32_t fn = prm->fn;
    if (fn < 0 || fn >= TS_REDUCE_COUNT)
        return h->fail(h, TS_EINVAL, "reduce: unknown function %d", (int)fn);
    int arg = fn == TS_REDUCE_ARGMAX || fn == TS_REDUCE_ARGMIN;
    if (!ts_plugin_fn_name(TS_OP_REDUCE, fn)) /* past the op table */
        return h->fail(h, TS_ENOTSUP, "reduce function %d is not implemented", (int)fn);
    const char *what = ts_plugin_fn_name(TS_OP_REDUCE, fn);
    int sum = fn == TS_REDUCE_SUM || fn == TS_REDUCE_MEAN;
    if (ts_plugin_dtype_is_half(in->dtype) ? !sum /* the rest through float32 */
                                           : !is_numeric(in->dtype) ||
                                                 (fn == TS_REDUCE_MEAN &&
                                                  !ts_plugin_dtype_is_float(in->dtype)))
        return h->fail(h, TS_ENOTSUP, "reduce %s is not implemented for %s", what,
                       dtype_name(in->dtype));
    int32_t want = arg ? TS_I64 : in->dtype;
    if (out->dtype != want)
        return h->fail(h, TS_EINVAL, "reduce %s: output is %s, expected %s", what,
                       dtype_name(out->dtype), dtype_name(want));
    *dim = -1;
    if (arg && (*dim = hk_norm_dim(prm->dim, in->ndim)) < 0)
        return h->fail(h, TS_EINVAL, "reduce %s: dim %d out of range for %d dims", what,
                       (int)prm->dim, (int)in->ndim);
    for (int d = 0; d < in->ndim; d++) {
        int64_t ni = in->shape[d], no = out->shape[d];
        int reduced = arg ? d == *dim : no == 1 && ni != 1;
        if (reduced ? no != 1 : no != ni)
            return h->fail(h, TS_ESHAPE,
                           "reduce %s: output size %lld at dim %d, input %lld (expected %s)",
                           what, (long long)no, d, (long long)ni, reduced ? "1" : "the input's");
    }
    return TS_OK;
}

/* A float dtype softmax's kernels take: float32, float64, and the 16-bit floats (computed in
 * float32, where the host kernels run them natively: hk_half_native_call). */
static int softmax_dtype(int32_t dt)
{
    return ts_plugin_dtype_is_float(dt) || ts_plugin_dtype_is_half(dt);
}

/* TS_OP_SOFTMAX_BWD's operands: y and g, out; one float dtype, out's shape. */
static ts_status softmax_bwd_operands(const ts_host *h, int dev, const ts_kernel_call *call)
{
    const char *what = "softmax_backward";
    ts_status s = hk_check_counts(h, dev, call, what, 2, 1);
    if (s)
        return s;
    if (!call->params || call->params_size < sizeof(ts_dim_params))
        return h->fail(h, TS_EINVAL, "%s: params missing or too small (%u < %zu)", what,
                       (unsigned)call->params_size, sizeof(ts_dim_params));
    static const char *const names[] = {"y", "g"};
    const ts_operand *out = &call->outputs[0];
    if ((s = hk_check_operand(h, dev, what, "output", out, NULL)))
        return s;
    for (int i = 0; i < 2; i++) {
        const ts_operand *in = &call->inputs[i];
        if ((s = hk_check_operand(h, dev, what, names[i], in, NULL)))
            return s;
        if (in->dtype != out->dtype || !softmax_dtype(out->dtype))
            return h->fail(h, softmax_dtype(in->dtype) ? TS_EINVAL : TS_ENOTSUP,
                           "%s: %s %s, output %s (one float dtype for all three)", what,
                           names[i], dtype_name(in->dtype), dtype_name(out->dtype));
        if (in->ndim != out->ndim)
            return h->fail(h, TS_ESHAPE, "%s: %s has %d dims, output %d", what, names[i],
                           (int)in->ndim, (int)out->ndim);
        for (int d = 0; d < in->ndim; d++)
            if (in->shape[d] != out->shape[d])
                return h->fail(h, TS_ESHAPE, "%s: %s size %lld at dim %d, output %lld", what,
                               names[i], (long long)in->shape[d], d, (long long)out->shape[d]);
    }
    return TS_OK;
}

ts_status hk_softmax_check(const ts_host *h, int dev, const ts_kernel_call *call,
                                    int *dim)
{
    const char *what = call->op == TS_OP_LOG_SOFTMAX ? "log_softmax"
                       : call->op == TS_OP_SOFTMAX_BWD ? "softmax_backward"
                                                        : "softmax";
    ts_status s = call->op == TS_OP_SOFTMAX_BWD
                      ? softmax_bwd_operands(h, dev, call)
                      : check_1in1out(h, dev, call, what, sizeof(ts_dim_params));
    if (s)
        return s;
    const ts_operand *in = &call->inputs[0], *out = &call->outputs[0];
    if (!softmax_dtype(out->dtype) || in->dtype != out->dtype)
        return h->fail(h, softmax_dtype(in->dtype) ? TS_EINVAL : TS_ENOTSUP,
                       "%s: input %s, output %s (float32, float64 or a 16-bit float, the same)",
                       what, dtype_name(in->dtype), dtype_name(out->dtype));
    for (int d = 0; d < in->ndim; d++)
        if (in->shape[d] != out->shape[d])
            return h->fail(h, TS_ESHAPE, "%s: output size %lld at dim %d, input %lld", what,
                           (long long)out->shape[d], d, (long long)in->shape[d]);
    const ts_dim_params *prm = call->params;
    if ((*dim = hk_norm_dim(prm->dim, in->ndim)) < 0)
        return h->fail(h, TS_EINVAL, "%s: dim %d out of range for %d dims", what,
                       (int)prm->dim, (int)in->ndim);
    return TS_OK;
}

ts_status hk_index_check(const ts_host *h, int dev, const ts_kernel_call *call,
                                  int *dim)
{
    int add = call->op == TS_OP_INDEX_ADD;
    const char *name = add ? "index_add" : "index_select";
    ts_status s;
    if (dev && (s = hk_check_counts(h, dev, call, name, 2, 1)))
        return s;
    if (!dev && (call->ninputs != 2 || call->noutputs != 1))
        return h->fail(h, TS_EINVAL, "%s: expects 2 inputs and 1 output, got %d and %d", name,
                       (int)call->ninputs, (int)call->noutputs);
    if (!call->params || call->params_size < sizeof(ts_dim_params))
        return h->fail(h, TS_EINVAL, "%s: missing ts_dim_params", name);
    const ts_operand *src = &call->inputs[0], *ix = &call->inputs[1], *dst = &call->outputs[0];
    if (dev && ((s = hk_check_operand(h, dev, name, "source", src, NULL)) ||
                (s = hk_check_operand(h, dev, name, "index", ix, NULL)) ||
                (s = hk_check_operand(h, dev, name, "output", dst, NULL))))
        return s;
    if (src->dtype != dst->dtype)
        return h->fail(h, TS_EINVAL, "%s: data and output dtypes differ (%d, %d)", name,
                       (int)src->dtype, (int)dst->dtype);
    if ((ix->dtype != TS_I64 && ix->dtype != TS_I32) || ix->ndim != 1)
        return h->fail(h, TS_EINVAL, "%s: the index must be a 1-D TS_I64 or TS_I32 tensor", name);
    int nd = dst->ndim;
    *dim = ((const ts_dim_params *)call->params)->dim;
    if (*dim < 0)
        *dim += nd;
    if (src->ndim != nd || nd < 1 || *dim < 0 || *dim >= nd)
        return h->fail(h, TS_EINVAL, "%s: dim %d is out of range for %d-D operands", name,
                       ((const ts_dim_params *)call->params)->dim, nd);
    int64_t n = ix->shape[0];
    /* The operand indexed along dim has n there; the other dims agree. */
    const ts_operand *picked = add ? src : dst;
    int bad = picked->shape[*dim] != n;
    for (int d = 0; d < nd; d++)
        bad |= d != *dim && src->shape[d] != dst->shape[d];
    if (bad)
        return h->fail(h, TS_ESHAPE, "%s: operand shapes disagree outside dim %d, or dim %d of "
                       "the %s is not the index length %lld", name, *dim, *dim,
                       add ? "source" : "output", (long long)n);
    return TS_OK;
}

/* x (N, C, H, W), y (N, C, P, Q) and ix (like y, TS_I64) or NULL; for the backward ops x is gx
 * and y is gy. */
static ts_status pool_check(const ts_host *h, int dev, const char *name,
                            const ts_pool2d_params *p, const ts_operand *x, const ts_operand *y,
                            const ts_operand *ix, const char *yname)
{
    ts_status s;
    if (dev && ((s = hk_check_operand(h, dev, name, "x", x, NULL)) ||
                (s = hk_check_operand(h, dev, name, yname, y, NULL)) ||
                (ix && (s = hk_check_operand(h, dev, name, "indices", ix, NULL)))))
        return s;
    if (x->dtype != y->dtype || (ix && ix->dtype != TS_I64))
        return h->fail(h, TS_EINVAL, "%s: x and %s need the same dtype, indices TS_I64", name,
                       yname);
    if (dev && !ts_plugin_dtype_is_float(x->dtype))
        return h->fail(h, TS_ENOTSUP, "%s is not implemented for %s", name, dtype_name(x->dtype));
    if (x->ndim != 4 || y->ndim != 4 || (ix && ix->ndim != 4))
        return h->fail(h, TS_ESHAPE, "%s: operands must be 4-D (N, C, H, W)", name);
    if (p->kernel_h < 1 || p->kernel_w < 1 || p->stride_h < 1 || p->stride_w < 1 ||
        p->pad_h < 0 || p->pad_w < 0 || p->pad_h > p->kernel_h / 2 || p->pad_w > p->kernel_w / 2)
        return h->fail(h, TS_EINVAL, "%s: kernel (%d, %d) and stride (%d, %d) must be >= 1 and "
                       "padding (%d, %d) between 0 and half the kernel", name, (int)p->kernel_h,
                       (int)p->kernel_w, (int)p->stride_h, (int)p->stride_w, (int)p->pad_h,
                       (int)p->pad_w);
    int64_t H = x->shape[2], W = x->shape[3];
    int64_t hspan = H + 2 * (int64_t)p->pad_h - p->kernel_h;
    int64_t wspan = W + 2 * (int64_t)p->pad_w - p->kernel_w;
    if (hspan < 0 || wspan < 0)
        return h->fail(h, TS_EINVAL, "%s: kernel %dx%d is larger than the padded %lldx%lld input",
                       name, (int)p->kernel_h, (int)p->kernel_w, (long long)H, (long long)W);
    int64_t P = hspan / p->stride_h + 1, Q = wspan / p->stride_w + 1;
    int bad = y->shape[0] != x->shape[0] || y->shape[1] != x->shape[1] || y->shape[2] != P ||
              y->shape[3] != Q;
    for (int d = 0; ix && d < 4; d++)
        bad |= ix->shape[d] != y->shape[d];
    if (bad)
        return h->fail(h, TS_ESHAPE, "%s: %s is (%lld, %lld, %lld, %lld), expected (%lld, %lld, "
                       "%lld, %lld)%s", name, yname, (long long)y->shape[0],
                       (long long)y->shape[1], (long long)y->shape[2], (long long)y->shape[3],
                       (long long)x->shape[0], (long long)x->shape[1], (long long)P,
                       (long long)Q, ix ? " (indices too)" : "");
    return TS_OK;
}

ts_status hk_pool2d_check(const ts_host *h, int dev, const ts_kernel_call *call)
{
    int bwd = call->op == TS_OP_MAXPOOL2D_BWD || call->op == TS_OP_AVGPOOL2D_BWD;
    int is_max = call->op == TS_OP_MAXPOOL2D || call->op == TS_OP_MAXPOOL2D_BWD;
    const char *name = bwd ? (is_max ? "maxpool2d_bwd" : "avgpool2d_bwd")
                           : (is_max ? "maxpool2d" : "avgpool2d");
    if (!bwd && (call->ninputs != 1 || call->noutputs < 1 || call->noutputs > (is_max ? 2 : 1)))
        return h->fail(h, TS_EINVAL, "%s: expects 1 input and %s output(s), got %d and %d", name,
                       is_max ? "1 or 2" : "1", (int)call->ninputs, (int)call->noutputs);
    if (bwd && (call->ninputs != (is_max ? 2 : 1) || call->noutputs != 1))
        return h->fail(h, TS_EINVAL, "%s: expects %s and 1 output, got %d and %d", name,
                       is_max ? "2 inputs (gy, indices)" : "1 input (gy)", (int)call->ninputs,
                       (int)call->noutputs);
    if (!call->params || call->params_size < sizeof(ts_pool2d_params))
        return h->fail(h, TS_EINVAL, "%s: missing ts_pool2d_params", name);
    if (bwd)
        return pool_check(h, dev, name, call->params, &call->outputs[0], &call->inputs[0],
                          is_max ? &call->inputs[1] : NULL, "gy");
    return pool_check(h, dev, name, call->params, &call->inputs[0], &call->outputs[0],
                      call->noutputs == 2 ? &call->outputs[1] : NULL, "y");
}

static int dense_like(const ts_operand *a, const ts_operand *b)
{
    if (a->dtype != b->dtype || a->ndim != b->ndim)
        return 0;
    int64_t acc = 1;
    for (int d = a->ndim - 1; d >= 0; d--) {
        if (a->shape[d] != b->shape[d])
            return 0;
        if (a->shape[d] != 1 && (a->strides[d] != acc || b->strides[d] != acc))
            return 0;
        acc *= a->shape[d];
    }
    return 1;
}

ts_status hk_optimizer_check(const ts_host *h, int dev, const ts_kernel_call *call)
{
    if (call->op == TS_OP_SGD_STEP) {
        const ts_sgd_params *P = call->params;
        if (!P || call->params_size < sizeof *P || call->ninputs != 1 || call->noutputs < 1)
            return h->fail(h, TS_EINVAL, "sgd_step: expected the grad, the parameter and params");
        int mom = P->momentum != 0;
        if (mom && call->noutputs < 2)
            return h->fail(h, TS_EINVAL, "sgd_step: momentum needs a buffer");
        if (dev && !ts_plugin_dtype_is_float(call->inputs[0].dtype))
            return h->fail(h, TS_ENOTSUP, "sgd_step is not implemented for %s",
                           dtype_name(call->inputs[0].dtype));
        for (int i = 0; i < 1 + mom; i++)
            if (!dense_like(&call->outputs[i], &call->inputs[0]))
                return h->fail(h, TS_EINVAL, "sgd_step: operands must be dense and alike");
        return TS_OK;
    }
    const ts_adam_params *P = call->params;
    if (!P || call->params_size < sizeof *P || call->ninputs != 1 || call->noutputs != 3 ||
        P->step < 1)
        return h->fail(h, TS_EINVAL, "adam_step: expected the grad, the parameter, two "
                       "moments and params with step >= 1");
    if (dev && !ts_plugin_dtype_is_float(call->inputs[0].dtype))
        return h->fail(h, TS_ENOTSUP, "adam_step is not implemented for %s",
                       dtype_name(call->inputs[0].dtype));
    for (int i = 0; i < 3; i++)
        if (!dense_like(&call->outputs[i], &call->inputs[0]))
            return h->fail(h, TS_EINVAL, "adam_step: operands must be dense and alike");
    return TS_OK;
}

/* ---- layer norm ------------------------------------------------------------------------ */

static int ln_contiguous(const ts_operand *o)
{
    for (int d = 0; d < o->ndim; d++)
        if (o->shape[d] == 0) /* no elements: any strides will do */
            return 1;
    int64_t want = 1;
    for (int d = o->ndim - 1; d >= 0; d--) {
        if (o->shape[d] != 1 && o->strides[d] != want)
            return 0;
        want *= o->shape[d];
    }
    return 1;
}

static int64_t ln_numel(const ts_operand *o)
{
    int64_t n = 1;
    for (int d = 0; d < o->ndim; d++)
        n *= o->shape[d];
    return n;
}

/* Checks a call's operands: counts, params, dtypes, contiguity and shapes; *rows and *cols
 * (D) the row layout. */
ts_status hk_norm_check(const ts_host *h, const ts_kernel_call *call, int bwd, int *affine,
                        int64_t *rows, int64_t *cols)
{
    const char *what = bwd ? "layer_norm_backward" : "layer_norm";
    int nin = call->ninputs, nout = call->noutputs;
    int ok = bwd ? ((nin == 4 && nout == 1) || (nin == 5 && nout == 3))
                 : ((nin == 1 || nin == 3) && nout == 3);
    if (!ok || !call->inputs || !call->outputs)
        return h->fail(h, TS_EINVAL, "%s: unexpected operand counts (%d inputs, %d outputs)",
                       what, nin, nout);
    if (!call->params || call->params_size < sizeof(ts_layer_norm_params))
        return h->fail(h, TS_EINVAL, "%s: params missing or too small", what);
    const ts_layer_norm_params *p = call->params;
    const ts_operand *x = &call->inputs[bwd ? 1 : 0];
    if (!(p->eps > 0) || p->ndim < 1 || p->ndim > x->ndim)
        return h->fail(h, TS_EINVAL, "%s: eps %g must be > 0 and ndim %d in [1, %d]", what,
                       p->eps, (int)p->ndim, (int)x->ndim);
    *affine = bwd ? nin == 5 : nin == 3;
    int lead = x->ndim - p->ndim;
    *cols = 1;
    for (int d = lead; d < x->ndim; d++)
        *cols *= x->shape[d];
    *rows = 1;
    for (int d = 0; d < lead; d++)
        *rows *= x->shape[d];
    for (int i = 0; i < nin + nout; i++) {
        const ts_operand *o = i < nin ? &call->inputs[i] : &call->outputs[i - nin];
        if (o->dtype != x->dtype)
            return h->fail(h, TS_EINVAL, "%s: operand %d is %d, not the input's dtype", what,
                           i, (int)o->dtype);
        if (!ln_contiguous(o))
            return h->fail(h, TS_EINVAL, "%s: operand %d is not contiguous", what, i);
        /* x-shaped, row-shaped or column-shaped, each checked by its element count */
        int64_t want;
        if (bwd)
            want = i <= 1 || i == nin ? *rows * *cols : (i == 2 || i == 3) ? *rows : *cols;
        else
            want = i == 0 || i == nin ? *rows * *cols : i < nin ? *cols : *rows;
        if (ln_numel(o) != want)
            return h->fail(h, TS_ESHAPE, "%s: operand %d has %lld elements, want %lld", what, i,
                           (long long)ln_numel(o), (long long)want);
    }
    return TS_OK;
}

/* ---- attention ---------------------------------------------------------------------------- */

int64_t hk_attention_numel(const ts_operand *o)
{
    return ln_numel(o);
}

int hk_attention_stats(const ts_kernel_call *call, int i)
{
    return (call->op == TS_OP_ATTENTION && i == call->ninputs + 1) ||
           (call->op == TS_OP_ATTENTION_BWD && i == 5);
}

ts_status hk_attention_check(const ts_host *h, int dev, const ts_kernel_call *call,
                             hk_attention_dims *a)
{
    int bwd = call->op == TS_OP_ATTENTION_BWD;
    const char *what = bwd ? "attention_backward" : "attention";
    ts_status s = hk_check_counts(h, dev, call, what, bwd ? 6 : 3, bwd ? 3 : 2);
    if (s)
        return s;
    if (!call->params || call->params_size < sizeof(ts_attention_params))
        return h->fail(h, TS_EINVAL, "%s: params missing or too small", what);
    const ts_attention_params *p = call->params;
    if (!isfinite(p->scale) || (p->causal != 0 && p->causal != 1))
        return h->fail(h, TS_EINVAL, "%s: scale %g must be finite and causal (%d) 0 or 1", what,
                       p->scale, (int)p->causal);
    const ts_operand *q = &call->inputs[bwd], *k = &call->inputs[bwd + 1];
    const ts_operand *v = &call->inputs[bwd + 2];
    if (q->ndim != 3 || k->ndim != 3 || v->ndim != 3)
        return h->fail(h, TS_ESHAPE, "%s: q, k and v must be 3-d (batch, rows, features)",
                       what);
    a->B = q->shape[0];
    a->Tq = q->shape[1];
    a->D = q->shape[2];
    a->Tk = k->shape[1];
    a->Dv = v->shape[2];
    if (k->shape[0] != a->B || v->shape[0] != a->B || k->shape[2] != a->D ||
        v->shape[1] != a->Tk)
        return h->fail(h, TS_ESHAPE, "%s: q (%lld, %lld, %lld), k (%lld, %lld, %lld) and v "
                       "(%lld, %lld, %lld) do not fit: k (B, Tk, D), v (B, Tk, Dv)", what,
                       (long long)q->shape[0], (long long)q->shape[1], (long long)q->shape[2],
                       (long long)k->shape[0], (long long)k->shape[1], (long long)k->shape[2],
                       (long long)v->shape[0], (long long)v->shape[1], (long long)v->shape[2]);
    if (p->causal ? a->Tq > a->Tk : (a->Tk == 0 && a->Tq > 0))
        return h->fail(h, TS_ESHAPE, "%s: %lld queries and %lld keys: a causal call needs "
                       "Tq <= Tk, any other at least one key", what, (long long)a->Tq,
                       (long long)a->Tk);
    const int32_t dt = q->dtype;
    if (!ts_plugin_dtype_is_float(dt) && !ts_plugin_dtype_is_half(dt))
        return h->fail(h, TS_EINVAL, "%s: q is %s, not a float dtype", what, dtype_name(dt));
    const int32_t sdt = dt == TS_F64 ? TS_F64 : TS_F32;
    /* every operand: its dtype, its shape by element count, dense */
    const int64_t qn = a->B * a->Tq * a->D, kn = a->B * a->Tk * a->D, vn = a->B * a->Tk * a->Dv;
    const int64_t on = a->B * a->Tq * a->Dv, ln = a->B * a->Tq;
    const int64_t fwd_want[5] = {qn, kn, vn, on, ln};
    const int64_t bwd_want[9] = {on, qn, kn, vn, on, ln, qn, kn, vn};
    for (int i = 0; i < (bwd ? 9 : 5); i++) {
        const ts_operand *o = i < call->ninputs ? &call->inputs[i]
                                                : &call->outputs[i - call->ninputs];
        if ((s = hk_check_operand(h, dev, what, i < call->ninputs ? "input" : "output", o,
                                  NULL)))
            return s;
        int32_t want_dt = hk_attention_stats(call, i) ? sdt : dt;
        if (o->dtype != want_dt)
            return h->fail(h, TS_EINVAL, "%s: operand %d is %s, want %s", what, i,
                           dtype_name(o->dtype), dtype_name(want_dt));
        if (!ln_contiguous(o))
            return h->fail(h, TS_EINVAL, "%s: operand %d is not contiguous", what, i);
        int64_t want = bwd ? bwd_want[i] : fwd_want[i];
        if (ln_numel(o) != want)
            return h->fail(h, TS_ESHAPE, "%s: operand %d has %lld elements, want %lld", what, i,
                           (long long)ln_numel(o), (long long)want);
    }
    /* the kernels read every row of the inputs while writing the outputs */
    for (int i = 0; i < call->noutputs; i++)
        for (int j = 0; j < call->ninputs; j++)
            if (hk_overlaps(&call->outputs[i], &call->inputs[j]))
                return h->fail(h, TS_EINVAL, "%s: output %d overlaps input %d; give outputs "
                               "memory of their own", what, i, j);
    return TS_OK;
}
