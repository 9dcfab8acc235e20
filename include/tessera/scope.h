/* tessera/scope.h: scoped tensors. Between ts_scope_begin and ts_scope_end every tensor a
 * ts_s_* function returns belongs to the scope and is released when it ends, so code that
 * builds an expression of tensors reads like the math:
 *
 *     ts_scope *sc = ts_scope_begin();
 *     ts_tensor *att = ts_s_softmax(ts_s_mul_scalar(ts_s_matmul(q, kt), scale), -1);
 *     ts_tensor *y = ts_s_matmul(att, v);
 *     return ts_scope_return(sc, y, &out);   // out: a reference of the caller's own
 *
 * The status is sticky: after a failure every later ts_s_* call of the scope does nothing and
 * returns NULL, and a NULL input does the same, so the caller checks once, at the end; the
 * message is the first failure's. The ts_s_* functions are thin forms of the status API
 * (tessera/ops.h, tensor.h), which stays the stable base: same kernels, same results.
 *
 * C evaluates a call's arguments in no set order: where the order of two ops matters (random
 * draws, as dropout's), give each its own statement.
 *
 * Scopes nest per thread (the innermost one owns what is made); a scope and its tensors
 * belong to the thread that began it. The bookkeeping reuses its memory: a steady training
 * step that uses scopes makes no host allocation for them. */
#ifndef TESSERA_SCOPE_H
#define TESSERA_SCOPE_H
#include <stdint.h>
#include <tessera/nn.h>
#include <tessera/tensor.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_scope ts_scope;

/* Begins a scope on this thread. NULL only when 64 scopes are already open on it: the
 * innermost open one then records the failure (its ts_s_* calls do nothing from there on), and
 * ts_scope_end(NULL) returns it. A thread that exits with scopes open releases their tensors. */
ts_scope *ts_scope_begin(void);
/* Releases every tensor the scope owns (a kept reference stays valid) and returns its status:
 * TS_OK, or the first failure with its message. Ending a scope that is not the innermost ends
 * the inner ones first. */
ts_status ts_scope_end(ts_scope *sc);
/* TS_OK, or the scope's first failure. */
ts_status ts_scope_status(const ts_scope *sc);
/* A new reference to t for the caller, which outlives the scope (NULL stays NULL). */
ts_tensor *ts_scope_keep(ts_tensor *t);
/* Hands *t, made by the status API, to the innermost scope (transfer full; *t is set to NULL)
 * and returns it; with status non-zero, records the failure instead and returns NULL. So
 * `ts_scope_adopt(ts_foo(a, &t), &t)` is the scoped form of any call (t is read only after
 * the call has run, whatever order C evaluates the arguments in). With t NULL, for a call that
 * makes no tensor (an in-place op), only a failure is recorded. */
ts_tensor *ts_scope_adopt(ts_status status, ts_tensor **t);
/* Ends the scope and hands r to the caller in *out (a reference of its own): the usual end of
 * a function that builds its result in a scope. On failure *out is NULL. */
ts_status ts_scope_return(ts_scope *sc, ts_tensor *r, ts_tensor **out);
/* The scoped form of a status-API call that makes one tensor in t (a ts_tensor * variable):
 * t is cleared first, so a call that fails without writing it brings in nothing stale.
 *     ts_tensor *t, *z = TS_SCOPED(ts_tensor_zeros(dev, TS_F32, 1, &n, &t), t); */
#define TS_SCOPED(call, t) ((t) = NULL, ts_scope_adopt((call), &(t)))

