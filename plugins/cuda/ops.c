/* plugins/cuda/ops.c: validation, planning and launch of every op except matmul and the
 * convolutions (gemm.c): elementwise (collapsed iteration spaces, stride-0 broadcasting, a
 * by-value scalar), reductions, softmax, index_select / index_add, cross entropy, pooling and
 * the fused optimizer steps. The argument checks are the host kernels' own (kernels/host/
 * opcheck.c, with dev = 1) so that every backend reports bad calls alike; indices are
 * range-checked on the device before anything is written (one stream synchronization, since
 * the result decides the status). */
#include "config.h"

#include <math.h>
#include <string.h>

#include "cuda_plugin.h"

static const char *dtype_name(int32_t dtype)
{
    return ts_plugin_dtype_name(dtype);
}

static const char *name_or(const char *name)
{
    return name ? name : "?";
}

static int64_t numel(const ts_operand *op)
{
    int64_t n = 1;
    for (int d = 0; d < op->ndim; d++)
        n *= op->shape[d];
    return n;
}

#define FAIL(c, code, ...) ((c)->host->fail((c)->host, (code), __VA_ARGS__))
#define LAUNCH(c, call) CU_CHECK(c, call)

/* ---- the elementwise iteration space --------------------------------------------------- */

/* Size-1 dims dropped; dim d merged into d+1 when every operand steps over d+1 exactly once
 * per step of d (a dense tensor, with or without stride-0 operands, becomes one dim). */
static void ew_plan(cu_ew_arg *a, const ts_operand *const *ops, int nops)
{
    const ts_operand *o = ops[0];
    memset(a, 0, sizeof *a);
    a->nops = nops;
    a->n = 1;
    int nd = 0;
    int64_t shape[TS_MAX_DIMS], str[CU_EW_MAX_OPS][TS_MAX_DIMS];
    for (int d = 0; d < o->ndim; d++) {
        a->n *= o->shape[d];
        if (o->shape[d] == 1)
            continue;
        shape[nd] = o->shape[d];
        for (int k = 0; k < nops; k++)
            str[k][nd] = ops[k]->strides[d];
        nd++;
    }
    for (int k = 0; k < nops; k++)
        a->base[k] = cuda_elem0(ops[k]);
    if (nd == 0) {
        a->ndim = 1;
        a->shape[0] = 1;
        return; /* strides 0: the one element */
    }
    /* Merge from the inside out into a (innermost last). */
    int m = nd - 1; /* write position, moving outwards */
    int64_t ms[TS_MAX_DIMS], mstr[CU_EW_MAX_OPS][TS_MAX_DIMS];
    ms[m] = shape[nd - 1];
    for (int k = 0; k < nops; k++)
        mstr[k][m] = str[k][nd - 1];
    for (int d = nd - 2; d >= 0; d--) {
        int mergeable = 1;
        for (int k = 0; k < nops && mergeable; k++)
            mergeable = str[k][d] == mstr[k][m] * ms[m];
        if (mergeable) {
            ms[m] *= shape[d];
        } else {
            m--;
            ms[m] = shape[d];
            for (int k = 0; k < nops; k++)
                mstr[k][m] = str[k][d];
        }
    }
    a->ndim = nd - m;
    for (int j = 0; j < a->ndim; j++) {
        a->shape[j] = ms[m + j];
        for (int k = 0; k < nops; k++)
            a->strides[k][j] = mstr[k][m + j];
    }
}

ts_status cuda_copy_strided(cuda_ctx *c, const ts_operand *dst, const ts_operand *src)
{
    const ts_operand *ops[2] = {dst, src};
    cu_ew_arg a;
    ew_plan(&a, ops, 2);
    LAUNCH(c, cu_ew_cast(c->stream, &a, dst->dtype, src->dtype));
    return TS_OK;
}

ts_status cuda_scale_inplace(cuda_ctx *c, const ts_operand *t, double beta)
{
    const ts_operand *ops[1] = {t};
    cu_ew_arg a;
    ew_plan(&a, ops, 1);
    if (beta == 0.0) { /* overwrites NaN too, as BLAS does for beta 0 */
        LAUNCH(c, cu_ew_fill(c->stream, &a, t->dtype, 0.0));
        return TS_OK;
    }
    const ts_operand *ops2[2] = {t, t};
    ew_plan(&a, ops2, 2);
    LAUNCH(c, cu_ew_binary(c->stream, &a, t->dtype, TS_BINARY_MUL, 2, beta));
    return TS_OK;
}

