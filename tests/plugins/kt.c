/* tests/plugins/kt.c: see kt.h. */
#include "kt.h"

#include <math.h>
#include <time.h>

static ts_device *loaded[8];
static int nloaded;

static void unload_all(void)
{
    for (int i = 0; i < nloaded; i++)
        ts_device_unload(loaded[i]);
    nloaded = 0;
}

ts_device *kt_load(const char *name)
{
    char *path;
    if (ts_plugin_find(NULL, name, &path) != TS_OK)
        SKIP("plugin %s is not built", name);
    free(path);
    ts_device *dev;
    CHECK_OK(ts_device_load(NULL, name, &dev));
    if (nloaded == 0)
        atexit(unload_all);
    loaded[nloaded++] = dev;
    return dev;
}

const char *const *kt_plugins(void)
{
    static const char *names[3];
    static const char *const all[] = {"cpu_blas", "cpu_onednn"};
    int n = 0;
    for (int i = 0; i < 2; i++) {
        char *path;
        if (ts_plugin_find(NULL, all[i], &path) == TS_OK) {
            free(path);
            names[n++] = all[i];
        }
    }
    names[n] = NULL;
    return names;
}

int64_t kt_numel(const ts_operand *op)
{
    return oph_numel(op);
}

kt_buf kt_make(ts_device *dev, int32_t dtype, int ndim, const int64_t *shape, kt_layout layout,
               uint64_t seed)
{
    kt_buf b = {.dev = dev};
    CHECK(ts_dtype_size(dtype) > 0 && ndim >= 0 && ndim <= TS_MAX_DIMS);
    b.nbytes = oph_lay_out(&b.op, dtype, ndim, shape, (int)layout);
    CHECK_OK(ts_device_alloc(dev, b.nbytes, "kt", &b.base));
    memset(b.base, 0xA5, b.nbytes); /* garbage between strided elements */
    b.op.data = b.base;
    kt_fill_random(&b, seed);
    return b;
}

