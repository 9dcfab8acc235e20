/* tools/cmd_train.c: `tessera train`: a model on Fashion-MNIST, with a progress bar on a
 * terminal, one summary per epoch (or one JSON object with --json), evaluation on the test
 * set, and checkpoints that resume bit-identically (parameters, optimizer state, step,
 * shuffle position). */
#include "config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

static const char usage[] =
    "usage: tessera train [--model mlp|lenet5|cnn] [--epochs N] [--batch-size B] [--lr X]\n"
    "                     [--optimizer sgd|adam|adamw] [--momentum M] [--weight-decay W]\n"
    "                     [--device NAME] [--config FILE] [--data DIR] [--save CKPT]\n"
    "                     [--resume CKPT] [--seed S] [--max-steps N] [--train-limit N]\n"
    "                     [--log-steps] [--json]\n"
    "\n"
    "Trains on Fashion-MNIST (default data: " TS_FASHION_MNIST_DIR ", Debian package\n"
    "dataset-fashion-mnist). Defaults: lenet5, 1 epoch, batch 64, adam, lr 1e-3, seed 1.\n"
    "  --save CKPT     write a checkpoint (safetensors) after every epoch and at the end\n"
    "  --resume CKPT   continue exactly where CKPT stopped (same model, optimizer, order)\n"
    "  --max-steps N   stop after N optimizer steps in all (then evaluate and save)\n"
    "  --train-limit N train on the first N training images only\n"
    "  --log-steps     print every step's loss (one line each; JSON lines with --json)\n"
    "  --json          one JSON object per epoch instead of the progress bar and summary\n";

typedef struct train_opts {
    const char *model, *optimizer, *device, *data, *save, *resume;
    int64_t epochs, batch, max_steps, train_limit;
    double lr, momentum, weight_decay;
    uint64_t seed;
    int json, log_steps;
} train_opts;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- models ------------------------------------------------------------------------------ */

#define ADD(seq, name, call)                                                                \
    do {                                                                                    \
        ts_module *m_;                                                                      \
        if ((s = (call)) || (s = ts_nn_sequential_add(seq, name, m_)))                       \
            goto fail;                                                                      \
    } while (0)

