/* tests/unit/test-nn.c: layers (forward values, parameters and their names, train/eval
 * behaviour), optimizers against a float64 reference written here (fused and composed
 * paths), gradient clipping, learning-rate schedules, and optimizer state through a
 * checkpoint. */
#include <math.h>
#include <unistd.h>

#include "../tap.h"

static ts_device *dev;
static ts_rng rng;

static void setup(void)
{
    dev = tap_start();
    ts_rng_init(&rng, 3);
}

static void host(const ts_tensor *t, float *out)
{
    ts_tensor *c;
    CHECK_OK(ts_cast(t, TS_F32, &c));
    CHECK_OK(ts_tensor_to_host(c, out, sizeof(float) * (size_t)ts_tensor_numel(c)));
    ts_tensor_unref(c);
}

static void test_linear_and_names(void)
{
    setup();
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, &rng};
    ts_module *seq, *fc;
    CHECK_OK(ts_nn_sequential(&seq));
    CHECK_OK(ts_nn_linear(dev, 5, 3, 1, &init, &fc));
    CHECK_OK(ts_nn_sequential_add(seq, "fc1", fc));
    ts_module *r;
    CHECK_OK(ts_nn_relu(&r));
    CHECK_OK(ts_nn_sequential_add(seq, "act", r));
    CHECK_OK(ts_nn_relu(&r));
    CHECK_FAILS(ts_nn_sequential_add(seq, "act", r), TS_EINVAL, "'act' is taken");
    CHECK_OK(ts_nn_relu(&r));
    CHECK_FAILS(ts_nn_sequential_add(seq, "bad name", r), TS_EINVAL, "not a name");
    ts_named_tensor p[4];
    CHECK_INT_EQ(ts_module_parameters(seq, p, 4), 2);
    CHECK(strcmp(p[0].name, "fc1.weight") == 0 && strcmp(p[1].name, "fc1.bias") == 0);
    CHECK_INT_EQ(ts_module_num_params(seq), 18);
    /* Kaiming-uniform bound 1/sqrt(fan_in). */
    float w[15], b[3], x[10], y[6];
    host(p[0].tensor, w);
    host(p[1].tensor, b);
    for (int i = 0; i < 15; i++)
        CHECK(fabsf(w[i]) <= 1 / sqrtf(5.0f));
    ts_tensor *xt, *yt;
    CHECK_OK(ts_tensor_rand(dev, TS_F32, 2, (const int64_t[]){2, 5}, -1, 1, &rng, &xt));
    host(xt, x);
    CHECK_OK(ts_module_forward(seq, xt, &yt));
    host(yt, y);
    for (int n = 0; n < 2; n++)
        for (int o = 0; o < 3; o++) {
            float want = b[o];
            for (int i = 0; i < 5; i++)
                want += x[n * 5 + i] * w[o * 5 + i];
            want = want > 0 ? want : 0;
            CHECK_MSG(fabsf(y[n * 3 + o] - want) < 1e-5f, "y[%d][%d] %g vs %g", n, o, y[n * 3 + o],
                      want);
        }
    CHECK(strcmp(ts_tensor_grad_fn_name(yt), "relu") == 0);
    ts_tensor *bad;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 2, (const int64_t[]){2, 4}, &bad));
    ts_tensor *o2 = (ts_tensor *)1;
    CHECK_FAILS(ts_module_forward(seq, bad, &o2), TS_ESHAPE, "fc1 (linear)", "5 features");
    ts_tensor_unref(bad), ts_tensor_unref(xt), ts_tensor_unref(yt);
    ts_module_free(seq);
    tap_end();
}

static void test_conv_pool_flatten_shapes(void)
{
    setup();
    ts_weight_init init = {TS_INIT_XAVIER_UNIFORM, 0, &rng};
    ts_conv2d_params cp = {1, 1, 2, 2, 1, 1, 1};
    ts_pool2d_params pp = {.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
    ts_module *seq, *m;
    CHECK_OK(ts_nn_sequential(&seq));
    CHECK_OK(ts_nn_conv2d(dev, 1, 6, 5, 5, &cp, 1, &init, &m));
    CHECK_OK(ts_nn_sequential_add(seq, "conv1", m));
    CHECK_OK(ts_nn_max_pool2d(&pp, &m));
    CHECK_OK(ts_nn_sequential_add(seq, "pool", m));
    CHECK_OK(ts_nn_avg_pool2d(&pp, &m));
    CHECK_OK(ts_nn_sequential_add(seq, "avg", m));
    CHECK_OK(ts_nn_flatten(&m));
    CHECK_OK(ts_nn_sequential_add(seq, "flat", m));
    ts_tensor *x, *y;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 4, (const int64_t[]){3, 1, 28, 28}, &x));
    CHECK_OK(ts_module_forward(seq, x, &y));
    CHECK(ts_tensor_ndim(y) == 2 && ts_tensor_shape(y)[0] == 3 && ts_tensor_shape(y)[1] == 6 * 7 * 7);
    ts_named_tensor p[2];
    CHECK_INT_EQ(ts_module_parameters(seq, p, 2), 2);
    CHECK(strcmp(p[0].name, "conv1.weight") == 0 && ts_tensor_ndim(p[0].tensor) == 4);
    float bias[6];
    host(p[1].tensor, bias); /* xavier: zero biases */
    for (int i = 0; i < 6; i++)
        CHECK(bias[i] == 0);
    ts_tensor_unref(x), ts_tensor_unref(y);
    ts_module_free(seq);
    tap_end();
}

