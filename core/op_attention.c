/* core/op_attention.c: scaled dot-product attention, softmax(scale q k^T + mask) v: one fused
 * kernel each way (TS_OP_ATTENTION, FlashAttention's online softmax) where the device runs
 * both, the same arithmetic composed from matmul and softmax elsewhere or when the fused
 * path is switched off. */
#include <math.h>
#include <stdatomic.h>

#include "grad_fns.h"

static atomic_int fused_mode = TS_ATTENTION_AUTO;

TS_API int ts_attention_fused(int mode)
{
    if (mode < TS_ATTENTION_COMPOSED || mode > TS_ATTENTION_AUTO)
        return atomic_load(&fused_mode);
    return atomic_exchange(&fused_mode, mode);
}

/* Where the measurements (docs/performance.md) put the crossovers. On the CPU plugins the
 * composed path's GEMMs (BLAS, with fused multiply-adds) win below this many keys and the
 * fused pass from it on. On the GPU the other way round: the fused kernel wins the short
 * contexts, where a step is bound by kernel launches, and cuBLAS's GEMMs the long ones. The
 * fused pass always saves the score matrices. */
#define FUSED_CROSSOVER_KEYS 512

static int use_fused(ts_device *dev, int32_t dtype, int64_t Tk)
{
    int mode = atomic_load(&fused_mode);
    if (mode == TS_ATTENTION_COMPOSED || !ts__device_runs(dev, TS_OP_ATTENTION, dtype) ||
        !ts__device_runs(dev, TS_OP_ATTENTION_BWD, dtype))
        return 0;
    const ts_plugin_desc *d = ts_device_desc(dev);
    return mode == TS_ATTENTION_FUSED ||
           ((d->flags & TS_PLUGIN_HOST_MEMORY) ? Tk >= FUSED_CROSSOVER_KEYS
                                               : Tk < FUSED_CROSSOVER_KEYS);
}

TS_API int ts_attention_fuses(const ts_tensor *q, const ts_tensor *k)
{
    if (!q || !k || q->ndim < 2 || k->ndim < 2)
        return 0;
    /* as ts_attention decides, under autocast in the dtype it would run in */
    int32_t dt = q->dtype;
    if (dt == TS_F32 && ts_autocast_dtype() != TS_F32)
        dt = ts_autocast_dtype();
    return use_fused(q->storage->dev, dt, k->shape[k->ndim - 2]);
}

/* Checks q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv): one device and dtype, the same
 * leading dims, the mask's needs. */
static ts_status check_qkv(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v,
                           int causal, ts_tensor **out)
{
    if (!out)
        return ts__fail(TS_EINVAL, "attention: out is NULL");
    *out = NULL;
    if (!q || !k || !v)
        return ts__fail(TS_EINVAL, "attention: q, k and v must not be NULL");
    ts_status s;
    if ((s = ts__need_float("attention", q)) || (s = ts__check_pair("attention", q, k, 1)) ||
        (s = ts__check_pair("attention", q, v, 1)))
        return s;
    if (causal != 0 && causal != 1)
        return ts__fail(TS_EINVAL, "attention: causal is %d; give 1 (a query sees the keys up "
                        "to its own position) or 0 (every key)", causal);
    char b1[160], b2[160], b3[160];
    int nd = q->ndim, ok = nd >= 2 && k->ndim == nd && v->ndim == nd;
    for (int d = 0; ok && d < nd - 2; d++)
        ok = k->shape[d] == q->shape[d] && v->shape[d] == q->shape[d];
    ok = ok && k->shape[nd - 1] == q->shape[nd - 1] && v->shape[nd - 2] == k->shape[nd - 2];
    if (!ok)
        return ts__fail(TS_ESHAPE, "attention: q %s, k %s and v %s do not fit: q (..., Tq, D), "
                        "k (..., Tk, D), v (..., Tk, Dv) with the same leading dims",
                        ts__shape_str(q->ndim, q->shape, b1, sizeof b1),
                        ts__shape_str(k->ndim, k->shape, b2, sizeof b2),
                        ts__shape_str(v->ndim, v->shape, b3, sizeof b3));
    int64_t Tq = q->shape[nd - 2], Tk = k->shape[nd - 2];
    if (causal ? Tq > Tk : (Tk == 0 && Tq > 0))
        return ts__fail(TS_ESHAPE, "attention: %lld queries and %lld keys: %s", (long long)Tq,
                        (long long)Tk, causal ? "a causal mask needs at least as many keys as "
                        "queries (query i sees keys up to i + Tk - Tq)"
                                              : "there must be at least one key");
    return TS_OK;
}

