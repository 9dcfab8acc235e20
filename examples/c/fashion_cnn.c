/* A CNN on Fashion-MNIST with tessera's C API: the built-in "cnn" model trained two epochs with
 * Adam, evaluated, saved and reloaded into a fresh model, which scores the same.
 *   cc fashion_cnn.c $(pkg-config --cflags --libs tessera) && ./a.out [TRAINING_IMAGES] */
#include <stdio.h>
#include <stdlib.h>
#include <tessera/tessera.h>

static void check(ts_status s) { if (s) { fprintf(stderr, "%s\n", ts_last_error()); exit(1); } }

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 60000; /* images per epoch */
    ts_tensor *x, *y, *tx, *ty;
    ts_module *m, *again;
    ts_model_config cnn;
    ts_rng rng = TS_RNG(42);
    ts_named_tensor params[16];
    ts_adam_options adam = TS_ADAM_DEFAULTS;
    ts_optim *opt;
    ts_loader *batches;
    double loss, acc;
    check(ts_init(NULL));
    check(ts_fashion_mnist_load(NULL, 1, NULL, &x, &y));
    check(ts_fashion_mnist_load(NULL, 0, NULL, &tx, &ty));
    check(ts_model_defaults("cnn", &cnn));
    check(ts_model_new(&cnn, NULL, &rng, &m));
    check(ts_model_new(&cnn, NULL, &rng, &again)); /* other weights, until it loads m's */
    check(ts_optim_adam(params, ts_module_parameters(m, params, 16), &adam, &opt));
    check(ts_loader_new(x, y, 64, 1, 42, 0, &batches)); /* shuffled batches of 64 */
    for (int epoch = 1; epoch <= 2; epoch++) { /* the last n images of each shuffled epoch */
        check(ts_loader_seek(batches, (uint64_t)epoch, ts_loader_batches(batches) - n / 64));
        check(ts_train_epoch(m, batches, opt, TS_LOSS_CROSS_ENTROPY, &loss));
        check(ts_evaluate(m, tx, ty, 1000, &acc));
        printf("epoch %d: train loss %.4f, test accuracy %.4f\n", epoch, loss, acc);
    }
    check(ts_module_save_file(m, "fashion_cnn.safetensors"));
    check(ts_module_load_file(again, "fashion_cnn.safetensors"));
    check(ts_evaluate(again, tx, ty, 1000, &acc));
    printf("reloaded: test accuracy %.4f\n", acc);
    ts_loader_free(batches), ts_optim_free(opt), ts_module_free(m), ts_module_free(again);
    ts_tensor_unref(x), ts_tensor_unref(y), ts_tensor_unref(tx), ts_tensor_unref(ty);
    ts_shutdown();
}
