/* tests/unit/test-autocast.c: mixed precision (ts_autocast_begin, tessera/autograd.h, and the
 * trainer's precision). Under autocast a matmul of float32 operands runs in the 16-bit dtype
 * and the row-wise ops come back to float32; a 16-bit float beside a float32 one is computed
 * in float32; the gradients of float32 parameters through an MLP under autocast agree with
 * the float64 ones within a bound derived from the 16-bit dtype's unit roundoff and the
 * roundings on the way, and come back in float32; a checkpointed segment recomputes in its
 * forward's precision (the same gradients bit for bit); the trainer's bfloat16 steps learn
 * as its float32 steps do. */
#include <math.h>

#include "../tap.h"

enum { N = 32, F = 12, H = 24, C = 5 };

static void test_dtypes_under_autocast(void)
{
    ts_device *dev = tap_start();
    ts_rng rng = TS_RNG(1);
    ts_tensor *a, *b, *mm, *sm, *sum, *mixed, *off;
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){3, 4}, 0, 1, &rng, &a));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){4, 5}, 0, 1, &rng, &b));
    CHECK(ts_autocast_dtype() == TS_F32);
    CHECK_OK(ts_autocast_begin(TS_BF16));
    CHECK(ts_autocast_dtype() == TS_BF16);
    CHECK_OK(ts_matmul(a, b, &mm));
    CHECK_OK(ts_softmax(mm, 1, &sm));
    CHECK_OK(ts_sum(mm, 0, NULL, 0, &sum));
    CHECK_OK(ts_add(mm, sm, &mixed)); /* bfloat16 + float32: float32 */
    CHECK_OK(ts_autocast_begin(TS_F32)); /* off inside: float32, on the rounded operands */
    ts_scope *sc = ts_scope_begin();
    ts_tensor *ra = ts_s_cast(ts_s_cast(a, TS_BF16), TS_F32);
    ts_tensor *rb = ts_s_cast(ts_s_cast(b, TS_BF16), TS_F32);
    CHECK_OK(ts_matmul(ra, rb, &off));
    CHECK_OK(ts_scope_end(sc));
    ts_autocast_end();
    ts_autocast_end();
    CHECK(ts_autocast_dtype() == TS_F32);
    CHECK_MSG(ts_tensor_dtype(mm) == TS_BF16 && ts_tensor_dtype(sm) == TS_F32 &&
              ts_tensor_dtype(sum) == TS_F32 && ts_tensor_dtype(mixed) == TS_F32 &&
              ts_tensor_dtype(off) == TS_F32,
              "dtypes: matmul %s softmax %s sum %s mixed add %s off %s",
              ts_dtype_name(ts_tensor_dtype(mm)), ts_dtype_name(ts_tensor_dtype(sm)),
              ts_dtype_name(ts_tensor_dtype(sum)), ts_dtype_name(ts_tensor_dtype(mixed)),
              ts_dtype_name(ts_tensor_dtype(off)));
    /* the bfloat16 matmul is the float32 one of the rounded operands, rounded once (half a
     * unit, 2^-8 relative), give or take float32's error on 4 products */
    float m16[15], m32[15];
    ts_tensor *w;
    CHECK_OK(ts_cast(mm, TS_F32, &w));
    CHECK_OK(ts_tensor_to_host(w, m16, sizeof m16));
    CHECK_OK(ts_tensor_to_host(off, m32, sizeof m32));
    for (int i = 0; i < 15; i++)
        CHECK_MSG(fabsf(m16[i] - m32[i]) <= 0x1p-8f * fabsf(m32[i]) + 1e-6f,
                  "element %d: bfloat16 %.9g, float32 %.9g", i, m16[i], m32[i]);
    CHECK_FAILS(ts_autocast_begin(TS_I32), TS_EDTYPE, "int32", "bfloat16");
    ts_tensor_unref(w);
    ts_tensor_unref(a), ts_tensor_unref(b), ts_tensor_unref(mm), ts_tensor_unref(sm);
    ts_tensor_unref(sum), ts_tensor_unref(mixed), ts_tensor_unref(off);
    tap_end();
}

