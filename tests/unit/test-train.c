/* tests/unit/test-train.c: the trainer, ts_train_epoch and ts_evaluate (tessera/train.h). An
 * epoch through ts_train_epoch leaves the same weights, bit for bit, as the loop written out
 * by hand, and its mean loss is the mean of that loop's losses; MSE trains too; a trainer's
 * step with clipping equals the hand-written step bit for bit, and with the batch in uneven
 * micro-batches equals it to the rounding of the gradients' sums; a loss function of one's
 * own and the output callback see every row; ts_evaluate in batches equals ts_accuracy over
 * everything; bad arguments fail with what is wrong. */
#include <float.h>
#include <math.h>

#include "../tap.h"

enum { N = 96, F = 12, C = 4, B = 16 };

static void data(ts_device *dev, ts_tensor **x, ts_tensor **y)
{
    ts_rng rng = TS_RNG(3);
    int64_t lab[N];
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){N, F}, 0, 1, &rng, x));
    float xs[N * F];
    CHECK_OK(ts_tensor_to_host(*x, xs, sizeof xs));
    for (int i = 0; i < N; i++) /* a learnable rule: the class of the largest of 4 features */
        for (int c = lab[i] = 0; c < C; c++)
            if (xs[i * F + c] > xs[i * F + lab[i]])
                lab[i] = c;
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){N}, lab, y));
}

static ts_module *mlp(ts_device *dev)
{
    ts_rng rng = TS_RNG(5);
    ts_weight_init init = TS_INIT_DEFAULT(&rng);
    ts_module *seq, *l;
    CHECK_OK(ts_nn_sequential(&seq));
    CHECK_OK(ts_nn_linear(dev, F, 16, 1, &init, &l));
    CHECK_OK(ts_nn_sequential_add(seq, "fc1", l));
    CHECK_OK(ts_nn_relu(&l));
    CHECK_OK(ts_nn_sequential_add(seq, "relu", l));
    CHECK_OK(ts_nn_linear(dev, 16, C, 1, &init, &l));
    CHECK_OK(ts_nn_sequential_add(seq, "fc2", l));
    return seq;
}

static ts_optim *adam(ts_module *m)
{
    ts_named_tensor p[8];
    ts_adam_options o = TS_ADAM_DEFAULTS;
    o.lr = 1e-2;
    ts_optim *opt;
    CHECK_OK(ts_optim_adam(p, ts_module_parameters(m, p, 8), &o, &opt));
    return opt;
}