/* ---- elementwise ops ------------------------------------------------------------------- */

static ts_status run_copy_cast(cuda_ctx *c, const ts_kernel_call *call)
{
    const void *prm;
    ts_status s = hk_ew_check(c->host, 1, call, &prm);
    return s ? s : cuda_copy_strided(c, &call->outputs[0], &call->inputs[0]);
}

static ts_status run_fill(cuda_ctx *c, const ts_kernel_call *call)
{
    const void *prm;
    ts_status s = hk_ew_check(c->host, 1, call, &prm);
    if (s)
        return s;
    const ts_fill_params *p = prm;
    const ts_operand *ops[1] = {&call->outputs[0]};
    cu_ew_arg a;
    ew_plan(&a, ops, 1);
    LAUNCH(c, cu_ew_fill(c->stream, &a, call->outputs[0].dtype, p->value));
    return TS_OK;
}

static ts_status run_unary(cuda_ctx *c, const ts_kernel_call *call)
{
    const void *prm;
    ts_status s = hk_ew_check(c->host, 1, call, &prm);
    if (s)
        return s;
    const ts_operand *out = &call->outputs[0], *in = &call->inputs[0];
    const ts_unary_params *p = prm;
    if (p->fn < 0 || p->fn >= TS_UNARY_COUNT)
        return FAIL(c, TS_EINVAL, "unary: unknown function %d", (int)p->fn);
    int int_ok = p->fn == TS_UNARY_NEG || p->fn == TS_UNARY_ABS || p->fn == TS_UNARY_RELU;
    int float_ok = ts_plugin_dtype_is_float(out->dtype) || ts_plugin_dtype_is_half(out->dtype);
    if (out->dtype == TS_U8 || (!float_ok && !int_ok))
        return FAIL(c, TS_ENOTSUP, "unary %s is not implemented for %s",
                    name_or(ts_plugin_fn_name(TS_OP_UNARY, p->fn)), dtype_name(out->dtype));
    const ts_operand *ops[2] = {out, in};
    cu_ew_arg a;
    ew_plan(&a, ops, 2);
    LAUNCH(c, cu_ew_unary(c->stream, &a, out->dtype, p->fn));
    return TS_OK;
}

static int is_compare(int32_t fn)
{
    return fn >= TS_BINARY_EQ && fn <= TS_BINARY_GE;
}

/* x op y with x = in[0] or the scalar (pos 1), y = in[1] or the scalar (pos 2). `data` is the
 * operand whose dtype the op runs in; ops[] the operands in kernel order. */
static ts_status binary_common(cuda_ctx *c, const char *what, int32_t fn, const ts_operand *out,
                               const ts_operand *x, const ts_operand *y, int pos, double scalar)
{
    ts_status s = hk_binary_dtype_check(c->host, what, fn, out, pos == 1 ? y : x,
                                                 pos == 0 ? y : NULL);
    if (s)
        return s;
    int32_t dt = pos == 1 ? y->dtype : x->dtype;
    if (!is_compare(fn) && dt == TS_U8)
        return FAIL(c, TS_ENOTSUP, "%s %s is not implemented for %s", what,
                    name_or(ts_plugin_fn_name(TS_OP_BINARY, fn)), dtype_name(dt));
    /* Integer div by zero and pow with a negative exponent have no integer result: scan the
     * divisor / exponent first so that a bad one fails the call before anything is written. */
    if ((dt == TS_I32 || dt == TS_I64) && (fn == TS_BINARY_DIV || fn == TS_BINARY_POW)) {
        int kind = fn == TS_BINARY_DIV ? 0 : 1;
        int64_t bad = -1;
        if (pos == 2) {
            /* The scalar converts like TS_OP_CAST: toward zero, NaN to 0. */
            double t = scalar != scalar ? 0.0 : scalar < 0 ? ceil(scalar) : floor(scalar);
            bad = (kind == 0 ? t == 0 : t < 0) ? 0 : -1;
        } else {
            const ts_operand *ops[1] = {y};
            cu_ew_arg a;
            ew_plan(&a, ops, 1);
            if ((s = cuda_flag_begin(c)))
                return s;
            cudaError_t e = cu_ew_find_bad_int(c->stream, &a, dt, kind, c->d_flag);
            if (e != cudaSuccess)
                s = cuda_fail_cu(c, "cu_ew_find_bad_int", e);
            if ((s = cuda_flag_end(c, s, &bad)))
                return s;
        }
        if (bad >= 0)
            return fn == TS_BINARY_DIV
                       ? FAIL(c, TS_EINVAL, "%s div: integer division by zero (%s)", what,
                              dtype_name(dt))
                       : FAIL(c, TS_EINVAL,
                              "%s pow: negative integer exponent (%s); cast to a float dtype "
                              "first",
                              what, dtype_name(dt));
    }
    cu_ew_arg a;
    if (pos == 0) {
        const ts_operand *ops[3] = {out, x, y};
        ew_plan(&a, ops, 3);
    } else {
        const ts_operand *ops[2] = {out, pos == 1 ? y : x};
        ew_plan(&a, ops, 2);
    }
    LAUNCH(c, cu_ew_binary(c->stream, &a, dt, fn, pos, scalar));
    return TS_OK;
}