static ts_module *mlp(ts_device *dev, int32_t dtype)
{
    ts_rng rng = TS_RNG(5);
    ts_weight_init init = TS_INIT_DEFAULT(&rng);
    ts_module *seq, *l;
    CHECK_OK(ts_nn_sequential(&seq));
    CHECK_OK(ts_nn_linear(dev, F, H, 1, &init, &l));
    CHECK_OK(ts_nn_sequential_add(seq, "fc1", l));
    CHECK_OK(ts_nn_gelu(&l));
    CHECK_OK(ts_nn_sequential_add(seq, "gelu", l));
    CHECK_OK(ts_nn_linear(dev, H, C, 1, &init, &l));
    CHECK_OK(ts_nn_sequential_add(seq, "fc2", l));
    CHECK_OK(ts_module_to_dtype(seq, dtype));
    return seq;
}

static void batch(ts_device *dev, int32_t dtype, ts_tensor **x, ts_tensor **y)
{
    ts_rng rng = TS_RNG(9);
    int64_t lab[N];
    for (int i = 0; i < N; i++)
        lab[i] = (i * 7) % C;
    ts_tensor *x32;
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){N, F}, 0, 1, &rng, &x32));
    CHECK_OK(ts_cast(x32, dtype, x));
    ts_tensor_unref(x32);
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, (const int64_t[]){N}, lab, y));
}

/* The gradients of m's parameters (loss: mean cross-entropy) into g[i] as doubles; autocast
 * dtype ac (TS_F32: none). Returns the parameters' count. */
static size_t grads(ts_module *m, ts_tensor *x, ts_tensor *y, int32_t ac, double **g,
                    int64_t *len)
{
    ts_named_tensor p[8];
    size_t np = ts_module_parameters(m, p, 8);
    ts_tensor *out, *loss;
    CHECK_OK(ts_autocast_begin(ac));
    CHECK_OK(ts_module_forward(m, x, &out));
    CHECK_OK(ts_cross_entropy(out, y, TS_REDUCTION_MEAN, &loss));
    ts_autocast_end();
    CHECK_MSG(ts_tensor_dtype(loss) == ts_tensor_dtype(p[0].tensor),
              "the loss is %s", ts_dtype_name(ts_tensor_dtype(loss)));
    CHECK_OK(ts_backward(loss, NULL, 0));
    for (size_t i = 0; i < np; i++) {
        ts_tensor *gr = ts_tensor_grad(p[i].tensor), *d;
        CHECK_MSG(gr && ts_tensor_dtype(gr) == ts_tensor_dtype(p[i].tensor),
                  "%s: gradient %s", p[i].name, gr ? ts_dtype_name(ts_tensor_dtype(gr)) : "none");
        len[i] = ts_tensor_numel(p[i].tensor);
        g[i] = malloc(sizeof(double) * (size_t)len[i]);
        CHECK_OK(ts_cast(gr, TS_F64, &d));
        CHECK_OK(ts_tensor_to_host(d, g[i], sizeof(double) * (size_t)len[i]));
        ts_tensor_unref(d);
        ts_tensor_zero_grad(p[i].tensor);
    }
    ts_tensor_unref(out), ts_tensor_unref(loss);
    return np;
}

/* ||a - b|| / ||b|| over every parameter's gradient. */
static double rel_err(size_t np, double **a, double **b, const int64_t *len)
{
    double d = 0, n = 0;
    for (size_t i = 0; i < np; i++)
        for (int64_t k = 0; k < len[i]; k++) {
            d += (a[i][k] - b[i][k]) * (a[i][k] - b[i][k]);
            n += b[i][k] * b[i][k];
        }
    return sqrt(d / n);
}

/* Against float64: each value on the way is rounded to the 16-bit dtype at most once per op:
 * forward x, W1 and b1 cast, the matmul, the bias add, GELU, W2 and b2 cast, the matmul, the
 * bias add (9); backward the same ops' gradients (9 more). 18 roundings of relative u each
 * bound the norm-wise relative error by 18 u (to first order), u = 2^-8 for bfloat16 and 2^-11
 * for float16. Float32 throughout: the same count with u = 2^-24. */