void kt_free(kt_buf *b)
{
    if (b->base)
        ts_device_free(b->dev, b->base);
    b->base = NULL;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void kt_fill_random(kt_buf *b, uint64_t seed)
{
    uint64_t s = seed * 7919 + 1;
    int64_t n = kt_numel(&b->op), idx[TS_MAX_DIMS];
    for (int64_t i = 0; i < n; i++) {
        kt_unravel(&b->op, i, idx);
        uint64_t r = splitmix(&s);
        double v;
        switch (b->op.dtype) {
        case TS_F32:
        case TS_F64: v = (double)(r >> 11) / 9007199254740992.0 * 4.0 - 2.0; break;
        case TS_U8: v = (double)(r & 1); break;
        default: v = (double)(int64_t)(r % 19) - 9.0; break;
        }
        kt_set(&b->op, idx, v);
    }
}

void kt_unravel(const ts_operand *op, int64_t linear, int64_t *idx)
{
    oph_unravel(op, linear, idx);
}

double kt_unary_ref(int32_t fn, double v)
{
    switch (fn) {
    case TS_UNARY_NEG: return -v;
    case TS_UNARY_ABS: return fabs(v);
    case TS_UNARY_EXP: return exp(v);
    case TS_UNARY_LOG: return log(v);
    case TS_UNARY_SQRT: return sqrt(v);
    case TS_UNARY_RSQRT: return 1 / sqrt(v);
    case TS_UNARY_TANH: return tanh(v);
    case TS_UNARY_SIGMOID: return 1 / (1 + exp(-v));
    case TS_UNARY_RELU: return v < 0 ? 0 : v;
    /* 0.5 v (1 + erf(v / sqrt 2)), with erfc so that the far negative tail keeps its relative
     * precision in the reference too */
    case TS_UNARY_GELU: return 0.5 * v * erfc(-v / sqrt(2.0));
    case TS_UNARY_ERF: return erf(v);
    case TS_UNARY_GELU_TANH:
        return 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    case TS_UNARY_GELU_TANH_DERIV: {
        double c = sqrt(2 / M_PI), k = 0.044715, t = tanh(c * (v + k * v * v * v));
        return 0.5 * (1 + t) + 0.5 * v * (1 - t * t) * c * (1 + 3 * k * v * v);
    }
    case TS_UNARY_SILU: return v / (1 + exp(-v));
    }
    return NAN;
}

double kt_get(const ts_operand *op, const int64_t *idx)
{
    CHECK_MSG(ts_dtype_size(op->dtype) > 0, "bad dtype %d", op->dtype);
    return oph_get(op, op->data, idx);
}

void kt_set(const ts_operand *op, const int64_t *idx, double v)
{
    CHECK_MSG(ts_dtype_size(op->dtype) > 0, "bad dtype %d", op->dtype);
    oph_set(op, op->data, idx, v);
}

ts_operand kt_broadcast(const ts_operand *op, int ndim, const int64_t *shape)
{
    ts_operand r = *op;
    int lead = ndim - op->ndim;
    CHECK(lead >= 0);
    r.ndim = ndim;
    for (int d = ndim - 1; d >= 0; d--) {
        int sd = d - lead;
        if (sd >= 0 && op->shape[sd] == shape[d]) {
            r.shape[d] = op->shape[sd];
            r.strides[d] = op->strides[sd];
        } else {
            CHECK(sd < 0 || op->shape[sd] == 1);
            r.shape[d] = shape[d];
            r.strides[d] = 0;
        }
    }
    return r;
}

ts_status kt_run(ts_device *dev, int32_t op, const ts_operand *in, int nin, const ts_operand *out,
                 int nout, const void *params, size_t params_size)
{
    ts_kernel_call call = {
        .struct_size = sizeof call,
        .op = op,
        .ninputs = nin,
        .noutputs = nout,
        .inputs = in,
        .outputs = out,
        .params = params,
        .params_size = (uint32_t)params_size,
    };
    return ts_device_run(dev, &call);
}

int kt_close(double a, double b, double rtol, double atol)
{
    return oph_close(a, b, rtol, atol);
}

double kt_rtol(int32_t dtype)
{
    return dtype == TS_F32 ? 1e-5 : dtype == TS_F64 ? 1e-12 : 0;
}

void kt_check_gaps(const kt_buf *b)
{
    int64_t at = oph_gap_written(&b->op, b->base, b->nbytes, 0xA5);
    CHECK_MSG(at < 0, "byte %lld of %zu outside the elements was written", (long long)at,
              b->nbytes);
}

void kt_check_no_live_blocks(ts_device *dev)
{
    ts_memory_stats st;
    CHECK_OK(ts_device_memory_stats(dev, &st));
    if (st.valid & TS_STATS_POOL)
        CHECK_INT_EQ(st.live_blocks, 0);
}

const char *kt_layout_name(int layout)
{
    return layout >= 0 && layout < KT_NLAYOUTS ? oph_layout_name(layout) : "unknown";
}

kt_buf kt_mirror(ts_device *dev, const kt_buf *b)
{
    kt_buf m = *b;
    m.dev = dev;
    CHECK_OK(ts_device_alloc(dev, b->nbytes, "kt", &m.base));
    CHECK_OK(ts_device_copy_from_host(dev, m.base, b->base, b->nbytes));
    m.op.data = m.base;
    return m;
}

void kt_fetch(kt_buf *h, const kt_buf *d)
{
    CHECK(h->nbytes == d->nbytes);
    CHECK_OK(ts_device_copy_to_host(d->dev, h->base, d->base, d->nbytes));
}

/* ---- graph capture against eager execution ---------------------------------------------- */

typedef struct gnet {
    ts_module *seq;
    ts_optim *opt;
    ts_tensor *x, *y; /* the fixed input batch and labels, rewritten before each step */
} gnet;

static void gnet_make(ts_device *dev, gnet *n)
{
    ts_rng rng;
    ts_rng_init(&rng, 7);
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, &rng};
    ts_conv2d_params c1 = {1, 1, 1, 1, 1, 1, 1};
    ts_pool2d_params pool = {2, 2, 2, 2, 0, 0, 0};
    ts_module *m;
    CHECK_OK(ts_nn_sequential(&n->seq));
    CHECK_OK(ts_nn_conv2d(dev, 1, 4, 3, 3, &c1, 1, &init, &m));
    CHECK_OK(ts_nn_sequential_add(n->seq, "conv", m));
    CHECK_OK(ts_nn_relu(&m));
    CHECK_OK(ts_nn_sequential_add(n->seq, "relu", m));
    CHECK_OK(ts_nn_max_pool2d(&pool, &m));
    CHECK_OK(ts_nn_sequential_add(n->seq, "pool", m));
    CHECK_OK(ts_nn_flatten(&m));
    CHECK_OK(ts_nn_sequential_add(n->seq, "flatten", m));
    CHECK_OK(ts_nn_linear(dev, 4 * 6 * 6, 10, 1, &init, &m));
    CHECK_OK(ts_nn_sequential_add(n->seq, "fc", m));
    ts_named_tensor params[8];
    size_t np = ts_module_parameters(n->seq, params, 8);
    ts_adam_options ao = {1e-2, 0.9, 0.999, 1e-8, 0};
    CHECK_OK(ts_optim_adam(params, np, &ao, &n->opt));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 4, (const int64_t[]){16, 1, 12, 12}, &n->x));
    CHECK_OK(ts_tensor_zeros(dev, TS_I64, 1, (const int64_t[]){16}, &n->y));
}