static ts_status run_binary(cuda_ctx *c, const ts_kernel_call *call)
{
    const void *prm;
    ts_status s = hk_ew_check(c->host, 1, call, &prm);
    if (s)
        return s;
    const ts_binary_params *p = prm;
    return binary_common(c, "binary", p->fn, &call->outputs[0], &call->inputs[0],
                         &call->inputs[1], 0, 0);
}

static ts_status run_binary_scalar(cuda_ctx *c, const ts_kernel_call *call)
{
    const void *prm;
    ts_status s = hk_ew_check(c->host, 1, call, &prm);
    if (s)
        return s;
    const ts_operand *out = &call->outputs[0], *in = &call->inputs[0];
    const ts_scalar_params *p = prm;
    return p->scalar_first ? binary_common(c, "binary_scalar", p->fn, out, NULL, in, 1, p->scalar)
                           : binary_common(c, "binary_scalar", p->fn, out, in, NULL, 2, p->scalar);
}

static ts_status run_where(cuda_ctx *c, const ts_kernel_call *call)
{
    const void *prm;
    ts_status s = hk_ew_check(c->host, 1, call, &prm);
    if (s)
        return s;
    const ts_operand *out = &call->outputs[0];
    const ts_operand *ops[4] = {out, &call->inputs[0], &call->inputs[1], &call->inputs[2]};
    cu_ew_arg a;
    ew_plan(&a, ops, 4);
    LAUNCH(c, cu_ew_where(c->stream, &a, out->dtype));
    return TS_OK;
}

/* ---- reductions and softmax ------------------------------------------------------------ */

static ts_status run_reduce(cuda_ctx *c, const ts_kernel_call *call)
{
    int dim;
    ts_status s = hk_reduce_check(c->host, 1, call, &dim);
    if (s)
        return s;
    const ts_reduce_params *prm = call->params;
    const ts_operand *in = &call->inputs[0], *out = &call->outputs[0];
    int32_t fn = prm->fn;
    int arg = fn == TS_REDUCE_ARGMAX || fn == TS_REDUCE_ARGMIN;
    const char *what = ts_plugin_fn_name(TS_OP_REDUCE, fn);
    cu_rd_arg p;
    memset(&p, 0, sizeof p);
    p.fn = fn;
    p.dtype = in->dtype;
    p.nout = 1;
    p.nslice = 1;
    p.in = cuda_elem0(in);
    p.out = cuda_elem0(out);
    for (int d = 0; d < in->ndim; d++) {
        int64_t ni = in->shape[d], no = out->shape[d];
        int reduced = arg ? d == dim : no == 1 && ni != 1; /* shapes checked */
        if (reduced) {
            p.nslice *= ni;
            if (p.nred > 0 && p.red_in[p.nred - 1] == in->strides[d] * ni) {
                p.red_shape[p.nred - 1] *= ni;
                p.red_in[p.nred - 1] = in->strides[d];
            } else {
                p.red_shape[p.nred] = ni;
                p.red_in[p.nred++] = in->strides[d];
            }
        } else if (ni != 1) {
            p.nout *= ni;
            p.keep_shape[p.nkeep] = ni;
            p.keep_in[p.nkeep] = in->strides[d];
            p.keep_out[p.nkeep++] = out->strides[d];
        }
    }
    if (p.nred == 0) {
        p.red_shape[0] = 1;
        p.red_in[0] = 0;
        p.nred = 1;
    }
    if (p.nout == 0)
        return TS_OK;
    if (p.nslice == 0 && fn != TS_REDUCE_SUM && fn != TS_REDUCE_MEAN)
        return FAIL(c, TS_EINVAL,
                    "reduce %s over an empty dim has no result (input has 0 elements along a "
                    "reduced dim)",
                    what);
    /* Few outputs with long slices: split each slice among blocks, combine in a second pass. */
    int nparts = 1;
    if (p.nout < 256 && p.nslice >= 65536) {
        int64_t want_parts = p.nslice / 32768;
        nparts = (int)(want_parts > 1024 ? 1024 : want_parts);
    }
    void *scratch = NULL;
    if (nparts > 1 &&
        (s = cuda_scratch(c, cu_reduce_scratch(p.nout, nparts), "reduce", &scratch)))
        return s;
    cudaError_t e = cu_reduce(c->stream, &p, nparts, scratch);
    cuda_scratch_free(c, scratch);
    if (e != cudaSuccess)
        return cuda_fail_cu(c, "cu_reduce (reduction kernel launch)", e);
    return TS_OK;
}

