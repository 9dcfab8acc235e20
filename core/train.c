/* core/train.c: the training loop's pieces (tessera/train.h), written with scoped tensors. */
#include "internal.h"

TS_API ts_status ts_train_epoch(ts_module *m, ts_loader *l, ts_optim *opt, ts_loss_kind loss,
                                double *mean_loss)
{
    if (!m || !l || !opt)
        return ts__fail(TS_EINVAL, "ts_train_epoch: model, loader or optimizer is NULL");
    if (loss != TS_LOSS_CROSS_ENTROPY && loss != TS_LOSS_MSE)
        return ts__fail(TS_EINVAL, "ts_train_epoch: loss %d is not a ts_loss_kind", (int)loss);
    ts_module_train(m, 1);
    ts_tensor *sum = NULL; /* the losses so far, on the device */
    int64_t steps = 0;
    ts_status s = TS_OK;
    for (;;) {
        ts_tensor *x, *y;
        if ((s = ts_loader_next(l, &x, &y)) || !x)
            break;
        ts_scope *sc = ts_scope_begin();
        x = ts_scope_adopt(TS_OK, &x);
        y = y ? ts_scope_adopt(TS_OK, &y) : NULL;
        ts_tensor *out = ts_s_forward(m, x);
        ts_tensor *l_ = loss == TS_LOSS_MSE ? ts_s_mse_loss(out, y, TS_REDUCTION_MEAN)
                                            : ts_s_cross_entropy(out, y, TS_REDUCTION_MEAN);
        if (l_)
            ts_scope_adopt(ts_backward(l_, NULL, 0), NULL);
        if (l_ && ts_scope_status(sc) == TS_OK)
            ts_scope_adopt(ts_optim_step(opt), NULL);
        ts_optim_zero_grad(opt);
        if (mean_loss && l_ && ts_scope_status(sc) == TS_OK) {
            ts_tensor *prev = sum;
            ts_no_grad_enter();
            sum = ts_scope_keep(prev ? ts_s_add(prev, l_) : ts_s_mul_scalar(l_, 1)); /* no graph */
            ts_no_grad_exit();
            ts_tensor_unref(prev);
        }
        steps++;
        if ((s = ts_scope_end(sc)))
            break;
    }
    if (s == TS_OK && mean_loss) {
        double v = 0;
        if (sum && (s = ts_tensor_item(sum, &v)) == TS_OK)
            *mean_loss = v / (double)steps;
        else if (!sum)
            *mean_loss = 0;
    }
    ts_tensor_unref(sum);
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