ts_status cli_build_model(const char *name, ts_device *dev, ts_rng *rng, ts_module **out)
{
    ts_module *seq;
    ts_status s = ts_nn_sequential(&seq);
    if (s)
        return s;
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, rng};
    ts_pool2d_params pool2 = {.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
    if (strcmp(name, "mlp") == 0) { /* 784-256-128-10 */
        ADD(seq, "flatten", ts_nn_flatten(&m_));
        ADD(seq, "fc1", ts_nn_linear(dev, 784, 256, 1, &init, &m_));
        ADD(seq, "relu1", ts_nn_relu(&m_));
        ADD(seq, "fc2", ts_nn_linear(dev, 256, 128, 1, &init, &m_));
        ADD(seq, "relu2", ts_nn_relu(&m_));
        ADD(seq, "fc3", ts_nn_linear(dev, 128, 10, 1, &init, &m_));
    } else if (strcmp(name, "lenet5") == 0) { /* LeNet-5, the first conv padded for 28x28 */
        ts_conv2d_params c1 = {1, 1, 2, 2, 1, 1, 1}, c2 = {1, 1, 0, 0, 1, 1, 1};
        ADD(seq, "conv1", ts_nn_conv2d(dev, 1, 6, 5, 5, &c1, 1, &init, &m_));
        ADD(seq, "relu1", ts_nn_relu(&m_));
        ADD(seq, "pool1", ts_nn_max_pool2d(&pool2, &m_));
        ADD(seq, "conv2", ts_nn_conv2d(dev, 6, 16, 5, 5, &c2, 1, &init, &m_));
        ADD(seq, "relu2", ts_nn_relu(&m_));
        ADD(seq, "pool2", ts_nn_max_pool2d(&pool2, &m_));
        ADD(seq, "flatten", ts_nn_flatten(&m_));
        ADD(seq, "fc1", ts_nn_linear(dev, 400, 120, 1, &init, &m_));
        ADD(seq, "relu3", ts_nn_relu(&m_));
        ADD(seq, "fc2", ts_nn_linear(dev, 120, 84, 1, &init, &m_));
        ADD(seq, "relu4", ts_nn_relu(&m_));
        ADD(seq, "fc3", ts_nn_linear(dev, 84, 10, 1, &init, &m_));
    } else if (strcmp(name, "cnn") == 0) { /* two conv+pool blocks, two linear layers */
        ts_conv2d_params c = {1, 1, 1, 1, 1, 1, 1};
        ADD(seq, "conv1", ts_nn_conv2d(dev, 1, 32, 3, 3, &c, 1, &init, &m_));
        ADD(seq, "relu1", ts_nn_relu(&m_));
        ADD(seq, "pool1", ts_nn_max_pool2d(&pool2, &m_));
        ADD(seq, "conv2", ts_nn_conv2d(dev, 32, 64, 3, 3, &c, 1, &init, &m_));
        ADD(seq, "relu2", ts_nn_relu(&m_));
        ADD(seq, "pool2", ts_nn_max_pool2d(&pool2, &m_));
        ADD(seq, "flatten", ts_nn_flatten(&m_));
        ADD(seq, "fc1", ts_nn_linear(dev, 64 * 7 * 7, 128, 1, &init, &m_));
        ADD(seq, "relu3", ts_nn_relu(&m_));
        ADD(seq, "fc2", ts_nn_linear(dev, 128, 10, 1, &init, &m_));
    } else {
        ts_module_free(seq);
        return TS_EINVAL;
    }
    *out = seq;
    return TS_OK;
fail:
    ts_module_free(seq);
    return s;
}

/* ---- state ------------------------------------------------------------------------------- */

typedef struct trainer {
    train_opts o;
    ts_device *dev;
    ts_module *model;
    ts_named_tensor *params, *buffers;
    size_t nparams, nbuffers;
    ts_optim *opt;
    ts_loader *loader;
    ts_tensor *train_x, *train_y, *test_x, *test_y;
    ts_rng rng;        /* initialisation and dropout */
    int64_t step;      /* optimizer steps taken */
    uint64_t epoch;    /* the epoch in progress (0-based) */
    int tty;
} trainer;

static void meta_u64(ts_checkpoint *ck, const char *key, uint64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    ts_checkpoint_set_meta(ck, key, b);
}

static ts_status save(trainer *t, const char *path)
{
    ts_checkpoint *ck;
    ts_status s = ts_checkpoint_new(&ck);
    if (s)
        return s;
    for (size_t i = 0; i < t->nparams && s == TS_OK; i++)
        s = ts_checkpoint_add(ck, t->params[i].name, t->params[i].tensor);
    for (size_t i = 0; i < t->nbuffers && s == TS_OK; i++)
        s = ts_checkpoint_add(ck, t->buffers[i].name, t->buffers[i].tensor);
    if (s == TS_OK)
        s = ts_optim_save_state(t->opt, ck);
    if (s == TS_OK) {
        uint64_t epoch;
        int64_t batch;
        ts_loader_position(t->loader, &epoch, &batch);
        ts_checkpoint_set_meta(ck, "train.model", t->o.model);
        ts_checkpoint_set_meta(ck, "train.format", "tessera-train-1");
        meta_u64(ck, "train.seed", t->o.seed);
        meta_u64(ck, "train.batch_size", (uint64_t)t->o.batch);
        meta_u64(ck, "train.train_limit", (uint64_t)t->o.train_limit);
        meta_u64(ck, "train.step", (uint64_t)t->step);
        meta_u64(ck, "train.epoch", epoch);
        meta_u64(ck, "train.batch", (uint64_t)batch);
        meta_u64(ck, "train.rng_seed", t->rng.seed);
        meta_u64(ck, "train.rng_offset", t->rng.offset);
        s = ts_checkpoint_save(ck, path);
    }
    ts_checkpoint_free(ck);
    return s;
}

