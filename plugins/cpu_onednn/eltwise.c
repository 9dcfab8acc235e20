/* plugins/cpu_onednn/eltwise.c: TS_OP_UNARY (exp, tanh, sigmoid) and TS_OP_SOFTMAX /
 * LOG_SOFTMAX, F32, on oneDNN eltwise and softmax primitives, for the calls where they are
 * exact enough and faster than the shared host kernels; dn_eltwise_wants decides per call.
 *
 * oneDNN runs these as JIT-vectorised polynomial approximations. When the thresholds below were
 * measured, the host kernels called libm's scalar expf/tanhf per element and oneDNN won by
 * several times on large tensors; they now use vmath.h's vectorised ones, and a remeasurement
 * (docs/backends.md) finds the host kernels faster for exp, sigmoid and softmax. On small
 * tensors the fixed cost of a primitive execution loses. The functions left on the host
 * kernels, and why:
 *  - neg, abs, relu, sqrt: one instruction per element, memory bound, vectorised by the
 *    compiler in the host kernel; oneDNN ties (relu) or loses (sqrt, 2x at 1M elements).
 *  - gelu: oneDNN's gelu_erf is 0.5x(1 + erf(x/sqrt 2)), which cancels for x << 0, where the
 *    host kernel uses erfc and keeps full relative precision.
 *  - log: oneDNN's log is off by 1.4e-6 absolute near 1 (log(1) = -1.43e-6), an unbounded
 *    relative error where the result is near 0.
 *  - rsqrt, erf: no oneDNN eltwise computes them directly.
 * Only dense operands with identical layouts (in place included) go to oneDNN, as a 1-D array
 * (unary) or with their own dims (softmax); anything strided stays on the host. */
#include "config.h"

#include "onednn.h"

/* Elements below which the host kernels are faster (measured with `tessera bench compare`,
 * docs/backends.md). exp ties at 4096 in CPU time, but with 2 threads on a busy machine it
 * took 5 ms there against 0.03 ms (oneDNN splits even 4096 elements over its threads and waits
 * for a descheduled one; the host kernel stays on one thread below 65536 elements); at 65536 it
 * wins 1.3-1.6x in CPU time and 7x in wall time; exp, tanh and sigmoid win 2.2-12x at 1M.
 * Softmax loses 2x at 256x1000, and wins up to 1.8x or ties at 1M. */
#define DN_UNARY_MIN 65536
#define DN_SOFTMAX_MIN (1 << 20)

/* The oneDNN eltwise algorithm (alpha = beta = 0) computing fn, or 0. */
static dnnl_alg_kind_t unary_alg(int32_t fn)
{
    switch (fn) {
    case TS_UNARY_EXP:
        return dnnl_eltwise_exp;
    case TS_UNARY_TANH:
        return dnnl_eltwise_tanh;
    case TS_UNARY_SIGMOID:
        return dnnl_eltwise_logistic;
    default:
        return (dnnl_alg_kind_t)0;
    }
}

/* Elements of t if it is dense row-major (size-1 dims ignored), else -1. */
static int64_t dense_numel(const ts_operand *t)
{
    int64_t expect = 1;
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] == 0)
            return 0;
        if (t->shape[d] == 1)
            continue;
        if (t->strides[d] != expect)
            return -1;
        expect *= t->shape[d];
    }
    return expect;
}

/* Elements if in and out are F32 with the same shapes and the same dense layout, with at least
 * min elements (in and out are then either the same memory or disjoint: the host guarantees
 * one or the other); else -1. */
static int64_t dense_pair(const ts_operand *in, const ts_operand *out, int64_t min)
{
    if (in->dtype != TS_F32 || out->dtype != TS_F32 || in->ndim != out->ndim)
        return -1;
    for (int d = 0; d < in->ndim; d++)
        if (in->shape[d] != out->shape[d])
            return -1;
    int64_t n = dense_numel(in);
    if (n < min || dense_numel(out) != n)
        return -1;
    return n;
}

int dn_eltwise_wants(const ts_kernel_call *call)
{
    if (call->ninputs != 1 || call->noutputs != 1 || !call->params)
        return 0;
    const ts_operand *in = &call->inputs[0], *out = &call->outputs[0];
    if (call->op == TS_OP_UNARY) {
        if (call->params_size < sizeof(ts_unary_params))
            return 0;
        const ts_unary_params *p = call->params;
        return unary_alg(p->fn) != 0 && dense_pair(in, out, DN_UNARY_MIN) > 0;
    }
    if (call->op == TS_OP_SOFTMAX || call->op == TS_OP_LOG_SOFTMAX) {
        if (call->params_size < sizeof(ts_dim_params) || in->ndim < 1)
            return 0;
        const ts_dim_params *p = call->params;
        if (p->dim < -in->ndim || p->dim >= in->ndim)
            return 0; /* the host kernel reports it */
        return dense_pair(in, out, DN_SOFTMAX_MIN) > 0;
    }
    return 0;
}

