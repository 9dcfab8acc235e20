/* core/train.c: the training loop (tessera/train.h): the trainer's step, the epoch over a
 * loader, the evaluation; written with scoped tensors. */
#include "internal.h"

struct ts_trainer {
    ts_module *m;
    ts_optim *opt;
    ts_trainer_options o;
    ts_named_tensor *params; /* for clipping */
    size_t np;
    ts_ddp *ddp;     /* world > 1 */
    int rank, world; /* world 1: this process alone */
    int64_t steps;
};

static ts_status check_options(const ts_trainer_options *o, const char *fn)
{
    if (!o->loss_fn && o->loss != TS_LOSS_CROSS_ENTROPY && o->loss != TS_LOSS_MSE)
        return ts__fail(TS_EINVAL, "%s: loss %d is not a ts_loss_kind", fn, (int)o->loss);
    if (!(o->clip_grad_norm >= 0) || o->accumulate < 0)
        return ts__fail(TS_EINVAL, "%s: clip_grad_norm %g and accumulate %lld must not be "
                        "negative", fn, o->clip_grad_norm, (long long)o->accumulate);
    return TS_OK;
}

TS_API ts_status ts_trainer_new(ts_module *m, ts_optim *opt, const ts_trainer_options *o,
                                ts_trainer **out)
{
    static const ts_trainer_options defaults = TS_TRAINER_OPTIONS_INIT;
    if (!out)
        return ts__fail(TS_EINVAL, "ts_trainer_new: out is NULL");
    *out = NULL;
    if (!m || !opt)
        return ts__fail(TS_EINVAL, "ts_trainer_new: model or optimizer is NULL");
    ts_status s = check_options(o ? o : &defaults, "ts_trainer_new");
    if (s)
        return s;
    ts_trainer *t = ts__calloc(1, sizeof *t);
    size_t np = ts_module_parameters(m, NULL, 0);
    if (!t || !(t->params = ts__calloc(np + 1, sizeof *t->params))) {
        free(t);
        return ts__fail(TS_ENOMEM, "ts_trainer_new: out of host memory");
    }
    t->m = m;
    t->opt = opt;
    t->o = o ? *o : defaults;
    t->np = ts_module_parameters(m, t->params, np);
    t->rank = ts_dist_rank();
    t->world = ts_dist_size();
    if (t->world > 1 && ((s = ts_dist_broadcast_module(m, 0)) ||
                         (s = ts_ddp_new(t->params, t->np, 0, &t->ddp)))) {
        ts_trainer_free(t);
        return s;
    }
    *out = t;
    return TS_OK;
}

TS_API void ts_trainer_free(ts_trainer *t)
{
    if (!t)
        return;
    ts_ddp_free(t->ddp);
    free(t->params);
    free(t);
}

TS_API int64_t ts_trainer_steps(const ts_trainer *t)
{
    return t ? t->steps : 0;
}

/* Rows [*lo, *lo + *n) of n_all are part `i` of `parts`: contiguous, the first n_all % parts
 * one row longer (the ranks' shares, and a share's micro-batches). */
static void split(int64_t n_all, int64_t parts, int64_t i, int64_t *lo, int64_t *n)
{
    int64_t q = n_all / parts, r = n_all % parts;
    *lo = i * q + (i < r ? i : r);
    *n = q + (i < r);
}

/* The mean cross-entropy over every position: logits (N, ..., C) flattened to rows of C
 * against the targets flattened alike (a sequence model's next-token loss). */
static ts_tensor *cross_entropy(ts_tensor *logits, ts_tensor *y)
{
    int nd = logits ? ts_tensor_ndim(logits) : 0;
    if (nd > 2 && y) {
        const int64_t C = ts_tensor_shape(logits)[nd - 1], rows = ts_tensor_numel(logits) / C;
        logits = ts_s_reshape(logits, 2, (const int64_t[]){rows, C});
        y = ts_s_reshape(y, 1, (const int64_t[]){ts_tensor_numel(y)});
    }
    return ts_s_cross_entropy(logits, y, TS_REDUCTION_MEAN);
}

/* Forward, loss and backward of rows [lo, lo + n) of the global batch of `rows`; adds the
 * global-batch-weighted mean loss to *loss (NULL: the loss is not read, so an asynchronous
 * device is not waited for). */
static ts_status micro_batch(ts_trainer *t, ts_tensor *x, ts_tensor *y, int64_t lo, int64_t n,
                             int64_t rows, double *loss)
{
    ts_scope *sc = ts_scope_begin();
    if (n < rows) { /* a view of the rows (the whole batch passed as it is) */
        x = ts_s_narrow(x, 0, lo, n);
        y = ts_s_narrow(y, 0, lo, n);
    }
    ts_tensor *out = ts_s_forward(t->m, x), *l = NULL;
    if (t->o.loss_fn)
        l = TS_SCOPED(t->o.loss_fn(t->o.user, out, y, &l), l);
    else if (t->o.loss == TS_LOSS_MSE)
        l = ts_s_mse_loss(out, y, TS_REDUCTION_MEAN);
    else
        l = cross_entropy(out, y);
    double lv = 0;
    if (l && loss)
        ts_scope_adopt(ts_tensor_item(l, &lv), NULL);
    /* weighted by its share of the global batch, so that the gradients, summed over the
     * micro-batches and averaged over the ranks, are the global batch's mean loss's */
    double w = (double)n * (double)t->world / (double)rows;
    if (w != 1.0)
        l = ts_s_mul_scalar(l, w);
    if (l)
        ts_scope_adopt(ts_backward(l, NULL, 0), NULL);
    if (t->o.on_output && out && ts_scope_status(sc) == TS_OK) {
        ts_no_grad_enter();
        ts_scope_adopt(t->o.on_output(t->o.user, out, y), NULL);
        ts_no_grad_exit();
    }
    if (loss)
        *loss += lv * (double)n / (double)rows;
    return ts_scope_end(sc);
}