static void test_norms_dropout_embedding(void)
{
    setup();
    ts_module *bn, *ln, *dr, *emb;
    CHECK_OK(ts_nn_batchnorm2d(dev, 3, 1e-5, 0.1, &bn));
    ts_tensor *x, *y;
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 4, (const int64_t[]){8, 3, 4, 4}, 5, 2, &rng, &x));
    CHECK_OK(ts_module_forward(bn, x, &y));
    /* Per channel: mean 0, variance 1 (biased, over N, H, W). */
    static float v[8 * 3 * 16], xv[8 * 3 * 16];
    host(y, v);
    host(x, xv);
    for (int c = 0; c < 3; c++) {
        double m = 0, q = 0, xm = 0;
        for (int n = 0; n < 8; n++)
            for (int i = 0; i < 16; i++) {
                m += v[(n * 3 + c) * 16 + i];
                q += v[(n * 3 + c) * 16 + i] * v[(n * 3 + c) * 16 + i];
                xm += xv[(n * 3 + c) * 16 + i];
            }
        m /= 128, q /= 128, xm /= 128;
        CHECK_MSG(fabs(m) < 1e-4 && fabs(q - 1) < 1e-3, "channel %d: mean %g, var %g", c, m, q);
        ts_named_tensor buf[2];
        CHECK_INT_EQ(ts_module_buffers(bn, buf, 2), 2);
        CHECK(strcmp(buf[0].name, "running_mean") == 0);
        float rm[3];
        host(buf[0].tensor, rm);
        CHECK_MSG(fabs(rm[c] - 0.1 * xm) < 1e-4, "running mean %g, want %g", rm[c], 0.1 * xm);
    }
    ts_tensor_unref(y);
    /* Eval mode uses the running statistics: a different output. */
    ts_module_train(bn, 0);
    CHECK_OK(ts_module_forward(bn, x, &y));
    host(y, v);
    CHECK(fabs(v[0] - (xv[0] - 0.1 * 5) / sqrt(0.9 + 0.1 * 4)) < 0.6);
    ts_tensor_unref(y);
    ts_tensor_unref(x);

    CHECK_OK(ts_nn_layernorm(dev, 1, (const int64_t[]){6}, 1e-5, &ln));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){4, 6}, 3, 2, &rng, &x));
    CHECK_OK(ts_module_forward(ln, x, &y));
    float lv[24];
    host(y, lv);
    for (int r = 0; r < 4; r++) {
        double m = 0;
        for (int i = 0; i < 6; i++)
            m += lv[r * 6 + i];
        CHECK(fabs(m / 6) < 1e-5);
    }
    ts_tensor_unref(y), ts_tensor_unref(x);

    CHECK_OK(ts_nn_dropout(0.5, &rng, &dr));
    CHECK_OK(ts_tensor_ones(dev, TS_F32, 1, (const int64_t[]){4000}, &x));
    CHECK_OK(ts_module_forward(dr, x, &y));
    static float dv[4000];
    host(y, dv);
    int zeros = 0;
    for (int i = 0; i < 4000; i++) {
        CHECK(dv[i] == 0 || dv[i] == 2);
        zeros += dv[i] == 0;
    }
    CHECK_MSG(zeros > 1800 && zeros < 2200, "%d of 4000 dropped", zeros);
    ts_tensor_unref(y);
    ts_module_train(dr, 0);
    CHECK_OK(ts_module_forward(dr, x, &y));
    CHECK(y == x); /* the identity in eval mode */
    ts_tensor_unref(y), ts_tensor_unref(x);

    ts_weight_init init = {TS_INIT_NORMAL, 1, &rng};
    CHECK_OK(ts_nn_embedding(dev, 10, 4, &init, &emb));
    int64_t ids[6] = {1, 2, 3, 4, 5, 9};
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){2, 3}, ids, &x));
    CHECK_OK(ts_module_forward(emb, x, &y));
    CHECK(ts_tensor_ndim(y) == 3 && ts_tensor_shape(y)[2] == 4);
    ts_tensor_unref(y), ts_tensor_unref(x);
    ts_module_free(bn), ts_module_free(ln), ts_module_free(dr), ts_module_free(emb);
    tap_end();
}

/* ---- optimizers against a float64 reference ------------------------------------------------ */

#define NP 7

typedef struct ref_state {
    double p[NP], m[NP], v[NP];
    int64_t t;
} ref_state;

static void ref_sgd(ref_state *r, const double *g, const ts_sgd_options *o)
{
    for (int i = 0; i < NP; i++) {
        double d = g[i] + o->weight_decay * r->p[i];
        if (o->momentum != 0) {
            r->m[i] = r->t == 0 ? d : o->momentum * r->m[i] + (1 - o->dampening) * d;
            d = o->nesterov ? d + o->momentum * r->m[i] : r->m[i];
        }
        r->p[i] -= o->lr * d;
    }
    r->t++;
}

static void ref_adam(ref_state *r, const double *g, const ts_adam_options *o, int decoupled)
{
    r->t++;
    for (int i = 0; i < NP; i++) {
        double gi = g[i];
        if (decoupled)
            r->p[i] *= 1 - o->lr * o->weight_decay;
        else
            gi += o->weight_decay * r->p[i];
        r->m[i] = o->beta1 * r->m[i] + (1 - o->beta1) * gi;
        r->v[i] = o->beta2 * r->v[i] + (1 - o->beta2) * gi * gi;
        double mh = r->m[i] / (1 - pow(o->beta1, (double)r->t));
        double vh = r->v[i] / (1 - pow(o->beta2, (double)r->t));
        r->p[i] -= o->lr * mh / (sqrt(vh) + o->eps);
    }
}

/* Runs 4 steps of kind (0 sgd, 1 adam, 2 adamw) with fixed gradients through tessera and the
 * reference; float64 parameters, so they must agree to 1e-12. */
static void check_optimizer(int kind, const void *opts, int fused)
{
    double init[NP] = {0.5, -1.25, 2.0, 0.0, 3.5, -0.75, 1.0};
    ref_state r;
    memset(&r, 0, sizeof r);
    memcpy(r.p, init, sizeof init);
    ts_tensor *p;
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){NP}, init, &p));
    CHECK_OK(ts_tensor_set_requires_grad(p, 1));
    ts_named_tensor np = {"w", p};
    ts_optim *o;
    if (kind == 0)
        CHECK_OK(ts_optim_sgd(&np, 1, opts, &o));
    else if (kind == 1)
        CHECK_OK(ts_optim_adam(&np, 1, opts, &o));
    else
        CHECK_OK(ts_optim_adamw(&np, 1, opts, &o));
    ts_optim_use_fused(o, fused);
    for (int step = 0; step < 4; step++) {
        double g[NP];
        for (int i = 0; i < NP; i++)
            g[i] = sin(1.0 + i + 3.0 * step);
        ts_tensor *gt;
        CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){NP}, g, &gt));
        CHECK_OK(ts_tensor_set_grad(p, gt));
        ts_tensor_unref(gt);
        CHECK_OK(ts_optim_step(o));
        if (kind == 0)
            ref_sgd(&r, g, opts);
        else
            ref_adam(&r, g, opts, kind == 2);
    }
    double got[NP];
    CHECK_OK(ts_tensor_to_host(p, got, sizeof got));
    for (int i = 0; i < NP; i++)
        CHECK_MSG(fabs(got[i] - r.p[i]) <= 1e-12 * (1 + fabs(r.p[i])),
                  "%s (%s) p[%d]: %.17g, reference %.17g", ts_optim_name(o),
                  fused ? "fused" : "composed", i, got[i], r.p[i]);
    CHECK_INT_EQ(ts_optim_steps(o), 4);
    ts_optim_free(o);
    ts_tensor_unref(p);
}