/* The same arithmetic from plain ops: softmax(scale q k^T, masked) v. */
static ts_status attention_composed(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v,
                                    int causal, double scale, ts_tensor **out)
{
    const int nd = q->ndim;
    const int64_t Tq = q->shape[nd - 2], Tk = k->shape[nd - 2];
    ts_device *dev = q->storage->dev;
    ts_scope *sc = ts_scope_begin();
    ts_tensor *att = ts_s_mul_scalar(ts_s_matmul(q, ts_s_transpose((ts_tensor *)k, nd - 2,
                                                                   nd - 1)), scale);
    if (causal) {
        /* + 0 where query i sees key j (j <= i + Tk - Tq), + -inf elsewhere: a (Tq, Tk) mask
         * broadcast over the leading dims, as a model that keeps one would add it */
        ts_tensor *i = NULL, *j = NULL, *zero = NULL, *ninf = NULL, *keep = NULL, *mask = NULL;
        i = TS_SCOPED(ts_tensor_arange(dev, TS_I64, (double)(Tk - Tq),
                                       (double)(Tk - Tq + Tq), 1, &i), i);
        j = TS_SCOPED(ts_tensor_arange(dev, TS_I64, 0, (double)Tk, 1, &j), j);
        zero = TS_SCOPED(ts_tensor_zeros(dev, q->dtype, 0, NULL, &zero), zero);
        ninf = TS_SCOPED(ts_tensor_full(dev, q->dtype, 0, NULL, -INFINITY, &ninf), ninf);
        keep = TS_SCOPED(ts_ge(ts_s_view(i, 2, (const int64_t[]){Tq, 1}),
                               ts_s_view(j, 2, (const int64_t[]){1, Tk}), &keep), keep);
        mask = TS_SCOPED(ts_where(keep, zero, ninf, &mask), mask);
        att = ts_s_add(att, mask);
    }
    /* In a 16-bit dtype (autocast's low one) the softmax reads and writes the scores in that
     * dtype, computing in float32 and rounding once, as the fused kernel does: not autocast's
     * float32 softmax with its casts both ways (2.5 passes over the T x T scores each way). */
    int off = ts_plugin_dtype_is_half(q->dtype) && ts__autocast_push(TS_F32) == TS_OK;
    ts_tensor *p = ts_s_softmax(att, -1);
    if (off)
        ts_autocast_end();
    return ts_scope_return(sc, ts_s_matmul(p, v), out);
}

static ts_status attention_backward(ts_node *n, ts_tensor *g, ts_tensor **gin)
{
    const ts_attention_params *p = (const ts_attention_params *)&n->p;
    ts_tensor *gc = NULL, *o[3] = {NULL, NULL, NULL};
    ts_status s = TS_OK;
    TRY(ts_tensor_contiguous(g, &gc));
    /* gradients as the kernel's (B, T, D) operands, viewed as the inputs' shapes below */
    for (int i = 0; i < 3; i++)
        TRY(ts_tensor_empty(n->in_device[i], n->in_dtype[i], n->saved[i]->ndim,
                            n->saved[i]->shape, &o[i]));
    ts_operand in[6], out_[3];
    ts__operand(gc, &in[0]);
    in[0].ndim = 3; /* go as (B, Tq, Dv): o's kernel shape */
    for (int d = 0; d < 3; d++)
        in[0].shape[d] = n->saved[3]->shape[d], in[0].strides[d] = n->saved[3]->strides[d];
    for (int i = 0; i < 5; i++)
        ts__operand(n->saved[i], &in[1 + i]);
    for (int i = 0; i < 3; i++)
        ts__operand(o[i], &out_[i]);
    TRY(ts__run(n->in_device[0], TS_OP_ATTENTION_BWD, in, 6, out_, 3, p, sizeof *p));
    for (int i = 0; i < 3; i++)
        if (n->needs[i])
            TRY(ts_tensor_view(o[i], n->in_ndim[i], n->in_shape[i], &gin[i]));
out:
    ts_tensor_unref(gc);
    for (int i = 0; i < 3; i++)
        ts_tensor_unref(o[i]);
    return s;
}

