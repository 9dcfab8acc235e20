/* tests/unit/test-threads.c: two threads train two models on the same device at once, so
 * they share its pool, its plugin and the core's registries. Each model must end exactly as
 * it does when trained alone (same seed, same steps), and nothing may stay alive. Run under
 * ThreadSanitizer by `make check-tsan` in a --enable-tsan build (docs/reliability.md). */
#include <pthread.h>

#include "../tap.h"

#define BATCH 8
#define STEPS 6
#define ROUNDS 3
#define MAXP 8

typedef struct job {
    ts_device *dev;
    uint64_t seed;
    ts_status status;
    char error[512];
    double checksum; /* sum of every parameter after training, as a fingerprint */
    float first;     /* one parameter element, compared bit for bit */
} job;

#define TRY(expr)                                                                           \
    do {                                                                                    \
        if ((s = (expr)))                                                                   \
            goto out;                                                                       \
    } while (0)

/* A small conv net trained STEPS Adam steps on random data from seed; every failure ends
 * the job with its status and message (a thread cannot CHECK). */
static void *train(void *arg)
{
    job *j = arg;
    ts_status s = TS_OK;
    ts_module *net = NULL, *l;
    ts_optim *opt = NULL;
    ts_tensor *x = NULL, *y = NULL, *logits = NULL, *loss = NULL;
    ts_named_tensor params[MAXP];
    ts_rng rng;
    ts_rng_init(&rng, j->seed);
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, &rng};
    ts_conv2d_params c = {1, 1, 1, 1, 1, 1, 1};
    ts_pool2d_params p2 = {.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
    TRY(ts_nn_sequential(&net));
    TRY(ts_nn_conv2d(j->dev, 1, 4, 3, 3, &c, 1, &init, &l));
    TRY(ts_nn_sequential_add(net, "conv", l));
    TRY(ts_nn_relu(&l));
    TRY(ts_nn_sequential_add(net, "relu", l));
    TRY(ts_nn_max_pool2d(&p2, &l));
    TRY(ts_nn_sequential_add(net, "pool", l));
    TRY(ts_nn_flatten(&l));
    TRY(ts_nn_sequential_add(net, "flatten", l));
    TRY(ts_nn_linear(j->dev, 4 * 14 * 14, 10, 1, &init, &l));
    TRY(ts_nn_sequential_add(net, "fc", l));
    size_t np = ts_module_parameters(net, params, MAXP);
    ts_adam_options ao = {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    TRY(ts_optim_adam(params, np, &ao, &opt));
    int64_t xs[] = {BATCH, 1, 28, 28}, ys[] = {BATCH};
    int64_t labels[BATCH];
    for (int i = 0; i < BATCH; i++)
        labels[i] = (int64_t)((j->seed + (uint64_t)i * 7) % 10);
    TRY(ts_tensor_rand(j->dev, TS_F32, 4, xs, 0, 1, &rng, &x));
    TRY(ts_tensor_from_host(j->dev, TS_I64, 1, ys, labels, &y));
    for (int step = 0; step < STEPS; step++) {
        TRY(ts_module_forward(net, x, &logits));
        TRY(ts_cross_entropy(logits, y, TS_REDUCTION_MEAN, &loss));
        TRY(ts_backward(loss, NULL, 0));
        TRY(ts_optim_step(opt));
        ts_optim_zero_grad(opt);
        ts_tensor_unref(loss);
        ts_tensor_unref(logits);
        loss = logits = NULL;
    }
    j->checksum = 0;
    for (size_t i = 0; i < np; i++) {
        int64_t n = ts_tensor_numel(params[i].tensor);
        float *v = malloc((size_t)n * sizeof *v);
        if (!v) {
            s = TS_ENOMEM;
            goto out;
        }
        s = ts_tensor_to_host(params[i].tensor, v, (size_t)n * sizeof *v);
        for (int64_t k = 0; !s && k < n; k++)
            j->checksum += v[k];
        if (i == 0)
            j->first = v[0];
        free(v);
        if (s)
            goto out;
    }
out:
    j->status = s;
    snprintf(j->error, sizeof j->error, "%s", s ? ts_last_error() : "");
    ts_tensor_unref(loss);
    ts_tensor_unref(logits);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    ts_optim_free(opt);
    ts_module_free(net);
    return NULL;
}

static void test_two_models_one_device(void)
{
    ts_device *dev = tap_start();
    job alone[2] = {{dev, 11, 0, "", 0, 0}, {dev, 12, 0, "", 0, 0}};
    for (int i = 0; i < 2; i++) {
        train(&alone[i]);
        CHECK_MSG(alone[i].status == TS_OK, "alone %d: %s", i, alone[i].error);
    }
    CHECK(alone[0].checksum != alone[1].checksum);
    for (int round = 0; round < ROUNDS; round++) {
        job both[2] = {{dev, 11, 0, "", 0, 0}, {dev, 12, 0, "", 0, 0}};
        pthread_t t[2];
        for (int i = 0; i < 2; i++)
            CHECK(pthread_create(&t[i], NULL, train, &both[i]) == 0);
        for (int i = 0; i < 2; i++)
            CHECK(pthread_join(t[i], NULL) == 0);
        for (int i = 0; i < 2; i++) {
            CHECK_MSG(both[i].status == TS_OK, "thread %d: %s", i, both[i].error);
            CHECK_MSG(memcmp(&both[i].first, &alone[i].first, sizeof(float)) == 0 &&
                          both[i].checksum == alone[i].checksum,
                      "round %d thread %d: checksum %.9g vs %.9g alone", round, i,
                      both[i].checksum, alone[i].checksum);
        }
    }
    ts_memory_stats st;
    CHECK_OK(ts_device_memory_stats(dev, &st));
    CHECK(!(st.valid & TS_STATS_POOL) || st.n_alloc > 0);
    tap_end();
}

/* Four threads allocate, fill, check and free blocks of mixed sizes on one device's pool: a
 * block handed to two threads at once, or a free list corrupted by a race, shows up as a
 * pattern overwritten by another thread. */
typedef struct hammer {
    ts_device *dev;
    unsigned id;
    int bad;
    char error[256];
} hammer;

#define HAMMER_ITERS 400
#define HAMMER_SLOTS 8

static void *hammer_run(void *arg)
{
    hammer *h = arg;
    void *slot[HAMMER_SLOTS] = {0};
    size_t size[HAMMER_SLOTS] = {0};
    uint64_t r = 0x9e3779b97f4a7c15ull * (h->id + 1);
    unsigned char *buf = malloc((size_t)4 << 20), *back = malloc((size_t)4 << 20);
    for (int it = 0; it < HAMMER_ITERS && !h->bad && buf && back; it++) {
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        int k = (int)(r % HAMMER_SLOTS);
        if (slot[k]) {
            /* Still holding exactly what this thread wrote? */
            memset(back, 0, size[k]);
            if (ts_device_copy_to_host(h->dev, back, slot[k], size[k]) != TS_OK)
                h->bad = 1;
            memset(buf, (int)(h->id * 16 + (unsigned)k), size[k]);
            if (memcmp(back, buf, size[k]) != 0) {
                snprintf(h->error, sizeof h->error, "slot %d (%zu bytes) was overwritten", k,
                         size[k]);
                h->bad = 1;
            }
            ts_device_free(h->dev, slot[k]);
            slot[k] = NULL;
            continue;
        }
        static const size_t sizes[] = {64, 1000, 4096, 70000, 600000, 3u << 20};
        size[k] = sizes[(r >> 8) % 6] + (size_t)(r >> 32) % 512;
        if (ts_device_alloc(h->dev, size[k], "hammer", &slot[k]) != TS_OK) {
            snprintf(h->error, sizeof h->error, "alloc: %s", ts_last_error());
            h->bad = 1;
            break;
        }
        memset(buf, (int)(h->id * 16 + (unsigned)k), size[k]);
        if (ts_device_copy_from_host(h->dev, slot[k], buf, size[k]) != TS_OK)
            h->bad = 1;
    }
    for (int k = 0; k < HAMMER_SLOTS; k++)
        ts_device_free(h->dev, slot[k]);
    free(buf);
    free(back);
    return NULL;
}

static void test_pool_hammer(void)
{
    ts_device *dev = tap_start();
    hammer h[4];
    pthread_t t[4];
    for (unsigned i = 0; i < 4; i++) {
        h[i] = (hammer){dev, i, 0, ""};
        CHECK(pthread_create(&t[i], NULL, hammer_run, &h[i]) == 0);
    }
    for (int i = 0; i < 4; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(!h[i].bad, "thread %d: %s", i, h[i].error);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {TAP_TEST(test_two_models_one_device),
                                     TAP_TEST(test_pool_hammer)};
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