static void test_optimizers_match_reference(void)
{
    setup();
    ts_sgd_options sgd[] = {
        {0.1, 0, 0, 0, 0},       {0.1, 0.9, 0, 0, 0},   {0.05, 0.9, 0.1, 0.01, 0},
        {0.05, 0.9, 0, 0.01, 1},
    };
    ts_adam_options adam = {0.01, 0.9, 0.999, 1e-8, 0.05};
    for (int fused = 0; fused < 2; fused++) {
        for (size_t k = 0; k < sizeof sgd / sizeof *sgd; k++)
            check_optimizer(0, &sgd[k], fused);
        check_optimizer(1, &adam, fused);
        check_optimizer(2, &adam, fused);
    }
    ts_sgd_options bad = {0.1, 0, 0.5, 0, 1};
    ts_optim *o = (ts_optim *)1;
    CHECK_FAILS(ts_optim_sgd(NULL, 0, &bad, &o), TS_EINVAL, "Nesterov");
    /* Hyper-parameters that train to NaN or silently do nothing are refused, each named. */
    const double inf = 1.0 / 0.0, nan = 0.0 / 0.0;
    const ts_sgd_options bad_sgd[] = {
        {inf, 0, 0, 0, 0}, {nan, 0, 0, 0, 0},  {-0.1, 0, 0, 0, 0}, {0.1, inf, 0, 0, 0},
        {0.1, -1, 0, 0, 0}, {0.1, 0.9, inf, 0, 0}, {0.1, 0.9, -0.5, 0, 0}, {0.1, 0.9, 1.5, 0, 0},
        {0.1, 0, 0, inf, 0}, {0.1, 0, 0, nan, 0}, {0.1, 0, 0, -1, 0},
    };
    for (size_t k = 0; k < sizeof bad_sgd / sizeof *bad_sgd; k++) {
        o = (ts_optim *)1;
        CHECK_FAILS(ts_optim_sgd(NULL, 0, &bad_sgd[k], &o), TS_EINVAL, "sgd", "finite");
        CHECK(o == NULL);
    }
    const ts_adam_options bad_adam[] = {
        {inf, 0.9, 0.999, 1e-8, 0}, {nan, 0.9, 0.999, 1e-8, 0}, {0.1, 1, 0.999, 1e-8, 0},
        {0.1, 0.9, nan, 1e-8, 0},   {0.1, 0.9, 0.999, inf, 0},  {0.1, 0.9, 0.999, 0, 0},
        {0.1, 0.9, 0.999, 1e-8, inf}, {0.1, 0.9, 0.999, 1e-8, -1},
    };
    for (size_t k = 0; k < sizeof bad_adam / sizeof *bad_adam; k++) {
        o = (ts_optim *)1;
        CHECK_FAILS(ts_optim_adam(NULL, 0, &bad_adam[k], &o), TS_EINVAL, "adam", "finite");
        CHECK(o == NULL);
        CHECK_FAILS(ts_optim_adamw(NULL, 0, &bad_adam[k], &o), TS_EINVAL, "adamw", "finite");
    }
    ts_tensor *c;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, (const int64_t[]){2}, &c));
    ts_named_tensor np = {"c", c};
    CHECK_FAILS(ts_optim_adam(&np, 1, &(ts_adam_options){0.1, 0.9, 0.999, 1e-8, 0}, &o),
                TS_EINVAL, "'c' does not require grad");
    ts_tensor_unref(c);
    tap_end();
}

static void test_clip_and_schedules(void)
{
    setup();
    ts_tensor *a, *g;
    CHECK_OK(ts_tensor_zeros(dev, TS_F64, 1, (const int64_t[]){2}, &a));
    CHECK_OK(ts_tensor_set_requires_grad(a, 1));
    double gv[2] = {3, 4};
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){2}, gv, &g));
    CHECK_OK(ts_tensor_set_grad(a, g));
    ts_tensor_unref(g);
    ts_named_tensor np = {"a", a};
    double norm;
    CHECK_OK(ts_clip_grad_norm(&np, 1, 1.0, &norm));
    CHECK(fabs(norm - 5) < 1e-12);
    CHECK_OK(ts_tensor_to_host(ts_tensor_grad(a), gv, sizeof gv));
    CHECK(fabs(sqrt(gv[0] * gv[0] + gv[1] * gv[1]) - 1) < 1e-6);
    /* A non-finite norm scales nothing and says why. */
    double bad[2] = {1, 1.0 / 0.0};
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){2}, bad, &g));
    CHECK_OK(ts_tensor_set_grad(a, g));
    ts_tensor_unref(g);
    CHECK_FAILS(ts_clip_grad_norm(&np, 1, 1.0, &norm), TS_EINVAL, "NaN or infinity");
    CHECK(isinf(norm));
    CHECK_OK(ts_tensor_to_host(ts_tensor_grad(a), gv, sizeof gv));
    CHECK(gv[0] == 1 && isinf(gv[1]));
    ts_tensor_unref(a);

    ts_lr_schedule st = {TS_LR_STEP, 0.1, 0, 10, 0.5, 0, 0};
    CHECK(ts_lr_at(&st, 0) == 0.1 && ts_lr_at(&st, 9) == 0.1 && ts_lr_at(&st, 10) == 0.05);
    ts_lr_schedule cos_ = {TS_LR_COSINE, 1.0, 10, 0, 0, 110, 0.0};
    CHECK(fabs(ts_lr_at(&cos_, 0) - 0.1) < 1e-12);   /* warm-up: 1/10 */
    CHECK(fabs(ts_lr_at(&cos_, 9) - 1.0) < 1e-12);   /* end of warm-up */
    CHECK(fabs(ts_lr_at(&cos_, 60) - 0.5) < 1e-12);  /* half way down */
    CHECK(fabs(ts_lr_at(&cos_, 200)) < 1e-12);       /* past the end: min_lr */
    tap_end();
}

/* The optimizer follows its schedule: the lr of step k is ts_lr_at(k), for the fused and the
 * composed update alike; bad schedules and learning rates are refused, each named. */