static ts_status run_softmax(cuda_ctx *c, const ts_kernel_call *call)
{
    int log_form = call->op == TS_OP_LOG_SOFTMAX;
    int dim;
    ts_status s = hk_softmax_check(c->host, 1, call, &dim);
    if (s)
        return s;
    const ts_operand *in = &call->inputs[0], *out = &call->outputs[0];
    cu_sm_arg a;
    memset(&a, 0, sizeof a);
    a.dtype = in->dtype;
    a.log_form = log_form;
    a.nslices = 1;
    for (int d = 0; d < in->ndim; d++) {
        if (d == dim)
            continue;
        a.oshape[a.nouter] = in->shape[d];
        a.ostr_in[a.nouter] = in->strides[d];
        a.ostr_out[a.nouter++] = out->strides[d];
        a.nslices *= in->shape[d];
    }
    a.len = in->ndim ? in->shape[dim] : 1;
    a.sx = in->ndim ? in->strides[dim] : 0;
    a.sy = in->ndim ? out->strides[dim] : 0;
    a.in = cuda_elem0(in);
    a.out = cuda_elem0(out);
    LAUNCH(c, cu_softmax(c->stream, &a));
    return TS_OK;
}

/* ---- index range checks ---------------------------------------------------------------- */

/* Fails with TS_EINVAL naming the first index of v outside [0, hi): "<what>: <noun> <value>
 * (at position <pos>) ...". */
static ts_status check_range(cuda_ctx *c, const cu_idx_view *v, int64_t hi, int64_t *bad_pos,
                             int64_t *bad_val)
{
    ts_status s = cuda_flag_begin(c);
    if (s)
        return s;
    cudaError_t e = cu_find_out_of_range(c->stream, v, hi, c->d_flag);
    if (e != cudaSuccess)
        s = cuda_fail_cu(c, "cu_find_out_of_range", e);
    if ((s = cuda_flag_end(c, s, bad_pos)))
        return s;
    *bad_val = 0;
    if (*bad_pos < 0)
        return TS_OK;
    int64_t off = 0, rem = *bad_pos;
    for (int d = v->ndim - 1; d >= 0; d--) {
        off += rem % v->shape[d] * v->strides[d];
        rem /= v->shape[d];
    }
    size_t es = v->dtype == TS_I64 ? 8 : 4;
    int64_t v64 = 0;
    int32_t v32 = 0;
    CU_CHECK(c, cudaMemcpyAsync(es == 8 ? (void *)&v64 : (void *)&v32,
                                (const char *)v->data + off * (int64_t)es, es,
                                cudaMemcpyDeviceToHost, c->stream));
    CU_CHECK(c, cudaStreamSynchronize(c->stream));
    *bad_val = es == 8 ? v64 : v32;
    return TS_OK;
}

/* ---- index_select / index_add ---------------------------------------------------------- */