static void test_gradients_against_float64(void)
{
    ts_device *dev = tap_start();
    ts_module *m64 = mlp(dev, TS_F64), *m32 = mlp(dev, TS_F32);
    ts_tensor *x64, *x32, *y;
    batch(dev, TS_F64, &x64, &y);
    ts_tensor_unref(y);
    batch(dev, TS_F32, &x32, &y);
    double *g64[8], *g[8];
    int64_t len[8];
    size_t np = grads(m64, x64, y, TS_F32, g64, len);
    static const struct {
        int32_t dt;
        double u;
    } cases[] = {{TS_F32, 0x1p-24}, {TS_BF16, 0x1p-8}, {TS_F16, 0x1p-11}};
    for (size_t c = 0; c < 3; c++) {
        CHECK(grads(m32, x32, y, cases[c].dt, g, len) == np);
        double e = rel_err(np, g, g64, len), bound = 18 * cases[c].u;
        printf("# autocast %s: gradients' relative error %.3g (bound %.3g)\n",
                 ts_dtype_name(cases[c].dt), e, bound);
        CHECK_MSG(e <= bound, "autocast %s: gradients' relative error %.3g > %.3g",
                  ts_dtype_name(cases[c].dt), e, bound);
        /* and the 16-bit paths really ran in 16 bits: farther from float64 than float32 is */
        if (cases[c].dt != TS_F32)
            CHECK_MSG(e > 100 * 0x1p-24, "autocast %s: error %.3g is float32's",
                      ts_dtype_name(cases[c].dt), e);
        for (size_t i = 0; i < np; i++)
            free(g[i]);
    }
    for (size_t i = 0; i < np; i++)
        free(g64[i]);
    ts_module_free(m64), ts_module_free(m32);
    ts_tensor_unref(x64), ts_tensor_unref(x32), ts_tensor_unref(y);
    tap_end();
}

/* A checkpointed sequential under autocast recomputes in bfloat16: the same gradients, bit
 * for bit, as without checkpointing. */
static void test_checkpoint_recomputes_in_its_precision(void)
{
    ts_device *dev = tap_start();
    ts_module *a = mlp(dev, TS_F32), *b = mlp(dev, TS_F32);
    ts_rng rng = TS_RNG(3);
    CHECK_OK(ts_nn_sequential_checkpoint(b, &rng, 1));
    ts_tensor *x, *y;
    batch(dev, TS_F32, &x, &y);
    double *ga[8], *gb[8];
    int64_t len[8];
    size_t np = grads(a, x, y, TS_BF16, ga, len);
    CHECK(grads(b, x, y, TS_BF16, gb, len) == np);
    for (size_t i = 0; i < np; i++) {
        CHECK_MSG(!memcmp(ga[i], gb[i], sizeof(double) * (size_t)len[i]),
                  "parameter %zu: checkpointed gradients differ", i);
        free(ga[i]), free(gb[i]);
    }
    ts_module_free(a), ts_module_free(b);
    ts_tensor_unref(x), ts_tensor_unref(y);
    tap_end();
}

/* 60 steps of Adam on a fixed batch: the bfloat16 trainer's loss falls as the float32 one's
 * does, its parameters stay float32; bad precisions and scales are refused. */