static void test_optimizer_follows_schedule(void)
{
    setup();
    for (int fused = 0; fused < 2; fused++) {
        double init = 1.0;
        ts_tensor *p;
        CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){1}, &init, &p));
        CHECK_OK(ts_tensor_set_requires_grad(p, 1));
        ts_named_tensor np = {"w", p};
        ts_optim *o;
        CHECK_OK(ts_optim_sgd(&np, 1, &(ts_sgd_options){0.5, 0, 0, 0, 0}, &o));
        ts_optim_use_fused(o, fused);
        ts_lr_schedule cs = {TS_LR_COSINE, 0.1, 3, 0, 0, 10, 0.01};
        CHECK_OK(ts_optim_set_schedule(o, &cs));
        CHECK(fabs(ts_optim_lr(o) - ts_lr_at(&cs, 0)) < 1e-15); /* at once */
        double want = init;
        for (int k = 0; k < 12; k++) {
            ts_tensor *g;
            double one = 1.0;
            CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){1}, &one, &g));
            CHECK_OK(ts_tensor_set_grad(p, g));
            ts_tensor_unref(g);
            CHECK_OK(ts_optim_step(o));
            CHECK_MSG(fabs(ts_optim_lr(o) - ts_lr_at(&cs, k)) < 1e-15,
                      "step %d used lr %.17g, the schedule says %.17g", k, ts_optim_lr(o),
                      ts_lr_at(&cs, k));
            want -= ts_lr_at(&cs, k); /* SGD with a gradient of 1: p -= lr */
        }
        double got;
        CHECK_OK(ts_tensor_to_host(p, &got, sizeof got));
        CHECK_MSG(fabs(got - want) < 1e-12, "%s: p %.17g, want %.17g",
                  fused ? "fused" : "composed", got, want);
        ts_lr_schedule back;
        CHECK(ts_optim_get_schedule(o, &back) && back.kind == TS_LR_COSINE);
        CHECK_OK(ts_optim_set_schedule(o, NULL));
        CHECK(!ts_optim_get_schedule(o, NULL));
        const ts_lr_schedule bad[] = {
            {7, 0.1, 0, 0, 0, 0, 0},                  {TS_LR_CONSTANT, -0.1, 0, 0, 0, 0, 0},
            {TS_LR_CONSTANT, 1.0 / 0.0, 0, 0, 0, 0, 0}, {TS_LR_CONSTANT, 0.1, -1, 0, 0, 0, 0},
            {TS_LR_STEP, 0.1, 0, 0, 0.5, 0, 0},       {TS_LR_STEP, 0.1, 0, 5, 0, 0, 0},
            {TS_LR_COSINE, 0.1, 10, 0, 0, 5, 0},      {TS_LR_COSINE, 0.1, 0, 0, 0, 5, 0.2},
        };
        for (size_t k = 0; k < sizeof bad / sizeof *bad; k++)
            CHECK_FAILS(ts_optim_set_schedule(o, &bad[k]), TS_EINVAL, "set_schedule");
        CHECK_FAILS(ts_optim_set_lr(o, 0.0 / 0.0), TS_EINVAL, "set_lr", "finite");
        CHECK_FAILS(ts_optim_set_lr(o, -1), TS_EINVAL, "set_lr");
        CHECK_OK(ts_optim_set_lr(o, 0.25));
        CHECK(ts_optim_lr(o) == 0.25);
        ts_optim_free(o);
        ts_tensor_unref(p);
    }
    tap_end();
}

/* Parameter groups: AdamW decays only the parameters whose group has a weight decay. With a
 * zero gradient the moments stay 0, so the update is exactly p *= 1 - lr * wd. */
static void test_parameter_groups(void)
{
    setup();
    for (int fused = 0; fused < 2; fused++) {
        double wv[6] = {1, 2, 3, 4, 5, 6}, bv[3] = {1, 2, 3}, ev[4] = {1, 1, 1, 1}, zero[6] = {0};
        ts_tensor *w, *b, *e;
        CHECK_OK(ts_tensor_from_host(dev, TS_F64, 2, (const int64_t[]){2, 3}, wv, &w));
        CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){3}, bv, &b));
        CHECK_OK(ts_tensor_from_host(dev, TS_F64, 2, (const int64_t[]){2, 2}, ev, &e));
        ts_named_tensor np[3] = {{"w", w}, {"b", b}, {"wte", e}};
        for (int i = 0; i < 3; i++)
            CHECK_OK(ts_tensor_set_requires_grad(np[i].tensor, 1));
        ts_optim *o;
        CHECK_OK(ts_optim_adamw(np, 3, &(ts_adam_options){0.1, 0.9, 0.999, 1e-8, 0.5}, &o));
        ts_optim_use_fused(o, fused);
        CHECK_INT_EQ(ts_optim_decay_matrices_only(o), 1); /* b */
        CHECK_OK(ts_optim_set_param_weight_decay(o, "wte", 0)); /* embeddings: by name */
        CHECK(ts_optim_param_weight_decay(o, "w") == 0.5 && ts_optim_param_weight_decay(o, "b") == 0);
        CHECK(isnan(ts_optim_param_weight_decay(o, "nope")));
        CHECK_FAILS(ts_optim_set_param_weight_decay(o, "nope", 0), TS_EINVAL, "'nope'");
        CHECK_FAILS(ts_optim_set_param_weight_decay(o, "w", -1), TS_EINVAL, "finite");
        for (int i = 0; i < 3; i++) {
            ts_tensor *g;
            CHECK_OK(ts_tensor_from_host(dev, TS_F64, ts_tensor_ndim(np[i].tensor),
                                         ts_tensor_shape(np[i].tensor), zero, &g));
            CHECK_OK(ts_tensor_set_grad(np[i].tensor, g));
            ts_tensor_unref(g);
        }
        CHECK_OK(ts_optim_step(o));
        double gw[6], gb[3], ge[4];
        CHECK_OK(ts_tensor_to_host(w, gw, sizeof gw));
        CHECK_OK(ts_tensor_to_host(b, gb, sizeof gb));
        CHECK_OK(ts_tensor_to_host(e, ge, sizeof ge));
        for (int i = 0; i < 6; i++)
            CHECK_MSG(fabs(gw[i] - wv[i] * (1 - 0.1 * 0.5)) < 1e-12, "w[%d] %.17g", i, gw[i]);
        for (int i = 0; i < 3; i++)
            CHECK_MSG(gb[i] == bv[i], "b[%d] decayed: %.17g", i, gb[i]);
        for (int i = 0; i < 4; i++)
            CHECK_MSG(ge[i] == 1, "wte[%d] decayed: %.17g", i, ge[i]);
        ts_optim_free(o);
        ts_tensor_unref(w), ts_tensor_unref(b), ts_tensor_unref(e);
    }
    tap_end();
}

/* ---- modules of your own --------------------------------------------------------------- */

static int freed_users;
static void free_user(void *u)
{
    freed_users++;
    free(u);
}

/* y = x + fc2(relu(fc1(x))) * scale: a residual block with children and a parameter of its
 * own. */