static ts_status run_index(cuda_ctx *c, const ts_kernel_call *call)
{
    int add = call->op == TS_OP_INDEX_ADD;
    const char *name = add ? "index_add" : "index_select";
    int dim;
    ts_status s = hk_index_check(c->host, 1, call, &dim);
    if (s)
        return s;
    const ts_operand *src = &call->inputs[0], *ix = &call->inputs[1], *dst = &call->outputs[0];
    int nd = dst->ndim;
    int64_t n = ix->shape[0];
    const ts_operand *picked = add ? src : dst;
    int64_t size = (add ? dst : src)->shape[dim];
    cu_idx_view v = {.data = cuda_elem0(ix), .dtype = ix->dtype, .ndim = 1,
                     .shape = {n}, .strides = {ix->strides[0]}};
    int64_t pos, val;
    if ((s = check_range(c, &v, size, &pos, &val)))
        return s;
    if (pos >= 0)
        return FAIL(c, TS_EINVAL,
                    "%s: index %lld (at position %lld) is out of range for dim %d of size %lld",
                    name, (long long)val, (long long)pos, dim, (long long)size);
    cu_index_arg a;
    memset(&a, 0, sizeof a);
    a.dtype = dst->dtype;
    a.add = add;
    a.dim = dim;
    a.ndim = nd;
    for (int d = 0; d < nd; d++) {
        a.shape[d] = picked->shape[d];
        a.dst_strides[d] = dst->strides[d];
        a.src_strides[d] = src->strides[d];
    }
    a.dst = cuda_elem0(dst);
    a.src = cuda_elem0(src);
    a.ix = cuda_elem0(ix);
    a.ix_dtype = ix->dtype;
    a.ix_stride = ix->strides[0];
    a.bound = size;
    LAUNCH(c, cu_index(c->stream, &a));
    return TS_OK;
}

/* ---- cross entropy --------------------------------------------------------------------- */

static ts_status run_xent(cuda_ctx *c, const ts_kernel_call *call)
{
    int bwd = call->op == TS_OP_CROSS_ENTROPY_BWD;
    const char *name = bwd ? "cross_entropy_bwd" : "cross_entropy";
    ts_status s = hk_check_counts(c->host, 1, call, name, bwd ? 3 : 2, 1);
    if (s)
        return s;
    const ts_operand *x = &call->inputs[0], *t = &call->inputs[1], *out = &call->outputs[0];
    const ts_operand *gl = bwd ? &call->inputs[2] : NULL;
    if ((s = hk_check_operand(c->host, 1, name, "logits", x, NULL)) ||
        (s = hk_check_operand(c->host, 1, name, "targets", t, NULL)) ||
        (s = hk_check_operand(c->host, 1, name, "output", out, NULL)) ||
        (gl && (s = hk_check_operand(c->host, 1, name, "gloss", gl, NULL))))
        return s;
    int32_t dt = x->dtype;
    if (!ts_plugin_dtype_is_float(dt) || out->dtype != dt || (gl && gl->dtype != dt) ||
        (t->dtype != TS_I64 && t->dtype != TS_I32))
        return FAIL(c, TS_EINVAL,
                    "%s: logits%s and %s need the same float dtype, targets TS_I64 or TS_I32",
                    name, bwd ? ", gloss" : "", bwd ? "glogits" : "loss");
    if (x->ndim != 2 || t->ndim != 1 || out->ndim != (bwd ? 2 : 1) || (gl && gl->ndim != 1))
        return FAIL(c, TS_ESHAPE, "%s: logits must be (N, C), targets%s (N) and %s", name,
                    bwd ? " and gloss" : "", bwd ? "glogits (N, C)" : "loss (N)");
    int64_t N = x->shape[0], C = x->shape[1];
    if (t->shape[0] != N || out->shape[0] != N || (bwd && out->shape[1] != C) ||
        (gl && gl->shape[0] != N))
        return FAIL(c, TS_ESHAPE,
                    "%s: logits are (%lld, %lld), so targets%s must be (%lld) and %s (%lld%s)",
                    name, (long long)N, (long long)C, gl ? " and gloss" : "", (long long)N,
                    bwd ? "glogits" : "loss", (long long)N, bwd ? ", C" : "");
    cu_idx_view v = {.data = cuda_elem0(t), .dtype = t->dtype, .ndim = 1,
                     .shape = {N}, .strides = {t->strides[0]}};
    int64_t pos, val;
    if ((s = check_range(c, &v, C, &pos, &val)))
        return s;
    if (pos >= 0)
        return FAIL(c, TS_EINVAL,
                    "%s: target %lld of sample %lld is out of range [0, C) for C = %lld", name,
                    (long long)val, (long long)pos, (long long)C);
    cu_xent_arg a;
    memset(&a, 0, sizeof a);
    a.dtype = dt;
    a.tdtype = t->dtype;
    a.bwd = bwd;
    a.N = N;
    a.C = C;
    a.x = cuda_elem0(x);
    a.xs0 = x->strides[0];
    a.xs1 = x->strides[1];
    a.t = cuda_elem0(t);
    a.ts = t->strides[0];
    a.gl = gl ? cuda_elem0(gl) : NULL;
    a.gls = gl ? gl->strides[0] : 0;
    a.out = cuda_elem0(out);
    a.os0 = out->strides[0];
    a.os1 = bwd ? out->strides[1] : 0;
    LAUNCH(c, cu_cross_entropy(c->stream, &a));
    return TS_OK;
}