static void test_epoch_equals_hand_loop(void)
{
    ts_device *dev = tap_start();
    ts_tensor *x, *y;
    data(dev, &x, &y);
    ts_module *a = mlp(dev), *b = mlp(dev);
    ts_optim *oa = adam(a), *ob = adam(b);
    ts_loader *la, *lb;
    CHECK_OK(ts_loader_new(x, y, B, 1, 9, 0, &la));
    CHECK_OK(ts_loader_new(x, y, B, 1, 9, 0, &lb));
    double first = 0, last = 0;
    for (uint64_t epoch = 0; epoch < 3; epoch++) {
        /* by hand */
        double sum = 0;
        int steps = 0;
        ts_module_train(a, 1);
        CHECK_OK(ts_loader_start_epoch(la, epoch));
        for (;;) {
            ts_tensor *bx, *by, *logits, *loss;
            CHECK_OK(ts_loader_next(la, &bx, &by));
            if (!bx)
                break;
            CHECK_OK(ts_module_forward(a, bx, &logits));
            CHECK_OK(ts_cross_entropy(logits, by, TS_REDUCTION_MEAN, &loss));
            CHECK_OK(ts_backward(loss, NULL, 0));
            CHECK_OK(ts_optim_step(oa));
            ts_optim_zero_grad(oa);
            float v;
            CHECK_OK(ts_tensor_to_host(loss, &v, sizeof v));
            sum += v;
            steps++;
            ts_tensor_unref(bx), ts_tensor_unref(by), ts_tensor_unref(logits);
            ts_tensor_unref(loss);
        }
        /* the library's */
        double mean;
        CHECK_OK(ts_loader_start_epoch(lb, epoch));
        CHECK_OK(ts_train_epoch(b, lb, ob, TS_LOSS_CROSS_ENTROPY, &mean));
        /* the float32 sum on the device against float64 here: a few ulps of the sum */
        CHECK_MSG(fabs(mean - sum / steps) <= 1e-6 * (sum / steps) * steps,
                  "epoch %llu: mean loss %.9g, by hand %.9g", (unsigned long long)epoch, mean,
                  sum / steps);
        if (epoch == 0)
            first = mean;
        last = mean;
        /* the loader is at the end of the epoch */
        ts_tensor *bx, *by;
        CHECK_OK(ts_loader_next(lb, &bx, &by));
        CHECK(bx == NULL);
    }
    CHECK_MSG(last < first, "the loss did not fall: %g -> %g", first, last);
    ts_named_tensor pa[8], pb[8];
    size_t np = ts_module_parameters(a, pa, 8);
    CHECK(ts_module_parameters(b, pb, 8) == np);
    for (size_t i = 0; i < np; i++) {
        float ha[16 * F], hb[16 * F];
        size_t bytes = (size_t)ts_tensor_numel(pa[i].tensor) * sizeof(float);
        CHECK(bytes <= sizeof ha);
        CHECK_OK(ts_tensor_to_host(pa[i].tensor, ha, bytes));
        CHECK_OK(ts_tensor_to_host(pb[i].tensor, hb, bytes));
        CHECK_MSG(memcmp(ha, hb, bytes) == 0, "%s differs from the hand loop's", pa[i].name);
    }
    /* evaluation: in batches of 10 (a short last one) as all at once */
    double acc_b, acc_all, acc_ref;
    CHECK_OK(ts_evaluate(b, x, y, 10, &acc_b));
    CHECK_OK(ts_evaluate(b, x, y, 0, &acc_all));
    ts_tensor *logits;
    CHECK_OK(ts_module_forward(b, x, &logits));
    CHECK_OK(ts_accuracy(logits, y, &acc_ref));
    ts_tensor_unref(logits);
    CHECK(acc_b == acc_ref && acc_all == acc_ref);
    CHECK_MSG(acc_ref > 0.5, "accuracy %g after 3 epochs on a learnable rule", acc_ref);
    ts_loader_free(la), ts_loader_free(lb), ts_optim_free(oa), ts_optim_free(ob);
    ts_module_free(a), ts_module_free(b);
    ts_tensor_unref(x), ts_tensor_unref(y);
    tap_end();
}

static void test_mse_and_errors(void)
{
    ts_device *dev = tap_start();
    ts_tensor *x, *y, *t;
    data(dev, &x, &y);
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 2, (const int64_t[]){N, C}, &t)); /* regress to 0 */
    ts_module *m = mlp(dev);
    ts_optim *o = adam(m);
    ts_loader *l;
    CHECK_OK(ts_loader_new(x, t, B, 0, 1, 0, &l));
    double l0, l1;
    CHECK_OK(ts_train_epoch(m, l, o, TS_LOSS_MSE, &l0));
    CHECK_OK(ts_loader_start_epoch(l, 1));
    CHECK_OK(ts_train_epoch(m, l, o, TS_LOSS_MSE, &l1));
    CHECK_MSG(l1 < l0, "MSE did not fall: %g -> %g", l0, l1);
    CHECK_OK(ts_loader_start_epoch(l, 2));
    CHECK_OK(ts_train_epoch(m, l, o, TS_LOSS_MSE, NULL)); /* no loss read */
    CHECK_FAILS(ts_train_epoch(m, l, o, (ts_loss_kind)7, NULL), TS_EINVAL, "loss 7");
    CHECK_FAILS(ts_train_epoch(NULL, l, o, TS_LOSS_MSE, NULL), TS_EINVAL, "NULL");
    /* cross-entropy against float targets: the step's own message */
    CHECK_OK(ts_loader_start_epoch(l, 3));
    CHECK_FAILS(ts_train_epoch(m, l, o, TS_LOSS_CROSS_ENTROPY, NULL), TS_EDTYPE, "cross");
    double acc;
    CHECK_FAILS(ts_evaluate(m, x, y, -1, &acc), TS_EINVAL, "negative");
    ts_tensor *few;
    CHECK_OK(ts_tensor_narrow(y, 0, 0, N - 1, &few));
    CHECK_FAILS(ts_evaluate(m, x, few, 0, &acc), TS_ESHAPE, "same number of rows");
    ts_tensor_unref(few);
    ts_loader_free(l), ts_optim_free(o), ts_module_free(m);
    ts_tensor_unref(x), ts_tensor_unref(y), ts_tensor_unref(t);
    tap_end();
}

