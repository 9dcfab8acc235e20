/* tessera/autograd.h: define-by-run reverse-mode differentiation.
 *
 * Every differentiable operation records a graph node when grad mode is on and one of its
 * inputs requires grad. Ownership is one way, with no cycles: a tensor holds a strong
 * reference to the node that made it (its grad_fn); a node holds strong references to the
 * nodes of its inputs and to the leaf tensors it accumulates into, and keeps what backward
 * needs as detached aliases of the saved tensors (same storage, no grad_fn) together with
 * their versions. No node ever points at memory it does not own. Nodes are recycled, so a
 * steady training step allocates none with malloc.
 *
 * backward runs in reverse topological order, sums gradients over broadcast dims, accumulates
 * into the .grad of leaves that require grad, and, unless retain_graph, releases each node's
 * saved tensors and edges as soon as it has run: a second backward through the same graph is
 * a clear error. */
#ifndef TESSERA_AUTOGRAD_H
#define TESSERA_AUTOGRAD_H

#include <tessera/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- grad mode (thread-local, nestable) ------------------------------------------------ */

/* Inside a no_grad scope nothing is recorded. Scopes nest; each enter needs one exit. */
void ts_no_grad_enter(void);
void ts_no_grad_exit(void);
/* A no_grad block:  TS_NO_GRAD { evaluate(model); }  (leave it by its end: a return, break
 * or goto out of it would skip the exit). */
#define TS_NO_GRAD                                                                          \
    for (int ts_no_grad_once_ = (ts_no_grad_enter(), 1); ts_no_grad_once_;                 \
         ts_no_grad_once_ = (ts_no_grad_exit(), 0))
/* Non-zero if operations on this thread record graph nodes now. */
int ts_grad_enabled(void);

/* ---- mixed precision (thread-local, nestable) ------------------------------------------ */

/* Between ts_autocast_begin(dtype) and ts_autocast_end(), as PyTorch's torch.autocast does:
 * matmuls, convolutions and linear layers run in dtype (TS_BF16 or TS_F16), their float32
 * operands cast to it (float64 ones are left alone); softmax, log-softmax, layer and RMS norm,
 * cross-entropy, MSE, sums and means take 16-bit float operands in float32 and return
 * float32. Casts are recorded like any op, so the gradients of float32 parameters (the
 * master weights) come back in float32. TS_F32 turns it off for an inner scope. backward
 * runs with it off; an activation-checkpointed segment recomputes under the setting of its
 * forward. TS_EDTYPE for another dtype; scopes nest (each begin needs one end). */
ts_status ts_autocast_begin(int32_t dtype);
void ts_autocast_end(void);
/* The dtype matmuls run in on this thread now: TS_BF16, TS_F16, or TS_F32 when off. */
int32_t ts_autocast_dtype(void);

/* ---- per-tensor state ------------------------------------------------------------------- */

/* Marks a leaf (a tensor no recorded op produced) as a parameter whose .grad backward fills.
 * TS_ESTATE for a non-leaf (use ts_tensor_detach first); TS_EDTYPE for a non-float tensor. */
ts_status ts_tensor_set_requires_grad(ts_tensor *t, int requires_grad);
int ts_tensor_requires_grad(const ts_tensor *t);
/* Non-zero if no recorded op produced t. */
int ts_tensor_is_leaf(const ts_tensor *t);
/* The accumulated gradient, or NULL. (transfer none: valid until the next backward, zero_grad
 * or unref of t) */
ts_tensor *ts_tensor_grad(const ts_tensor *t);
/* Drops t's gradient (the next backward starts from none). */
void ts_tensor_zero_grad(ts_tensor *t);
/* Replaces t's gradient with grad (a new reference is taken; NULL clears). Shape, dtype and
 * device must match t's. */
ts_status ts_tensor_set_grad(ts_tensor *t, ts_tensor *grad);
/* The name of the node that made t ("mul", "matmul", ...), or NULL for a leaf. */
const char *ts_tensor_grad_fn_name(const ts_tensor *t);
/* A view of t's data outside the graph: no grad_fn, requires_grad off. (transfer full) */
ts_status ts_tensor_detach(ts_tensor *t, ts_tensor **out);

/* ---- backward --------------------------------------------------------------------------- */

/* Back-propagates from loss. grad: the gradient of the final objective w.r.t. loss (same
 * shape, dtype, device), or NULL when loss has one element (the gradient is then 1).
 * retain_graph non-zero keeps saved tensors for another backward. Errors: TS_ESTATE when
 * loss does not require grad, when the graph was already freed by an earlier backward, or
 * when a tensor saved for backward was modified in place since (the message names the op);
 * TS_ESHAPE for a grad of the wrong shape. On error nothing is half-accumulated into a leaf
 * of a node that had not run. */
