/* tessera/optim.h: optimizers (SGD with momentum / dampening / Nesterov / weight decay, Adam,
 * AdamW) with parameter groups (a weight decay per parameter), gradient clipping by norm, and
 * learning-rate schedules the optimizer follows. An optimizer keeps its state
 * (moments, step count) on the parameters' device, created lazily at the first step, and
 * updates parameters in place with grad mode off. The update is one fused kernel per parameter
 * when the plugin offers it (TS_OP_SGD_STEP / TS_OP_ADAM_STEP), composed from elementwise ops
 * otherwise (the same arithmetic, equal up to float rounding). State saves into and loads from
 * a checkpoint. */
#ifndef TESSERA_OPTIM_H
#define TESSERA_OPTIM_H

#include <stddef.h>
#include <tessera/checkpoint.h>
#include <tessera/nn.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ts_optim ts_optim;

typedef struct ts_sgd_options {
    double lr;
    double momentum;     /* 0: plain SGD */
    double dampening;
    double weight_decay; /* L2: added to the gradient */
    int32_t nesterov;    /* needs momentum > 0 and dampening 0 */
} ts_sgd_options;

typedef struct ts_adam_options {
    double lr;
    double beta1, beta2; /* 0.9, 0.999 */
    double eps;          /* 1e-8 */
    double weight_decay; /* Adam: L2 added to the gradient; AdamW: decoupled decay */
} ts_adam_options;

/* Defaults to start from, changing only what differs:
 *     ts_adam_options o = TS_ADAMW_DEFAULTS; o.lr = 3e-4; */
#define TS_SGD_DEFAULTS(lr) {(lr), 0.0, 0.0, 0.0, 0}
#define TS_ADAM_DEFAULTS {1e-3, 0.9, 0.999, 1e-8, 0.0}
#define TS_ADAMW_DEFAULTS {1e-3, 0.9, 0.999, 1e-8, 0.01} /* PyTorch's AdamW weight decay */

/* The optimizer keeps references to the n parameters; names are copied (they key the state in
 * checkpoints: "optim.<name>.<slot>"). (transfer full) on *out. */
ts_status ts_optim_sgd(const ts_named_tensor *params, size_t n, const ts_sgd_options *o,
                       ts_optim **out);
ts_status ts_optim_adam(const ts_named_tensor *params, size_t n, const ts_adam_options *o,
                        ts_optim **out);
ts_status ts_optim_adamw(const ts_named_tensor *params, size_t n, const ts_adam_options *o,
                         ts_optim **out);
void ts_optim_free(ts_optim *opt);

/* One update of every parameter that has a gradient. */
ts_status ts_optim_step(ts_optim *opt);
/* Drops every parameter's gradient. */
void ts_optim_zero_grad(ts_optim *opt);
/* The learning rate the next step uses. set_lr: a finite lr >= 0 (TS_EINVAL otherwise); with
 * a schedule set, the schedule decides again at the next step. */
double ts_optim_lr(const ts_optim *opt);
ts_status ts_optim_set_lr(ts_optim *opt, double lr);
/* Steps taken so far. */
int64_t ts_optim_steps(const ts_optim *opt);
/* Whether to use the plugin's fused update kernel when it has one (default on); off composes
 * the update from elementwise ops, as for a plugin without it. */
void ts_optim_use_fused(ts_optim *opt, int fused);
/* "sgd", "adam", "adamw". (transfer none, static) */
const char *ts_optim_name(const ts_optim *opt);

/* Parameter groups: parameter name's own weight decay instead of the optimizer's (AdamW's
 * decoupled decay, SGD's and Adam's L2 term alike); TS_EINVAL for an unknown name or a value
 * that is not finite and >= 0. decay_matrices_only gives every parameter of fewer than 2 dims
 * (biases, norm gains) a weight decay of 0, as transformers are trained, and returns how many
 * it exempted; exempt others (embeddings) by name. param_weight_decay: the decay in force for
 * name (NaN for an unknown one). */
ts_status ts_optim_set_param_weight_decay(ts_optim *opt, const char *name, double weight_decay);
size_t ts_optim_decay_matrices_only(ts_optim *opt);
double ts_optim_param_weight_decay(const ts_optim *opt, const char *name);

/* Adds the state (every moment tensor, the step count and the hyper-parameters) to ck, and
 * restores all of it from one, so a resumed run continues exactly: the optimizer kind must
 * match (TS_EINVAL), state tensors must match their parameters' shapes (TS_ESHAPE). */
ts_status ts_optim_save_state(const ts_optim *opt, ts_checkpoint *ck);
ts_status ts_optim_load_state(ts_optim *opt, const ts_checkpoint *ck);

/* Scales the gradients of the n parameters so their global L2 norm is at most max_norm;
 * *total_norm (may be NULL) gets the norm before clipping. A norm that is not finite (a
 * gradient holds NaN or infinity) is TS_EINVAL with nothing scaled. */
ts_status ts_clip_grad_norm(const ts_named_tensor *params, size_t n, double max_norm,
                            double *total_norm);

/* ts_clip_grad_norm of the gradients opt's next step reads: the parameters', or with a
 * sharded optimizer (ts_optim_shard) this rank's averaged share of them, the norm then summed
 * over the ranks so that every rank scales alike. */
ts_status ts_optim_clip_grad_norm(ts_optim *opt, double max_norm, double *total_norm);
/* A sharded optimizer's whole state gathered on rank root, for ts_optim_save_state there
 * until the next step (a collective: every rank calls it; the others keep their share only).
 * Unsharded: does nothing. */
ts_status ts_optim_consolidate_state(ts_optim *opt, int root);

/* Learning-rate schedules: a linear warm-up from 0 over warmup_steps, then constant, step
 * decay (times gamma every step_size steps) or cosine decay to min_lr at total_steps. */
typedef enum ts_lr_kind {
    TS_LR_CONSTANT = 0,
    TS_LR_STEP = 1,
    TS_LR_COSINE = 2
} ts_lr_kind;

typedef struct ts_lr_schedule {
    int32_t kind; /* ts_lr_kind */
    double base_lr;
    int64_t warmup_steps;
    int64_t step_size; /* TS_LR_STEP */
    double gamma;      /* TS_LR_STEP */
    int64_t total_steps; /* TS_LR_COSINE */
    double min_lr;       /* TS_LR_COSINE */
} ts_lr_schedule;

/* The learning rate at step (0-based; a negative step counts as 0). */
double ts_lr_at(const ts_lr_schedule *s, int64_t step);
/* Makes the optimizer set its learning rate to ts_lr_at(s, steps taken) before every step
 * (and at once); NULL removes the schedule. The schedule is checked (TS_EINVAL naming the bad
 * value: a known kind, a finite base_lr >= 0, warmup_steps >= 0; step: step_size >= 1 and a
 * finite gamma > 0; cosine: total_steps >= warmup_steps and 0 <= min_lr <= base_lr) and saved
 * with the optimizer's state, so a resumed run follows it exactly. get_schedule: 1 and *out
 * when one is set, else 0. */
ts_status ts_optim_set_schedule(ts_optim *opt, const ts_lr_schedule *s);
int ts_optim_get_schedule(const ts_optim *opt, ts_lr_schedule *out);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_OPTIM_H */