TS_API ts_status ts_trainer_step(ts_trainer *t, ts_tensor *x, ts_tensor *y, ts_step_result *r)
{
    if (!t || !x || !y)
        return ts__fail(TS_EINVAL, "ts_trainer_step: trainer, inputs or targets is NULL");
    int64_t rows = ts_tensor_ndim(x) > 0 ? ts_tensor_shape(x)[0] : 0;
    if (rows < 1 || ts_tensor_ndim(y) < 1 || ts_tensor_shape(y)[0] != rows) {
        char bx[96], by[96];
        return ts__fail(TS_ESHAPE, "ts_trainer_step: inputs %s and targets %s need the same "
                        "number of rows, at least one", ts_tensor_describe(x, bx, sizeof bx),
                        ts_tensor_describe(y, by, sizeof by));
    }
    int64_t lo, n, k = t->o.accumulate > 1 ? t->o.accumulate : 1;
    split(rows, t->world, t->rank, &lo, &n);
    int64_t last = (n < k ? n : k) - 1; /* the last micro-batch with rows */
    double loss = 0;
    ts_status s = TS_OK;
    ts_module_train(t->m, 1);
    for (int64_t i = 0; i <= last && s == TS_OK; i++) {
        int64_t mlo, mn;
        split(n, k, i, &mlo, &mn);
        ts_ddp_no_sync(t->ddp, i < last);
        s = micro_batch(t, x, y, lo + mlo, mn, rows, r ? &loss : NULL);
    }
    ts_ddp_no_sync(t->ddp, 0);
    if (s == TS_OK && t->ddp) /* every rank, even one without rows */
        s = ts_ddp_sync(t->ddp);
    if (s == TS_OK && t->o.clip_grad_norm > 0)
        s = ts_clip_grad_norm(t->params, t->np, t->o.clip_grad_norm, NULL);
    if (s == TS_OK)
        s = ts_optim_step(t->opt);
    ts_optim_zero_grad(t->opt);
    int stop = r && r->stop;
    if (s == TS_OK && t->world > 1) { /* the global batch's loss; a stop rides on the sum */
        double red[2] = {loss, stop};
        s = ts_dist_allreduce_sum(red, 2, TS_F64);
        loss = red[0];
        stop = red[1] > 0;
    }
    if (s)
        return s;
    t->steps++;
    if (r)
        *r = (ts_step_result){loss, n, stop};
    return TS_OK;
}

TS_API ts_status ts_train_epoch(ts_module *m, ts_loader *l, ts_optim *opt, ts_loss_kind loss,
                                double *mean_loss)
{
    if (!m || !l || !opt)
        return ts__fail(TS_EINVAL, "ts_train_epoch: model, loader or optimizer is NULL");
    ts_trainer t = {.m = m, .opt = opt, .o = TS_TRAINER_OPTIONS_INIT, .world = 1};
    t.o.loss = loss;
    ts_status s = check_options(&t.o, "ts_train_epoch");
    double sum = 0;
    int64_t steps = 0;
    while (s == TS_OK) {
        ts_tensor *x, *y;
        ts_step_result r = {0};
        if ((s = ts_loader_next(l, &x, &y)) || !x)
            break;
        s = ts_trainer_step(&t, x, y, mean_loss ? &r : NULL);
        ts_tensor_unref(x);
        ts_tensor_unref(y);
        sum += r.loss;
        steps++;
    }
    if (s == TS_OK && mean_loss)
        *mean_loss = steps ? sum / (double)steps : 0;
    return s;
}

TS_API ts_status ts_evaluate(ts_module *m, ts_tensor *x, ts_tensor *y, int64_t batch,
                             double *accuracy)
{
    if (!m || !x || !y || !accuracy || batch < 0)
        return ts__fail(TS_EINVAL, "ts_evaluate: NULL argument or a negative batch size");
    if (ts_tensor_ndim(x) < 1 || ts_tensor_ndim(y) < 1 ||
        ts_tensor_shape(x)[0] != ts_tensor_shape(y)[0]) {
        char bx[96], by[96];
        return ts__fail(TS_ESHAPE, "ts_evaluate: inputs %s and labels %s must have the same "
                        "number of rows", ts_tensor_describe(x, bx, sizeof bx),
                        ts_tensor_describe(y, by, sizeof by));
    }
    int64_t n = ts_tensor_shape(x)[0], correct = 0;
    if (batch == 0 || batch > n)
        batch = n > 0 ? n : 1;
    ts_module_train(m, 0);
    ts_status s = TS_OK;
    ts_no_grad_enter();
    for (int64_t at = 0; at < n && s == TS_OK; at += batch) {
        int64_t len = n - at < batch ? n - at : batch;
        double acc = 0;
        ts_scope *sc = ts_scope_begin();
        ts_tensor *logits = ts_s_forward(m, ts_s_narrow(x, 0, at, len));
        if (logits)
            ts_scope_adopt(ts_accuracy(logits, ts_s_narrow(y, 0, at, len), &acc), NULL);
        if ((s = ts_scope_end(sc)) == TS_OK)
            correct += (int64_t)(acc * (double)len + 0.5);
    }
    ts_no_grad_exit();
    if (s == TS_OK)
        *accuracy = n > 0 ? (double)correct / (double)n : 0;
    return s;
}