static ts_optim *sgd(ts_module *m)
{
    ts_named_tensor p[8];
    ts_sgd_options o = TS_SGD_DEFAULTS(0.5);
    ts_optim *opt;
    CHECK_OK(ts_optim_sgd(p, ts_module_parameters(m, p, 8), &o, &opt));
    return opt;
}

typedef struct seen {
    int calls;
    int64_t rows;
    int losses;
} seen;

static ts_status count_rows(void *user, ts_tensor *out, ts_tensor *target)
{
    seen *s = user;
    s->calls++;
    s->rows += ts_tensor_shape(out)[0];
    return ts_tensor_shape(target)[0] == ts_tensor_shape(out)[0] ? TS_OK
                                                                  : ts_fail(TS_ESHAPE, "rows");
}

static ts_status my_loss(void *user, ts_tensor *out, ts_tensor *target, ts_tensor **loss)
{
    ((seen *)user)->losses++;
    return ts_cross_entropy(out, target, TS_REDUCTION_MEAN, loss);
}

/* The largest |a - b| over m's and n's parameters, and the largest |a|. */
static double param_diff(ts_module *m, ts_module *n, double *scale)
{
    ts_named_tensor pa[8], pb[8];
    size_t np = ts_module_parameters(m, pa, 8), worst_i = 0;
    CHECK(ts_module_parameters(n, pb, 8) == np);
    double worst = 0;
    *scale = 0;
    for (size_t i = 0; i < np; i++) {
        float ha[16 * F], hb[16 * F];
        int64_t k = ts_tensor_numel(pa[i].tensor);
        CHECK_OK(ts_tensor_to_host(pa[i].tensor, ha, (size_t)k * sizeof(float)));
        CHECK_OK(ts_tensor_to_host(pb[i].tensor, hb, (size_t)k * sizeof(float)));
        for (int64_t j = 0; j < k; j++) {
            if (fabs((double)ha[j] - hb[j]) > worst)
                worst = fabs((double)ha[j] - hb[j]), worst_i = i;
            *scale = fmax(*scale, fabs(ha[j]));
        }
    }
    (void)worst_i;
    return worst;
}

/* One step written out: forward, loss, backward, clipping (clip > 0), step; the loss. */
static double hand_step(ts_module *m, ts_optim *o, ts_tensor *x, ts_tensor *y, double clip)
{
    ts_named_tensor p[8];
    size_t np = ts_module_parameters(m, p, 8);
    ts_tensor *logits, *loss;
    ts_module_train(m, 1);
    CHECK_OK(ts_module_forward(m, x, &logits));
    CHECK_OK(ts_cross_entropy(logits, y, TS_REDUCTION_MEAN, &loss));
    CHECK_OK(ts_backward(loss, NULL, 0));
    if (clip > 0) {
        double norm;
        CHECK_OK(ts_clip_grad_norm(p, np, clip, &norm));
        CHECK_MSG(norm > clip, "gradient norm %g: not clipped, a weaker test", norm);
    }
    CHECK_OK(ts_optim_step(o));
    ts_optim_zero_grad(o);
    double v;
    CHECK_OK(ts_tensor_item(loss, &v));
    ts_tensor_unref(logits), ts_tensor_unref(loss);
    return v;
}

