/* tessera/train.h: the training loop's pieces in the library. ts_train_epoch runs one epoch of
 * supervised training (forward, loss, backward, optimizer step) over a loader's batches;
 * ts_evaluate measures a classifier's accuracy. Each step's tensors are released as it ends
 * (a scope per step). tessera train's trainer does more (schedules, clipping, checkpoints,
 * resume, data parallelism); these are the loop a C program writes, once. */
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
    TS_LOSS_CROSS_ENTROPY = 0, /* integer class labels (N), logits (N, C) */
    TS_LOSS_MSE = 1            /* float targets of the output's shape */
} ts_loss_kind;

/* One epoch: m in training mode; for every batch of l from its current position to the end of
 * the epoch, the loss (mean over the batch) backpropagated, one ts_optim_step and
 * ts_optim_zero_grad. *mean_loss (NULL: not read) is the mean of the batches' losses, summed on
 * the device and read once at the end. The loader is left at the epoch's end; call
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
