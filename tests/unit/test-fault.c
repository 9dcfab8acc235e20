/* tests/unit/test-fault.c: SQLite-style fault injection across one whole LeNet-5 training
 * step (forward, cross-entropy, backward, Adam step, checkpoint save) at batch 4. Each site
 * (pool allocations, libtessera's host allocations, plugin calls) is counted once, then every
 * one of its calls is made to fail in turn. Each failing step must return an error status with
 * a message, leave nothing alive that was not alive before, leave the last good checkpoint on
 * disk byte for byte (and no temporary file next to it), and leave the model able to take
 * the next, uninjected step. docs/reliability.md has the figures. */
#include <dirent.h>
#include <math.h>
#include <sys/stat.h>

#include <tessera/fault.h>

#include "../tap.h"

#define BATCH 4
#define MAXP 16

typedef struct model {
    ts_device *dev;
    ts_module *net;
    ts_named_tensor params[MAXP];
    size_t np;
    ts_optim *opt;
    ts_tensor *x, *y; /* (4, 1, 28, 28) f32, (4) i64 */
    char path[512];   /* the checkpoint */
} model;

#define ADD(call, name)                                                                     \
    do {                                                                                    \
        ts_module *m_;                                                                      \
        CHECK_OK(call);                                                                     \
        CHECK_OK(ts_nn_sequential_add(m->net, name, m_));                                   \
    } while (0)

/* LeNet-5 as `tessera train --model lenet5` builds it. */
static void model_init(model *m, ts_device *dev, const char *dir)
{
    memset(m, 0, sizeof *m);
    m->dev = dev;
    ts_rng rng;
    ts_rng_init(&rng, 7);
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, &rng};
    ts_pool2d_params p2 = {.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
    ts_conv2d_params c1 = {1, 1, 2, 2, 1, 1, 1}, c2 = {1, 1, 0, 0, 1, 1, 1};
    CHECK_OK(ts_nn_sequential(&m->net));
    ADD(ts_nn_conv2d(dev, 1, 6, 5, 5, &c1, 1, &init, &m_), "conv1");
    ADD(ts_nn_relu(&m_), "relu1");
    ADD(ts_nn_max_pool2d(&p2, &m_), "pool1");
    ADD(ts_nn_conv2d(dev, 6, 16, 5, 5, &c2, 1, &init, &m_), "conv2");
    ADD(ts_nn_relu(&m_), "relu2");
    ADD(ts_nn_max_pool2d(&p2, &m_), "pool2");
    ADD(ts_nn_flatten(&m_), "flatten");
    ADD(ts_nn_linear(dev, 400, 120, 1, &init, &m_), "fc1");
    ADD(ts_nn_relu(&m_), "relu3");
    ADD(ts_nn_linear(dev, 120, 84, 1, &init, &m_), "fc2");
    ADD(ts_nn_relu(&m_), "relu4");
    ADD(ts_nn_linear(dev, 84, 10, 1, &init, &m_), "fc3");
    m->np = ts_module_parameters(m->net, m->params, MAXP);
    CHECK(m->np == 10);
    ts_adam_options ao = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    CHECK_OK(ts_optim_adam(m->params, m->np, &ao, &m->opt));
    int64_t xs[] = {BATCH, 1, 28, 28}, ys[] = {BATCH};
    int64_t labels[BATCH] = {3, 1, 4, 1};
    CHECK_OK(ts_tensor_rand(dev, TS_F32, 4, xs, 0, 1, &rng, &m->x));
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, ys, labels, &m->y));
    snprintf(m->path, sizeof m->path, "%s/lenet5.safetensors", dir);
}

static void model_fini(model *m)
{
    ts_optim_free(m->opt);
    ts_module_free(m->net);
    ts_tensor_unref(m->x);
    ts_tensor_unref(m->y);
}

/* One training step, checkpoint included; the gradients are dropped whatever happened, as a
 * training loop does before its next step. *loss gets the loss when there is one. */
static ts_status step(model *m, float *loss)
{
    ts_tensor *logits = NULL, *l = NULL;
    ts_checkpoint *ck = NULL;
    ts_status s;
    if ((s = ts_module_forward(m->net, m->x, &logits)) ||
        (s = ts_cross_entropy(logits, m->y, TS_REDUCTION_MEAN, &l)) ||
        (s = ts_tensor_to_host(l, loss, sizeof *loss)) || (s = ts_backward(l, NULL, 0)) ||
        (s = ts_optim_step(m->opt)) || (s = ts_checkpoint_new(&ck)))
        goto out;
    for (size_t i = 0; i < m->np && !s; i++)
        s = ts_checkpoint_add(ck, m->params[i].name, m->params[i].tensor);
    if (s || (s = ts_optim_save_state(m->opt, ck)) ||
        (s = ts_checkpoint_set_meta(ck, "test", "fault")) ||
        (s = ts_checkpoint_save(ck, m->path)))
        goto out;
out:
    ts_checkpoint_free(ck);
    ts_tensor_unref(l);
    ts_tensor_unref(logits);
    ts_optim_zero_grad(m->opt);
    return s;
}