static void test_trainer_step(void)
{
    ts_device *dev = tap_start();
    ts_tensor *x, *y;
    data(dev, &x, &y);
    ts_module *hand = mlp(dev), *one = mlp(dev), *own = mlp(dev), *plain = mlp(dev),
              *acc = mlp(dev);
    ts_optim *oh = sgd(hand), *o1 = sgd(one), *oo = sgd(own), *op = sgd(plain), *oa = sgd(acc);
    seen s1 = {0}, sa = {0}, so = {0};
    ts_trainer *t1, *ta, *to;
    ts_trainer_options opt = TS_TRAINER_OPTIONS_INIT;
    opt.on_output = count_rows;
    opt.user = &sa;
    opt.accumulate = 5; /* 96 rows: 20, 19, 19, 19, 19; no clipping, which would hide a scale */
    CHECK_OK(ts_trainer_new(acc, oa, &opt, &ta));
    opt.clip_grad_norm = 0.25; /* small enough to clip */
    opt.accumulate = 1;
    opt.user = &s1;
    CHECK_OK(ts_trainer_new(one, o1, &opt, &t1));
    opt.user = &so;
    opt.loss_fn = my_loss;
    CHECK_OK(ts_trainer_new(own, oo, &opt, &to));
    const int steps = 3;
    for (int k = 0; k < steps; k++) {
        double lh = hand_step(hand, oh, x, y, 0.25), lp = hand_step(plain, op, x, y, 0);
        ts_step_result r1 = {0}, ra = {0}, ro = {0};
        CHECK_OK(ts_trainer_step(t1, x, y, &r1));
        CHECK_OK(ts_trainer_step(ta, x, y, &ra));
        CHECK_OK(ts_trainer_step(to, x, y, &ro));
        CHECK_MSG(r1.loss == lh && ro.loss == lh, "step %d: loss %.9g / %.9g, by hand %.9g", k,
                  r1.loss, ro.loss, lh);
        /* the micro-batches' float32 means of ~20 rows, weighted */
        CHECK_MSG(fabs(ra.loss - lp) <= N * FLT_EPSILON * lp, "step %d: accumulated loss %.9g, "
                  "whole batch %.9g", k, ra.loss, lp);
        CHECK(r1.rows == N && ra.rows == N && !r1.stop && !ra.stop);
    }
    double scale, d;
    d = param_diff(hand, one, &scale);
    CHECK_MSG(d == 0, "one pass with clipping differs from the hand-written step by %g", d);
    d = param_diff(hand, own, &scale);
    CHECK_MSG(d == 0, "the loss function of one's own differs by %g", d);
    /* Accumulated: the same gradient summed in other groups. Each gradient element is a sum
     * over N rows, so its rounding is within N ulps of the sum of magnitudes, bounded here by
     * the parameters' scale; three steps of lr 0.5. */
    d = param_diff(plain, acc, &scale);
    double tol = steps * N * FLT_EPSILON * scale, moved = param_diff(plain, hand, &scale);
    CHECK_MSG(d <= tol, "accumulated over 5 micro-batches: parameters differ by %g (tolerance "
              "%g)", d, tol);
    CHECK_MSG(moved > 100 * tol, "the steps moved the parameters by %g only: a weak test",
              moved);
    CHECK(s1.calls == steps && s1.rows == steps * N);
    CHECK_MSG(sa.calls == steps * 5 && sa.rows == steps * N, "on_output: %d calls, %lld rows",
              sa.calls, (long long)sa.rows);
    CHECK(so.losses == steps && so.calls == steps);
    CHECK(ts_trainer_steps(ta) == steps);
    ts_trainer_free(t1), ts_trainer_free(ta), ts_trainer_free(to);
    ts_optim_free(oh), ts_optim_free(o1), ts_optim_free(oa), ts_optim_free(oo);
    ts_optim_free(op);
    ts_module_free(hand), ts_module_free(one), ts_module_free(acc), ts_module_free(own);
    ts_module_free(plain);
    ts_tensor_unref(x), ts_tensor_unref(y);
    tap_end();
}

static ts_status failing_loss(void *user, ts_tensor *out, ts_tensor *target, ts_tensor **loss)
{
    (void)user, (void)out, (void)target, (void)loss;
    return ts_fail(TS_EINVAL, "my loss refuses");
}