/* A contiguous (B, T, F) view of t (..., T, F). (transfer full) */
static ts_status as_3d(const ts_tensor *t, ts_tensor **out)
{
    ts_tensor *c = NULL;
    int64_t B = 1;
    for (int d = 0; d < t->ndim - 2; d++)
        B *= t->shape[d];
    ts_status s = ts_tensor_contiguous((ts_tensor *)t, &c);
    if (!s)
        s = ts_tensor_view(c, 3, (const int64_t[]){B, t->shape[t->ndim - 2],
                                                    t->shape[t->ndim - 1]}, out);
    ts_tensor_unref(c);
    return s;
}

TS_API ts_status ts_attention(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v,
                              int causal, double scale, ts_tensor **out)
{
    TS__AUTOCAST(TS__AC_LOW, 3, ((const ts_tensor *const[]){q, k, v}),
                 ts_attention(ac_[0], ac_[1], ac_[2], causal, scale, out));
    ts_status s = check_qkv(q, k, v, causal, out);
    if (s)
        return s;
    const int nd = q->ndim;
    if (scale == 0)
        scale = 1 / sqrt((double)q->shape[nd - 1]);
    if (!isfinite(scale))
        return ts__fail(TS_EINVAL, "attention: scale %g must be finite (0: 1/sqrt(D))", scale);
    ts_device *dev = q->storage->dev;
    if (!use_fused(dev, q->dtype, k->shape[nd - 2]))
        return attention_composed(q, k, v, causal, scale, out);
    ts_tensor *q3 = NULL, *k3 = NULL, *v3 = NULL, *o = NULL, *lse = NULL, *y = NULL;
    ts_attention_params p = {scale, causal};
    const int32_t sdt = q->dtype == TS_F64 ? TS_F64 : TS_F32;
    if ((s = as_3d(q, &q3)) || (s = as_3d(k, &k3)) || (s = as_3d(v, &v3)))
        goto done;
    const int64_t B = q3->shape[0], Tq = q3->shape[1], Dv = v3->shape[2];
    if ((s = ts__new(dev, q->dtype, 3, (const int64_t[]){B, Tq, Dv}, &o)) ||
        (s = ts__new(dev, sdt, 2, (const int64_t[]){B, Tq}, &lse)))
        goto done;
    ts_operand in[3], outs[2];
    ts__operand(q3, &in[0]);
    ts__operand(k3, &in[1]);
    ts__operand(v3, &in[2]);
    ts__operand(o, &outs[0]);
    ts__operand(lse, &outs[1]);
    if ((s = ts__run(dev, TS_OP_ATTENTION, in, 3, outs, 2, &p, sizeof p)) == TS_ENOTSUP) {
        /* declined for these sizes (a cuda head wider than its kernels take): composed */
        ts_clear_error();
        s = attention_composed(q, k, v, causal, scale, out);
        goto done;
    }
    if (s)
        goto done;
    int64_t shape[TS_MAX_DIMS];
    for (int d = 0; d < nd - 1; d++)
        shape[d] = q->shape[d];
    shape[nd - 1] = Dv;
    if ((s = ts_tensor_view(o, nd, shape, &y)))
        goto done;
    const ts_tensor *inputs[3] = {q, k, v};
    if (ts__grad_needed(3, inputs)) {
        const ts_tensor *save[5] = {q3, k3, v3, o, lse};
        if ((s = ts__record("attention", attention_backward, y, 3, inputs, 5, save, &p,
                            sizeof p, NULL)))
            goto done;
    }
    *out = y;
    y = NULL;
done:
    ts_tensor_unref(q3), ts_tensor_unref(k3), ts_tensor_unref(v3);
    ts_tensor_unref(o), ts_tensor_unref(lse), ts_tensor_unref(y);
    return s;
}
