/* kernels/host/loss.c: the fused cross-entropy loss TS_OP_CROSS_ENTROPY and its gradient
 * TS_OP_CROSS_ENTROPY_BWD on F32/F64 logits with TS_I64 or TS_I32 targets. Each row goes
 * through log-sum-exp with its max subtracted, in double whatever the dtype, so logits in the
 * thousands stay finite; rows are independent and run on OpenMP threads. */
#include "hostkern.h"
#include "vmath.h"

#include <math.h>

int hk_loss_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_CROSS_ENTROPY || op == TS_OP_CROSS_ENTROPY_BWD) &&
           hk_op_defined(op, dtype);
}

static double ld(const ts_operand *t, int64_t off)
{
    return t->dtype == TS_F32 ? (double)((const float *)t->data)[off]
                              : ((const double *)t->data)[off];
}

static void st(const ts_operand *t, int64_t off, double v)
{
    if (t->dtype == TS_F32)
        ((float *)t->data)[off] = (float)v;
    else
        ((double *)t->data)[off] = v;
}

static int64_t target_at(const ts_operand *t, int64_t i)
{
    int64_t off = t->offset + i * t->strides[0];
    return t->dtype == TS_I64 ? ((const int64_t *)t->data)[off]
                              : (int64_t)((const int32_t *)t->data)[off];
}

/* One float32 row with unit strides, vectorized as softmax's is: the max (NaN if any logit
 * is NaN), e_j = exp(x_j - max) and their sum in double lanes; the loss lse - x_t, or the
 * gradient g (e_j / sum - [j == t]). out may be x itself (written after every read). */
HK_CLONES static void ce_row_f32(const float *x, int64_t C, int64_t t, double g, float *out,
                                 int bwd)
{
    const float xt = x[t], m = hk_max_nan_f32(x, C);
    if (!bwd) {
        out[0] = (float)((double)m + log(hk_exp_shift_sum_f32(x, m, NULL, C)) - (double)xt);
        return;
    }
    double sum = hk_exp_shift_sum_f32(x, m, out, C);
    const float gs = (float)(g / sum), gf = (float)g;
#pragma omp simd
    for (int64_t j = 0; j < C; j++)
        out[j] = out[j] * gs;
    out[t] -= gf;
}

/* logits: (N, C), targets: (N) TS_I64/TS_I32, [gloss: (N)] -> loss: (N) or glogits: (N, C). */
ts_status hk_loss(hk_dev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    if (call->op != TS_OP_CROSS_ENTROPY && call->op != TS_OP_CROSS_ENTROPY_BWD)
        return TS_ENOTSUP;
    int bwd = call->op == TS_OP_CROSS_ENTROPY_BWD;
    const char *name = bwd ? "cross_entropy_bwd" : "cross_entropy";
    if (call->ninputs != (bwd ? 3 : 2) || call->noutputs != 1)
        return h->fail(h, TS_EINVAL, "%s: expects %d inputs and 1 output, got %d and %d", name,
                       bwd ? 3 : 2, (int)call->ninputs, (int)call->noutputs);
    const ts_operand *x = &call->inputs[0], *t = &call->inputs[1], *out = &call->outputs[0];
    const ts_operand *gl = bwd ? &call->inputs[2] : NULL;
    int32_t dt = x->dtype;
    if ((dt != TS_F32 && dt != TS_F64) || out->dtype != dt || (gl && gl->dtype != dt) ||
        (t->dtype != TS_I64 && t->dtype != TS_I32))
        return h->fail(h, TS_EINVAL, "%s: logits%s and %s need the same float dtype, targets "
                       "TS_I64 or TS_I32", name, bwd ? ", gloss" : "", bwd ? "glogits" : "loss");
    if (x->ndim != 2 || t->ndim != 1 || out->ndim != (bwd ? 2 : 1) || (gl && gl->ndim != 1))
        return h->fail(h, TS_ESHAPE, "%s: logits must be (N, C), targets%s (N) and %s", name,
                       bwd ? " and gloss" : "", bwd ? "glogits (N, C)" : "loss (N)");
    int64_t N = x->shape[0], C = x->shape[1];
    if (t->shape[0] != N || out->shape[0] != N || (bwd && out->shape[1] != C) ||
        (gl && gl->shape[0] != N))
        return h->fail(h, TS_ESHAPE, "%s: logits are (%lld, %lld), so targets%s must be (%lld) "
                       "and %s (%lld%s); got targets (%lld)%s, %s (%lld%s)", name, (long long)N,
                       (long long)C, gl ? " and gloss" : "", (long long)N,
                       bwd ? "glogits" : "loss", (long long)N, bwd ? ", C" : "",
                       (long long)t->shape[0], gl ? (gl->shape[0] == N ? ", gloss (N)"
                                                                      : ", gloss not (N)") : "",
                       bwd ? "glogits" : "loss", (long long)out->shape[0],
                       bwd ? (out->shape[1] == C ? ", C" : ", not C") : "");
    for (int64_t i = 0; i < N; i++) {
        int64_t ti = target_at(t, i);
        if (ti < 0 || ti >= C)
            return h->fail(h, TS_EINVAL, "%s: target %lld of sample %lld is out of range "
                           "[0, C) for C = %lld", name, (long long)ti, (long long)i, (long long)C);
    }
    int64_t xs0 = x->strides[0], xs1 = x->strides[1], os0 = out->strides[0];
    int64_t os1 = bwd ? out->strides[1] : 0;
    if (dt == TS_F32 && xs1 == 1 && (!bwd || os1 == 1)) {
        const float *xf = (const float *)x->data;
        float *of = (float *)out->data;
        _Pragma("omp parallel for num_threads(hk_threads(hd)) schedule(static) if(N * C > 16384)")
        for (int64_t i = 0; i < N; i++) {
            double g = gl ? ld(gl, gl->offset + i * gl->strides[0]) : 0.0;
            ce_row_f32(xf + x->offset + i * xs0, C, target_at(t, i), g,
                       of + out->offset + i * os0, bwd);
        }
        return TS_OK;
    }
    _Pragma("omp parallel for num_threads(hk_threads(hd)) schedule(static) if(N * C > 16384)")
    for (int64_t i = 0; i < N; i++) {
        int64_t xo = x->offset + i * xs0, oo = out->offset + i * os0, ti = target_at(t, i);
        /* gloss and the target's logit are read before anything is written: glogits may be
         * the logits themselves. */
        double g = gl ? ld(gl, gl->offset + i * gl->strides[0]) : 0.0;
        double xt = ld(x, xo + ti * xs1);
        double m = -INFINITY;
        for (int64_t j = 0; j < C; j++) {
            double v = ld(x, xo + j * xs1);
            if (v > m || isnan(v))
                m = v;
            if (isnan(v))
                break;
        }
        double sum = 0.0;
        for (int64_t j = 0; j < C; j++)
            sum += exp(ld(x, xo + j * xs1) - m);
        double lse = m + log(sum);
        if (!bwd) {
            st(out, oo, lse - xt);
            continue;
        }
        for (int64_t j = 0; j < C; j++) {
            double sm = exp(ld(x, xo + j * xs1) - lse);
            st(out, oo + j * os1, g * (sm - (j == ti ? 1.0 : 0.0)));
        }
    }
    return TS_OK;
}