static ts_status meta_num(const ts_checkpoint *ck, const char *path, const char *key,
                          uint64_t *v)
{
    const char *txt = ts_checkpoint_meta(ck, key);
    char *end;
    if (!txt || !*txt)
        return fprintf(stderr, "tessera: error: %s: not a tessera training checkpoint (no "
                               "'%s')\n", path, key), TS_ECORRUPT;
    *v = strtoull(txt, &end, 10);
    if (*end)
        return fprintf(stderr, "tessera: error: %s: metadata '%s' = '%s' is not a number\n", path,
                       key, txt), TS_ECORRUPT;
    return TS_OK;
}

static int resume(trainer *t)
{
    ts_checkpoint *ck;
    ts_status s = ts_checkpoint_load(t->o.resume, t->dev, &ck);
    if (s)
        return cli_fail(s, "--resume");
    const char *model = ts_checkpoint_meta(ck, "train.model");
    uint64_t seed, batch_size, limit, step, epoch, batch, rseed, roff;
    int rc = 1;
    if (!model || strcmp(model, t->o.model) != 0) {
        fprintf(stderr, "tessera: error: %s holds a '%s' model, not '%s' (use --model %s)\n",
                t->o.resume, model ? model : "(unknown)", t->o.model, model ? model : "...");
        goto out;
    }
    if (meta_num(ck, t->o.resume, "train.seed", &seed) ||
        meta_num(ck, t->o.resume, "train.batch_size", &batch_size) ||
        meta_num(ck, t->o.resume, "train.train_limit", &limit) ||
        meta_num(ck, t->o.resume, "train.step", &step) ||
        meta_num(ck, t->o.resume, "train.epoch", &epoch) ||
        meta_num(ck, t->o.resume, "train.batch", &batch) ||
        meta_num(ck, t->o.resume, "train.rng_seed", &rseed) ||
        meta_num(ck, t->o.resume, "train.rng_offset", &roff))
        goto out;
    if (seed != t->o.seed || (int64_t)batch_size != t->o.batch ||
        (int64_t)limit != t->o.train_limit) {
        fprintf(stderr, "tessera: error: %s was trained with --seed %llu --batch-size %llu "
                        "--train-limit %llu; resume with the same values\n",
                t->o.resume, (unsigned long long)seed, (unsigned long long)batch_size,
                (unsigned long long)limit);
        goto out;
    }
    for (size_t i = 0; i < t->nparams; i++)
        if ((s = ts_checkpoint_restore(ck, t->params[i].name, t->params[i].tensor))) {
            rc = cli_fail(s, "--resume");
            goto out;
        }
    for (size_t i = 0; i < t->nbuffers; i++)
        if ((s = ts_checkpoint_restore(ck, t->buffers[i].name, t->buffers[i].tensor))) {
            rc = cli_fail(s, "--resume");
            goto out;
        }
    if ((s = ts_optim_load_state(t->opt, ck)) ||
        (s = ts_loader_seek(t->loader, epoch, (int64_t)batch))) {
        rc = cli_fail(s, "--resume");
        goto out;
    }
    t->step = (int64_t)step;
    t->epoch = epoch;
    t->rng.seed = rseed;
    t->rng.offset = roff;
    rc = 0;
out:
    ts_checkpoint_free(ck);
    return rc;
}

/* ---- training and evaluation --------------------------------------------------------------- */

