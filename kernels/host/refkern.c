/* kernels/host/refkern.c: the reference host kernels: every shared host kernel (hostkern.h)
 * plus matmul and the three convolutions as plain loops accumulating in double. No BLAS, no
 * threads, no scratch memory: slow, short and easy to trust. libtessera runs them for plugins
 * whose memory is host-addressable (TS_PLUGIN_HOST_MEMORY) and that do not implement an op,
 * and ts_reference_run exposes them to conformance checks. */
#include "refkern.h"

static double ld(const ts_operand *o, int64_t off)
{
    const char *p = o->data;
    switch (o->dtype) {
    case TS_F32: return ((const float *)(const void *)p)[off];
    default: return ((const double *)(const void *)p)[off];
    }
}

static void st(const ts_operand *o, int64_t off, double v)
{
    char *p = o->data;
    if (o->dtype == TS_F32)
        ((float *)(void *)p)[off] = (float)v;
    else
        ((double *)(void *)p)[off] = v;
}

static int ref_matmul_conv_supports(int32_t op, int32_t dtype)
{
    return (ts_plugin_dtype_is_float(dtype) || ts_plugin_dtype_is_half(dtype)) &&
           (op == TS_OP_MATMUL || op == TS_OP_CONV2D ||
                               op == TS_OP_CONV2D_BWD_DATA || op == TS_OP_CONV2D_BWD_WEIGHT);
}

int hk_ref_supports(int32_t op, int32_t dtype)
{
    return ref_matmul_conv_supports(op, dtype) || hk_supports(op, dtype);
}

static ts_status ref_matmul(hk_dev *hd, const ts_kernel_call *call)
{
    hk_matmul_dims md;
    ts_status s = hk_matmul_check(hd->host, call, &md);
    if (s)
        return s;
    const ts_operand *A = &call->inputs[0], *B = &call->inputs[1], *C = &call->outputs[0];
    double alpha = 1, beta = 0;
    if (call->params && call->params_size >= sizeof(ts_matmul_params)) {
        const ts_matmul_params *p = call->params;
        alpha = p->alpha;
        beta = p->beta;
    }
    int nd = md.nd;
    int64_t idx[TS_MAX_DIMS] = {0};
    for (int64_t b = 0; b < md.nbatch; b++) {
        int64_t ao = A->offset, bo = B->offset, co = C->offset;
        for (int d = 0; d < nd - 2; d++) {
            ao += idx[d] * A->strides[d];
            bo += idx[d] * B->strides[d];
            co += idx[d] * C->strides[d];
        }
        for (int64_t i = 0; i < md.M; i++)
            for (int64_t j = 0; j < md.N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < md.K; k++)
                    acc += ld(A, ao + i * A->strides[nd - 2] + k * A->strides[nd - 1]) *
                           ld(B, bo + k * B->strides[nd - 2] + j * B->strides[nd - 1]);
                int64_t c = co + i * C->strides[nd - 2] + j * C->strides[nd - 1];
                /* beta == 0 ignores what out held (it may be uninitialised, even NaN). */
                st(C, c, alpha * acc + (beta != 0 ? beta * ld(C, c) : 0));
            }
        for (int d = nd - 3; d >= 0; d--) {
            if (++idx[d] < C->shape[d])
                break;
            idx[d] = 0;
        }
    }
    return TS_OK;
}

static int64_t off4(const ts_operand *o, int64_t a, int64_t b, int64_t c, int64_t d)
{
    return o->offset + a * o->strides[0] + b * o->strides[1] + c * o->strides[2] +
           d * o->strides[3];
}

