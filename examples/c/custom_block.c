/* A model of one's own with tessera's C API: a residual block x + fc2(relu(fc1(rmsnorm(x))))
 * whose RMSNorm is written from scoped ops, between a linear embedding of Fashion-MNIST's
 * 784 pixels and a linear head; trained two epochs with Adam.
 *   cc custom_block.c $(pkg-config --cflags --libs tessera) && ./a.out [TRAINING_IMAGES] */
#include <stdio.h>
#include <stdlib.h>
#include <tessera/tessera.h>

static void check(ts_status s) { if (s) { fprintf(stderr, "%s\n", ts_last_error()); exit(1); } }

/* x / sqrt(mean(x^2) + eps) * w, over the features (dim 1), in the current scope. */
static ts_tensor *rmsnorm(ts_tensor *x, ts_tensor *w)
{
    ts_tensor *ms = ts_s_mean(ts_s_mul(x, x), 1, (const int[]){1}, 1);
    return ts_s_mul(ts_s_mul(x, ts_s_rsqrt(ts_s_add_scalar(ms, 1e-6))), w);
}

static ts_status block_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    ts_scope *sc = ts_scope_begin();
    ts_tensor *h = rmsnorm(x, ts_module_param(m, "norm_weight"));
    h = ts_s_relu(ts_s_forward(ts_module_child(m, "fc1"), h));
    return ts_scope_return(sc, ts_s_add(x, ts_s_forward(ts_module_child(m, "fc2"), h)), y);
}

static ts_module *block(int64_t d, ts_weight_init *init)
{
    static const ts_module_def def = {"block", block_forward, NULL};
    ts_module *m, *fc1, *fc2;
    ts_tensor *w;
    check(ts_module_custom(&def, NULL, &m));
    check(ts_tensor_ones(NULL, TS_F32, 1, &d, &w));
    check(ts_module_add_param(m, "norm_weight", w)), ts_tensor_unref(w);
    check(ts_nn_linear(NULL, d, 4 * d, 1, init, &fc1)), check(ts_module_add_child(m, "fc1", fc1));
    check(ts_nn_linear(NULL, 4 * d, d, 1, init, &fc2)), check(ts_module_add_child(m, "fc2", fc2));
    return m;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 60000; /* images per epoch */
    ts_rng rng = TS_RNG(7);
    ts_weight_init init = TS_INIT_DEFAULT(&rng);
    ts_tensor *x, *y, *tx, *ty;
    ts_module *model, *l;
    ts_named_tensor params[16];
    ts_adam_options adam = TS_ADAM_DEFAULTS;
    ts_optim *opt;
    ts_loader *batches;
    double loss, acc;
    check(ts_init(NULL));
    check(ts_fashion_mnist_load(NULL, 1, NULL, &x, &y));
    check(ts_fashion_mnist_load(NULL, 0, NULL, &tx, &ty));
    check(ts_nn_sequential(&model));
    check(ts_nn_flatten(&l)), check(ts_nn_sequential_add(model, "flatten", l));
    check(ts_nn_linear(NULL, 784, 128, 1, &init, &l)), check(ts_nn_sequential_add(model, "in", l));
    check(ts_nn_sequential_add(model, "block", block(128, &init)));
    check(ts_nn_linear(NULL, 128, 10, 1, &init, &l)), check(ts_nn_sequential_add(model, "out", l));
    check(ts_optim_adam(params, ts_module_parameters(model, params, 16), &adam, &opt));
    check(ts_loader_new(x, y, 64, 1, 7, 0, &batches));
    for (int epoch = 1; epoch <= 2; epoch++) {
        check(ts_loader_seek(batches, (uint64_t)epoch, ts_loader_batches(batches) - n / 64));
        check(ts_train_epoch(model, batches, opt, TS_LOSS_CROSS_ENTROPY, &loss));
        check(ts_evaluate(model, tx, ty, 1000, &acc));
        printf("epoch %d: train loss %.4f, test accuracy %.4f\n", epoch, loss, acc);
    }
    ts_loader_free(batches), ts_optim_free(opt), ts_module_free(model);
    ts_tensor_unref(x), ts_tensor_unref(y), ts_tensor_unref(tx), ts_tensor_unref(ty);
    ts_shutdown();
}