static void test_trainer_errors(void)
{
    ts_device *dev = tap_start();
    ts_tensor *x, *y, *few;
    data(dev, &x, &y);
    ts_module *m = mlp(dev);
    ts_optim *o = sgd(m);
    ts_trainer *t = (ts_trainer *)&t;
    ts_trainer_options opt = TS_TRAINER_OPTIONS_INIT;
    CHECK_FAILS(ts_trainer_new(NULL, o, NULL, &t), TS_EINVAL, "NULL");
    CHECK(t == NULL);
    opt.accumulate = -2;
    CHECK_FAILS(ts_trainer_new(m, o, &opt, &t), TS_EINVAL, "accumulate -2");
    opt.accumulate = 1;
    opt.clip_grad_norm = NAN;
    CHECK_FAILS(ts_trainer_new(m, o, &opt, &t), TS_EINVAL, "clip_grad_norm");
    opt.clip_grad_norm = 0;
    opt.loss = (ts_loss_kind)9;
    CHECK_FAILS(ts_trainer_new(m, o, &opt, &t), TS_EINVAL, "loss 9");
    opt.loss = TS_LOSS_CROSS_ENTROPY;
    opt.accumulate = 200; /* more micro-batches than rows: one row each */
    CHECK_OK(ts_trainer_new(m, o, &opt, &t));
    ts_step_result r = {0};
    CHECK_OK(ts_trainer_step(t, x, y, &r));
    CHECK(r.rows == N && isfinite(r.loss));
    CHECK_OK(ts_tensor_narrow(y, 0, 0, N - 1, &few));
    CHECK_FAILS(ts_trainer_step(t, x, few, &r), TS_ESHAPE, "same number of rows");
    CHECK_FAILS(ts_trainer_step(t, x, NULL, &r), TS_EINVAL, "NULL");
    CHECK(ts_trainer_steps(t) == 1);
    ts_trainer_free(t);
    opt.accumulate = 2;
    opt.loss_fn = failing_loss;
    CHECK_OK(ts_trainer_new(m, o, &opt, &t));
    CHECK_FAILS(ts_trainer_step(t, x, y, &r), TS_EINVAL, "my loss refuses");
    /* nothing left behind by the failed step: the next one starts from zero gradients */
    ts_named_tensor p[8];
    size_t np = ts_module_parameters(m, p, 8);
    for (size_t i = 0; i < np; i++) {
        const ts_tensor *g = ts_tensor_grad(p[i].tensor);
        double v = 0;
        if (g) {
            ts_tensor *a, *sum;
            CHECK_OK(ts_abs(g, &a));
            CHECK_OK(ts_sum(a, 0, NULL, 0, &sum));
            CHECK_OK(ts_tensor_item(sum, &v));
            ts_tensor_unref(a), ts_tensor_unref(sum);
        }
        CHECK_MSG(v == 0, "%s keeps a gradient after a failed step", p[i].name);
    }
    ts_trainer_free(t);
    ts_trainer_free(NULL);
    ts_tensor_unref(few);
    ts_optim_free(o), ts_module_free(m);
    ts_tensor_unref(x), ts_tensor_unref(y);
    tap_end();
}

/* Memory by role: a model's parameters, Adam's two moments, the data a program tags, all
 * counted on the device; everything freed brings the counts back. */
static void test_memory_roles(void)
{
    ts_device *dev = tap_start();
    uint64_t base[TS_ROLE_COUNT], now[TS_ROLE_COUNT];
    ts_device_memory_by_role(dev, base);
    ts_tensor *x, *y;
    data(dev, &x, &y);
    ts_tensor_set_role(x, TS_ROLE_DATA);
    ts_tensor_set_role(y, TS_ROLE_DATA);
    ts_module *m = mlp(dev);
    ts_optim *o = adam(m);
    uint64_t pbytes = (uint64_t)ts_module_num_params(m) * sizeof(float);
    ts_device_memory_by_role(dev, now);
    CHECK_MSG(now[TS_ROLE_PARAMETER] - base[TS_ROLE_PARAMETER] == pbytes,
              "parameters: %llu bytes counted, %llu made", (unsigned long long)(
                  now[TS_ROLE_PARAMETER] - base[TS_ROLE_PARAMETER]), (unsigned long long)pbytes);
    CHECK(now[TS_ROLE_DATA] - base[TS_ROLE_DATA] == (uint64_t)N * F * 4 + (uint64_t)N * 8);
    ts_trainer *t;
    CHECK_OK(ts_trainer_new(m, o, NULL, &t));
    CHECK_OK(ts_trainer_step(t, x, y, NULL));
    ts_device_memory_by_role(dev, now);
    CHECK_MSG(now[TS_ROLE_OPTIMIZER] - base[TS_ROLE_OPTIMIZER] == 2 * pbytes,
              "Adam's state: %llu bytes, want two moments of %llu",
              (unsigned long long)(now[TS_ROLE_OPTIMIZER] - base[TS_ROLE_OPTIMIZER]),
              (unsigned long long)pbytes);
    uint64_t g = now[TS_ROLE_GRADIENT] - base[TS_ROLE_GRADIENT];
    CHECK_MSG(g == 0 || g == pbytes, "gradients: %llu bytes", (unsigned long long)g);
    ts_trainer_free(t), ts_optim_free(o), ts_module_free(m);
    ts_tensor_unref(x), ts_tensor_unref(y);
    ts_device_memory_by_role(dev, now);
    for (int r = 0; r < TS_ROLE_COUNT; r++)
        CHECK_MSG(now[r] == base[r], "%s: %llu bytes left", ts_memory_role_name(r),
                  (unsigned long long)(now[r] - base[r]));
    CHECK(!strcmp(ts_memory_role_name(TS_ROLE_OPTIMIZER), "optimizer"));
    tap_end();
}

/* ---- ts_fit ------------------------------------------------------------------------------ */