/* Correct predictions of logits (B, 10) against labels (B), added to *correct. */
static ts_status count_correct(ts_tensor *logits, ts_tensor *labels, int64_t *correct)
{
    ts_tensor *pred = NULL, *eq = NULL, *n = NULL, *n64 = NULL;
    int64_t c = 0;
    ts_status s = ts_argmax(logits, 1, 0, &pred);
    if (s == TS_OK)
        s = ts_eq(pred, labels, &eq);
    if (s == TS_OK)
        s = ts_cast(eq, TS_I64, &n64);
    if (s == TS_OK)
        s = ts_sum(n64, 0, NULL, 0, &n);
    if (s == TS_OK)
        s = ts_tensor_to_host(n, &c, sizeof c);
    if (s == TS_OK)
        *correct += c;
    ts_tensor_unref(pred);
    ts_tensor_unref(eq);
    ts_tensor_unref(n);
    ts_tensor_unref(n64);
    return s;
}

static ts_status evaluate(trainer *t, double *acc)
{
    int64_t n = ts_tensor_size(t->test_x, 0), correct = 0;
    ts_status s = TS_OK;
    ts_module_train(t->model, 0);
    ts_no_grad_enter();
    for (int64_t b = 0; b < n && s == TS_OK; b += 1000) {
        int64_t len = n - b < 1000 ? n - b : 1000;
        ts_tensor *x = NULL, *y = NULL, *logits = NULL;
        if ((s = ts_tensor_narrow(t->test_x, 0, b, len, &x)) == TS_OK &&
            (s = ts_tensor_narrow(t->test_y, 0, b, len, &y)) == TS_OK &&
            (s = ts_module_forward(t->model, x, &logits)) == TS_OK)
            s = count_correct(logits, y, &correct);
        ts_tensor_unref(x);
        ts_tensor_unref(y);
        ts_tensor_unref(logits);
    }
    ts_no_grad_exit();
    ts_module_train(t->model, 1);
    *acc = n ? (double)correct / (double)n : 0;
    return s;
}

static void progress(const trainer *t, int64_t batch, int64_t nbatches, double loss,
                     double rate)
{
    ts_memory_stats st;
    ts_device_memory_stats(t->dev, &st);
    char b[32];
    int width = 30, done = (int)(width * batch / (nbatches ? nbatches : 1));
    fprintf(stdout, "\r  epoch %llu [", (unsigned long long)t->epoch + 1);
    for (int i = 0; i < width; i++)
        fputc(i < done ? '=' : i == done ? '>' : ' ', stdout);
    fprintf(stdout, "] %lld/%lld  %.0f img/s  loss %.4f  pool %s ", (long long)batch,
            (long long)nbatches, rate, loss, cli_bytes(st.in_use, b, sizeof b));
    fflush(stdout);
}