/* Exactly one file in dir: no temporary left behind by a failed save. */
static void only_checkpoint_in(const char *dir)
{
    DIR *d = opendir(dir);
    CHECK(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
            CHECK_MSG(++n == 1 && strcmp(e->d_name, "lenet5.safetensors") == 0,
                      "stray file %s in %s", e->d_name, dir);
    closedir(d);
}

/* The checkpoint on disk loads, and holds what the model held when it was written (cur
 * gives the parameters' values then, flattened). */
static void checkpoint_matches(const model *m, const float *want, size_t nwant)
{
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_load(m->path, m->dev, &ck));
    size_t k = 0;
    for (size_t i = 0; i < m->np; i++) {
        ts_tensor *t = ts_checkpoint_get(ck, m->params[i].name);
        CHECK_MSG(t, "checkpoint lacks %s", m->params[i].name);
        int64_t n = ts_tensor_numel(t);
        float *v = malloc((size_t)n * sizeof *v);
        CHECK_OK(ts_tensor_to_host(t, v, (size_t)n * sizeof *v));
        CHECK(k + (size_t)n <= nwant && memcmp(v, want + k, (size_t)n * sizeof *v) == 0);
        k += (size_t)n;
        free(v);
    }
    CHECK(k == nwant);
    ts_checkpoint_free(ck);
}

static float *params_now(const model *m, size_t *n)
{
    size_t total = 0;
    for (size_t i = 0; i < m->np; i++)
        total += (size_t)ts_tensor_numel(m->params[i].tensor);
    float *v = malloc(total * sizeof *v), *p = v;
    for (size_t i = 0; i < m->np; i++) {
        size_t k = (size_t)ts_tensor_numel(m->params[i].tensor);
        CHECK_OK(ts_tensor_to_host(m->params[i].tensor, p, k * sizeof *v));
        p += k;
    }
    *n = total;
    return v;
}

static const char *site_name(unsigned site)
{
    return site == TS_FAULT_POOL   ? "pool"
           : site == TS_FAULT_HOST ? "host"
           : site == TS_FAULT_IO   ? "I/O"
                                   : "kernel";
}

/* Every failure point of a step at site, one run each. */
static void walk(unsigned site)
{
    ts_device *dev = tap_start();
    const char *dir = tap_tmpdir();
    model m;
    model_init(&m, dev, dir);
    float loss;
    /* The first step creates Adam's state and writes the first good checkpoint. */
    CHECK_OK(step(&m, &loss));
    ts_fault_arm(site, 0);
    CHECK_OK(step(&m, &loss));
    uint64_t count = ts_fault_count();
    ts_fault_disarm();
    CHECK_MSG(count > 0, "a step makes no %s calls", site_name(site));
    tap_live live0 = {ts_tensor_live_count(), ts_storage_live_count(), ts_memory_live_count(),
                      ts_autograd_live_nodes()};
    for (uint64_t n = 1; n <= count; n++) {
        size_t good_len, want_n;
        unsigned char *good = tap_read_all(m.path, &good_len);
        float *want = params_now(&m, &want_n);
        /* what the file holds: the parameters as the last good step saved them */
        checkpoint_matches(&m, want, want_n);
        ts_clear_error();
        ts_fault_arm(site, n);
        ts_status s = step(&m, &loss);
        unsigned fired = ts_fault_fired();
        ts_fault_disarm();
        CHECK_MSG(fired == site, "%s call %llu of %llu was never made", site_name(site),
                  (unsigned long long)n, (unsigned long long)count);
        CHECK_MSG(s != TS_OK, "%s failure %llu of %llu: the step reported success",
                  site_name(site), (unsigned long long)n, (unsigned long long)count);
        CHECK_MSG(ts_last_error()[0], "%s failure %llu: %s without a message", site_name(site),
                  (unsigned long long)n, ts_status_name(s));
        tap_live l = {ts_tensor_live_count(), ts_storage_live_count(), ts_memory_live_count(),
                      ts_autograd_live_nodes()};
        CHECK_MSG(!memcmp(&l, &live0, sizeof l),
                  "%s failure %llu (%s: %s): %llu tensors, %llu storages, %llu blocks, %llu "
                  "nodes alive; %llu, %llu, %llu, %llu before",
                  site_name(site), (unsigned long long)n, ts_status_name(s), ts_last_error(),
                  (unsigned long long)l.tensors, (unsigned long long)l.storages,
                  (unsigned long long)l.blocks, (unsigned long long)l.nodes,
                  (unsigned long long)live0.tensors, (unsigned long long)live0.storages,
                  (unsigned long long)live0.blocks, (unsigned long long)live0.nodes);
        /* The good checkpoint is still there, whole; unless the save's last step failed,
         * the fsync of the directory after the rename, when the new one is there, whole. */
        size_t len;
        unsigned char *now = tap_read_all(m.path, &len);
        if (site == TS_FAULT_IO && strstr(ts_last_error(), "syncing the directory")) {
            CHECK_MSG(n == count, "the directory fsync is I/O call %llu of %llu",
                      (unsigned long long)n, (unsigned long long)count);
            size_t new_n;
            float *new_params = params_now(&m, &new_n);
            checkpoint_matches(&m, new_params, new_n);
            free(new_params);
        } else {
            CHECK_MSG(len == good_len && memcmp(now, good, len) == 0,
                      "%s failure %llu (%s) changed the checkpoint", site_name(site),
                      (unsigned long long)n, ts_last_error());
        }
        only_checkpoint_in(dir);
        free(now);
        free(good);
        free(want);
        /* The model goes on. */
        CHECK_OK(step(&m, &loss));
        CHECK(isfinite(loss));
    }
    printf("# %s: %llu failure points in one step, each survived\n", site_name(site),
           (unsigned long long)count);
    size_t want_n;
    float *want = params_now(&m, &want_n);
    checkpoint_matches(&m, want, want_n);
    free(want);
    model_fini(&m);
    tap_end();
}