/* Batch k (two batches in turn), written into the fixed input tensors. */
static void gnet_batch(gnet *n, int k)
{
    k %= 2;
    float xs[16 * 144];
    int64_t ys[16];
    for (int i = 0; i < 16 * 144; i++)
        xs[i] = (float)((i * 37 + k * 101) % 97) / 97.0f;
    for (int i = 0; i < 16; i++)
        ys[i] = (i + k) % 10;
    ts_device *dev = ts_tensor_device(n->x);
    CHECK_OK(ts_device_copy_from_host(dev, ts_tensor_data(n->x), xs, sizeof xs));
    CHECK_OK(ts_device_copy_from_host(dev, ts_tensor_data(n->y), ys, sizeof ys));
}

static void gnet_forward_backward(gnet *n, ts_tensor **loss)
{
    ts_tensor *logits;
    CHECK_OK(ts_module_forward(n->seq, n->x, &logits));
    CHECK_OK(ts_cross_entropy(logits, n->y, TS_REDUCTION_MEAN, loss));
    ts_tensor_unref(logits);
    CHECK_OK(ts_backward(*loss, NULL, 0));
}

static void gnet_free(gnet *n)
{
    ts_tensor_unref(n->x);
    ts_tensor_unref(n->y);
    ts_optim_free(n->opt);
    ts_module_free(n->seq);
}

static double kt_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