/* ---- pooling --------------------------------------------------------------------------- */

static cu_t4 t4(const ts_operand *o)
{
    cu_t4 t;
    t.p = cuda_elem0(o);
    for (int d = 0; d < 4; d++) {
        t.n[d] = o->shape[d];
        t.s[d] = o->strides[d];
    }
    return t;
}

/* in, when it shares memory with out, copied into dense pool scratch (*buf, freed by the
 * caller); else in itself. */
static ts_status unalias(cuda_ctx *c, const ts_operand *in, const ts_operand *out,
                         const char *tag, ts_operand *copy, void **buf)
{
    *copy = *in;
    if (!hk_overlaps(in, out))
        return TS_OK;
    ts_status s = cuda_scratch(c, (size_t)numel(in) * ts_plugin_dtype_size(in->dtype), tag, buf);
    if (s)
        return s;
    *copy = hk_dense_like(in, *buf);
    return cuda_copy_strided(c, copy, in);
}

static ts_status run_pool(cuda_ctx *c, const ts_kernel_call *call)
{
    int is_max = call->op == TS_OP_MAXPOOL2D;
    ts_status s = hk_pool2d_check(c->host, 1, call);
    if (s)
        return s;
    const ts_pool2d_params *p = call->params;
    const ts_operand *x = &call->inputs[0], *y = &call->outputs[0];
    const ts_operand *ix = call->noutputs == 2 ? &call->outputs[1] : NULL;
    cu_t4 tx = t4(x), ty = t4(y), tix;
    if (ix)
        tix = t4(ix);
    LAUNCH(c, cu_pool2d(c->stream, x->dtype, is_max, p, &tx, &ty, ix ? &tix : NULL));
    return TS_OK;
}

static ts_status run_pool_bwd(cuda_ctx *c, const ts_kernel_call *call)
{
    int is_max = call->op == TS_OP_MAXPOOL2D_BWD;
    const char *name = is_max ? "maxpool2d_bwd" : "avgpool2d_bwd";
    ts_status s = hk_pool2d_check(c->host, 1, call);
    if (s)
        return s;
    const ts_pool2d_params *p = call->params;
    const ts_operand *gy = &call->inputs[0], *gx = &call->outputs[0];
    const ts_operand *ix = is_max ? &call->inputs[1] : NULL;
    if (numel(gx) == 0)
        return TS_OK;
    int64_t H = gx->shape[2], W = gx->shape[3];
    if (ix) {
        cu_idx_view v = {.data = cuda_elem0(ix), .dtype = TS_I64, .ndim = 4};
        for (int d = 0; d < 4; d++) {
            v.shape[d] = ix->shape[d];
            v.strides[d] = ix->strides[d];
        }
        int64_t pos, val;
        if ((s = check_range(c, &v, H * W, &pos, &val)))
            return s;
        if (pos >= 0) {
            int64_t i3 = pos % ix->shape[3], i2 = pos / ix->shape[3] % ix->shape[2];
            int64_t i1 = pos / (ix->shape[3] * ix->shape[2]) % ix->shape[1];
            int64_t i0 = pos / (ix->shape[3] * ix->shape[2] * ix->shape[1]);
            return FAIL(c, TS_EINVAL,
                        "%s: index %lld at (%lld, %lld, %lld, %lld) is outside the %lldx%lld "
                        "plane",
                        name, (long long)val, (long long)i0, (long long)i1, (long long)i2,
                        (long long)i3, (long long)H, (long long)W);
        }
    }
    /* gx is written (zeroed, for max) before gy is read: inputs sharing its memory are read
     * from copies. */
    ts_operand gyc, ixc;
    void *gybuf = NULL, *ixbuf = NULL;
    if ((s = unalias(c, gy, gx, name, &gyc, &gybuf)))
        goto done;
    if (ix && (s = unalias(c, ix, gx, name, &ixc, &ixbuf)))
        goto done;
    if (ix) {
        const ts_operand *ops[1] = {gx};
        cu_ew_arg a;
        ew_plan(&a, ops, 1);
        cudaError_t e = cu_ew_fill(c->stream, &a, gx->dtype, 0.0);
        if (e != cudaSuccess) {
            s = cuda_fail_cu(c, "cu_ew_fill (zeroing gx)", e);
            goto done;
        }
    }
    cu_t4 tgy = t4(&gyc), tgx = t4(gx), tix;
    if (ix)
        tix = t4(&ixc);
    cudaError_t e = cu_pool2d_bwd(c->stream, gx->dtype, p, &tgy, ix ? &tix : NULL, &tgx);
    if (e != cudaSuccess)
        s = cuda_fail_cu(c, "cu_pool2d_bwd (pooling backward launch)", e);
done:
    cuda_scratch_free(c, ixbuf);
    cuda_scratch_free(c, gybuf);
    return s;
}

