/* plugins/common/opcheck.c: argument checks and operand helpers shared by every plugin's
 * kernels, host or not: convolution and matmul shape checks, the overlap test, dense
 * operands. Uses nothing but the plugin ABI (no host memory, no OpenMP), so the cuda plugin
 * compiles it too. */
#include "hostkern.h"

static int64_t elem_size(int32_t dtype)
{
    switch (dtype) {
    case TS_F32:
    case TS_I32: return 4;
    case TS_F64:
    case TS_I64: return 8;
    case TS_U8: return 1;
    default: return 0;
    }
}

ts_status ts_hostkern_conv_check(const ts_host *h, const char *name, const ts_conv2d_params *p,
                            const ts_operand *x, const ts_operand *w, const ts_operand *y,
                            const ts_operand *bias, const char *yname, ts_conv_dims *d)
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
    *d = (ts_conv_dims){N, C, H, W, K, R, S, P, Q, G};
    return TS_OK;
}

ts_status ts_hostkern_matmul_check(const ts_host *h, const ts_kernel_call *call,
                                   ts_matmul_dims *md)
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
    *md = (ts_matmul_dims){nd, M, K, N, nbatch};
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

int ts_hostkern_overlaps(const ts_operand *a, const ts_operand *b)
{
    intptr_t alo, ahi, blo, bhi;
    return byte_span(a, &alo, &ahi) && byte_span(b, &blo, &bhi) && alo < bhi && blo < ahi;
}

ts_operand ts_hostkern_dense_like(const ts_operand *op, void *buf)
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