typedef struct fit_log {
    int64_t events[5];
    int64_t eval_at[8], nevals;
    int64_t first_batch;         /* the first EPOCH_BEGIN's batch */
    int64_t stop_after;          /* > 0: ask to stop once this step has run */
    volatile sig_atomic_t stop;
    ts_fit_event fail_on;        /* fail_at > 0: this event fails at that step */
    int64_t fail_at;
    ts_tensor *x, *y;            /* the batch function's data */
    int64_t batches_made, nan_at; /* nan_at > 0: step nan_at's batch (1-based) is NaN */
} fit_log;

static ts_status log_event(void *user, ts_fit_event ev, const ts_fit_state *st)
{
    fit_log *l = user;
    if (ev == TS_FIT_EPOCH_BEGIN && l->events[ev] == 0)
        l->first_batch = st->batch;
    l->events[ev]++;
    if (ev == TS_FIT_EVAL && l->nevals < 8) {
        l->eval_at[l->nevals++] = st->step;
        CHECK(st->steps_since > 0 && st->rows_since > 0 && isfinite(st->mean_loss));
    }
    if (ev == TS_FIT_STEP && l->stop_after && st->step == l->stop_after)
        l->stop = 1;
    if (l->fail_at && ev == l->fail_on && st->step == l->fail_at)
        return ts_trainer_set_steps(NULL, 0); /* a failure with its message */
    return TS_OK;
}

static void check_same_params(ts_module *a, ts_module *b, const char *what)
{
    double scale;
    double d = param_diff(a, b, &scale);
    CHECK_MSG(d == 0, "%s: parameters differ by %g", what, d);
}

static void test_fit_loader(void)
{
    ts_device *dev = tap_start();
    ts_tensor *x, *y;
    data(dev, &x, &y);
    ts_module *a = mlp(dev), *b = mlp(dev);
    ts_optim *oa = adam(a), *ob = adam(b);
    ts_loader *la, *lb;
    CHECK_OK(ts_loader_new(x, y, B, 1, 9, 0, &la));
    CHECK_OK(ts_loader_new(x, y, B, 1, 9, 0, &lb));
    const int64_t nb = N / B;
    /* two epochs through ts_fit == two epochs through ts_train_epoch, bit for bit */
    ts_trainer *t;
    CHECK_OK(ts_trainer_new(a, oa, NULL, &t));
    fit_log log = {0};
    ts_fit_options fo = {.loader = la, .epochs = 2, .on_event = log_event, .user = &log};
    ts_fit_state st;
    CHECK_OK(ts_fit(t, &fo, &st));
    for (uint64_t e = 0; e < 2; e++) {
        CHECK_OK(ts_loader_start_epoch(lb, e));
        CHECK_OK(ts_train_epoch(b, lb, ob, TS_LOSS_CROSS_ENTROPY, NULL));
    }
    check_same_params(a, b, "ts_fit against ts_train_epoch");
    CHECK(st.step == 2 * nb && st.last_step == 2 * nb && st.first_step == 0 && !st.stopped);
    CHECK(log.events[TS_FIT_STEP] == 2 * nb && log.events[TS_FIT_STEP_BEGIN] == 2 * nb);
    CHECK(log.events[TS_FIT_EPOCH_BEGIN] == 2 && log.events[TS_FIT_EPOCH_END] == 2);
    CHECK(log.nevals == 2 && log.eval_at[0] == nb && log.eval_at[1] == 2 * nb);
    uint64_t ep;
    int64_t bi;
    ts_loader_position(la, &ep, &bi);
    CHECK_MSG(ep == 2 && bi == 0, "loader left at epoch %llu batch %lld, not the next epoch's "
              "start", (unsigned long long)ep, (long long)bi);
    /* at its end already: nothing to do */
    memset(&log, 0, sizeof log);
    CHECK_OK(ts_fit(t, &fo, &st));
    CHECK(st.step == 2 * nb && log.events[TS_FIT_STEP] == 0 && log.nevals == 0);
    /* a run of steps ends inside an epoch: evaluated there, the epoch closed, position kept */
    ts_trainer_free(t);
    ts_optim_free(oa);
    ts_module_free(a);
    a = mlp(dev);
    oa = adam(a);
    CHECK_OK(ts_trainer_new(a, oa, NULL, &t));
    CHECK_OK(ts_loader_start_epoch(la, 0));
    memset(&log, 0, sizeof log);
    fo.steps = nb + 2;
    fo.eval_every = 4; /* at 4 and at the epoch's end (6), then at the run's end (8) */
    CHECK_OK(ts_fit(t, &fo, &st));
    CHECK(st.step == nb + 2 && st.last_step == nb + 2);
    CHECK_MSG(log.nevals == 3 && log.eval_at[0] == 4 && log.eval_at[1] == nb &&
              log.eval_at[2] == nb + 2, "%lld evaluations", (long long)log.nevals);
    CHECK(log.events[TS_FIT_EPOCH_END] == 2);
    ts_loader_position(la, &ep, &bi);
    CHECK(ep == 1 && bi == 2);
    /* a callback's failure ends the run with its status */
    memset(&log, 0, sizeof log);
    log.fail_on = TS_FIT_STEP;
    log.fail_at = nb + 3;
    fo.steps = 0;
    CHECK_FAILS(ts_fit(t, &fo, &st), TS_EINVAL, "ts_trainer_set_steps");
    CHECK(st.step == nb + 3);
    /* no epochs: as many as the steps take; no end at all is refused */
    memset(&log, 0, sizeof log);
    fo.epochs = 0;
    fo.steps = st.step + 2 * nb; /* from inside epoch 1: its end, epoch 2, into epoch 3 */
    fo.eval_every = 0;
    CHECK_OK(ts_fit(t, &fo, &st));
    CHECK_MSG(st.step == 3 * nb + 3 && log.events[TS_FIT_EPOCH_END] == 3,
              "no epochs: step %lld, %lld epochs ended", (long long)st.step,
              (long long)log.events[TS_FIT_EPOCH_END]);
    fo.steps = 0;
    CHECK_FAILS(ts_fit(t, &fo, &st), TS_EINVAL, "no end");
    ts_trainer_free(t);
    ts_loader_free(la), ts_loader_free(lb);
    ts_optim_free(oa), ts_optim_free(ob);
    ts_module_free(a), ts_module_free(b);
    ts_tensor_unref(x), ts_tensor_unref(y);
    tap_end();
}