static void test_trainer_precision(void)
{
    ts_device *dev = tap_start();
    ts_tensor *x, *y;
    batch(dev, TS_F32, &x, &y);
    double last[2] = {0}, first[2] = {0};
    for (int bf = 0; bf < 2; bf++) {
        ts_module *m = mlp(dev, TS_F32);
        ts_named_tensor p[8];
        size_t np = ts_module_parameters(m, p, 8);
        ts_adam_options ao = TS_ADAM_DEFAULTS;
        ao.lr = 1e-2;
        ts_optim *opt;
        CHECK_OK(ts_optim_adam(p, np, &ao, &opt));
        ts_trainer_options o = TS_TRAINER_OPTIONS_INIT;
        o.precision = bf ? TS_BF16 : TS_F32;
        ts_trainer *t;
        CHECK_OK(ts_trainer_new(m, opt, &o, &t));
        for (int k = 0; k < 60; k++) {
            ts_step_result r = {0};
            CHECK_OK(ts_trainer_step(t, x, y, &r));
            if (k == 0)
                first[bf] = r.loss;
            last[bf] = r.loss;
        }
        for (size_t i = 0; i < np; i++)
            CHECK(ts_tensor_dtype(p[i].tensor) == TS_F32);
        ts_trainer_free(t);
        ts_optim_free(opt);
        ts_module_free(m);
    }
    printf("# loss over 60 steps: float32 %.4f -> %.4f, bfloat16 %.4f -> %.4f\n", first[0],
             last[0], first[1], last[1]);
    CHECK_MSG(fabs(first[1] - first[0]) <= 18 * 0x1p-8 * first[0] &&
                  last[1] < 0.5 * first[1] && fabs(last[1] - last[0]) <= 0.1 * first[0],
              "bfloat16 %.4f -> %.4f against float32 %.4f -> %.4f", first[1], last[1],
              first[0], last[0]);
    ts_module *m = mlp(dev, TS_F32);
    ts_named_tensor p[8];
    ts_optim *opt;
    ts_adam_options ao = TS_ADAM_DEFAULTS;
    CHECK_OK(ts_optim_adam(p, ts_module_parameters(m, p, 8), &ao, &opt));
    ts_trainer_options o = TS_TRAINER_OPTIONS_INIT;
    o.precision = TS_I32;
    ts_trainer *t = NULL;
    CHECK_FAILS(ts_trainer_new(m, opt, &o, &t), TS_EINVAL, "precision", "TS_F16");
    o.precision = TS_F16;
    o.loss_scale = -2;
    CHECK_FAILS(ts_trainer_new(m, opt, &o, &t), TS_EINVAL, "loss_scale");
    ts_optim_free(opt);
    ts_module_free(m);
    ts_tensor_unref(x), ts_tensor_unref(y);
    tap_end();
}

/* Bit-for-bit copies of m's parameters (malloc'd, one block). */
static float *params_of(ts_module *m, size_t *n)
{
    ts_named_tensor p[8];
    size_t np = ts_module_parameters(m, p, 8), total = 0, at = 0;
    for (size_t i = 0; i < np; i++)
        total += (size_t)ts_tensor_numel(p[i].tensor);
    float *v = malloc(sizeof(float) * total);
    for (size_t i = 0; i < np; i++) {
        size_t k = (size_t)ts_tensor_numel(p[i].tensor);
        CHECK_OK(ts_tensor_to_host(p[i].tensor, v + at, sizeof(float) * k));
        at += k;
    }
    *n = total;
    return v;
}

typedef struct f16run {
    ts_module *m;
    ts_optim *opt;
    ts_trainer *t;
} f16run;

static f16run f16_new(ts_device *dev, double scale, int64_t interval)
{
    f16run r = {mlp(dev, TS_F32), NULL, NULL};
    ts_named_tensor p[8];
    ts_adam_options ao = TS_ADAM_DEFAULTS;
    ao.lr = 1e-2;
    CHECK_OK(ts_optim_adam(p, ts_module_parameters(r.m, p, 8), &ao, &r.opt));
    ts_trainer_options o = TS_TRAINER_OPTIONS_INIT;
    o.precision = TS_F16;
    o.loss_scale = scale;
    o.scale_interval = interval;
    CHECK_OK(ts_trainer_new(r.m, r.opt, &o, &r.t));
    return r;
}

static void f16_free(f16run *r)
{
    ts_trainer_free(r->t);
    ts_optim_free(r->opt);
    ts_module_free(r->m);
}

/* float16 with dynamic loss scaling: from a scale of 2^40 the scaled gradients overflow
 * float16, so the first steps are skipped (parameters untouched, bit for bit) with the scale
 * halved each time, until they fit; then it learns, and the scale doubles after each run of
 * `interval` clean steps. A run saved midway (model, optimizer, loss scale, step count) and
 * resumed in fresh objects ends bit for bit where the straight run does; resumed without its
 * loss scale it does not. */