static void test_pool_failures(void)
{
    walk(TS_FAULT_POOL);
}

static void test_host_failures(void)
{
    walk(TS_FAULT_HOST);
}

static void test_kernel_failures(void)
{
    walk(TS_FAULT_KERNEL);
}

/* Every write, fsync and rename of the step's checkpoint save. */
static void test_io_failures(void)
{
    walk(TS_FAULT_IO);
}

/* Building the model and its optimizer, then resuming from a checkpoint (load, restore of
 * every parameter and of Adam's state), at every failure point of every site. */
static ts_status build(ts_device *dev, const char *dir, model *m)
{
    /* model_init CHECKs every call; here each must fail cleanly, so build by hand. */
    ts_rng rng;
    ts_rng_init(&rng, 7);
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, &rng};
    ts_conv2d_params c1 = {1, 1, 2, 2, 1, 1, 1};
    ts_module *seq = NULL, *l;
    ts_status s;
    memset(m, 0, sizeof *m);
    if ((s = ts_nn_sequential(&seq)))
        return s;
    if ((s = ts_nn_conv2d(dev, 1, 6, 5, 5, &c1, 1, &init, &l)) ||
        (s = ts_nn_sequential_add(seq, "conv1", l)) || (s = ts_nn_flatten(&l)) ||
        (s = ts_nn_sequential_add(seq, "flatten", l)) ||
        (s = ts_nn_linear(dev, 6 * 28 * 28, 10, 1, &init, &l)) ||
        (s = ts_nn_sequential_add(seq, "fc", l)))
        goto fail;
    m->net = seq;
    m->np = ts_module_parameters(seq, m->params, MAXP);
    ts_adam_options ao = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8};
    if ((s = ts_optim_adam(m->params, m->np, &ao, &m->opt)))
        goto fail;
    snprintf(m->path, sizeof m->path, "%s/small.safetensors", dir);
    return TS_OK;
fail:
    ts_module_free(seq);
    memset(m, 0, sizeof *m);
    return s;
}

static ts_status resume(model *m)
{
    ts_checkpoint *ck;
    ts_status s = ts_checkpoint_load(m->path, m->dev, &ck);
    for (size_t i = 0; !s && i < m->np; i++)
        s = ts_checkpoint_restore(ck, m->params[i].name, m->params[i].tensor);
    if (!s)
        s = ts_optim_load_state(m->opt, ck);
    if (ck)
        ts_checkpoint_free(ck);
    return s;
}