static ts_status ref_conv(hk_dev *hd, const ts_kernel_call *call)
{
    const ts_host *h = hd->host;
    int op = call->op;
    int fwd = op == TS_OP_CONV2D;
    if ((fwd ? call->ninputs != 2 && call->ninputs != 3 : call->ninputs != 2) ||
        call->noutputs != 1)
        return h->fail(h, TS_EINVAL, "%s: wrong operand count (%d inputs, %d outputs)",
                       fwd ? "conv2d" : "conv2d backward", (int)call->ninputs,
                       (int)call->noutputs);
    if (!call->params || call->params_size < sizeof(ts_conv2d_params))
        return h->fail(h, TS_EINVAL, "conv2d: missing ts_conv2d_params");
    const ts_conv2d_params *p = call->params;
    /* Name the operands by their role in the forward: x (N,C,H,W), w (K,C/G,R,S), y. */
    const ts_operand *x, *w, *y, *bias = NULL;
    hk_conv_dims d;
    ts_status s;
    if (fwd) {
        x = &call->inputs[0], w = &call->inputs[1], y = &call->outputs[0];
        bias = call->ninputs == 3 ? &call->inputs[2] : NULL;
        s = hk_conv_check(h, "conv2d", p, x, w, y, bias, "y", &d);
    } else if (op == TS_OP_CONV2D_BWD_DATA) {
        y = &call->inputs[0], w = &call->inputs[1], x = &call->outputs[0];
        s = hk_conv_check(h, "conv2d_bwd_data", p, x, w, y, NULL, "gy", &d);
    } else {
        y = &call->inputs[0], x = &call->inputs[1], w = &call->outputs[0];
        s = hk_conv_check(h, "conv2d_bwd_weight", p, x, w, y, NULL, "gy", &d);
    }
    if (s)
        return s;
    int64_t Cg = d.C / d.G, Kg = d.K / d.G;
    /* Backward outputs are overwritten: zero them, then accumulate. */
    if (op == TS_OP_CONV2D_BWD_DATA)
        for (int64_t n = 0; n < d.N; n++)
            for (int64_t c = 0; c < d.C; c++)
                for (int64_t i = 0; i < d.H; i++)
                    for (int64_t j = 0; j < d.W; j++)
                        st(x, off4(x, n, c, i, j), 0);
    if (op == TS_OP_CONV2D_BWD_WEIGHT)
        for (int64_t k = 0; k < d.K; k++)
            for (int64_t c = 0; c < Cg; c++)
                for (int64_t r = 0; r < d.R; r++)
                    for (int64_t q = 0; q < d.S; q++)
                        st(w, off4(w, k, c, r, q), 0);
    for (int64_t n = 0; n < d.N; n++)
        for (int64_t k = 0; k < d.K; k++) {
            int64_t g = k / Kg;
            for (int64_t pp = 0; pp < d.P; pp++)
                for (int64_t qq = 0; qq < d.Q; qq++) {
                    int64_t yo = off4(y, n, k, pp, qq);
                    double gy = fwd ? 0 : ld(y, yo), acc = 0;
                    for (int64_t c = 0; c < Cg; c++)
                        for (int64_t r = 0; r < d.R; r++) {
                            int64_t ih = pp * p->stride_h - p->pad_h + r * p->dilation_h;
                            if (ih < 0 || ih >= d.H)
                                continue;
                            for (int64_t q = 0; q < d.S; q++) {
                                int64_t iw = qq * p->stride_w - p->pad_w + q * p->dilation_w;
                                if (iw < 0 || iw >= d.W)
                                    continue;
                                int64_t xo = off4(x, n, g * Cg + c, ih, iw);
                                int64_t wo = off4(w, k, c, r, q);
                                if (fwd)
                                    acc += ld(x, xo) * ld(w, wo);
                                else if (op == TS_OP_CONV2D_BWD_DATA)
                                    st(x, xo, ld(x, xo) + gy * ld(w, wo));
                                else
                                    st(w, wo, ld(w, wo) + gy * ld(x, xo));
                            }
                        }
                    if (fwd)
                        st(y, yo, acc + (bias ? ld(bias, bias->offset + k * bias->strides[0])
                                              : 0));
                }
        }
    return TS_OK;
}

static ts_status ref_run(void *hd, const ts_kernel_call *call)
{
    return hk_ref_run(hd, call);
}

ts_status hk_ref_run(hk_dev *hd, const ts_kernel_call *call)
{
    if (hk_call_has_half(call) && !hk_half_native(call->op))
        return hk_via_float32(hd->host, 0, call, hk_convert, hd, ref_run, hd);
    int32_t dtype = call->noutputs > 0 ? call->outputs[0].dtype : TS_F32;
    if (ref_matmul_conv_supports(call->op, dtype))
        return call->op == TS_OP_MATMUL ? ref_matmul(hd, call) : ref_conv(hd, call);
    return hk_run(hd, call);
}