static void test_float16_loss_scaling(void)
{
    ts_device *dev = tap_start();
    ts_tensor *x, *y;
    batch(dev, TS_F32, &x, &y);
    f16run a = f16_new(dev, 0x1p40, 5);
    int skipped = 0, first_clean = -1;
    double scale = 0, loss0 = 0, loss = 0;
    int64_t clean = 0;
    for (int k = 0; k < 80; k++) {
        size_t n;
        float *before = params_of(a.m, &n);
        double sc0;
        ts_trainer_loss_scale(a.t, &sc0, NULL);
        ts_step_result r = {0};
        CHECK_OK(ts_trainer_step(a.t, x, y, &r));
        float *after = params_of(a.m, &n);
        ts_trainer_loss_scale(a.t, &scale, &clean);
        if (r.skipped) {
            skipped++;
            CHECK_MSG(!memcmp(before, after, n * sizeof(float)) && scale == sc0 / 2,
                      "step %d skipped: parameters changed, or the scale went %g -> %g", k, sc0,
                      scale);
        } else {
            if (first_clean < 0) {
                first_clean = k;
                loss0 = r.loss;
            }
            loss = r.loss;
            CHECK_MSG(memcmp(before, after, n * sizeof(float)), "step %d: nothing changed", k);
        }
        free(before), free(after);
    }
    printf("# float16: %d steps skipped from 2^40, then loss %.4f -> %.4f; scale %g\n", skipped,
           loss0, loss, scale);
    /* the first clean step after the initial run of skips; a doubling every 5 clean steps
     * may overflow again (skipped, halved back) */
    CHECK_MSG(first_clean >= 10 && skipped >= first_clean && loss < 0.5 * loss0 &&
                  scale >= 0x1p10 && scale < 0x1p40,
              "%d skipped, first clean step %d, loss %.4f -> %.4f, scale %g", skipped,
              first_clean, loss0, loss, scale);
    /* resumed midway, against a straight run of 40 steps */
    f16_free(&a);
    a = f16_new(dev, 0x1p40, 5);
    for (int k = 0; k < 40; k++)
        CHECK_OK(ts_trainer_step(a.t, x, y, NULL));
    f16run b = f16_new(dev, 0x1p40, 5), c = f16_new(dev, 0x1p40, 5), d = f16_new(dev, 0x1p40, 5);
    for (int k = 0; k < 25; k++)
        CHECK_OK(ts_trainer_step(b.t, x, y, NULL));
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_module_save(b.m, NULL, ck));
    CHECK_OK(ts_optim_save_state(b.opt, ck));
    double bs;
    int64_t bc;
    ts_trainer_loss_scale(b.t, &bs, &bc);
    f16run *rs[2] = {&c, &d};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(ts_module_load(rs[i]->m, NULL, ck));
        CHECK_OK(ts_optim_load_state(rs[i]->opt, ck));
        CHECK_OK(ts_trainer_set_steps(rs[i]->t, 25));
        if (i == 0) /* d is resumed without its loss scale */
            CHECK_OK(ts_trainer_set_loss_scale(rs[i]->t, bs, bc));
        for (int k = 25; k < 40; k++)
            CHECK_OK(ts_trainer_step(rs[i]->t, x, y, NULL));
    }
    size_t n1, n2, n3;
    float *pa = params_of(a.m, &n1), *pc = params_of(c.m, &n2), *pd = params_of(d.m, &n3);
    CHECK_MSG(!memcmp(pa, pc, n1 * sizeof(float)), "resumed with its loss scale: parameters "
              "differ from the straight run's");
    CHECK_MSG(memcmp(pa, pd, n1 * sizeof(float)), "resumed without its loss scale: the same "
              "parameters (the test cannot tell)");
    free(pa), free(pc), free(pd);
    CHECK_FAILS(ts_trainer_set_loss_scale(c.t, -1, 0), TS_EINVAL, "scale");
    ts_checkpoint_free(ck);
    f16_free(&a), f16_free(&b), f16_free(&c), f16_free(&d);
    ts_tensor_unref(x), ts_tensor_unref(y);
    tap_end();
}

/* Under autocast a linear casts its float32 weight before transposing it: one dense cast, and
 * the weight's gradient comes back through the cast in the weight's own layout, so the
 * optimizer's gradient is the backward's tensor itself, not a copy of a transposed view (the
 * kernel profile counts no float32 copy in the forward and backward). */