static void *first(const ts_operand *t)
{
    return (float *)t->data + t->offset;
}

/* Non-zero if any of the n floats at x is NaN (finite_only: or infinite). oneDNN's
 * approximations do not keep IEEE semantics there (exp(NaN) is +inf, a softmax row holding a
 * NaN gets zeros), so such calls go to the host kernels; the scan is a vectorised read, a
 * small fraction of the function's own cost. */
static int has_special(const float *x, int64_t n, int finite_only, int threads)
{
    int bad = 0;
#pragma omp parallel for simd num_threads(threads) reduction(| : bad) if (threads > 1 && n > 65536)
    for (int64_t i = 0; i < n; i++)
        bad |= finite_only ? !(x[i] - x[i] == 0.0f) : x[i] != x[i];
    return bad;
}

static ts_status run_entry(dn_ctx *c, const dn_key *key, dn_spec *sp, const char *name,
                           const ts_operand *in, const ts_operand *out)
{
    dn_entry *e = dn_cache_find(c, key);
    if (!e) {
        dnnl_status_t st = dnnl_primitive_attr_create(&sp->attr);
        if (st)
            return dn_fail(c, st, name, "dnnl_primitive_attr_create");
        ts_status s = dn_cache_create(c, key, sp, name, &e);
        dnnl_primitive_attr_destroy(sp->attr);
        if (s)
            return s;
    }
    void *handles[2] = {first(in), first(out)};
    ts_status s = dn_execute(c, e, handles, name);
    dn_entry_release(c, e);
    return s;
}

/* in, out: the same shape, dense, F32 (dn_eltwise_wants said yes). */
ts_status dn_eltwise(dn_ctx *c, const ts_kernel_call *call)
{
    const ts_operand *in = &call->inputs[0], *out = &call->outputs[0];
    int64_t n = dense_pair(in, out, 1);
    if (has_special(first(in), n, call->op != TS_OP_UNARY, hk_threads(&c->hd)))
        return hk_run(&c->hd, call);
    dn_key key = {0};
    dn_key_push(&key, call->op);
    dn_spec sp = {.nargs = 2,
                  .args = {DNNL_ARG_SRC, DNNL_ARG_DST},
                  .outputs = {0, 1},
                  .query = {dnnl_query_src_md, dnnl_query_dst_md}};
    dnnl_status_t st;
    if (call->op == TS_OP_UNARY) {
        const ts_unary_params *p = call->params;
        dnnl_alg_kind_t alg = unary_alg(p->fn);
        dn_key_push(&key, p->fn);
        dn_key_push(&key, n);
        dnnl_eltwise_desc_t ed;
        if ((st = dn_md_strided(&sp.user[0], 1, &n, (const int64_t[]){1})))
            return dn_fail(c, st, "unary", "building the memory descriptors");
        sp.user[1] = sp.user[0];
        if ((st = dnnl_eltwise_forward_desc_init(&ed, dnnl_forward_inference, alg, &sp.user[0],
                                                 0.0f, 0.0f)))
            return dn_fail(c, st, "unary", "dnnl_eltwise_forward_desc_init");
        sp.op_desc = &ed;
        return run_entry(c, &key, &sp, "unary", in, out);
    }
    const char *name = call->op == TS_OP_SOFTMAX ? "softmax" : "log_softmax";
    const ts_dim_params *p = call->params;
    int dim = p->dim < 0 ? p->dim + in->ndim : p->dim;
    /* Dense with size-1 dims anywhere: give every dim its row-major stride. */
    int64_t strides[TS_MAX_DIMS], ext = 1;
    for (int d = in->ndim - 1; d >= 0; d--) {
        strides[d] = ext;
        ext *= in->shape[d];
    }
    dn_key_push(&key, dim);
    dn_key_push(&key, in->ndim);
    for (int d = 0; d < in->ndim; d++)
        dn_key_push(&key, in->shape[d]);
    dnnl_softmax_v2_desc_t sd;
    if ((st = dn_md_strided(&sp.user[0], in->ndim, in->shape, strides)))
        return dn_fail(c, st, name, "building the memory descriptors");
    sp.user[1] = sp.user[0];
    if ((st = dnnl_softmax_v2_forward_desc_init(
             &sd, dnnl_forward_inference,
             call->op == TS_OP_SOFTMAX ? dnnl_softmax_accurate : dnnl_softmax_log, &sp.user[0],
             &sp.user[1], dim)))
        return dn_fail(c, st, name, "dnnl_softmax_v2_forward_desc_init");
    sp.op_desc = &sd;
    return run_entry(c, &key, &sp, name, in, out);
}