/* ---- the ops, in the innermost scope (each as the ts_ function of the same name) ---------- */
ts_tensor *ts_s_add(const ts_tensor *a, const ts_tensor *b);
ts_tensor *ts_s_sub(const ts_tensor *a, const ts_tensor *b);
ts_tensor *ts_s_mul(const ts_tensor *a, const ts_tensor *b);
ts_tensor *ts_s_div(const ts_tensor *a, const ts_tensor *b);
ts_tensor *ts_s_pow(const ts_tensor *a, const ts_tensor *b);
ts_tensor *ts_s_add_scalar(const ts_tensor *x, double s);
ts_tensor *ts_s_mul_scalar(const ts_tensor *x, double s);
ts_tensor *ts_s_pow_scalar(const ts_tensor *x, double s);
ts_tensor *ts_s_neg(const ts_tensor *x);
ts_tensor *ts_s_abs(const ts_tensor *x);
ts_tensor *ts_s_exp(const ts_tensor *x);
ts_tensor *ts_s_log(const ts_tensor *x);
ts_tensor *ts_s_sqrt(const ts_tensor *x);
ts_tensor *ts_s_rsqrt(const ts_tensor *x);
ts_tensor *ts_s_tanh(const ts_tensor *x);
ts_tensor *ts_s_sigmoid(const ts_tensor *x);
ts_tensor *ts_s_relu(const ts_tensor *x);
ts_tensor *ts_s_gelu_tanh(const ts_tensor *x);
ts_tensor *ts_s_silu(const ts_tensor *x);
ts_tensor *ts_s_unary(int fn, const ts_tensor *x);
ts_tensor *ts_s_binary_scalar(int fn, const ts_tensor *x, double s, int scalar_first);
ts_tensor *ts_s_cast(const ts_tensor *x, int32_t dtype); /* the same tensor when already dtype */
ts_tensor *ts_s_sum(const ts_tensor *x, int ndims, const int *dims, int keepdim);
ts_tensor *ts_s_mean(const ts_tensor *x, int ndims, const int *dims, int keepdim);
ts_tensor *ts_s_matmul(const ts_tensor *a, const ts_tensor *b);
ts_tensor *ts_s_softmax(const ts_tensor *x, int dim);
ts_tensor *ts_s_attention(const ts_tensor *q, const ts_tensor *k, const ts_tensor *v,
                          int causal, double scale);
ts_tensor *ts_s_log_softmax(const ts_tensor *x, int dim);
ts_tensor *ts_s_embedding(const ts_tensor *weight, const ts_tensor *index);
ts_tensor *ts_s_layer_norm(const ts_tensor *x, const ts_tensor *weight, const ts_tensor *bias,
                           int ndim, double eps);
ts_tensor *ts_s_rms_norm(const ts_tensor *x, const ts_tensor *weight, int ndim, double eps);
/* Losses (tessera/autograd.h). */
ts_tensor *ts_s_cross_entropy(const ts_tensor *logits, const ts_tensor *targets, int reduction);
ts_tensor *ts_s_mse_loss(const ts_tensor *input, const ts_tensor *target, int reduction);
/* Views (tessera/tensor.h). */
ts_tensor *ts_s_view(ts_tensor *t, int ndim, const int64_t *shape);
ts_tensor *ts_s_reshape(ts_tensor *t, int ndim, const int64_t *shape);
ts_tensor *ts_s_narrow(ts_tensor *t, int dim, int64_t start, int64_t length);
ts_tensor *ts_s_transpose(ts_tensor *t, int dim0, int dim1);
ts_tensor *ts_s_permute(ts_tensor *t, const int *dims);
ts_tensor *ts_s_contiguous(ts_tensor *t);
ts_tensor *ts_s_unsqueeze(ts_tensor *t, int dim);
ts_tensor *ts_s_expand(ts_tensor *t, int ndim, const int64_t *shape);
/* In place (tessera/ops.h): the updated tensor itself, which stays the caller's (not the
 * scope's), or NULL; nothing is written once the scope has failed. */
ts_tensor *ts_s_copy_(ts_tensor *dst, const ts_tensor *src);
ts_tensor *ts_s_add_(ts_tensor *a, const ts_tensor *b);
ts_tensor *ts_s_sub_(ts_tensor *a, const ts_tensor *b);
ts_tensor *ts_s_mul_scalar_(ts_tensor *x, double s);
/* A module's forward (tessera/nn.h). */
ts_tensor *ts_s_forward(ts_module *m, ts_tensor *x);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_SCOPE_H */