/* A run stopped part-way (a stop request, as a signal handler makes it), saved, and resumed in
 * fresh objects from the checkpoint, ends with the parameters of the run straight through. */
static void test_fit_stop_and_resume(void)
{
    ts_device *dev = tap_start();
    ts_tensor *x, *y;
    data(dev, &x, &y);
    const int64_t nb = N / B;
    ts_module *a = mlp(dev), *b = mlp(dev), *c = mlp(dev);
    ts_optim *oa = adam(a), *ob = adam(b), *oc = adam(c);
    ts_loader *la, *lb, *lc;
    CHECK_OK(ts_loader_new(x, y, B, 1, 9, 0, &la));
    CHECK_OK(ts_loader_new(x, y, B, 1, 9, 0, &lb));
    CHECK_OK(ts_loader_new(x, y, B, 1, 9, 0, &lc));
    ts_trainer *ta, *tb, *tc;
    ts_trainer_options to = {.clip_grad_norm = 0.5, .accumulate = 3};
    CHECK_OK(ts_trainer_new(a, oa, &to, &ta));
    CHECK_OK(ts_trainer_new(b, ob, &to, &tb));
    CHECK_OK(ts_trainer_new(c, oc, &to, &tc));
    ts_fit_state st;
    ts_fit_options fo = {.loader = la, .epochs = 2};
    CHECK_OK(ts_fit(ta, &fo, &st));
    /* stopped: asked after step nb + 1, honoured after the next */
    fit_log log = {.stop_after = nb + 1};
    fo = (ts_fit_options){.loader = lb, .epochs = 2, .stop = &log.stop, .on_event = log_event,
                          .user = &log};
    CHECK_OK(ts_fit(tb, &fo, &st));
    CHECK_MSG(st.stopped && st.step == nb + 2, "stopped %d at step %lld", st.stopped,
              (long long)st.step);
    CHECK_MSG(log.nevals == 1, "%lld evaluations: the stopped epoch is not evaluated",
              (long long)log.nevals);
    ts_checkpoint *ck;
    uint64_t ep;
    int64_t bi;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_module_save(b, NULL, ck));
    CHECK_OK(ts_optim_save_state(ob, ck));
    ts_loader_position(lb, &ep, &bi);
    CHECK(ep == 1 && bi == 2);
    /* resumed in c */
    CHECK_OK(ts_module_load(c, NULL, ck));
    CHECK_OK(ts_optim_load_state(oc, ck));
    CHECK_OK(ts_loader_seek(lc, ep, bi));
    CHECK_OK(ts_trainer_set_steps(tc, st.step));
    memset(&log, 0, sizeof log);
    fo = (ts_fit_options){.loader = lc, .epochs = 2, .on_event = log_event, .user = &log};
    CHECK_OK(ts_fit(tc, &fo, &st));
    CHECK(st.first_step == nb + 2 && st.step == 2 * nb && log.first_batch == 2);
    check_same_params(a, c, "stopped, saved and resumed against straight");
    CHECK_FAILS(ts_trainer_set_steps(tc, -1), TS_EINVAL, "negative");
    ts_checkpoint_free(ck);
    ts_trainer_free(ta), ts_trainer_free(tb), ts_trainer_free(tc);
    ts_loader_free(la), ts_loader_free(lb), ts_loader_free(lc);
    ts_optim_free(oa), ts_optim_free(ob), ts_optim_free(oc);
    ts_module_free(a), ts_module_free(b), ts_module_free(c);
    ts_tensor_unref(x), ts_tensor_unref(y);
    tap_end();
}