static ts_status block_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    ts_tensor *h = NULL, *r = NULL, *o = NULL, *sc = NULL;
    ts_status s;
    if ((s = ts_module_forward(ts_module_child(m, "fc1"), x, &h)) || (s = ts_relu(h, &r)) ||
        (s = ts_module_forward(ts_module_child(m, "fc2"), r, &o)) ||
        (s = ts_mul(o, ts_module_param(m, "scale"), &sc)))
        goto out;
    s = ts_add(x, sc, y);
out:
    ts_tensor_unref(h), ts_tensor_unref(r), ts_tensor_unref(o), ts_tensor_unref(sc);
    return s;
}

/* logits = x @ W^T with W the embedding's weight, shared (weight tying). */
static ts_status head_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    ts_tensor *wt = NULL;
    ts_status s = ts_tensor_transpose(ts_module_param(m, "weight"), 0, 1, &wt);
    if (!s)
        s = ts_matmul(x, wt, y);
    ts_tensor_unref(wt);
    return s;
}

static ts_status failing_forward(ts_module *m, ts_tensor *x, ts_tensor **y)
{
    (void)x, (void)y;
    return ts_module_forward(ts_module_child(m, "missing"), x, y);
}

static void test_custom_modules(void)
{
    setup();
    ts_rng r5;
    ts_rng_init(&r5, 5);
    ts_weight_init init = {TS_INIT_NORMAL, 0.3, &r5};
    freed_users = 0;
    ts_module_def bdef = {"residual_block", block_forward, free_user};
    ts_module *blk, *fc1, *fc2, *seq, *head, *emb;
    CHECK_OK(ts_module_custom(&bdef, malloc(16), &blk));
    CHECK(strcmp(ts_module_kind(blk), "residual_block") == 0);
    CHECK_OK(ts_nn_linear(dev, 4, 8, 1, &init, &fc1));
    CHECK_OK(ts_nn_linear(dev, 8, 4, 0, &init, &fc2));
    CHECK_OK(ts_module_add_child(blk, "fc1", fc1));
    CHECK_OK(ts_module_add_child(blk, "fc2", fc2));
    ts_tensor *scale;
    CHECK_OK(ts_tensor_full(dev, TS_F32, 1, (const int64_t[]){4}, 0.5, &scale));
    CHECK_OK(ts_module_add_param(blk, "scale", scale));
    ts_tensor *count;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 1, (const int64_t[]){1}, &count));
    CHECK_OK(ts_module_add_buffer(blk, "count", count));
    /* Names: taken, malformed, and on a module that is not a custom one. */
    CHECK_FAILS(ts_module_add_param(blk, "fc1", scale), TS_EINVAL, "'fc1' is taken");
    CHECK_FAILS(ts_module_add_param(blk, "a.b", scale), TS_EINVAL, "'a.b' is not a name");
    CHECK_FAILS(ts_module_add_param(fc1, "x", scale), TS_EINVAL, "only modules made with");
    ts_module *extra;
    CHECK_OK(ts_nn_relu(&extra));
    CHECK_FAILS(ts_module_add_child(fc1, "r", extra), TS_EINVAL, "ts_module_custom or");
    CHECK_FAILS(ts_module_custom(&(ts_module_def){"x", NULL, NULL}, NULL, &extra), TS_EINVAL,
                "forward");
    /* Inside a sequential container, followed by a tied output head. */
    CHECK_OK(ts_nn_sequential(&seq));
    CHECK_OK(ts_nn_sequential_add(seq, "block", blk));
    CHECK_OK(ts_nn_embedding(dev, 6, 4, &init, &emb)); /* (6, 4): the tied table */
    ts_module_def hdef = {"tied_head", head_forward, NULL};
    CHECK_OK(ts_module_custom(&hdef, NULL, &head));
    ts_named_tensor ep[1];
    CHECK_INT_EQ(ts_module_parameters(emb, ep, 1), 1);
    CHECK_OK(ts_module_add_shared_param(head, "weight", ep[0].tensor));
    CHECK_OK(ts_nn_sequential_add(seq, "head", head));
    ts_module *owner;
    CHECK_OK(ts_module_custom(&(ts_module_def){"net", block_forward, NULL}, NULL, &owner));
    CHECK_OK(ts_module_add_child(owner, "wte", emb));
    CHECK_OK(ts_module_add_child(owner, "body", seq));
    /* Parameters: own ones first, then children, dotted; the shared weight once, as wte's. */
    ts_named_tensor pn[16];
    size_t np = ts_module_parameters(owner, pn, 16);
    const char *want[] = {"wte.weight", "body.block.scale", "body.block.fc1.weight",
                          "body.block.fc1.bias", "body.block.fc2.weight"};
    CHECK_INT_EQ(np, 5);
    for (size_t i = 0; i < np; i++)
        CHECK_MSG(strcmp(pn[i].name, want[i]) == 0, "parameter %zu is '%s', want '%s'", i,
                  pn[i].name, want[i]);
    ts_named_tensor bn[4];
    CHECK_INT_EQ(ts_module_buffers(owner, bn, 4), 1);
    CHECK(strcmp(bn[0].name, "body.block.count") == 0);
    /* Forward and backward through the custom modules: y = head(block(x)). */
    float xv[8] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f, 0.7f, -0.8f};
    ts_tensor *x, *y, *loss;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 2, (const int64_t[]){2, 4}, xv, &x));
    CHECK_OK(ts_module_forward(seq, x, &y));
    CHECK_INT_EQ(ts_tensor_ndim(y), 2);
    CHECK(ts_tensor_shape(y)[0] == 2 && ts_tensor_shape(y)[1] == 6);
    CHECK_OK(ts_sum(y, 0, NULL, 0, &loss));
    CHECK_OK(ts_backward(loss, NULL, 0));
    for (size_t i = 0; i < np; i++)
        CHECK_MSG(ts_tensor_grad(pn[i].tensor), "no gradient reached '%s'", pn[i].name);
    /* d(sum of logits)/dW for the tied table is column sums of the block output: check one
     * element against the value computed from y's input. */
    ts_tensor *h;
    CHECK_OK(ts_module_forward(blk, x, &h));
    float hv[8], gw[24];
    host(h, hv);
    host(ts_tensor_grad(ep[0].tensor), gw);
    for (int r = 0; r < 6; r++)
        for (int c = 0; c < 4; c++)
            CHECK_MSG(fabsf(gw[r * 4 + c] - (hv[c] + hv[4 + c])) < 1e-5f,
                      "tied weight grad [%d,%d] %g, want %g", r, c, gw[r * 4 + c],
                      hv[c] + hv[4 + c]);
    /* A failing forward is named by its kind. */
    ts_module *bad;
    CHECK_OK(ts_module_custom(&(ts_module_def){"broken_block", failing_forward, NULL}, NULL, &bad));
    ts_tensor *yb = (ts_tensor *)1;
    CHECK_FAILS(ts_module_forward(bad, x, &yb), TS_EINVAL, "broken_block");
    CHECK(yb == NULL);
    ts_module_free(bad);
    ts_module_train(owner, 0);
    CHECK(!ts_module_is_training(blk) && !ts_module_is_training(head));
    ts_tensor_unref(h), ts_tensor_unref(x), ts_tensor_unref(y), ts_tensor_unref(loss);
    ts_tensor_unref(scale), ts_tensor_unref(count);
    ts_module_free(owner);
    CHECK_INT_EQ(freed_users, 1);
    tap_end();
}