/* One epoch; returns TS_OK and sets *stop when --max-steps is reached. */
static ts_status run_epoch(trainer *t, int *stop)
{
    ts_tensor *x, *y;
    double loss_sum = 0, t0 = now();
    int64_t seen = 0, correct = 0, nb = ts_loader_batches(t->loader), bi;
    uint64_t ep;
    ts_loader_position(t->loader, &ep, &bi);
    ts_status s;
    while ((s = ts_loader_next(t->loader, &x, &y)) == TS_OK && x) {
        ts_tensor *logits = NULL, *loss = NULL, *d = NULL;
        double lv = 0;
        if ((s = ts_module_forward(t->model, x, &logits)) == TS_OK &&
            (s = ts_cross_entropy(logits, y, TS_REDUCTION_MEAN, &loss)) == TS_OK &&
            (s = ts_backward(loss, NULL, 0)) == TS_OK && (s = ts_optim_step(t->opt)) == TS_OK &&
            (s = ts_cast(loss, TS_F64, &d)) == TS_OK && (s = ts_tensor_to_host(d, &lv, sizeof lv)) == TS_OK) {
            ts_optim_zero_grad(t->opt);
            ts_no_grad_enter();
            s = count_correct(logits, y, &correct);
            ts_no_grad_exit();
        }
        int64_t bs = ts_tensor_size(x, 0);
        ts_tensor_unref(logits);
        ts_tensor_unref(loss);
        ts_tensor_unref(d);
        ts_tensor_unref(x);
        ts_tensor_unref(y);
        if (s)
            return s;
        t->step++;
        bi++;
        seen += bs;
        loss_sum += lv * (double)bs;
        if (t->o.log_steps) {
            if (t->o.json)
                printf("{\"step\": %lld, \"loss\": %.9g}\n", (long long)t->step, lv);
            else
                printf("step %lld loss %.9g\n", (long long)t->step, lv);
        } else if (t->tty && !t->o.json && (bi % 10 == 0 || bi == nb)) {
            progress(t, bi, nb, loss_sum / (double)seen, (double)seen / (now() - t0));
        }
        if (t->o.max_steps > 0 && t->step >= t->o.max_steps) {
            *stop = 1;
            break;
        }
    }
    if (s)
        return s;
    double secs = now() - t0, test_acc = 0;
    if ((s = evaluate(t, &test_acc)))
        return s;
    ts_memory_stats st;
    ts_device_memory_stats(t->dev, &st);
    double train_loss = seen ? loss_sum / (double)seen : 0;
    double train_acc = seen ? (double)correct / (double)seen : 0;
    if (t->o.json) {
        printf("{\"epoch\": %llu, \"steps\": %lld, \"train_loss\": %.6f, \"train_acc\": %.4f, "
               "\"test_acc\": %.4f, \"seconds\": %.2f, \"pool_in_use\": %llu, "
               "\"pool_reserved\": %llu, \"pool_peak_reserved\": %llu, \"pool_peak_in_use\": "
               "%llu}\n",
               (unsigned long long)t->epoch + 1, (long long)t->step, train_loss, train_acc,
               test_acc, secs, (unsigned long long)st.in_use, (unsigned long long)st.reserved,
               (unsigned long long)st.peak_reserved, (unsigned long long)st.peak_in_use);
    } else {
        char b1[32], b2[32], b3[32];
        if (t->tty && !t->o.log_steps)
            printf("\r%*s\r", 110, "");
        printf("epoch %llu: train loss %.4f acc %.4f, test acc %.4f, %.1f s, pool in use %s / "
               "reserved %s / peak %s\n",
               (unsigned long long)t->epoch + 1, train_loss, train_acc, test_acc, secs,
               cli_bytes(st.in_use, b1, sizeof b1), cli_bytes(st.reserved, b2, sizeof b2),
               cli_bytes(st.peak_reserved, b3, sizeof b3));
    }
    fflush(stdout);
    return TS_OK;
}

/* ---- the command ------------------------------------------------------------------------- */

static long long strtoll_10(const char *s, char **end)
{
    return strtoll(s, end, 10);
}

static unsigned long long strtoull_10(const char *s, char **end)
{
    return strtoull(s, end, 10);
}


