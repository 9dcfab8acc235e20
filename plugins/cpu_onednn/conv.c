/* plugins/cpu_onednn/conv.c: TS_OP_CONV2D, CONV2D_BWD_DATA and CONV2D_BWD_WEIGHT, F32, and
 * natively in bfloat16 and float16 (float32 accumulation; oneDNN's AVX512_BF16 / AMX kernels
 * where the CPU has them; a shape it has only reference kernels for is declined and runs
 * through float32 copies), on oneDNN convolution primitives. The primitives are created with format "any", so oneDNN
 * picks its preferred (often blocked) layouts; the user's strided nchw / oihw (goihw with
 * groups) operands are reordered into pool scratch and back where they differ (see the
 * cache in cpu_onednn.c). Dilation is passed in oneDNN's convention (dilation - 1). The
 * checks and messages are those of cpu_blas's conv.c. */
#include "config.h"

#include "onednn.h"

int dn_conv_supports(int32_t op, int32_t dtype)
{
    return (op == TS_OP_CONV2D || op == TS_OP_CONV2D_BWD_DATA || op == TS_OP_CONV2D_BWD_WEIGHT) &&
           dtype == TS_F32;
}

/* Checks as cpu_blas does (one shared check), then refuses what oneDNN does not run here. */
static ts_status conv_check(const ts_host *h, const char *name, const ts_conv2d_params *p,
                            const ts_operand *x, const ts_operand *w, const ts_operand *y,
                            const ts_operand *bias, const char *yname, int half,
                            hk_conv_dims *d)
{
    ts_status s = hk_conv_check(h, name, p, x, w, y, bias, yname, d);
    if (s == TS_OK && y->dtype != TS_F32 && !(half && ts_plugin_dtype_is_half(y->dtype)))
        return h->fail(h, TS_ENOTSUP, "%s: cpu_onednn runs float32 only", name);
    return s;
}

/* Writes v(k) into every element of t (N, K, P, Q) or (K, ...): bias[k] or 0. */
static void fill_operand(const ts_operand *t, const ts_operand *bias)
{
    int64_t n = 1, idx[TS_MAX_DIMS] = {0};
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    for (int64_t i = 0; i < n; i++) {
        int64_t off = t->offset;
        for (int d = 0; d < t->ndim; d++)
            off += idx[d] * t->strides[d];
        float v = 0.0f;
        if (bias)
            v = ((const float *)bias->data)[bias->offset + idx[1] * bias->strides[0]];
        ((float *)t->data)[off] = v;
        for (int d = t->ndim - 1; d >= 0; d--) {
            if (++idx[d] < t->shape[d])
                break;
            idx[d] = 0;
        }
    }
}

static dnnl_data_type_t dnnl_dt(int32_t dt)
{
    return dt == TS_BF16 ? dnnl_bf16 : dt == TS_F16 ? dnnl_f16 : dnnl_f32;
}

/* The user layout of w (K, Cg, R, S): 4-D, or 5-D (G, K/G, Cg, R, S) with groups. */
static dnnl_status_t weights_md(dnnl_memory_desc_t *md, const ts_operand *w, int64_t G,
                                int any)
{
    int64_t dims[5], strides[5];
    int nd = G > 1 ? 5 : 4;
    if (G > 1) {
        dims[0] = G;
        dims[1] = w->shape[0] / G;
        strides[0] = dims[1] * w->strides[0];
        strides[1] = w->strides[0];
        for (int i = 1; i < 4; i++) {
            dims[i + 1] = w->shape[i];
            strides[i + 1] = w->strides[i];
        }
    } else {
        for (int i = 0; i < 4; i++) {
            dims[i] = w->shape[i];
            strides[i] = w->strides[i];
        }
    }
    if (any) {
        dnnl_dims_t dd;
        for (int i = 0; i < nd; i++)
            dd[i] = dims[i];
        return dnnl_memory_desc_init_by_tag(md, nd, dd, dnnl_dt(w->dtype),
                                            dnnl_format_tag_any);
    }
    return dn_md_strided_dt(md, nd, dims, strides, w->dtype);
}