/* Step k's batch: B rows from k * B (mod N); NaN inputs at step nan_at. */
static ts_status batch_of(void *user, int64_t k, ts_tensor **x, ts_tensor **y)
{
    fit_log *l = user;
    l->batches_made++;
    int64_t at = k * B % N;
    ts_status s = ts_tensor_narrow(l->x, 0, at, B, x);
    if (s == TS_OK && l->nan_at == k + 1) {
        ts_tensor *v = *x;
        s = ts_mul_scalar(v, NAN, x);
        ts_tensor_unref(v);
    }
    return s ? s : ts_tensor_narrow(l->y, 0, at, B, y);
}

static void test_fit_batch_fn(void)
{
    ts_device *dev = tap_start();
    ts_module *a = mlp(dev), *b = mlp(dev);
    ts_optim *oa = adam(a), *ob = adam(b);
    fit_log log = {0};
    data(dev, &log.x, &log.y);
    ts_trainer *t;
    CHECK_OK(ts_trainer_new(a, oa, NULL, &t));
    ts_fit_options fo = {.batch = batch_of, .steps = 5, .eval_every = 2,
                         .on_event = log_event, .user = &log};
    ts_fit_state st;
    CHECK_OK(ts_fit(t, &fo, &st));
    CHECK(st.step == 5 && log.batches_made == 5 && log.events[TS_FIT_EPOCH_BEGIN] == 0);
    CHECK_MSG(log.nevals == 3 && log.eval_at[0] == 2 && log.eval_at[1] == 4 &&
              log.eval_at[2] == 5, "%lld evaluations", (long long)log.nevals);
    for (int64_t k = 0; k < 5; k++) { /* the same steps by hand */
        ts_tensor *bx, *by;
        CHECK_OK(batch_of(&log, k, &bx, &by));
        hand_step(b, ob, bx, by, 0);
        ts_tensor_unref(bx), ts_tensor_unref(by);
    }
    check_same_params(a, b, "ts_fit with a batch function against the hand loop");
    /* a loss that is not finite ends the run: TS_ESTATE, the step counted */
    fo.steps = 9;
    log.nan_at = 7;
    CHECK_FAILS(ts_fit(t, &fo, &st), TS_ESTATE, "NaN", "step 7");
    CHECK(st.diverged && st.step == 7 && isnan(st.loss));
    /* what is wrong */
    CHECK_FAILS(ts_fit(NULL, &fo, &st), TS_EINVAL, "NULL");
    fo.steps = 0;
    CHECK_FAILS(ts_fit(t, &fo, &st), TS_EINVAL, "batch function", "steps");
    fo.steps = 10;
    fo.eval_every = -1;
    CHECK_FAILS(ts_fit(t, &fo, NULL), TS_EINVAL, "negative");
    ts_trainer_free(t);
    ts_optim_free(oa), ts_optim_free(ob);
    ts_module_free(a), ts_module_free(b);
    ts_tensor_unref(log.x), ts_tensor_unref(log.y);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_epoch_equals_hand_loop),
        TAP_TEST(test_mse_and_errors),
        TAP_TEST(test_trainer_step),
        TAP_TEST(test_trainer_errors),
        TAP_TEST(test_memory_roles),
        TAP_TEST(test_fit_loader),
        TAP_TEST(test_fit_stop_and_resume),
        TAP_TEST(test_fit_batch_fn),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
