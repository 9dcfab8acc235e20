/* tests/unit/test-threads.c: the threading contract of docs/writing-a-plugin.md, on every
 * shipped plugin that loads here (cpu_blas, cpu_onednn, cuda where a GPU answers): two threads
 * train two models on the same device at once, so they share its pool, its plugin and the
 * core's registries, and each model must end exactly as it does when trained alone (same seed,
 * same steps); four threads run many small matmuls on one device, each checked exactly against
 * its own inputs; four threads hammer the pool. Nothing may stay alive. Run under
 * ThreadSanitizer by `make check-tsan` in a --enable-tsan build (docs/reliability.md). */
#include <dlfcn.h>
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

/* The plugin name, loaded for the running test (tap_start first); SKIPs it when the plugin is
 * not built or has no usable device here (cuda without a GPU). Unload with ts_device_unload
 * before tap_end. */
static ts_device *load(const char *name)
{
    char *path;
    if (ts_plugin_find(NULL, name, &path) != TS_OK)
        SKIP("plugin %s is not built", name);
    free(path);
    ts_device *dev;
    ts_status s = ts_device_load(NULL, tap_plugin_under_test(name), &dev);
    if (s == TS_ENODEV)
        SKIP("plugin %s has no device here: %s", name, ts_last_error());
    CHECK_MSG(s == TS_OK, "loading %s: %s", name, ts_last_error());
    return dev;
}