static void test_build_and_resume_failures(void)
{
    ts_device *dev = tap_start();
    const char *dir = tap_tmpdir();
    /* A checkpoint of a trained small model to resume from. */
    model m;
    CHECK_OK(build(dev, dir, &m));
    m.dev = dev;
    int64_t xs[] = {BATCH, 1, 28, 28}, ys[] = {BATCH};
    int64_t labels[BATCH] = {3, 1, 4, 1};
    ts_rng rng;
    ts_rng_init(&rng, 9);
    CHECK_OK(ts_tensor_rand(dev, TS_F32, 4, xs, 0, 1, &rng, &m.x));
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, ys, labels, &m.y));
    float loss;
    CHECK_OK(step(&m, &loss));
    ts_tensor *x = m.x, *y = m.y;
    ts_optim_free(m.opt);
    ts_module_free(m.net);
    static const unsigned sites[] = {TS_FAULT_POOL, TS_FAULT_HOST, TS_FAULT_KERNEL};
    uint64_t points = 0;
    for (size_t k = 0; k < 3; k++) {
        tap_live live0 = {ts_tensor_live_count(), ts_storage_live_count(),
                          ts_memory_live_count(), ts_autograd_live_nodes()};
        ts_fault_arm(sites[k], 0);
        CHECK_OK(build(dev, dir, &m));
        m.dev = dev;
        CHECK_OK(resume(&m));
        uint64_t count = ts_fault_count();
        ts_fault_disarm();
        ts_optim_free(m.opt);
        ts_module_free(m.net);
        for (uint64_t n = 1; n <= count; n++) {
            ts_clear_error();
            ts_fault_arm(sites[k], n);
            ts_status s = build(dev, dir, &m);
            m.dev = dev;
            if (!s)
                s = resume(&m);
            unsigned fired = ts_fault_fired();
            ts_fault_disarm();
            CHECK_MSG(fired == sites[k], "%s call %llu was never made", site_name(sites[k]),
                      (unsigned long long)n);
            CHECK_MSG(s != TS_OK && ts_last_error()[0],
                      "%s failure %llu of building and resuming went unreported",
                      site_name(sites[k]), (unsigned long long)n);
            ts_optim_free(m.opt);
            ts_module_free(m.net);
            tap_live l = {ts_tensor_live_count(), ts_storage_live_count(),
                          ts_memory_live_count(), ts_autograd_live_nodes()};
            CHECK_MSG(!memcmp(&l, &live0, sizeof l),
                      "%s failure %llu (%s): %llu tensors, %llu storages, %llu blocks alive; "
                      "%llu, %llu, %llu before", site_name(sites[k]), (unsigned long long)n,
                      ts_last_error(), (unsigned long long)l.tensors,
                      (unsigned long long)l.storages, (unsigned long long)l.blocks,
                      (unsigned long long)live0.tensors, (unsigned long long)live0.storages,
                      (unsigned long long)live0.blocks);
        }
        printf("# build + resume, %s: %llu failure points, each survived\n",
               site_name(sites[k]), (unsigned long long)count);
        points += count;
    }
    CHECK(points > 0);
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    tap_end();
}

/* The hook itself: counting, one failure only, disarm, and the status each site gives. */
static void test_hook(void)
{
    ts_device *dev = tap_start();
    int64_t shape[] = {8};
    ts_tensor *a = NULL, *b = NULL;
    ts_fault_arm(TS_FAULT_POOL, 0);
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, shape, &a));
    CHECK(ts_fault_count() == 1 && ts_fault_fired() == 0);
    ts_tensor_unref(a);
    ts_fault_arm(TS_FAULT_POOL, 1);
    CHECK_FAILS(ts_tensor_zeros(dev, TS_F32, 1, shape, &a), TS_ENOMEM, "injected");
    CHECK(a == NULL && ts_fault_fired() == TS_FAULT_POOL);
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, shape, &a)); /* only the n-th fails */
    ts_fault_arm(TS_FAULT_KERNEL, 1);
    CHECK_FAILS(ts_add(a, a, &b), TS_EPLUGIN, "cpu_blas", "injected");
    ts_fault_arm(TS_FAULT_HOST, 1);
    CHECK_FAILS(ts_add(a, a, &b), TS_ENOMEM, "");
    CHECK(b == NULL);
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_checkpoint_add(ck, "a", a));
    const char *path = tap_write_file(tap_tmpdir(), "hook.st", "old");
    ts_fault_arm(TS_FAULT_IO, 1);
    CHECK_FAILS(ts_checkpoint_save(ck, path), TS_EIO, "hook.st", "injected");
    CHECK(ts_fault_fired() == TS_FAULT_IO);
    ts_checkpoint_free(ck);
    ts_fault_disarm();
    CHECK_OK(ts_add(a, a, &b));
    CHECK(ts_fault_count() == 1);
    ts_tensor_unref(a);
    ts_tensor_unref(b);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {TAP_TEST(test_hook), TAP_TEST(test_pool_failures),
                                     TAP_TEST(test_host_failures),
                                     TAP_TEST(test_kernel_failures),
                                     TAP_TEST(test_io_failures),
                                     TAP_TEST(test_build_and_resume_failures)};
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