/* ---- optimizers ------------------------------------------------------------------------ */

static ts_status run_optim(cuda_ctx *c, const ts_kernel_call *call)
{
    ts_status s = hk_optimizer_check(c->host, 1, call);
    if (s)
        return s;
    if (call->op == TS_OP_SGD_STEP) {
        const ts_sgd_params *P = call->params;
        int mom = P->momentum != 0;
        LAUNCH(c, cu_sgd(c->stream, call->inputs[0].dtype, numel(&call->inputs[0]),
                         cuda_elem0(&call->inputs[0]), cuda_elem0(&call->outputs[0]),
                         mom ? cuda_elem0(&call->outputs[1]) : NULL, P));
        return TS_OK;
    }
    const ts_adam_params *P = call->params;
    LAUNCH(c, cu_adam(c->stream, call->inputs[0].dtype, numel(&call->inputs[0]),
                      cuda_elem0(&call->inputs[0]), cuda_elem0(&call->outputs[0]),
                      cuda_elem0(&call->outputs[1]), cuda_elem0(&call->outputs[2]), P));
    return TS_OK;
}

static ts_status run_layer_norm(cuda_ctx *c, const ts_kernel_call *call)
{
    int bwd = call->op == TS_OP_LAYER_NORM_BWD, affine = 0;
    int64_t rows = 0, D = 0;
    ts_status s = hk_norm_check(c->host, call, bwd, &affine, &rows, &D);
    if (s)
        return s;
    const ts_operand *in = call->inputs, *out = call->outputs;
    const int32_t dt = in[0].dtype;
    if (!bwd) {
        const ts_layer_norm_params *P = call->params;
        LAUNCH(c, cu_layer_norm(c->stream, dt, cuda_elem0(&in[0]),
                                affine ? cuda_elem0(&in[1]) : NULL,
                                affine ? cuda_elem0(&in[2]) : NULL, cuda_elem0(&out[0]),
                                cuda_elem0(&out[1]), cuda_elem0(&out[2]), rows, D, P->eps));
        return TS_OK;
    }
    LAUNCH(c, cu_layer_norm_bwd(c->stream, dt, cuda_elem0(&in[0]), cuda_elem0(&in[1]),
                                cuda_elem0(&in[2]), cuda_elem0(&in[3]),
                                affine ? cuda_elem0(&in[4]) : NULL, cuda_elem0(&out[0]),
                                affine ? cuda_elem0(&out[1]) : NULL,
                                affine ? cuda_elem0(&out[2]) : NULL, rows, D));
    return TS_OK;
}

/* ---- attention -------------------------------------------------------------------------- */