static dnnl_status_t any_md(dnnl_memory_desc_t *md, const ts_operand *t)
{
    dnnl_dims_t dd;
    for (int i = 0; i < t->ndim; i++)
        dd[i] = t->shape[i];
    return dnnl_memory_desc_init_by_tag(md, t->ndim, dd, dnnl_dt(t->dtype),
                                        dnnl_format_tag_any);
}

static void push_operand(dn_key *k, const ts_operand *t)
{
    dn_key_push(k, t->ndim);
    for (int d = 0; d < t->ndim; d++) {
        dn_key_push(k, t->shape[d]);
        dn_key_push(k, t->shape[d] == 1 ? 0 : t->strides[d]);
    }
}

/* The key of op with x, w, y (for the backward ops: gx or x, gw or w, gy). */
static void conv_key(dn_key *key, int32_t op, const ts_conv2d_params *p, const ts_operand *x,
                     const ts_operand *w, const ts_operand *y, const ts_operand *bias)
{
    dn_key_push(key, op);
    dn_key_push(key, y->dtype);
    dn_key_push(key, p->stride_h);
    dn_key_push(key, p->stride_w);
    dn_key_push(key, p->pad_h);
    dn_key_push(key, p->pad_w);
    dn_key_push(key, p->dilation_h);
    dn_key_push(key, p->dilation_w);
    dn_key_push(key, p->groups);
    push_operand(key, x);
    push_operand(key, w);
    push_operand(key, y);
    dn_key_push(key, bias != NULL);
    if (bias)
        push_operand(key, bias);
}

/* The cached entry for op with x, w, y under key (conv_key). A 16-bit entry refuses oneDNN's
 * reference kernels (TS_ENOTSUP). */
