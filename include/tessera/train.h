/* tessera/train.h: the training loop in the library. A ts_trainer takes one optimizer step
 * per call of ts_trainer_step, the step of every built-in model and of tessera train: forward,
 * loss, backward over micro-batches (gradient accumulation), the gradients averaged over the
 * ranks of a distributed job, clipped, the optimizer's step, the gradients zeroed, and the
 * global batch's mean loss read back. ts_train_epoch runs a loader's epoch through the same
 * step; ts_fit runs the whole loop around it (epochs or steps, evaluation, checkpoints and
 * stopping through one callback); ts_evaluate measures a classifier's accuracy. Each step's
 * tensors are released as it ends (a scope per micro-batch). */
#ifndef TESSERA_TRAIN_H
#define TESSERA_TRAIN_H
#include <signal.h>
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
    int32_t precision;       /* TS_F32 (0): as the parameters are; TS_BF16 or TS_F16: mixed
                              * precision, forward and loss under ts_autocast_begin (float32
                              * master weights, gradients and optimizer state); TS_F16 with
                              * dynamic loss scaling, as PyTorch's GradScaler: the loss times
                              * the scale before backward, the gradients times its inverse
                              * after; a step whose gradients hold an infinity or NaN is
                              * skipped and the scale halved; scale_interval clean steps in a
                              * row double it */
    double loss_scale;       /* TS_F16: the initial scale (0: 65536) */
    int64_t scale_interval;  /* TS_F16: clean steps before the scale doubles (0: 2000) */
    int32_t shard_optimizer; /* more than one rank: the optimizer's state sharded over them
                              * (ts_optim_shard); also on with [dist] shard_optimizer = true.
                              * Save it after ts_optim_consolidate_state on every rank; it
                              * stays sharded over this trainer's ranks, so free it with the
                              * trainer (it cannot step without it) */
} ts_trainer_options;

/* A zeroed struct is the default: cross-entropy, no clipping, one pass, float32. */
#define TS_TRAINER_OPTIONS_INIT {TS_LOSS_CROSS_ENTROPY, NULL, NULL, NULL, 0, 1, TS_F32, 0, 0, 0}

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
    int skipped;  /* out: float16's loss scaling skipped the optimizer step (a gradient was
                   * not finite; the scale was halved) */
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

/* A resumed run's count of steps taken (ts_trainer_steps), as its checkpoint recorded it. */
ts_status ts_trainer_set_steps(ts_trainer *t, int64_t steps);
/* TS_F16's loss scale and the clean steps since it last changed: what a checkpoint keeps so
 * that a resumed run scales as the straight one (1 and 0 for other precisions). */
void ts_trainer_loss_scale(const ts_trainer *t, double *scale, int64_t *clean_steps);
ts_status ts_trainer_set_loss_scale(ts_trainer *t, double scale, int64_t clean_steps);

/* ---- the run: ts_fit ------------------------------------------------------------------
 * The loop around the step, the one tessera train runs for every model: batch after batch
 * from a loader (epoch after epoch) or from a function of the step, each one ts_trainer_step,
 * until the run's end (its epochs, or its steps, whichever comes first), a stop request
 * (checked once per step, honoured by every rank after the same step) or a loss that is not
 * finite. The caller's callback sees each event and does what the run prints, records or
 * saves; ts_fit itself prints nothing and installs no signal handler. */

/* The global batch of step `step` (0-based: the first step of a run is 0): x and y, rows
 * first, the same on every rank (transfer full: ts_fit releases them). */
typedef ts_status (*ts_batch_fn)(void *user, int64_t step, ts_tensor **x, ts_tensor **y);

typedef enum ts_fit_event {
    TS_FIT_EPOCH_BEGIN = 0, /* a loader's epoch is about to run (from its position) */
    TS_FIT_STEP_BEGIN = 1,  /* step st->step + 1 is about to run */
    TS_FIT_STEP = 2,        /* step st->step ran: st->loss is its loss (finite) */
    TS_FIT_EVAL = 3,        /* time to evaluate: every eval_every steps, at the end of a
                             * loader's epoch, and at the run's last step */
    TS_FIT_EPOCH_END = 4    /* a loader's epoch ended (the loader already at the next one's
                             * start), or the run ended inside it at its last step */
} ts_fit_event;

/* Where the run stands, as the callback sees it. */
typedef struct ts_fit_state {
    int64_t step;       /* optimizer steps taken (ts_trainer_steps) */
    int64_t first_step; /* steps taken when this ts_fit began (a resumed run's start) */
    int64_t last_step;  /* the step the run ends at */
    uint64_t epoch;     /* loader: the epoch in progress (0-based) */
    int64_t batch;      /* loader: that epoch's batches done */
    int64_t batches;    /* loader: batches per epoch (0 without a loader) */
    double loss;        /* the last step's global mean loss */
    double mean_loss;    /* the mean loss per row over the steps since the last TS_FIT_EVAL
                          * (these four start again after each; zero in the state ts_fit
                          * returns when the run ended with an evaluation) */
    double loss_sum;     /* the sum of those steps' losses, each times its rows */
    int64_t steps_since; /* those steps */
    int64_t rows_since;  /* and their global rows */
    int stopped;   /* out: the run ended on a stop request, after step `step` (no evaluation) */
    int diverged;  /* out: the run ended on a loss that is not finite (ts_fit's TS_ESTATE) */
    int64_t skipped; /* float16: the steps of this ts_fit that loss scaling skipped */
} ts_fit_state;

/* The callback: a non-OK status ends the run with it. */
typedef ts_status (*ts_fit_fn)(void *user, ts_fit_event ev, const ts_fit_state *st);

typedef struct ts_fit_options {
    ts_loader *loader;  /* the batches, epoch after epoch, from the loader's position; or */
    ts_batch_fn batch;  /* with no loader: step k's batch is batch(user, k, ...) */
    int64_t epochs;     /* loader: the run ends when its epoch `epochs - 1` is done (0: as
                         * many epochs as `steps` takes) */
    int64_t steps;      /* > 0: the run ends at this step, if it comes first (required with
                         * a batch function, and with a loader and no epochs) */
    int64_t eval_every; /* > 0: TS_FIT_EVAL after every step that is a multiple of it */
    const volatile sig_atomic_t *stop; /* NULL, or nonzero when the run should stop (a signal
                                        * handler's flag): every rank stops after the same step */
    ts_fit_fn on_event; /* NULL: none */
    void *user;         /* handed to batch and on_event */
} ts_fit_options;

/* Runs t from its step count (ts_trainer_steps) and the loader's position to the run's end.
 * TS_OK with *st at the last step taken (st->stopped if a stop request ended it); on a loss
 * that is not finite, TS_ESTATE with st->diverged set and st at that step (its optimizer step
 * applied). Nothing to do (already at the end): TS_OK with no step. st may be NULL. */
ts_status ts_fit(ts_trainer *t, const ts_fit_options *o, ts_fit_state *st);

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
