/* core/train.c: the training loop (tessera/train.h): the trainer's step, the epoch over a
 * loader, the run around them (ts_fit), the evaluation; written with scoped tensors. */
#include "internal.h"

#include <math.h>
#include <string.h>

struct ts_trainer {
    ts_module *m;
    ts_optim *opt;
    ts_trainer_options o;
    ts_named_tensor *params; /* for clipping */
    size_t np;
    ts_ddp *ddp;     /* world > 1 */
    int rank, world; /* world 1: this process alone */
    int64_t steps;
    double scale;      /* TS_F16: the loss scale (1 otherwise) */
    int64_t clean;     /* TS_F16: clean steps since the scale last changed */
    int64_t interval;  /* TS_F16: clean steps before it doubles */
};

enum { SCALE_INIT = 65536, SCALE_INTERVAL = 2000 };

static ts_status check_options(const ts_trainer_options *o, const char *fn)
{
    if (!o->loss_fn && o->loss != TS_LOSS_CROSS_ENTROPY && o->loss != TS_LOSS_MSE)
        return ts__fail(TS_EINVAL, "%s: loss %d is not a ts_loss_kind", fn, (int)o->loss);
    if (!(o->clip_grad_norm >= 0) || o->accumulate < 0)
        return ts__fail(TS_EINVAL, "%s: clip_grad_norm %g and accumulate %lld must not be "
                        "negative", fn, o->clip_grad_norm, (long long)o->accumulate);
    if (o->precision != TS_F32 && o->precision != TS_BF16 && o->precision != TS_F16)
        return ts__fail(TS_EINVAL, "%s: precision %d: TS_F32, TS_BF16 or TS_F16", fn,
                        (int)o->precision);
    if (!(o->loss_scale >= 0) || o->loss_scale > 1e30 || o->scale_interval < 0)
        return ts__fail(TS_EINVAL, "%s: loss_scale %g must be in [0, 1e30] (0: 65536) and "
                        "scale_interval %lld not negative", fn, o->loss_scale,
                        (long long)o->scale_interval);
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
    int f16 = t->o.precision == TS_F16;
    t->scale = !f16 ? 1 : t->o.loss_scale > 0 ? t->o.loss_scale : SCALE_INIT;
    t->interval = t->o.scale_interval > 0 ? t->o.scale_interval : SCALE_INTERVAL;
    t->rank = ts_dist_rank();
    t->world = ts_dist_size();
    int shard = t->o.shard_optimizer || ts__dist_shard_optimizer();
    if (t->world > 1 && ((s = ts_dist_broadcast_module(m, 0)) ||
                         (s = ts_ddp_new(t->params, t->np, 0, &t->ddp)) ||
                         (shard && (s = ts_optim_shard(opt, t->ddp))))) {
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
    /* mixed precision: the forward and the loss under autocast, backward as recorded */
    int ac = 0;
    if (t->o.precision != TS_F32) {
        ts_status as = ts_autocast_begin(t->o.precision);
        ac = as == TS_OK;
        ts_scope_adopt(as, NULL);
    }
    ts_tensor *out = ts_s_forward(t->m, x), *l = NULL;
    if (t->o.loss_fn)
        l = TS_SCOPED(t->o.loss_fn(t->o.user, out, y, &l), l);
    else if (t->o.loss == TS_LOSS_MSE)
        l = ts_s_mse_loss(out, y, TS_REDUCTION_MEAN);
    else
        l = cross_entropy(out, y);
    if (ac)
        ts_autocast_end();
    double lv = 0;
    if (l && loss)
        ts_scope_adopt(ts_tensor_item(l, &lv), NULL);
    /* weighted by its share of the global batch, so that the gradients, summed over the
     * micro-batches and averaged over the ranks, are the global batch's mean loss's */
    double w = (double)n * (double)t->world / (double)rows * t->scale; /* float16: scaled */
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

/* float16's loss scaling after backward: every gradient times 1 / scale; *skip when one holds
 * an infinity or NaN (the sum of each gradient times 0 is 0 exactly when all are finite), the
 * scale then halved; else one more clean step, and the scale doubled after `interval`. */
static ts_status unscale(ts_trainer *t, int *skip)
{
    ts_scope *sc = ts_scope_begin();
    ts_no_grad_enter();
    ts_tensor *bad = NULL;
    int sharded; /* the gradients the step reads: this rank's share of them */
    size_t n = ts__optim_nstep(t->opt, &sharded);
    if (!sharded)
        n = t->np;
    for (size_t i = 0; i < n; i++) {
        ts_tensor *g = ts_tensor_grad(sharded ? ts__optim_step_tensor(t->opt, i)
                                              : t->params[i].tensor);
        if (!g)
            continue;
        ts_s_mul_scalar_(g, 1.0 / t->scale);
        ts_tensor *z = ts_s_sum(ts_s_cast(ts_s_mul_scalar(g, 0.0), TS_F64), 0, NULL, 0);
        bad = bad ? ts_s_add(bad, z) : z;
    }
    double v = 0;
    if (bad)
        ts_scope_adopt(ts_tensor_item(bad, &v), NULL);
    ts_no_grad_exit();
    ts_status s = ts_scope_end(sc);
    if (s == TS_OK && sharded) { /* one verdict for every rank */
        v = v != 0; /* NaN too */
        s = ts_dist_allreduce_sum(&v, 1, TS_F64);
    }
    *skip = s == TS_OK && v != 0; /* NaN compares unequal too */
    if (s == TS_OK && *skip) {
        t->scale = t->scale * 0.5 > 0 ? t->scale * 0.5 : t->scale;
        t->clean = 0;
    } else if (s == TS_OK && ++t->clean >= t->interval) {
        t->scale = t->scale * 2 <= 1e30 ? t->scale * 2 : t->scale;
        t->clean = 0;
    }
    return s;
}

TS_API void ts_trainer_loss_scale(const ts_trainer *t, double *scale, int64_t *clean_steps)
{
    if (scale)
        *scale = t ? t->scale : 1;
    if (clean_steps)
        *clean_steps = t ? t->clean : 0;
}

TS_API ts_status ts_trainer_set_loss_scale(ts_trainer *t, double scale, int64_t clean_steps)
{
    if (!t || !(scale > 0) || scale > 1e30 || clean_steps < 0)
        return ts__fail(TS_EINVAL, "ts_trainer_set_loss_scale: trainer is NULL, or scale %g is "
                        "not in (0, 1e30], or clean steps %lld negative", scale,
                        (long long)clean_steps);
    if (t->o.precision != TS_F16 && scale != 1)
        return ts__fail(TS_ESTATE, "ts_trainer_set_loss_scale: the trainer is not float16; "
                        "only float16 scales its loss (scale 1)");
    t->scale = scale;
    t->clean = clean_steps;
    return TS_OK;
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
    int skip = 0;
    if (s == TS_OK && t->o.precision == TS_F16) /* the same gradients, so the same verdict, on
                                                 * every rank */
        s = unscale(t, &skip);
    if (s == TS_OK && !skip && t->o.clip_grad_norm > 0)
        s = ts_optim_sharded(t->opt)
                ? ts_optim_clip_grad_norm(t->opt, t->o.clip_grad_norm, NULL)
                : ts_clip_grad_norm(t->params, t->np, t->o.clip_grad_norm, NULL);
    if (s == TS_OK && !skip)
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
        *r = (ts_step_result){loss, n, stop, skip};
    return TS_OK;
}

TS_API ts_status ts_trainer_set_steps(ts_trainer *t, int64_t steps)
{
    if (!t || steps < 0)
        return ts__fail(TS_EINVAL, "ts_trainer_set_steps: trainer is NULL or steps %lld is "
                        "negative", (long long)steps);
    t->steps = steps;
    return TS_OK;
}

/* ---- ts_fit: the run ----------------------------------------------------------------------- */

static ts_status emit(const ts_fit_options *o, ts_fit_event ev, ts_fit_state *st)
{
    ts_status s = o->on_event ? o->on_event(o->user, ev, st) : TS_OK;
    if (ev == TS_FIT_EVAL) { /* the running figures start again */
        st->mean_loss = st->loss_sum = 0;
        st->steps_since = st->rows_since = 0;
    }
    return s;
}

/* One step on the global batch (x, y), both released: the step, the figures, TS_FIT_STEP.
 * *done: the run ends here (a stop request, or its last step). */
static ts_status fit_step(ts_trainer *t, const ts_fit_options *o, ts_fit_state *st,
                          ts_tensor *x, ts_tensor *y, int *done)
{
    int64_t rows = ts_tensor_ndim(x) > 0 ? ts_tensor_shape(x)[0] : 0;
    ts_step_result r = {.stop = o->stop && *o->stop != 0};
    ts_status s = ts_trainer_step(t, x, y, &r);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    if (s)
        return s;
    st->step = t->steps;
    st->batch += st->batches > 0;
    st->loss = r.loss;
    st->skipped += r.skipped;
    if (!isfinite(r.loss)) {
        st->diverged = 1;
        return ts__fail(TS_ESTATE, "ts_fit: the loss became %s at step %lld: training "
                        "diverged (try a smaller learning rate)", isnan(r.loss) ? "NaN" :
                        "infinite", (long long)st->step);
    }
    st->loss_sum += r.loss * (double)rows;
    st->rows_since += rows;
    st->steps_since++;
    st->mean_loss = st->loss_sum / (double)st->rows_since;
    st->stopped = r.stop;
    *done = r.stop || st->step >= st->last_step;
    if ((s = emit(o, TS_FIT_STEP, st)) || r.stop)
        return s;
    if (o->eval_every > 0 && st->step % o->eval_every == 0 && st->step < st->last_step)
        s = emit(o, TS_FIT_EVAL, st);
    return s;
}

/* With a loader: its position's epoch, or the next one's start where it stands at an end. */
static ts_status fit_position(ts_loader *l, ts_fit_state *st)
{
    int64_t bi;
    ts_loader_position(l, &st->epoch, &bi);
    if (bi >= st->batches) {
        ts_status s = ts_loader_start_epoch(l, ++st->epoch);
        if (s)
            return s;
        bi = 0;
    }
    st->batch = bi;
    return TS_OK;
}

static ts_status fit_loader(ts_trainer *t, const ts_fit_options *o, ts_fit_state *st)
{
    ts_status s = fit_position(o->loader, st);
    if (s)
        return s;
    /* epochs 0: as many as the steps take */
    uint64_t epochs = o->epochs > 0 ? (uint64_t)o->epochs : UINT64_MAX;
    if (o->epochs > 0) {
        int64_t left = st->epoch < epochs ? (st->batches - st->batch) +
                                                (int64_t)(epochs - st->epoch - 1) * st->batches
                                          : 0;
        st->last_step = st->step + left;
    } else {
        st->last_step = o->steps;
    }
    if (o->steps > 0 && o->steps < st->last_step)
        st->last_step = o->steps;
    int done = st->step >= st->last_step;
    while (!done && st->epoch < epochs) {
        if ((s = emit(o, TS_FIT_EPOCH_BEGIN, st)))
            return s;
        for (;;) {
            ts_tensor *x, *y;
            if ((s = ts_loader_next(o->loader, &x, &y)) || !x)
                break;
            if ((s = emit(o, TS_FIT_STEP_BEGIN, st)) == TS_OK)
                s = fit_step(t, o, st, x, y, &done);
            else
                ts_tensor_unref(x), ts_tensor_unref(y);
            if (s || done)
                break;
        }
        /* the epoch's end, or the run's (unless an eval_every step just evaluated) */
        if (s == TS_OK && !st->stopped && (o->eval_every == 0 || st->steps_since > 0))
            s = emit(o, TS_FIT_EVAL, st);
        uint64_t ep = st->epoch;
        if (s == TS_OK) /* a finished epoch is saved as the next one's start */
            s = fit_position(o->loader, st);
        if (s || st->stopped)
            return s;
        uint64_t next = st->epoch;
        st->epoch = ep; /* the epoch that ended, for the callback */
        if ((s = emit(o, TS_FIT_EPOCH_END, st)))
            return s;
        st->epoch = next;
    }
    return TS_OK;
}

static ts_status fit_steps(ts_trainer *t, const ts_fit_options *o, ts_fit_state *st)
{
    st->last_step = o->steps;
    int done = st->step >= st->last_step;
    ts_status s = TS_OK;
    while (!done && s == TS_OK) {
        ts_tensor *x = NULL, *y = NULL;
        if ((s = emit(o, TS_FIT_STEP_BEGIN, st)) ||
            (s = o->batch(o->user, st->step, &x, &y)))
            break;
        if (!x || !y) {
            ts_tensor_unref(x), ts_tensor_unref(y);
            return ts__fail(TS_EINVAL, "ts_fit: the batch function gave no batch for step "
                            "%lld", (long long)st->step);
        }
        if ((s = fit_step(t, o, st, x, y, &done)) == TS_OK && done && !st->stopped)
            s = emit(o, TS_FIT_EVAL, st);
    }
    return s;
}

TS_API ts_status ts_fit(ts_trainer *t, const ts_fit_options *o, ts_fit_state *st)
{
    ts_fit_state mine;
    if (!st)
        st = &mine;
    memset(st, 0, sizeof *st);
    if (!t || !o)
        return ts__fail(TS_EINVAL, "ts_fit: trainer or options is NULL");
    if (!o->loader && (!o->batch || o->steps <= 0))
        return ts__fail(TS_EINVAL, "ts_fit: no data: give a loader, or a batch function and "
                        "the run's steps (> 0)");
    if (o->loader && o->epochs <= 0 && o->steps <= 0)
        return ts__fail(TS_EINVAL, "ts_fit: the run has no end: give its epochs or its steps "
                        "(> 0)");
    if (o->epochs < 0 || o->steps < 0 || o->eval_every < 0)
        return ts__fail(TS_EINVAL, "ts_fit: epochs %lld, steps %lld and eval_every %lld must "
                        "not be negative", (long long)o->epochs, (long long)o->steps,
                        (long long)o->eval_every);
    st->step = st->first_step = t->steps;
    if (!o->loader)
        return fit_steps(t, o, st);
    st->batches = ts_loader_batches(o->loader);
    if (st->batches < 1)
        return ts__fail(TS_EINVAL, "ts_fit: the loader has no batch");
    return fit_loader(t, o, st);
}

TS_API ts_status ts_train_epoch(ts_module *m, ts_loader *l, ts_optim *opt, ts_loss_kind loss,
                                double *mean_loss)
{
    if (!m || !l || !opt)
        return ts__fail(TS_EINVAL, "ts_train_epoch: model, loader or optimizer is NULL");
    ts_trainer t = {.m = m, .opt = opt, .o = TS_TRAINER_OPTIONS_INIT, .world = 1, .scale = 1};
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