void kt_check_graph_step(ts_device *dev, int steps)
{
    gnet a, b;
    gnet_make(dev, &a);
    gnet_make(dev, &b);
    float la[64], lb[64];
    CHECK(steps >= 4 && steps <= 64);
    /* Eager. */
    double t0 = kt_now();
    for (int k = 0; k < steps; k++) {
        ts_tensor *loss;
        gnet_batch(&a, k);
        ts_optim_zero_grad(a.opt);
        gnet_forward_backward(&a, &loss);
        CHECK_OK(ts_optim_step(a.opt));
        CHECK_OK(ts_tensor_to_host(loss, &la[k], sizeof la[k]));
        ts_tensor_unref(loss);
    }
    double t_eager = kt_now() - t0;
    /* Step 0 eager (warms the pool), step 1 recorded, then replayed. */
    ts_tensor *loss = NULL, *sentinel[4] = {NULL};
    static const int64_t sentinel_shape[4][4] = {
        {16, 4, 12, 12}, {16, 4, 6, 6}, {16, 1, 1, 144}, {16, 1, 1, 10}};
    ts_graph *g = NULL;
    t0 = kt_now();
    for (int k = 0; k < steps; k++) {
        gnet_batch(&b, k);
        if (k == 0) {
            ts_optim_zero_grad(b.opt);
            gnet_forward_backward(&b, &loss);
            CHECK_OK(ts_optim_step(b.opt));
            CHECK_OK(ts_tensor_to_host(loss, &lb[k], sizeof lb[k]));
            ts_tensor_unref(loss);
            continue;
        }
        if (k == 1) {
            ts_optim_zero_grad(b.opt); /* the recorded backward writes fresh gradients */
            ts_memory_stats before, after;
            CHECK_OK(ts_device_memory_stats(dev, &before));
            CHECK_OK(ts_graph_capture_begin(dev));
            CHECK_FAILS(ts_graph_capture_begin(dev), TS_ESTATE, "already recording");
            gnet_forward_backward(&b, &loss);
            CHECK_OK(ts_graph_capture_end(dev, &g));
            CHECK_OK(ts_device_memory_stats(dev, &after));
            CHECK(after.live_blocks > before.live_blocks);
            /* Tensors made now, of the activations' sizes, must not be given the blocks the
             * recording freed: every replay writes those. */
            for (int i = 0; i < 4; i++)
                CHECK_OK(ts_tensor_full(dev, TS_F32, 4, sentinel_shape[i], 7.0, &sentinel[i]));
        }
        CHECK_OK(ts_graph_replay(g));
        CHECK_OK(ts_optim_step(b.opt));
        CHECK_OK(ts_tensor_to_host(loss, &lb[k], sizeof lb[k]));
    }
    CHECK_OK(ts_device_synchronize(dev));
    double t_graph = kt_now() - t0;
    for (int i = 0; i < 4; i++) {
        size_t cnt = (size_t)ts_tensor_numel(sentinel[i]);
        float *h = malloc(cnt * sizeof *h);
        CHECK(h);
        CHECK_OK(ts_tensor_to_host(sentinel[i], h, cnt * sizeof *h));
        for (size_t j = 0; j < cnt; j++)
            CHECK_MSG(h[j] == 7.0f, "a tensor made after the recording was overwritten by a "
                      "replay (element %zu of tensor %d is %g): the recording's freed blocks "
                      "were handed out again", j, i, (double)h[j]);
        free(h);
        ts_tensor_unref(sentinel[i]);
    }
    for (int k = 0; k < steps; k++)
        CHECK_MSG(memcmp(&la[k], &lb[k], sizeof la[k]) == 0,
                  "step %d: loss %.9g eagerly, %.9g replayed", k, (double)la[k], (double)lb[k]);
    /* The last step saw the same batch as step last - 2 (a replay, as long as steps >= 4). */
    CHECK_MSG(lb[steps - 1] < lb[steps - 3], "the replayed steps did not train: loss %g -> %g "
              "on the same batch", (double)lb[steps - 3], (double)lb[steps - 1]);
    ts_named_tensor pa[8], pb[8];
    size_t np = ts_module_parameters(a.seq, pa, 8);
    CHECK(ts_module_parameters(b.seq, pb, 8) == np);
    for (size_t i = 0; i < np; i++) {
        size_t bytes = (size_t)ts_tensor_numel(pa[i].tensor) * sizeof(float);
        float *ha = malloc(bytes), *hb = malloc(bytes);
        CHECK(ha && hb);
        CHECK_OK(ts_tensor_to_host(pa[i].tensor, ha, bytes));
        CHECK_OK(ts_tensor_to_host(pb[i].tensor, hb, bytes));
        CHECK_MSG(memcmp(ha, hb, bytes) == 0, "parameter %s differs after %d steps",
                  pa[i].name, steps);
        free(ha);
        free(hb);
    }
    printf("# %d steps: %.3f ms per step eagerly, %.3f ms recorded and replayed; loss %.4f -> "
           "%.4f\n",
           steps, t_eager * 1e3 / steps, t_graph * 1e3 / steps, (double)lb[0],
           (double)lb[steps - 1]);
    ts_tensor_unref(loss);
    ts_graph_free(g);
    gnet_free(&a);
    gnet_free(&b);
}