static void test_optimizer_state_round_trip(void)
{
    setup();
    /* Two identical parameters: one optimizer runs 6 steps straight; another runs 3, saves,
     * a fresh one loads and runs 3 more. Same result, bit for bit. */
    double init[NP] = {1, 2, 3, 4, 5, 6, 7};
    ts_tensor *p1, *p2;
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){NP}, init, &p1));
    CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){NP}, init, &p2));
    CHECK_OK(ts_tensor_set_requires_grad(p1, 1));
    CHECK_OK(ts_tensor_set_requires_grad(p2, 1));
    ts_adam_options ao = {0.01, 0.9, 0.999, 1e-8, 0.01};
    ts_named_tensor n1 = {"w", p1}, n2 = {"w", p2};
    ts_optim *a, *b, *c;
    CHECK_OK(ts_optim_adamw(&n1, 1, &ao, &a));
    CHECK_OK(ts_optim_adamw(&n2, 1, &ao, &b));
    /* A schedule and a group of its own, which the saved state must carry. */
    ts_lr_schedule sch = {TS_LR_COSINE, 0.02, 2, 0, 0, 6, 0.001};
    CHECK_OK(ts_optim_set_schedule(a, &sch));
    CHECK_OK(ts_optim_set_schedule(b, &sch));
    CHECK_OK(ts_optim_set_param_weight_decay(a, "w", 0.3));
    CHECK_OK(ts_optim_set_param_weight_decay(b, "w", 0.3));
    const char *path = NULL;
    char pbuf[4200];
    for (int step = 0; step < 6; step++) {
        double g[NP];
        for (int i = 0; i < NP; i++)
            g[i] = cos(i * 0.7 + step);
        ts_tensor *gt;
        CHECK_OK(ts_tensor_from_host(dev, TS_F64, 1, (const int64_t[]){NP}, g, &gt));
        CHECK_OK(ts_tensor_set_grad(p1, gt));
        CHECK_OK(ts_tensor_set_grad(p2, gt));
        ts_tensor_unref(gt);
        CHECK_OK(ts_optim_step(a));
        CHECK_OK(ts_optim_step(b));
        if (step == 2) {
            ts_checkpoint *ck;
            CHECK_OK(ts_checkpoint_new(&ck));
            CHECK_OK(ts_optim_save_state(b, ck));
            snprintf(pbuf, sizeof pbuf, "%s/optim.safetensors", tap_tmpdir());
            path = pbuf;
            CHECK_OK(ts_checkpoint_save(ck, path));
            ts_checkpoint_free(ck);
            ts_optim_free(b);
            CHECK_OK(ts_optim_adamw(&n2, 1, &(ts_adam_options){1, 0.5, 0.5, 1, 0}, &b));
            CHECK_OK(ts_checkpoint_load(path, dev, &ck));
            CHECK_OK(ts_optim_load_state(b, ck));
            CHECK_INT_EQ(ts_optim_steps(b), 3);
            ts_lr_schedule got;
            CHECK(ts_optim_get_schedule(b, &got) && got.kind == TS_LR_COSINE &&
                  got.base_lr == 0.02 && got.warmup_steps == 2 && got.total_steps == 6 &&
                  got.min_lr == 0.001);
            CHECK(ts_optim_param_weight_decay(b, "w") == 0.3);
            /* Loading into another kind of optimizer is refused. */
            CHECK_OK(ts_optim_sgd(&n2, 1, &(ts_sgd_options){0.1, 0, 0, 0, 0}, &c));
            CHECK_FAILS(ts_optim_load_state(c, ck), TS_EINVAL, "'adamw'", "'sgd'");
            ts_optim_free(c);
            ts_checkpoint_free(ck);
        }
    }
    double v1[NP], v2[NP];
    CHECK_OK(ts_tensor_to_host(p1, v1, sizeof v1));
    CHECK_OK(ts_tensor_to_host(p2, v2, sizeof v2));
    CHECK(memcmp(v1, v2, sizeof v1) == 0);
    ts_optim_free(a), ts_optim_free(b);
    ts_tensor_unref(p1), ts_tensor_unref(p2);
    tap_end();
}

/* ---- every layer's backward, by finite differences (float32, so loose tolerances) --------- */

/* L = sum(m(x) * R) with R fixed, evaluated on the host in double. */
static double objective(ts_module *m, ts_tensor *x, const float *R, int64_t n)
{
    ts_tensor *y;
    CHECK_OK(ts_module_forward(m, x, &y));
    CHECK_INT_EQ(ts_tensor_numel(y), n);
    float *v = malloc(sizeof(float) * (size_t)n);
    host(y, v);
    double l = 0;
    for (int64_t i = 0; i < n; i++)
        l += (double)v[i] * R[i];
    free(v);
    ts_tensor_unref(y);
    return l;
}

/* Compares backward's gradients of x and of every parameter with central differences at up
 * to 12 elements each. */
