/* core/grad_fns.h: the recording hooks the forward ops call (grad_fns.c, and each family's
 * core/op_*.c beside its front end). Each records a node for out when a gradient is needed,
 * and is a cheap no-op otherwise. On failure the caller drops out and returns the status. */
#ifndef TESSERA_CORE_GRAD_FNS_H
#define TESSERA_CORE_GRAD_FNS_H

#include "internal.h"

enum {
    TS__VIEW_RESHAPE = 0, /* view, reshape, flatten, squeeze, unsqueeze */
    TS__VIEW_PERMUTE = 1, /* params: dims packed 4 bits each */
    TS__VIEW_EXPAND = 2,
    TS__VIEW_SLICE = 3,   /* params: dim, start, stop, step (clamped) */
    TS__VIEW_SELECT = 4   /* params: dim, index (non-negative) */
};

ts_status ts__ag_binary(int fn, const ts_tensor *a, const ts_tensor *b, ts_tensor *out);
ts_status ts__ag_scalar(int fn, const ts_tensor *x, double c, int first, ts_tensor *out);
ts_status ts__ag_unary(int fn, const ts_tensor *x, ts_tensor *out);
ts_status ts__ag_where(const ts_tensor *c, const ts_tensor *a, const ts_tensor *b,
                       ts_tensor *out);
ts_status ts__ag_cast(const ts_tensor *x, ts_tensor *out);
ts_status ts__ag_identity(const char *name, const ts_tensor *x, ts_tensor *out);
ts_status ts__ag_to(const ts_tensor *x, ts_tensor *out);
/* reduced_mask: bit d set if dim d of x was reduced. */
ts_status ts__ag_reduce(int fn, const ts_tensor *x, int64_t reduced_mask, ts_tensor *out);
ts_status ts__ag_matmul(const ts_tensor *a, const ts_tensor *b, ts_tensor *out);
ts_status ts__ag_softmax(int log_form, const ts_tensor *x, int dim, ts_tensor *out);
ts_status ts__ag_index_select(const ts_tensor *x, int dim, const ts_tensor *index,
                              ts_tensor *out);
/* Backward of a slice or select node n straight into acc, the gradient its input has
 * accumulated so far in this pass: acc's part += g in place. Only when acc is this pass's own
 * (no other reference to it or its storage), contiguous, of the input's shape and of g's
 * dtype and device: then 1 (*s says how the add went); else 0 and the usual backward runs. */
int ts__view_backward_into(ts_node *n, ts_tensor *g, ts_tensor *acc, ts_status *s);
ts_status ts__ag_view(int kind, const ts_tensor *x, ts_tensor *out, const int64_t *params,
                      int nparams);
ts_status ts__ag_conv2d(const ts_tensor *x, const ts_tensor *w, const ts_tensor *bias,
                        const ts_conv2d_params *p, ts_tensor *out);
ts_status ts__ag_pool2d(const ts_tensor *x, const ts_pool2d_params *p, const ts_tensor *indices,
                        ts_tensor *out);
/* Layer norm, fused: saved x (contiguous), mean, rstd and the weight. */
ts_status ts__ag_layer_norm(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                            const ts_tensor *xc, const ts_tensor *mean, const ts_tensor *rstd,
                            const ts_layer_norm_params *p, ts_tensor *out);
ts_status ts__ag_cross_entropy(const ts_tensor *logits, const ts_tensor *targets,
                               ts_tensor *out);

/* ---- mixed precision (autocast.c) ------------------------------------------------------ */

enum { TS__AC_LOW = 1, TS__AC_FLOAT32 = 2, TS__AC_MAX = 4 };
/* Under ts_autocast_begin: the n operands (up to TS__AC_MAX, NULL allowed) as the op wants
 * them, TS__AC_LOW: float32 ones cast to the autocast dtype; TS__AC_FLOAT32: 16-bit float
 * ones cast to float32. *cast is 0 when none needs it (out untouched); else out[i] holds a
 * reference to each operand, cast or not (NULL for NULL), for ts__autocast_release. */
ts_status ts__autocast(int kind, int n, const ts_tensor *const *in, ts_tensor **out, int *cast);
void ts__autocast_release(int n, ts_tensor **t);
/* Opens an autocast scope of dtype (TS_F32: off) without checks, for ts_autocast_end to
 * close: backward turns it off, a checkpointed segment's recompute puts its forward's back. */
ts_status ts__autocast_push(int32_t dtype);

/* An op front end's first lines under autocast: the op again on its operands as cast, when
 * any needed it. CALL uses ac_[0..] in place of the operands. */
#define TS__AUTOCAST(kind, n, ops, CALL)                                                    \
    do {                                                                                    \
        ts_tensor *ac_[TS__AC_MAX];                                                         \
        int acc_;                                                                           \
        ts_status acs_ = ts__autocast((kind), (n), (ops), ac_, &acc_);                      \
        if (acs_)                                                                           \
            return acs_;                                                                    \
        if (acc_) {                                                                         \
            acs_ = (CALL);                                                                  \
            ts__autocast_release((n), ac_);                                                 \
            return acs_;                                                                    \
        }                                                                                   \
    } while (0)

/* ---- what the op families share (core/op_*.c, ops.c, losses.c, grad_fns.c) ---------- */

/* TS_EDTYPE unless t is of a float dtype (float32, float64, bfloat16, float16). */
static inline ts_status ts__need_float(const char *op, const ts_tensor *t)
{
    if (!ts__dtype_is_float(t->dtype))
        return ts__fail(TS_EDTYPE, "%s: %s tensor; this op needs a float dtype (float32, "
                        "float64, bfloat16 or float16)", op, ts_dtype_name(t->dtype));
    return TS_OK;
}

/* Reduces g to input i's shape (broadcast dims summed). (transfer full) */
static inline ts_status ts__grad_to_input(const ts_node *n, int i, ts_tensor *g,
                                          ts_tensor **out)
{
    return ts__sum_to(g, n->in_ndim[i], n->in_shape[i], out);
}

/* x OP y as a float mask of x's dtype, in the current scope. */
static inline ts_tensor *ts__s_mask(int fn, const ts_tensor *x, const ts_tensor *y)
{
    ts_tensor *m = NULL;
    m = TS_SCOPED(ts_binary(fn, x, y, &m), m);
    return ts_s_cast(m, x ? ts_tensor_dtype(x) : TS_F32);
}

/* In a backward formula: on failure, s is set and control goes to out. */
#define TRY(expr)                                                                           \
    do {                                                                                    \
        if ((s = (expr)))                                                                   \
            goto out;                                                                       \
    } while (0)

/* Records with ts__ag_* call, dropping *out and returning the status on failure. */
#define TS__RECORD(call, out)                                                               \
    do {                                                                                    \
        ts_status rs_ = (call);                                                             \
        if (rs_) {                                                                          \
            ts_tensor_unref(out);                                                           \
            return rs_;                                                                     \
        }                                                                                   \
    } while (0)

#endif