static void test_linear_weight_cast_dense(void)
{
    ts_device *dev = tap_start();
    ts_rng rng = TS_RNG(4);
    ts_weight_init init = TS_INIT_DEFAULT(&rng);
    ts_module *lin;
    ts_tensor *x, *y, *g;
    CHECK_OK(ts_nn_linear(dev, F, H, 1, &init, &lin));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, (const int64_t[]){N, F}, 0, 1, &rng, &x));
    CHECK_OK(ts_tensor_full(dev, TS_BF16, 2, (const int64_t[]){N, H}, 1.0, &g));
    ts_profile_reset();
    int was = ts_profile_enable(1);
    CHECK_OK(ts_autocast_begin(TS_BF16));
    CHECK_OK(ts_module_forward(lin, x, &y));
    ts_autocast_end();
    CHECK_OK(ts_backward(y, g, 0));
    ts_profile_enable(was);
    uint64_t copies = tap_profile_calls(TS_OP_COPY, -1, TS_F32);
    CHECK_MSG(copies == 0, "%llu float32 copies in a linear's forward and backward under autocast",
              (unsigned long long)copies);
    ts_named_tensor p[2]; /* weight, bias */
    CHECK(ts_module_parameters(lin, p, 2) == 2);
    const ts_tensor *gw = ts_tensor_grad(p[0].tensor);
    CHECK_MSG(ts_tensor_dtype(y) == TS_BF16 && gw && ts_tensor_dtype(gw) == TS_F32 &&
                  ts_tensor_is_contiguous(gw),
              "y %s, weight gradient %s%s", ts_dtype_name(ts_tensor_dtype(y)),
              gw ? ts_dtype_name(ts_tensor_dtype(gw)) : "none",
              gw && !ts_tensor_is_contiguous(gw) ? " (not contiguous)" : "");
    if (!gw)
        goto out;
    /* the gradient itself: sum over the rows of x's bfloat16 values, for every output */
    float xs[N * F], gws[H * F];
    ts_tensor *xb, *xr;
    CHECK_OK(ts_cast(x, TS_BF16, &xb));
    CHECK_OK(ts_cast(xb, TS_F32, &xr));
    CHECK_OK(ts_tensor_to_host(xr, xs, sizeof xs));
    CHECK_OK(ts_tensor_to_host(gw, gws, sizeof gws));
    for (int o = 0; o < H; o++)
        for (int f = 0; f < F; f++) {
            double want = 0;
            for (int i = 0; i < N; i++)
                want += xs[i * F + f];
            /* N bfloat16 products summed in float32, rounded once to bfloat16 */
            double tol = 0x1p-8 * fabs(want) + N * 0x1p-24 * 8;
            if (fabs(gws[o * F + f] - want) > tol) {
                CHECK_MSG(0, "weight gradient (%d, %d): %.9g, not %.9g", o, f, gws[o * F + f],
                          want);
                o = H;
                break;
            }
        }
    ts_tensor_unref(xb), ts_tensor_unref(xr);
out:
    ts_tensor_unref(x), ts_tensor_unref(y), ts_tensor_unref(g);
    ts_module_free(lin);
    tap_end();
}

/* A float32 tensor plus a bfloat16 one (the GPT's residual stream plus a block's output under
 * autocast) is computed in float32, the bfloat16 one cast up; the float32 one is used as it
 * is, not copied by a cast to its own dtype, in the forward or (its gradient) the backward
 * (each was a float32 copy of the residual stream, twice per block). */
