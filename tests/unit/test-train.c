/* tests/unit/test-train.c: ts_train_epoch and ts_evaluate (tessera/train.h). An epoch through
 * ts_train_epoch leaves the same weights, bit for bit, as the loop written out by hand, and its
 * mean loss is the mean of that loop's losses; MSE trains too; ts_evaluate in batches equals
 * ts_accuracy over everything; bad arguments fail with what is wrong. */
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

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_epoch_equals_hand_loop),
        TAP_TEST(test_mse_and_errors),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
