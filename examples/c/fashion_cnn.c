/* A small CNN on Fashion-MNIST with tessera's C API: a custom model, training, evaluation,
 * saving and reloading. cc fashion_cnn.c $(pkg-config --cflags --libs tessera); ./a.out [N] */
#include <stdio.h>
#include <stdlib.h>
#include <tessera/tessera.h>

static void die(const char *what) { fprintf(stderr, "%s: %s\n", what, ts_last_error()); exit(1); }
#define TRY(c) ((c) == TS_OK ? (void)0 : die(#c)) /* an expression: also in for (...) */
#define ADD(name, make) do { ts_module *l_; TRY(make); TRY(ts_nn_sequential_add(m, name, l_)); } while (0)

static ts_module *cnn(ts_rng *rng) /* conv 16 - pool - conv 32 - pool - linear 10 */
{
    ts_weight_init init = TS_INIT_DEFAULT(rng);
    ts_conv2d_params pad1 = TS_CONV2D_PAD(1);
    ts_pool2d_params pool = TS_POOL2D(2);
    ts_module *m;
    TRY(ts_nn_sequential(&m));
    ADD("conv1", ts_nn_conv2d(NULL, 1, 16, 3, 3, &pad1, 1, &init, &l_));
    ADD("relu1", ts_nn_relu(&l_));
    ADD("pool1", ts_nn_max_pool2d(&pool, &l_));
    ADD("conv2", ts_nn_conv2d(NULL, 16, 32, 3, 3, &pad1, 1, &init, &l_));
    ADD("relu2", ts_nn_relu(&l_));
    ADD("pool2", ts_nn_max_pool2d(&pool, &l_));
    ADD("flatten", ts_nn_flatten(&l_));
    ADD("fc", ts_nn_linear(NULL, 32 * 7 * 7, 10, 1, &init, &l_));
    return m;
}

static double accuracy(ts_module *m, ts_tensor *x, ts_tensor *y)
{
    ts_tensor *logits;
    double a = 0;
    ts_module_train(m, 0);
    TS_NO_GRAD {
        TRY(ts_module_forward(m, x, &logits));
        TRY(ts_accuracy(logits, y, &a));
    }
    ts_tensor_unref(logits);
    return a;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 60000, nt = n < 10000 ? n : 10000;
    ts_tensor *xs, *ys, *txs, *tys, *x, *y, *tx, *ty, *bx, *by, *logits, *loss;
    ts_rng rng = TS_RNG(42);
    TRY(ts_init(NULL));
    TRY(ts_fashion_mnist_load(NULL, 1, NULL, &xs, &ys));
    TRY(ts_fashion_mnist_load(NULL, 0, NULL, &txs, &tys));
    TRY(ts_tensor_narrow(xs, 0, 0, n, &x)), TRY(ts_tensor_narrow(ys, 0, 0, n, &y));
    TRY(ts_tensor_narrow(txs, 0, 0, nt, &tx)), TRY(ts_tensor_narrow(tys, 0, 0, nt, &ty));
    ts_module *m = cnn(&rng), *again = cnn(&rng);
    ts_named_tensor params[16];
    ts_adam_options adam = TS_ADAM_DEFAULTS;
    ts_optim *opt;
    ts_loader *batches;
    TRY(ts_optim_adam(params, ts_module_parameters(m, params, 16), &adam, &opt));
    TRY(ts_loader_new(x, y, 64, 1, 42, 0, &batches));
    for (int epoch = 0; epoch < 2; epoch++) {
        ts_module_train(m, 1);
        TRY(ts_loader_start_epoch(batches, (uint64_t)epoch));
        for (TRY(ts_loader_next(batches, &bx, &by)); bx; TRY(ts_loader_next(batches, &bx, &by))) {
            TRY(ts_module_forward(m, bx, &logits));
            TRY(ts_cross_entropy(logits, by, TS_REDUCTION_MEAN, &loss));
            TRY(ts_backward(loss, NULL, 0));
            TRY(ts_optim_step(opt));
            ts_optim_zero_grad(opt);
            ts_tensor_unref(logits), ts_tensor_unref(loss), ts_tensor_unref(bx), ts_tensor_unref(by);
        }
        printf("epoch %d: test accuracy %.4f\n", epoch + 1, accuracy(m, tx, ty));
    }
    TRY(ts_module_save_file(m, "fashion_cnn.safetensors"));
    TRY(ts_module_load_file(again, "fashion_cnn.safetensors")); /* it drew other weights */
    printf("reloaded: test accuracy %.4f\n", accuracy(again, tx, ty));
    ts_loader_free(batches), ts_optim_free(opt), ts_module_free(m), ts_module_free(again);
    for (ts_tensor **t = (ts_tensor *[]){xs, ys, txs, tys, x, y, tx, ty, NULL}; *t; t++)
        ts_tensor_unref(*t);
    ts_shutdown();
    return 0;
}