static void layer_gradcheck(const char *name, ts_module *m, ts_tensor *x)
{
    ts_tensor *y, *Rt, *prod, *L;
    CHECK_OK(ts_tensor_set_requires_grad(x, 1));
    CHECK_OK(ts_module_forward(m, x, &y));
    int64_t n = ts_tensor_numel(y);
    CHECK_OK(ts_tensor_randn(dev, TS_F32, ts_tensor_ndim(y), ts_tensor_shape(y), 0, 1, &rng, &Rt));
    float *R = malloc(sizeof(float) * (size_t)n);
    host(Rt, R);
    CHECK_OK(ts_mul(y, Rt, &prod));
    CHECK_OK(ts_sum(prod, 0, NULL, 0, &L));
    CHECK_OK(ts_backward(L, NULL, 0));
    ts_tensor_unref(y), ts_tensor_unref(prod), ts_tensor_unref(L), ts_tensor_unref(Rt);
    ts_named_tensor p[8];
    size_t np = ts_module_parameters(m, p, 8);
    ts_tensor *targets[9] = {x};
    const char *tnames[9] = {"input"};
    for (size_t i = 0; i < np; i++)
        targets[i + 1] = p[i].tensor, tnames[i + 1] = p[i].name;
    ts_no_grad_enter();
    for (size_t k = 0; k <= np; k++) {
        ts_tensor *t = targets[k];
        int64_t tn = ts_tensor_numel(t);
        float *data = ts_tensor_data(t), *g = malloc(sizeof(float) * (size_t)tn);
        CHECK_MSG(ts_tensor_grad(t), "%s: no gradient for %s", name, tnames[k]);
        host(ts_tensor_grad(t), g);
        for (int64_t j = 0; j < tn; j += tn / 12 + 1) {
            const float eps = 1e-2f;
            float keep = data[j];
            data[j] = keep + eps;
            double lp = objective(m, x, R, n);
            data[j] = keep - eps;
            double lm = objective(m, x, R, n);
            data[j] = keep;
            double num = (lp - lm) / (2 * eps);
            CHECK_MSG(fabs(num - g[j]) <= 2e-2 * (1 + fabs(num)),
                      "%s: d/d %s[%lld]: backward %g, finite difference %g", name, tnames[k],
                      (long long)j, g[j], num);
        }
        free(g);
        ts_tensor_zero_grad(t);
    }
    ts_no_grad_exit();
    free(R);
}

static void test_layer_backward(void)
{
    setup();
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, &rng};
    ts_module *m;
    ts_tensor *x;
    CHECK_OK(ts_nn_linear(dev, 6, 4, 1, &init, &m));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){3, 6}, 0, 1, &rng, &x));
    layer_gradcheck("linear", m, x);
    ts_module_free(m), ts_tensor_unref(x);

    ts_conv2d_params cp = {2, 1, 1, 0, 1, 1, 1};
    CHECK_OK(ts_nn_conv2d(dev, 2, 3, 3, 2, &cp, 1, &init, &m));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 4, (const int64_t[]){2, 2, 5, 4}, 0, 1, &rng, &x));
    layer_gradcheck("conv2d", m, x);
    ts_module_free(m), ts_tensor_unref(x);

    CHECK_OK(ts_nn_batchnorm2d(dev, 3, 1e-5, 0.1, &m));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 4, (const int64_t[]){4, 3, 2, 2}, 1, 2, &rng, &x));
    ts_module_train(m, 0); /* eval: running statistics, so finite differences see one function */
    layer_gradcheck("batchnorm2d (eval)", m, x);
    ts_module_free(m), ts_tensor_unref(x);

    CHECK_OK(ts_nn_layernorm(dev, 1, (const int64_t[]){5}, 1e-5, &m));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){3, 5}, 1, 2, &rng, &x));
    layer_gradcheck("layernorm", m, x);
    ts_module_free(m), ts_tensor_unref(x);

    ts_pool2d_params pp = {.kernel_h = 2, .kernel_w = 2, .stride_h = 2, .stride_w = 2};
    CHECK_OK(ts_nn_avg_pool2d(&pp, &m));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 4, (const int64_t[]){1, 2, 4, 4}, 0, 1, &rng, &x));
    layer_gradcheck("avg_pool2d", m, x);
    ts_module_free(m), ts_tensor_unref(x);

    ts_module *seq, *c;
    CHECK_OK(ts_nn_sequential(&seq));
    CHECK_OK(ts_nn_tanh(&c));
    CHECK_OK(ts_nn_sequential_add(seq, "tanh", c));
    CHECK_OK(ts_nn_gelu(&c));
    CHECK_OK(ts_nn_sequential_add(seq, "gelu", c));
    CHECK_OK(ts_nn_flatten(&c));
    CHECK_OK(ts_nn_sequential_add(seq, "flatten", c));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 3, (const int64_t[]){2, 3, 2}, 0, 1, &rng, &x));
    layer_gradcheck("tanh+gelu+flatten", seq, x);
    ts_module_free(seq), ts_tensor_unref(x);
    tap_end();
}

/* BatchNorm in training mode: its output depends on the whole batch, so check the input
 * gradient against the closed form: dx = (g - mean(g) - xhat * mean(g * xhat)) / std. */
static void test_batchnorm_training_backward(void)
{
    setup();
    ts_module *bn;
    CHECK_OK(ts_nn_batchnorm2d(dev, 1, 1e-5, 0.1, &bn));
    float xv[8] = {0.5f, -1, 2, 3, -0.25f, 1.5f, 0, 4};
    ts_tensor *x, *y, *G, *prod, *L;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 4, (const int64_t[]){8, 1, 1, 1}, xv, &x));
    CHECK_OK(ts_tensor_set_requires_grad(x, 1));
    CHECK_OK(ts_module_forward(bn, x, &y));
    float gv[8] = {1, -2, 0.5f, 3, 0, -1, 2, 1};
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 4, (const int64_t[]){8, 1, 1, 1}, gv, &G));
    CHECK_OK(ts_mul(y, G, &prod));
    CHECK_OK(ts_sum(prod, 0, NULL, 0, &L));
    CHECK_OK(ts_backward(L, NULL, 0));
    double mean = 0, var = 0, mg = 0, mgx = 0, xh[8], dx[8];
    for (int i = 0; i < 8; i++)
        mean += xv[i] / 8.0;
    for (int i = 0; i < 8; i++)
        var += (xv[i] - mean) * (xv[i] - mean) / 8.0;
    double sd = sqrt(var + 1e-5);
    for (int i = 0; i < 8; i++) {
        xh[i] = (xv[i] - mean) / sd;
        mg += gv[i] / 8.0;
        mgx += gv[i] * xh[i] / 8.0;
    }
    float got[8];
    host(ts_tensor_grad(x), got);
    for (int i = 0; i < 8; i++) {
        dx[i] = (gv[i] - mg - xh[i] * mgx) / sd;
        CHECK_MSG(fabs(got[i] - dx[i]) < 1e-4 * (1 + fabs(dx[i])), "dx[%d] %g vs %g", i, got[i],
                  dx[i]);
    }
    ts_tensor_unref(x), ts_tensor_unref(y), ts_tensor_unref(G), ts_tensor_unref(prod);
    ts_tensor_unref(L);
    ts_module_free(bn);
    tap_end();
}

/* ts_module_to_dtype: parameters and buffers change dtype in place (same tensors, values
 * converted, gradients dropped), forward then runs in the new dtype; a bad dtype or NULL is
 * refused and changes nothing. */
