/* tessera/train.h: the training loop in the library. A ts_trainer takes one optimizer step
 * per call of ts_trainer_step, the step of every built-in model and of tessera train: forward,
 * loss, backward over micro-batches (gradient accumulation), the gradients averaged over the
 * ranks of a distributed job, clipped, the optimizer's step, the gradients zeroed, and the
 * global batch's mean loss read back. ts_train_epoch runs a loader's epoch through the same
 * step; ts_evaluate measures a classifier's accuracy. Each step's tensors are released as it
 * ends (a scope per micro-batch). */
#ifndef TESSERA_TRAIN_H
#define TESSERA_TRAIN_H
#include <stdint.h>
#include <tessera/data.h>
#include <tessera/nn.h>
#include <tessera/optim.h>
#ifdef __cplusplus
extern "C" {
#endif

/* The loss a step minimises, over the batch's (logits, labels). */
typedef enum ts_loss_kind {
    TS_LOSS_CROSS_ENTROPY = 0, /* integer class labels (N), logits (N, C); or a sequence's,
                                * (N, T, ...) and (N, T, ..., C): the mean over every position
                                * (a language model's next-token loss, ts_gpt_loss) */
    TS_LOSS_MSE = 1            /* float targets of the output's shape */
} ts_loss_kind;

/* The loss of a batch: the mean over its rows, of output (the model's) against target (transfer
 * full on *loss). */
typedef ts_status (*ts_loss_fn)(void *user, ts_tensor *output, ts_tensor *target,
                                ts_tensor **loss);
/* Called with each micro-batch's output and target after its backward, nothing recorded (a
 * running accuracy, say). A non-OK status ends the step with it. */
typedef ts_status (*ts_output_fn)(void *user, ts_tensor *output, ts_tensor *target);

typedef struct ts_trainer_options {
    ts_loss_kind loss;       /* when loss_fn is NULL */
    ts_loss_fn loss_fn;      /* NULL: loss */
    ts_output_fn on_output;  /* NULL: none */
    void *user;              /* handed to loss_fn and on_output */
    double clip_grad_norm;   /* > 0: the gradients' global norm clipped to it before the step */
    int64_t accumulate;      /* micro-batches per step (0 or 1: the batch in one pass) */
} ts_trainer_options;

/* A zeroed struct is the default: cross-entropy, no clipping, one pass. */
#define TS_TRAINER_OPTIONS_INIT {TS_LOSS_CROSS_ENTROPY, NULL, NULL, NULL, 0, 1}

typedef struct ts_trainer ts_trainer;

/* A trainer of m's parameters with opt (both borrowed: they must outlive it). In a job of more
 * than one rank (ts_dist_size() > 1) it is data-parallel as PyTorch's DDP: every rank starts
 * from rank 0's parameters and buffers (broadcast here, a collective: every rank calls it),
 * each rank trains on its share of every batch (contiguous rows, the first batch % world ranks
 * one row more) and the gradients are averaged over ranks, bucket by bucket while backward
 * runs. o NULL: the defaults. */
ts_status ts_trainer_new(ts_module *m, ts_optim *opt, const ts_trainer_options *o,
                         ts_trainer **out);
void ts_trainer_free(ts_trainer *t);

typedef struct ts_step_result {
    double loss;  /* out: the global batch's mean loss, over every rank's rows */
    int64_t rows; /* out: the rows this rank trained on */
    int stop;     /* in: this process wants to stop (a signal); out: some rank did, so every
                   * rank stops after this same step */
} ts_step_result;

/* One optimizer step on the global batch (x, y) (rows first; every rank passes the same
 * batch and takes its share): m in training mode; the share split into `accumulate`
 * micro-batches as evenly as possible, each one's mean loss weighted by its share of the
 * global batch and backpropagated (gradients add up); then the gradients averaged over
 * ranks, clipped, ts_optim_step and ts_optim_zero_grad. The gradient is that of the global
 * batch's mean loss whatever the micro-batches and ranks (to float rounding); with one pass
 * on one rank the step is exactly forward, loss, backward, step. r may be NULL: the loss is
 * then not read back (no wait for an asynchronous device; r->stop is 0). On failure the
 * gradients are zeroed and the parameters are those of before the optimizer step (a failure
 * inside ts_optim_step aside). */
ts_status ts_trainer_step(ts_trainer *t, ts_tensor *x, ts_tensor *y, ts_step_result *r);
/* Optimizer steps taken through t. */
int64_t ts_trainer_steps(const ts_trainer *t);

/* One epoch: m in training mode; for every batch of l from its current position to the end of
 * the epoch, the loss (mean over the batch) backpropagated, one ts_optim_step and
 * ts_optim_zero_grad (ts_trainer_step's step, one pass, on this process alone). *mean_loss
 * (NULL: no loss is read back) is the mean of the batches' losses, each read after its step.
 * The loader is left at the epoch's end; call
 * ts_loader_start_epoch for the next. On failure, the step's message; earlier steps stay
 * applied. */
ts_status ts_train_epoch(ts_module *m, ts_loader *l, ts_optim *opt, ts_loss_kind loss,
                         double *mean_loss);

/* The share of x's rows (first dim) whose largest logit under m is at y's class, in batches of
 * `batch` rows (0: all at once), with m in evaluation mode and nothing recorded; m is left in
 * evaluation mode. */
ts_status ts_evaluate(ts_module *m, ts_tensor *x, ts_tensor *y, int64_t batch, double *accuracy);

#ifdef __cplusplus
}
#endif
#endif /* TESSERA_TRAIN_H */