static void two_models_one_device(const char *name)
{
    /* oneDNN's convolutions run on its own threads, after which LeakSanitizer's exit-time
     * tracer crashes (tests/plugins/test-onednn.c); tap_end still checks tessera's objects. */
    if (strcmp(name, "cpu_onednn") == 0)
        setenv("TS_NO_LSAN_CHECK", "1", 1);
    tap_start();
    ts_device *dev = load(name);
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
    ts_device_unload(dev);
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

static void pool_hammer(const char *name)
{
    tap_start();
    ts_device *dev = load(name);
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
    ts_device_unload(dev);
    tap_end();
}

/* Four threads run MM_ITERS matmuls each on one device, every one on fresh inputs of small
 * integers (so every product and sum is exact in float32, whatever the summation order) and
 * checked element by element against a product computed here from the same inputs: a result
 * computed on another thread's operands, or written into another thread's output, is caught
 * whatever its value. Even iterations use one shape shared by all threads (one cached
 * primitive executed by all of them at once); odd ones draw from MM_SHAPES shapes, more than
 * a primitive cache of 256 holds, so entries are created, looked up and evicted concurrently
 * while other threads run them. Every 128th is large enough for cpu_onednn to cut it into
 * parts (up to 4: one per configured thread) that its threads run side by side while the
 * other threads run theirs. */
#define MM_THREADS 4
#define MM_ITERS 5000
#define MM_DIM 16
#define MM_SHAPES 320 /* (M, N) in [1, 20] x [1, 16], K = 7 */
#define MM_BIG 128    /* every 128th iteration: (2 MM_BIG, MM_BIG) @ (MM_BIG, MM_BIG) */
#define MM_BUF (2 * MM_BIG * MM_BIG)

typedef struct mm_job {
    ts_device *dev;
    unsigned id;
    int wrong, done;
    char error[512];
} mm_job;

static void *mm_run(void *arg)
{
    mm_job *j = arg;
    float a[MM_BUF], b[MM_BUF], c[MM_BUF];
    uint64_t r = 0x9e3779b97f4a7c15ull * (j->id + 1);
    ts_tensor *ta = NULL, *tb = NULL, *tc = NULL;
    for (int it = 0; it < MM_ITERS; it++) {
        int64_t M = MM_DIM, K = MM_DIM, N = MM_DIM;
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        if (it % 4 == 3) {
            int shape = (int)(r % MM_SHAPES);
            M = 1 + shape / 16;
            N = 1 + shape % 16;
            K = 7;
        } else if (it % 128 == 2) {
            M = 2 * MM_BIG;
            K = N = MM_BIG;
        }
        for (int64_t i = 0; i < M * K; i++)
            a[i] = (float)((int)((r >> (i % 40)) % 9) - 4 + (int)j->id);
        for (int64_t i = 0; i < K * N; i++)
            b[i] = (float)((int)((r >> ((i + 17) % 40)) % 7) - 3 - (int)(it % 5));
        int64_t as[] = {M, K}, bs[] = {K, N};
        ts_status s;
        if ((s = ts_tensor_from_host(j->dev, TS_F32, 2, as, a, &ta)) ||
            (s = ts_tensor_from_host(j->dev, TS_F32, 2, bs, b, &tb)) ||
            (s = ts_matmul(ta, tb, &tc)) ||
            (s = ts_tensor_to_host(tc, c, (size_t)(M * N) * sizeof c[0]))) {
            snprintf(j->error, sizeof j->error, "iteration %d: %s: %s", it, ts_status_name(s),
                     ts_last_error());
            j->wrong++;
        } else {
            for (int64_t m = 0; m < M; m++)
                for (int64_t n = 0; n < N; n++) {
                    double want = 0;
                    for (int64_t k = 0; k < K; k++)
                        want += (double)a[m * K + k] * b[k * N + n];
                    if (c[m * N + n] != (float)want) {
                        if (!j->wrong)
                            snprintf(j->error, sizeof j->error,
                                     "iteration %d (%lldx%lld @ %lldx%lld): [%lld,%lld] = %g, "
                                     "expected %g",
                                     it, (long long)M, (long long)K, (long long)K, (long long)N,
                                     (long long)m, (long long)n, (double)c[m * N + n], want);
                        j->wrong++;
                        m = M; /* count a wrong product once */
                        break;
                    }
                }
        }
        ts_tensor_unref(ta);
        ts_tensor_unref(tb);
        ts_tensor_unref(tc);
        ta = tb = tc = NULL;
        j->done++;
    }
    return NULL;
}

typedef long long (*live_fn)(void);

/* The plugin's test-only diagnostic NAME_SUFFIX (e.g. cpu_onednn_primitive_live), or NULL. */
static live_fn diagnostic(ts_device *dev, const char *name, const char *suffix)
{
    void *h = dlopen(ts_device_path(dev), RTLD_NOW | RTLD_NOLOAD);
    CHECK_MSG(h, "dlopen(%s, RTLD_NOLOAD): %s", ts_device_path(dev), dlerror());
    char sym[96];
    snprintf(sym, sizeof sym, "%s_%s", name, suffix);
    void *p = dlsym(h, sym);
    dlclose(h); /* the device keeps its own reference */
    live_fn f = NULL;
    if (p)
        memcpy(&f, &p, sizeof f);
    return f;
}

static void matmul_threads(const char *name)
{
    tap_start();
    ts_device *dev = load(name);
    mm_job j[MM_THREADS];
    pthread_t t[MM_THREADS];
    for (unsigned i = 0; i < MM_THREADS; i++) {
        j[i] = (mm_job){dev, i, 0, 0, ""};
        CHECK(pthread_create(&t[i], NULL, mm_run, &j[i]) == 0);
    }
    for (int i = 0; i < MM_THREADS; i++)
        CHECK(pthread_join(t[i], NULL) == 0);
    for (int i = 0; i < MM_THREADS; i++)
        CHECK_MSG(j[i].wrong == 0 && j[i].done == MM_ITERS,
                  "%s thread %d: %d of %d matmuls wrong; first: %s", name, i, j[i].wrong, j[i].done,
                  j[i].error);
    /* cpu_onednn: entries evicted while other threads ran them are freed once released (the
     * cache holds 256 one-primitive matmul entries), and executions return their streams
     * (16 are kept idle). */
    live_fn prims = diagnostic(dev, name, "primitive_live");
    live_fn streams = diagnostic(dev, name, "stream_live");
    if (strcmp(name, "cpu_onednn") == 0)
        CHECK_MSG(prims && streams, "the test build of cpu_onednn (tests/plugins/hooks) is not "
                  "what was loaded: %s", ts_device_path(dev));
    if (prims)
        CHECK_MSG(prims() <= 256,
                  "%s: %lld primitives alive after the threads ended (the cache "
                  "holds 256)",
                  name, prims());
    if (streams)
        CHECK_MSG(streams() >= 1 && streams() <= 16, "%s: %lld streams alive (at most 16 idle)",
                  name, streams());
    ts_device_unload(dev);
    tap_end();
}

#define PER_PLUGIN(fn)                                                                             \
    static void test_##fn##_cpu_blas(void)                                                         \
    {                                                                                              \
        fn("cpu_blas");                                                                            \
    }                                                                                              \
    static void test_##fn##_cpu_onednn(void)                                                       \
    {                                                                                              \
        fn("cpu_onednn");                                                                          \
    }                                                                                              \
    static void test_##fn##_cuda(void)                                                             \
    {                                                                                              \
        fn("cuda");                                                                                \
    }
PER_PLUGIN(matmul_threads)
PER_PLUGIN(two_models_one_device)
PER_PLUGIN(pool_hammer)

int main(int argc, char **argv)
{
    static const tap_test tests[] = {TAP_TEST(test_matmul_threads_cpu_blas),
                                     TAP_TEST(test_matmul_threads_cpu_onednn),
                                     TAP_TEST(test_matmul_threads_cuda),
                                     TAP_TEST(test_two_models_one_device_cpu_blas),
                                     TAP_TEST(test_two_models_one_device_cpu_onednn),
                                     TAP_TEST(test_two_models_one_device_cuda),
                                     TAP_TEST(test_pool_hammer_cpu_blas),
                                     TAP_TEST(test_pool_hammer_cpu_onednn),
                                     TAP_TEST(test_pool_hammer_cuda)};
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