static void test_module_to_dtype(void)
{
    setup();
    ts_module *seq, *lin, *bn;
    ts_weight_init init = {TS_INIT_KAIMING_UNIFORM, 0, &rng};
    CHECK_OK(ts_nn_sequential(&seq));
    CHECK_OK(ts_nn_batchnorm2d(dev, 2, 1e-5, 0.1, &bn));
    CHECK_OK(ts_nn_sequential_add(seq, "bn", bn));
    CHECK_OK(ts_nn_flatten(&lin));
    CHECK_OK(ts_nn_sequential_add(seq, "flat", lin));
    CHECK_OK(ts_nn_linear(dev, 8, 3, 1, &init, &lin));
    CHECK_OK(ts_nn_sequential_add(seq, "fc", lin));
    ts_named_tensor lp[2];
    CHECK_INT_EQ(ts_module_parameters(lin, lp, 2), 2);
    ts_tensor *w = lp[0].tensor;
    float before[24], after[24];
    host(w, before);
    ts_tensor *x, *y, *l;
    CHECK_OK(ts_tensor_ones(dev, TS_F32, 4, (const int64_t[]){2, 2, 2, 2}, &x));
    CHECK_OK(ts_module_forward(seq, x, &y));
    CHECK_OK(ts_sum(y, 0, NULL, 0, &l));
    CHECK_OK(ts_backward(l, NULL, 0));
    CHECK(ts_tensor_grad(w) != NULL);
    ts_tensor_unref(y), ts_tensor_unref(l);
    CHECK_FAILS(ts_module_to_dtype(seq, TS_I64), TS_EINVAL, "float32 or float64");
    CHECK_FAILS(ts_module_to_dtype(NULL, TS_F64), TS_EINVAL, "NULL");
    CHECK_INT_EQ(ts_tensor_dtype(w), TS_F32);
    CHECK_OK(ts_module_to_dtype(seq, TS_F64));
    CHECK_INT_EQ(ts_module_parameters(lin, lp, 2), 2);
    CHECK(lp[0].tensor == w); /* the same tensor */
    CHECK_INT_EQ(ts_tensor_dtype(w), TS_F64);
    CHECK(ts_tensor_grad(w) == NULL);
    CHECK(ts_tensor_requires_grad(w));
    ts_named_tensor b[2];
    CHECK_INT_EQ(ts_module_buffers(seq, b, 2), 2);
    CHECK_INT_EQ(ts_tensor_dtype(b[0].tensor), TS_F64);
    host(w, after);
    for (int i = 0; i < 24; i++)
        CHECK(before[i] == after[i]); /* float32 -> float64 is exact */
    CHECK_OK(ts_module_to_dtype(seq, TS_F64)); /* already: nothing to do */
    ts_tensor *x64;
    CHECK_OK(ts_cast(x, TS_F64, &x64));
    CHECK_OK(ts_module_forward(seq, x64, &y));
    CHECK_INT_EQ(ts_tensor_dtype(y), TS_F64);
    ts_tensor_unref(y), ts_tensor_unref(x64), ts_tensor_unref(x);
    ts_module_free(seq);
    tap_end();
}

/* ts_module_save/load: a state dict under a prefix round-trips; a module of another shape or
 * a wrong prefix is refused naming the tensor, and leaves the module as it was. */
static void test_state_dict(void)
{
    setup();
    ts_weight_init init = TS_INIT_DEFAULT(&rng);
    ts_module *a, *b, *c;
    CHECK_OK(ts_nn_linear(NULL, 3, 2, 1, &init, &a));
    CHECK_OK(ts_nn_linear(NULL, 3, 2, 1, &init, &b));
    CHECK_OK(ts_nn_linear(NULL, 3, 4, 1, &init, &c));
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_module_save(a, "enc.", ck));
    CHECK_INT_EQ(ts_checkpoint_count(ck), 2);
    CHECK(!strcmp(ts_checkpoint_name(ck, 0), "enc.weight"));
    ts_named_tensor pa[2], pb[2], pc[2];
    ts_module_parameters(a, pa, 2);
    ts_module_parameters(b, pb, 2);
    ts_module_parameters(c, pc, 2);
    float wc[12], wc2[12], wa[6], wb[6];
    CHECK_OK(ts_tensor_to_host(pc[0].tensor, wc, sizeof wc));
    CHECK_FAILS(ts_module_load(c, "enc.", ck), TS_ESHAPE, "'enc.weight' is float32 (2, 3)",
                "(4, 3) in the module");
    CHECK_FAILS(ts_module_load(b, "dec.", ck), TS_EINVAL, "no tensor 'dec.weight'");
    CHECK_OK(ts_tensor_to_host(pc[0].tensor, wc2, sizeof wc2));
    CHECK(memcmp(wc, wc2, sizeof wc) == 0); /* untouched */
    CHECK_OK(ts_module_load(b, "enc.", ck));
    CHECK_OK(ts_tensor_to_host(pa[0].tensor, wa, sizeof wa));
    CHECK_OK(ts_tensor_to_host(pb[0].tensor, wb, sizeof wb));
    CHECK(memcmp(wa, wb, sizeof wa) == 0);
    ts_checkpoint_free(ck);
    ts_module_free(a), ts_module_free(b), ts_module_free(c);
}

/* A layer without an initialisation is an error, not all-zero weights that never train. */
static void test_null_init_refused(void)
{
    ts_module *m = NULL;
    ts_conv2d_params cp = {1, 1, 0, 0, 1, 1, 1};
    CHECK_FAILS(ts_nn_linear(NULL, 4, 3, 1, NULL, &m), TS_EINVAL, "linear: init is NULL");
    CHECK(m == NULL);
    CHECK_FAILS(ts_nn_conv2d(NULL, 1, 2, 3, 3, &cp, 1, NULL, &m), TS_EINVAL,
                "conv2d: init is NULL", "TS_INIT_KAIMING_UNIFORM");
    CHECK_FAILS(ts_nn_embedding(NULL, 10, 4, NULL, &m), TS_EINVAL, "embedding: init is NULL");
    CHECK(m == NULL);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_linear_and_names),
        TAP_TEST(test_null_init_refused),
        TAP_TEST(test_state_dict),
        TAP_TEST(test_conv_pool_flatten_shapes),
        TAP_TEST(test_norms_dropout_embedding),
        TAP_TEST(test_optimizers_match_reference),
        TAP_TEST(test_clip_and_schedules),
        TAP_TEST(test_custom_modules),
        TAP_TEST(test_optimizer_follows_schedule),
        TAP_TEST(test_parameter_groups),
        TAP_TEST(test_optimizer_state_round_trip),
        TAP_TEST(test_layer_backward),
        TAP_TEST(test_batchnorm_training_backward),
        TAP_TEST(test_module_to_dtype),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