static ts_status conv_entry(dn_ctx *c, const dn_key *keyp, int32_t op, const char *name,
                            const ts_conv2d_params *p, const ts_operand *x, const ts_operand *w,
                            const ts_operand *y, const ts_operand *bias, dn_entry **e)
{
    int64_t G = p->groups;
    const dn_key key = *keyp;
    const int32_t dt = y->dtype;
    if ((*e = dn_cache_find(c, &key)))
        return TS_OK;

    dnnl_status_t st;
    dnnl_memory_desc_t ux, uw, uy, ub, ax, aw, ay, ab;
    if ((st = dn_md_strided_dt(&ux, 4, x->shape, x->strides, dt)) ||
        (st = weights_md(&uw, w, G, 0)) ||
        (st = dn_md_strided_dt(&uy, 4, y->shape, y->strides, dt)) || (st = any_md(&ax, x)) ||
        (st = weights_md(&aw, w, G, 1)) || (st = any_md(&ay, y)))
        return dn_fail(c, st, name, "building the memory descriptors");
    if (bias && ((st = dn_md_strided_dt(&ub, 1, bias->shape, bias->strides, dt)) ||
                 (st = any_md(&ab, bias))))
        return dn_fail(c, st, name, "building the memory descriptors");
    dnnl_dims_t strides = {p->stride_h, p->stride_w};
    dnnl_dims_t dil = {p->dilation_h - 1, p->dilation_w - 1};
    dnnl_dims_t pad = {p->pad_h, p->pad_w};
    dnnl_convolution_desc_t fwd, bwd;
    /* The forward descriptor: the primitive itself, or the hint of a backward one. */
    if ((st = dnnl_dilated_convolution_forward_desc_init(
             &fwd, dnnl_forward_training, dnnl_convolution_direct, &ax, &aw,
             op == TS_OP_CONV2D && bias ? &ab : NULL, &ay, strides, dil, pad, pad)))
        return dn_fail(c, st, name, "dnnl_dilated_convolution_forward_desc_init");
    dn_spec sp = {.no_reference = dt != TS_F32};
    if (op == TS_OP_CONV2D) {
        sp.op_desc = &fwd;
        sp.nargs = bias ? 4 : 3;
        sp.args[0] = DNNL_ARG_SRC;
        sp.user[0] = ux;
        sp.query[0] = dnnl_query_src_md;
        sp.args[1] = DNNL_ARG_WEIGHTS;
        sp.user[1] = uw;
        sp.query[1] = dnnl_query_weights_md;
        sp.args[2] = DNNL_ARG_DST;
        sp.user[2] = uy;
        sp.query[2] = dnnl_query_dst_md;
        sp.outputs[2] = 1;
        if (bias) {
            sp.args[3] = DNNL_ARG_BIAS;
            sp.user[3] = ub;
            sp.query[3] = dnnl_query_weights_md;
            sp.qidx[3] = 1;
        }
    } else if (op == TS_OP_CONV2D_BWD_DATA) {
        /* With few input channels oneDNN's blocked diff_src pads them to 16 and its direct
         * kernel wastes most of its work (5 ms vs 1.9 ms at LeNet-5 conv1, N=64): ask for
         * plain nchw there, which selects the gemm-based implementation (measured worse
         * already at 6 channels, so only below 4). */
        dnnl_memory_desc_t gx_md = ax;
        if (x->shape[1] / G < 4 && (st = dnnl_memory_desc_init_by_tag(
                                        &gx_md, 4, ax.dims, dnnl_dt(dt), dnnl_nchw)))
            return dn_fail(c, st, name, "building the memory descriptors");
        if ((st = dnnl_dilated_convolution_backward_data_desc_init(
                 &bwd, dnnl_convolution_direct, &gx_md, &aw, &ay, strides, dil, pad, pad)))
            return dn_fail(c, st, name, "dnnl_dilated_convolution_backward_data_desc_init");
        sp.op_desc = &bwd;
        sp.hint_desc = &fwd;
        sp.nargs = 3;
        sp.args[0] = DNNL_ARG_DIFF_DST;
        sp.user[0] = uy;
        sp.query[0] = dnnl_query_diff_dst_md;
        sp.args[1] = DNNL_ARG_WEIGHTS;
        sp.user[1] = uw;
        sp.query[1] = dnnl_query_weights_md;
        sp.args[2] = DNNL_ARG_DIFF_SRC;
        sp.user[2] = ux;
        sp.query[2] = dnnl_query_diff_src_md;
        sp.outputs[2] = 1;
    } else {
        if ((st = dnnl_dilated_convolution_backward_weights_desc_init(
                 &bwd, dnnl_convolution_direct, &ax, &aw, NULL, &ay, strides, dil, pad, pad)))
            return dn_fail(c, st, name, "dnnl_dilated_convolution_backward_weights_desc_init");
        sp.op_desc = &bwd;
        sp.hint_desc = &fwd;
        sp.nargs = 3;
        sp.args[0] = DNNL_ARG_DIFF_DST;
        sp.user[0] = uy;
        sp.query[0] = dnnl_query_diff_dst_md;
        sp.args[1] = DNNL_ARG_SRC;
        sp.user[1] = ux;
        sp.query[1] = dnnl_query_src_md;
        sp.args[2] = DNNL_ARG_DIFF_WEIGHTS;
        sp.user[2] = uw;
        sp.query[2] = dnnl_query_diff_weights_md;
        sp.outputs[2] = 1;
    }
    if ((st = dnnl_primitive_attr_create(&sp.attr)))
        return dn_fail(c, st, name, "dnnl_primitive_attr_create");
    ts_status s = dn_cache_create(c, &key, &sp, name, e);
    dnnl_primitive_attr_destroy(sp.attr);
    return s;
}

static void *first(const ts_operand *t)
{
    return (char *)t->data + t->offset * (int64_t)ts_plugin_dtype_size(t->dtype);
}

/* CONV2D: in x (N, C, H, W), w (K, C/groups, R, S), bias (K) optional; out y (N, K, P, Q).
 * BWD_DATA: in gy, w; out gx. BWD_WEIGHT: in gy, x; out gw. */