static void test_promotion_copies_nothing(void)
{
    ts_device *dev = tap_start();
    ts_rng rng = TS_RNG(6);
    ts_tensor *x, *h, *h32, *y, *g;
    const int64_t shape[2] = {N, F};
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, shape, 0, 1, &rng, &x));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, shape, 0, 1, &rng, &h32));
    CHECK_OK(ts_cast(h32, TS_BF16, &h));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 2, shape, 0, 1, &rng, &g));
    CHECK_OK(ts_tensor_set_requires_grad(x, 1));
    CHECK_OK(ts_tensor_set_requires_grad(h, 1));
    /* x2 = 2 x, not a leaf (whose .grad would be its own copy of g): as in a model */
    ts_tensor *x2;
    CHECK_OK(ts_mul_scalar(x, 2, &x2));
    ts_profile_reset();
    int was = ts_profile_enable(1);
    CHECK_OK(ts_add(x2, h, &y));
    CHECK_OK(ts_backward(y, g, 0));
    ts_profile_enable(was);
    uint64_t copies = tap_profile_calls(TS_OP_COPY, -1, -1);
    CHECK_MSG(copies == 0, "%llu copies in x + h and its backward", (unsigned long long)copies);
    CHECK(ts_tensor_dtype(y) == TS_F32);
    float xs[N * F], hs[N * F], ys[N * F], gs[N * F], gx[N * F], gh[N * F];
    ts_tensor *hw, *ghw;
    CHECK_OK(ts_cast(h, TS_F32, &hw));
    CHECK_OK(ts_cast(ts_tensor_grad(h), TS_F32, &ghw));
    CHECK_OK(ts_tensor_to_host(x, xs, sizeof xs));
    CHECK_OK(ts_tensor_to_host(hw, hs, sizeof hs));
    CHECK_OK(ts_tensor_to_host(y, ys, sizeof ys));
    CHECK_OK(ts_tensor_to_host(g, gs, sizeof gs));
    CHECK_OK(ts_tensor_to_host(ts_tensor_grad(x), gx, sizeof gx));
    CHECK_OK(ts_tensor_to_host(ghw, gh, sizeof gh));
    for (int i = 0; i < N * F; i++) {
        /* the gradient of h: g rounded to bfloat16 (to nearest, even) */
        uint32_t u;
        memcpy(&u, &gs[i], 4);
        u = (u + 0x7fff + (u >> 16 & 1)) & 0xffff0000u;
        float want_gh;
        memcpy(&want_gh, &u, 4);
        if (ys[i] != 2 * xs[i] + hs[i] || gx[i] != 2 * gs[i] || gh[i] != want_gh) {
            CHECK_MSG(0, "element %d: y %.9g (2 x + h %.9g), grad x %.9g (2 g %.9g), grad h "
                      "%.9g (%.9g)", i, ys[i], 2 * xs[i] + hs[i], gx[i], 2 * gs[i], gh[i],
                      want_gh);
            break;
        }
    }
    /* a cast to its own dtype copies in the forward (a new tensor), and its backward hands
     * the gradient on as it is */
    ts_tensor *c, *x3;
    ts_tensor_zero_grad(x);
    CHECK_OK(ts_mul_scalar(x, 2, &x3));
    CHECK_OK(ts_cast(x3, TS_F32, &c));
    ts_profile_reset();
    was = ts_profile_enable(1);
    CHECK_OK(ts_backward(c, g, 0));
    ts_profile_enable(was);
    copies = tap_profile_calls(TS_OP_COPY, -1, -1);
    CHECK_MSG(copies == 0, "%llu copies in the backward of a cast to float32 of a float32 tensor",
              (unsigned long long)copies);
    CHECK_OK(ts_tensor_to_host(ts_tensor_grad(x), gx, sizeof gx));
    for (int i = 0; i < N * F; i++)
        if (gx[i] != 2 * gs[i]) {
            CHECK_MSG(0, "through the cast: grad x %.9g, not %.9g", gx[i], 2 * gs[i]);
            break;
        }
    ts_tensor_unref(c), ts_tensor_unref(x3);
    ts_tensor_unref(x), ts_tensor_unref(x2), ts_tensor_unref(h), ts_tensor_unref(h32);
    ts_tensor_unref(y), ts_tensor_unref(g), ts_tensor_unref(hw), ts_tensor_unref(ghw);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_dtypes_under_autocast),
        TAP_TEST(test_gradients_against_float64),
        TAP_TEST(test_checkpoint_recomputes_in_its_precision),
        TAP_TEST(test_trainer_precision),
        TAP_TEST(test_float16_loss_scaling),
        TAP_TEST(test_linear_weight_cast_dense),
        TAP_TEST(test_promotion_copies_nothing),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