static int parse(int argc, char **argv, train_opts *o, const cli_common *common)
{
    *o = (train_opts){.model = "lenet5", .optimizer = "adam", .epochs = 1, .batch = 64,
                      .lr = -1, .seed = 1, .json = common->json};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
#define TAKE(field, conv)                                                                   \
    do {                                                                                    \
        if (!v)                                                                             \
            return cli_usage_error("train", "%s needs a value", a);                        \
        o->field = conv(v, &end);                                                           \
        i++;                                                                                \
    } while (0)
        if (!strcmp(a, "--model")) {
            if (!v)
                return cli_usage_error("train", "--model needs mlp, lenet5 or cnn");
            o->model = v, i++;
        } else if (!strcmp(a, "--optimizer")) {
            if (!v)
                return cli_usage_error("train", "--optimizer needs sgd, adam or adamw");
            o->optimizer = v, i++;
        } else if (!strcmp(a, "--device") || !strcmp(a, "--data") || !strcmp(a, "--save") ||
                   !strcmp(a, "--resume")) {
            if (!v)
                return cli_usage_error("train", "%s needs a value", a);
            *(!strcmp(a, "--device") ? &o->device : !strcmp(a, "--data") ? &o->data
                                                : !strcmp(a, "--save")    ? &o->save
                                                                          : &o->resume) = v;
            i++;
        } else if (!strcmp(a, "--epochs")) {
            TAKE(epochs, strtoll_10);
        } else if (!strcmp(a, "--batch-size")) {
            TAKE(batch, strtoll_10);
        } else if (!strcmp(a, "--max-steps")) {
            TAKE(max_steps, strtoll_10);
        } else if (!strcmp(a, "--train-limit")) {
            TAKE(train_limit, strtoll_10);
        } else if (!strcmp(a, "--seed")) {
            TAKE(seed, strtoull_10);
        } else if (!strcmp(a, "--lr")) {
            TAKE(lr, strtod);
        } else if (!strcmp(a, "--momentum")) {
            TAKE(momentum, strtod);
        } else if (!strcmp(a, "--weight-decay")) {
            TAKE(weight_decay, strtod);
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--log-steps")) {
            o->log_steps = 1;
        } else if (!strcmp(a, "--config")) {
            if (!v)
                return cli_usage_error("train", "--config needs a FILE");
            i++; /* handled by the caller */
        } else if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return -1;
        } else {
            return cli_usage_error("train", "unexpected argument '%s'", a);
        }
        if (end && *end)
            return cli_usage_error("train", "%s: '%s' is not a number", a, v);
#undef TAKE
    }
    if (strcmp(o->model, "mlp") && strcmp(o->model, "lenet5") && strcmp(o->model, "cnn"))
        return cli_usage_error("train", "unknown model '%s' (mlp, lenet5 or cnn)", o->model);
    if (strcmp(o->optimizer, "sgd") && strcmp(o->optimizer, "adam") &&
        strcmp(o->optimizer, "adamw"))
        return cli_usage_error("train", "unknown optimizer '%s' (sgd, adam or adamw)",
                               o->optimizer);
    if (o->epochs < 1 || o->batch < 1 || o->max_steps < 0 || o->train_limit < 0)
        return cli_usage_error("train", "--epochs and --batch-size must be >= 1, --max-steps "
                               "and --train-limit >= 0");
    if (o->lr < 0)
        o->lr = strcmp(o->optimizer, "sgd") == 0 ? 0.05 : 1e-3;
    if (!(o->lr > 0) || !(o->momentum >= 0) || !(o->weight_decay >= 0))
        return cli_usage_error("train", "--lr must be > 0, --momentum and --weight-decay >= 0");
    return 0;
}

static void trainer_free(trainer *t)
{
    ts_loader_free(t->loader);
    ts_optim_free(t->opt);
    ts_module_free(t->model);
    free(t->params);
    free(t->buffers);
    ts_tensor_unref(t->train_x);
    ts_tensor_unref(t->train_y);
    ts_tensor_unref(t->test_x);
    ts_tensor_unref(t->test_y);
}