static ts_status run_conv(dn_ctx *c, const ts_kernel_call *call, int half, int *declined)
{
    const ts_host *h = c->hd.host;
    int32_t op = call->op;
    if (!dn_conv_supports(op, TS_F32))
        return TS_ENOTSUP;
    const char *name = op == TS_OP_CONV2D ? "conv2d"
                       : op == TS_OP_CONV2D_BWD_DATA ? "conv2d_bwd_data"
                                                     : "conv2d_bwd_weight";
    int fwd = op == TS_OP_CONV2D;
    if (fwd ? (call->ninputs != 2 && call->ninputs != 3) || call->noutputs != 1
            : call->ninputs != 2 || call->noutputs != 1)
        return h->fail(h, TS_EINVAL, "%s: expects %s inputs and 1 output, got %d and %d", name,
                       fwd ? "2 or 3" : "2", (int)call->ninputs, (int)call->noutputs);
    if (!call->params || call->params_size < sizeof(ts_conv2d_params))
        return h->fail(h, TS_EINVAL, "%s: missing ts_conv2d_params", name);
    const ts_conv2d_params *p = call->params;
    const ts_operand *out = &call->outputs[0], *x, *w, *y, *bias = NULL;
    if (fwd) {
        x = &call->inputs[0];
        w = &call->inputs[1];
        y = out;
        bias = call->ninputs == 3 ? &call->inputs[2] : NULL;
    } else {
        y = &call->inputs[0];
        x = op == TS_OP_CONV2D_BWD_DATA ? out : &call->inputs[1];
        w = op == TS_OP_CONV2D_BWD_DATA ? &call->inputs[1] : out;
    }
    hk_conv_dims d = {0};
    ts_status s = conv_check(h, name, p, x, w, y, bias, fwd ? "y" : "gy", half, &d);
    if (s)
        return s;
    int alias = 0;
    for (int i = 0; i < call->ninputs; i++)
        alias |= hk_overlaps(out, &call->inputs[i]);
    /* Empty sums and aliasing go through float32, and so do convolutions with fewer than 16
     * channels per group in or out: oneDNN's 16-bit kernels block channels by 16 or 32, and
     * at LeNet-5's sizes (1 -> 6 -> 16 channels) its bfloat16 step measured 1.24x slower
     * than the route through float32 (a 32 -> 64 channel network: 1.28x faster). */
    if (half && (d.N == 0 || d.C == 0 || d.K == 0 || alias || d.C / d.G < 16 ||
                 d.K / d.G < 16)) {
        *declined = 1;
        return TS_OK;
    }
    if (fwd && (d.N == 0 || d.K == 0))
        return TS_OK;
    if (!fwd && (d.N == 0 || d.C == 0 || d.K == 0)) {
        fill_operand(out, NULL); /* empty sums */
        return TS_OK;
    }
    if (fwd && d.C == 0) {
        fill_operand(out, bias);
        return TS_OK;
    }

    /* An output sharing memory with an input goes through dense scratch. */
    void *obuf = NULL;
    ts_operand od = *out;
    if (alias) {
        int64_t n = 1;
        for (int k = 0; k < out->ndim; k++)
            n *= out->shape[k];
        if ((s = h->scratch_alloc(h, (size_t)n * 4, name, &obuf)))
            return s;
        od = hk_dense_like(out, obuf);
        if (fwd)
            y = &od;
        else if (op == TS_OP_CONV2D_BWD_DATA)
            x = &od;
        else
            w = &od;
    }
    /* the key of the operands the primitive will see: an aliased output's dense scratch */
    dn_key key = {0};
    conv_key(&key, op, p, x, w, y, bias);
    dn_entry *e = NULL;
    if (half && dn_is_declined(c, &key)) {
        *declined = 1;
        goto done;
    }
    if ((s = conv_entry(c, &key, op, name, p, x, w, y, bias, &e))) {
        if (half && s == TS_ENOTSUP) { /* no fast kernels for it: this key through float32 */
            dn_declined(c, &key);
            *declined = 1;
            s = TS_OK;
        }
        goto done;
    }
    void *handles[4];
    if (fwd) {
        handles[0] = first(x);
        handles[1] = first(w);
        handles[2] = first(y);
        handles[3] = bias ? first(bias) : NULL;
    } else {
        handles[0] = first(y);
        handles[1] = first(op == TS_OP_CONV2D_BWD_DATA ? w : x);
        handles[2] = first(op == TS_OP_CONV2D_BWD_DATA ? x : w);
    }
    if ((s = dn_execute(c, e, handles, name)))
        goto done;
    if (obuf)
        s = hk_dev_copy_strided(out, &od);
done:
    dn_entry_release(c, e);
    h->scratch_free(h, obuf);
    return s;
}

ts_status dn_conv(dn_ctx *c, const ts_kernel_call *call)
{
    int declined = 0;
    return run_conv(c, call, 0, &declined);
}

ts_status dn_conv_half(dn_ctx *c, const ts_kernel_call *call, int *declined)
{
    *declined = 0;
    return run_conv(c, call, 1, declined);
}