ts_status ts_backward(ts_tensor *loss, const ts_tensor *grad, int retain_graph);

/* ---- hooks ------------------------------------------------------------------------------ */

/* Called with the gradient flowing into t, before it is accumulated (leaf) or propagated
 * (non-leaf). The hook may modify grad in place (clip it, scale it) and must not keep it
 * beyond the call; a non-OK status aborts the backward with that status. */
typedef ts_status (*ts_grad_hook)(ts_tensor *grad, void *user);
/* One hook per tensor; registering again replaces it; fn NULL removes it. */
ts_status ts_tensor_register_hook(ts_tensor *t, ts_grad_hook fn, void *user);

/* Called once per backward for a leaf t (a parameter), when every gradient that backward
 * sends to t has been accumulated into t's .grad (a tied weight receives several): from then
 * on its .grad does not change in that backward. Data parallelism uses it to reduce gradients
 * while backward goes on. A non-OK status aborts the backward. Leaves only; one per tensor;
 * fn NULL removes it. */
typedef ts_status (*ts_grad_ready_hook)(ts_tensor *t, void *user);
ts_status ts_tensor_register_post_accumulate_hook(ts_tensor *t, ts_grad_ready_hook fn,
                                                  void *user);

/* ---- gradient checkpointing ------------------------------------------------------------- */

/* A segment of the forward pass: computes *out from the inputs (transfer full on *out). It
 * must be deterministic (same inputs, same output) because it runs twice. */
typedef ts_status (*ts_segment_fn)(void *user, int nin, ts_tensor *const *in, ts_tensor **out);

/* Runs fn without recording its inside, so none of its intermediate activations are kept;
 * during backward it runs fn again with recording on and back-propagates through that.
 * Leaves used inside fn (weights captured in user) get their gradients as usual. Trades one
 * extra forward of the segment for its activation memory. (transfer full) on *out. */
ts_status ts_grad_checkpoint(ts_segment_fn fn, void *user, int nin, ts_tensor *const *inputs,
                        ts_tensor **out);
/* The same for a segment that draws random numbers from rng (dropout): the recomputation
 * draws what the forward drew (rng's offset set back for it, then restored), so the
 * gradients are those of the forward that ran. */
ts_status ts_grad_checkpoint_rng(ts_segment_fn fn, void *user, ts_rng *rng, int nin,
                                 ts_tensor *const *inputs, ts_tensor **out);

/* ---- losses ----------------------------------------------------------------------------- */

typedef enum ts_reduction {
    TS_REDUCTION_MEAN = 0,
    TS_REDUCTION_SUM = 1,
    TS_REDUCTION_NONE = 2
} ts_reduction;

/* Cross-entropy of logits (N, C) against integer targets (N), fused and numerically stable
 * (log-sum-exp); a target outside [0, C) is TS_EINVAL naming it. reduction: mean or sum over
 * the batch (a 0-d result) or none (N). (transfer full) */
ts_status ts_cross_entropy(const ts_tensor *logits, const ts_tensor *targets, int reduction,
                           ts_tensor **out);
/* Mean squared error (input - target)^2, input and target float of the same shape. */
ts_status ts_mse_loss(const ts_tensor *input, const ts_tensor *target, int reduction,
                      ts_tensor **out);
/* Binary cross-entropy of logits against targets in [0, 1] (same shape): softplus(x) - x y,
 * stable for any logit (PyTorch's BCEWithLogitsLoss). */
ts_status ts_bce_with_logits(const ts_tensor *logits, const ts_tensor *target, int reduction,
                             ts_tensor **out);
/* The share of rows of logits (N, C) whose largest entry is at labels' class (N): a
 * classifier's accuracy, computed without recording anything. */
ts_status ts_accuracy(const ts_tensor *logits, const ts_tensor *labels, double *acc);
/* Negative log-likelihood of log-probabilities (N, C) (ts_log_softmax's output) at integer
 * targets (N); a target outside [0, C) is TS_EINVAL naming it. */
ts_status ts_nll_loss(const ts_tensor *logp, const ts_tensor *targets, int reduction,
                      ts_tensor **out);

/* ---- accounting ------------------------------------------------------------------------- */

/* Graph nodes alive in the process: leak tests assert it returns to its start. */
uint64_t ts_autograd_live_nodes(void);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_AUTOGRAD_H */