int cmd_train(int argc, char **argv, const cli_common *common)
{
    trainer t = {0};
    const char *config = common->config;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "--config"))
            config = argv[i + 1];
    int rc = parse(argc, argv, &t.o, common);
    if (rc)
        return rc < 0 ? 0 : rc;
    t.tty = isatty(STDOUT_FILENO);
    ts_status s = ts_init(config);
    if (s)
        return cli_fail(s, "cannot start tessera");
    rc = 1;
    t.dev = ts_default_device();
    if (t.o.device && (s = ts_device_get(t.o.device, &t.dev))) {
        cli_fail(s, "--device");
        goto out;
    }
    double t0 = now();
    if ((s = ts_fashion_mnist_load(t.o.data, 1, t.dev, &t.train_x, &t.train_y)) ||
        (s = ts_fashion_mnist_load(t.o.data, 0, t.dev, &t.test_x, &t.test_y))) {
        cli_fail(s, "cannot load the data");
        goto out;
    }
    if (t.o.train_limit > 0 && t.o.train_limit < ts_tensor_size(t.train_x, 0)) {
        ts_tensor *x, *y;
        if ((s = ts_tensor_narrow(t.train_x, 0, 0, t.o.train_limit, &x)) ||
            (s = ts_tensor_narrow(t.train_y, 0, 0, t.o.train_limit, &y))) {
            cli_fail(s, "--train-limit");
            goto out;
        }
        ts_tensor_unref(t.train_x);
        ts_tensor_unref(t.train_y);
        t.train_x = x;
        t.train_y = y;
    }
    ts_rng_init(&t.rng, t.o.seed);
    if ((s = cli_build_model(t.o.model, t.dev, &t.rng, &t.model))) {
        cli_fail(s, "cannot build the model");
        goto out;
    }
    t.nparams = ts_module_parameters(t.model, NULL, 0);
    t.nbuffers = ts_module_buffers(t.model, NULL, 0);
    t.params = calloc(t.nparams + 1, sizeof *t.params);
    t.buffers = calloc(t.nbuffers + 1, sizeof *t.buffers);
    if (!t.params || !t.buffers) {
        fprintf(stderr, "tessera: error: out of memory\n");
        goto out;
    }
    ts_module_parameters(t.model, t.params, t.nparams);
    ts_module_buffers(t.model, t.buffers, t.nbuffers);
    if (!strcmp(t.o.optimizer, "sgd")) {
        ts_sgd_options so = {t.o.lr, t.o.momentum, 0, t.o.weight_decay, 0};
        s = ts_optim_sgd(t.params, t.nparams, &so, &t.opt);
    } else {
        ts_adam_options ao = {t.o.lr, 0.9, 0.999, 1e-8, t.o.weight_decay};
        s = !strcmp(t.o.optimizer, "adam") ? ts_optim_adam(t.params, t.nparams, &ao, &t.opt)
                                           : ts_optim_adamw(t.params, t.nparams, &ao, &t.opt);
    }
    if (s || (s = ts_loader_new(t.train_x, t.train_y, t.o.batch, 1, t.o.seed, 0, &t.loader))) {
        cli_fail(s, "cannot set up training");
        goto out;
    }
    if (t.o.resume && resume(&t))
        goto out;
    if (!t.o.json)
        printf("tessera train: %s (%lld parameters) on '%s', %s lr %g, batch %lld, %lld "
               "training images, data loaded in %.1f s\n",
               t.o.model, (long long)ts_module_num_params(t.model), ts_device_name(t.dev),
               t.o.optimizer, t.o.lr, (long long)t.o.batch,
               (long long)ts_tensor_size(t.train_x, 0), now() - t0);
    int stop = 0;
    for (; t.epoch < (uint64_t)t.o.epochs && !stop; t.epoch++) {
        uint64_t ep;
        int64_t bi;
        ts_loader_position(t.loader, &ep, &bi);
        if (ep != t.epoch || bi >= ts_loader_batches(t.loader))
            s = ts_loader_start_epoch(t.loader, t.epoch);
        if (s == TS_OK)
            s = run_epoch(&t, &stop);
        if (s) {
            cli_fail(s, "training failed");
            goto out;
        }
        /* The next epoch starts on the next loop; save the position as its beginning. */
        if (!stop && (s = ts_loader_start_epoch(t.loader, t.epoch + 1))) {
            cli_fail(s, "training failed");
            goto out;
        }
        if (t.o.save && (s = save(&t, t.o.save))) {
            cli_fail(s, "--save");
            goto out;
        }
    }
    rc = 0;
out:
    trainer_free(&t);
    ts_shutdown();
    return rc;
}