static ts_status run_attention(cuda_ctx *c, const ts_kernel_call *call)
{
    hk_attention_dims d;
    ts_status s = hk_attention_check(c->host, 1, call, &d);
    if (s)
        return s;
    const int bwd = call->op == TS_OP_ATTENTION_BWD;
    /* heads wider than the kernels' registers, or more batch rows than a grid's y: declined
     * (no message), and the core composes the attention */
    if (!cu_attention_fits(d.D, d.Dv) || d.B > 65535)
        return TS_ENOTSUP;
    const ts_attention_params *P = call->params;
    const ts_operand *in = call->inputs, *out = call->outputs;
    cu_att_arg a = {.dtype = in[0].dtype, .backward = bwd, .causal = P->causal, .B = d.B,
                    .Tq = d.Tq, .Tk = d.Tk, .D = d.D, .Dv = d.Dv, .scale = P->scale};
    if (bwd) {
        a.go = cuda_elem0(&in[0]), a.q = cuda_elem0(&in[1]), a.k = cuda_elem0(&in[2]);
        a.v = cuda_elem0(&in[3]), a.o = cuda_elem0(&in[4]), a.lse = cuda_elem0(&in[5]);
        a.gq = cuda_elem0(&out[0]), a.gk = cuda_elem0(&out[1]), a.gv = cuda_elem0(&out[2]);
        if (d.B * d.Tq == 0) { /* no query sees a key: their gradients are zero */
            const size_t es = ts_plugin_dtype_size(in[0].dtype);
            LAUNCH(c, cudaMemsetAsync(a.gk, 0, (size_t)(d.B * d.Tk * d.D) * es, c->stream));
            LAUNCH(c, cudaMemsetAsync(a.gv, 0, (size_t)(d.B * d.Tk * d.Dv) * es, c->stream));
            return TS_OK;
        }
    } else {
        a.q = cuda_elem0(&in[0]), a.k = cuda_elem0(&in[1]), a.v = cuda_elem0(&in[2]);
        a.o = cuda_elem0(&out[0]), a.lse = cuda_elem0(&out[1]);
    }
    void *scratch = NULL;
    size_t nb = cu_attention_scratch(&a);
    if (nb && (s = cuda_scratch(c, nb, "attention row sums", &scratch)))
        return s;
    cudaError_t e = cu_attention(c->stream, &a, scratch);
    if (scratch)
        cuda_scratch_free(c, scratch);
    LAUNCH(c, e);
    return TS_OK;
}

/* ---- entry points ---------------------------------------------------------------------- */

int cuda_ops_supports(int32_t op, int32_t dtype)
{
    switch (op) {
    case TS_OP_COPY:
    case TS_OP_CAST:
    case TS_OP_FILL:
    case TS_OP_WHERE:
    case TS_OP_BINARY:
    case TS_OP_BINARY_SCALAR:
    case TS_OP_INDEX_SELECT:
    case TS_OP_INDEX_ADD:
    case TS_OP_UNARY:
    case TS_OP_REDUCE:
    case TS_OP_SOFTMAX:
    case TS_OP_LOG_SOFTMAX:
    case TS_OP_CROSS_ENTROPY:
    case TS_OP_CROSS_ENTROPY_BWD:
    case TS_OP_MAXPOOL2D:
    case TS_OP_AVGPOOL2D:
    case TS_OP_MAXPOOL2D_BWD:
    case TS_OP_AVGPOOL2D_BWD:
    case TS_OP_SGD_STEP:
    case TS_OP_ADAM_STEP:
    case TS_OP_LAYER_NORM:
    case TS_OP_LAYER_NORM_BWD:
    case TS_OP_ATTENTION:
    case TS_OP_ATTENTION_BWD:
        return hk_op_defined(op, dtype);
    default:
        return 0;
    }
}

ts_status cuda_ops_run(cuda_ctx *c, const ts_kernel_call *call)
{
    switch (call->op) {
    case TS_OP_COPY:
    case TS_OP_CAST: return run_copy_cast(c, call);
    case TS_OP_FILL: return run_fill(c, call);
    case TS_OP_UNARY: return run_unary(c, call);
    case TS_OP_BINARY: return run_binary(c, call);
    case TS_OP_BINARY_SCALAR: return run_binary_scalar(c, call);
    case TS_OP_WHERE: return run_where(c, call);
    case TS_OP_REDUCE: return run_reduce(c, call);
    case TS_OP_SOFTMAX:
    case TS_OP_LOG_SOFTMAX: return run_softmax(c, call);
    case TS_OP_INDEX_SELECT:
    case TS_OP_INDEX_ADD: return run_index(c, call);
    case TS_OP_CROSS_ENTROPY:
    case TS_OP_CROSS_ENTROPY_BWD: return run_xent(c, call);
    case TS_OP_MAXPOOL2D:
    case TS_OP_AVGPOOL2D: return run_pool(c, call);
    case TS_OP_MAXPOOL2D_BWD:
    case TS_OP_AVGPOOL2D_BWD: return run_pool_bwd(c, call);
    case TS_OP_SGD_STEP:
    case TS_OP_ADAM_STEP: return run_optim(c, call);
    case TS_OP_LAYER_NORM:
    case TS_OP_LAYER_NORM_BWD: return run_layer_norm(c, call);
    case TS_OP_ATTENTION:
    case TS_OP_ATTENTION_BWD: return run_attention(c, call);
    default: return TS_ENOTSUP;
    }
}
