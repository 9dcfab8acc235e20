/* tests/unit/test-gpt.c: the GPT of models/gpt.c (ts_gpt_new), written with the public API:
 * names like GPT-2's, a tied head (one tensor), the first step's loss ln(256) within a few
 * percent, a tiny model memorising a short repetitive text within a few hundred steps, and
 * a float64 gradient check of a whole tiny block's parameters. */
#include <math.h>

#include <tessera/tessera.h>
#include "../tap.h"

static ts_device *dev;

static void setup(void)
{
    tap_start();
    CHECK_OK(ts_device_load(NULL, "cpu_blas", &dev));
}

static void teardown(void)
{
    ts_device_unload(dev);
    tap_end();
}

/* (B, T) windows of text at the given starts, and the next-token targets. */
static void batch(const char *text, const int64_t *starts, int64_t B, int64_t T, ts_tensor **x,
                  ts_tensor **y)
{
    int64_t *xv = malloc(sizeof *xv * (size_t)(B * T)), *yv = malloc(sizeof *yv * (size_t)(B * T));
    CHECK(xv && yv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) {
            xv[b * T + t] = (unsigned char)text[starts[b] + t];
            yv[b * T + t] = (unsigned char)text[starts[b] + t + 1];
        }
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){B, T}, xv, x));
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){B, T}, yv, y));
    free(xv);
    free(yv);
}

static void test_names_and_tying(void)
{
    setup();
    ts_rng rng;
    ts_rng_init(&rng, 1);
    ts_gpt_config cfg = {256, 16, 2, 2, 32, 0, 0};
    ts_module *gpt;
    CHECK_OK(ts_gpt_new(&cfg, dev, &rng, &gpt));
    ts_named_tensor p[64];
    size_t n = ts_module_parameters(gpt, p, 64);
    /* wte, wpe, 12 per block, ln_f (2): the tied head adds nothing */
    CHECK_INT_EQ(n, 2 + 12 * 2 + 2);
    const char *want[] = {"transformer.wte.weight", "transformer.wpe.weight",
                          "transformer.h.0.ln_1.weight", "transformer.h.0.ln_1.bias",
                          "transformer.h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.bias",
                          "transformer.h.0.attn.c_proj.weight", "transformer.h.0.attn.c_proj.bias",
                          "transformer.h.0.ln_2.weight", "transformer.h.0.ln_2.bias",
                          "transformer.h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.bias",
                          "transformer.h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.bias"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECK_MSG(strcmp(p[i].name, want[i]) == 0, "parameter %zu '%s', want '%s'", i, p[i].name,
                  want[i]);
    CHECK(strcmp(p[n - 2].name, "transformer.ln_f.weight") == 0);
    CHECK(ts_module_param(gpt, "lm_head_weight") == p[0].tensor); /* the same tensor */
    /* weights N(0, 0.02); the residual projections N(0, 0.02 / sqrt(2 layers)) */
    float w[3 * 32 * 32];
    CHECK_OK(ts_tensor_to_host(p[4].tensor, w, sizeof w));
    double ss = 0;
    for (int i = 0; i < 3 * 32 * 32; i++)
        ss += (double)w[i] * w[i];
    double sd = sqrt(ss / (3 * 32 * 32));
    CHECK_MSG(fabs(sd - 0.02) < 0.002, "c_attn std %g, want 0.02", sd);
    CHECK_OK(ts_tensor_to_host(p[6].tensor, w, sizeof(float) * 32 * 32));
    ss = 0;
    for (int i = 0; i < 32 * 32; i++)
        ss += (double)w[i] * w[i];
    sd = sqrt(ss / (32 * 32));
    CHECK_MSG(fabs(sd - 0.01) < 0.0015, "c_proj std %g, want 0.02/sqrt(4) = 0.01", sd);
    /* too long an input is a clear error */
    ts_tensor *x, *y, *logits = NULL;
    int64_t starts[1] = {0};
    char text[64];
    memset(text, 'a', sizeof text);
    batch(text, starts, 1, 16, &x, &y);
    ts_tensor *x17;
    int64_t ids[17] = {0};
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){1, 17}, ids, &x17));
    CHECK_FAILS(ts_module_forward(gpt, x17, &logits), TS_ESHAPE, "gpt:", "T <= 16");
    ts_tensor_unref(x17), ts_tensor_unref(x), ts_tensor_unref(y);
    ts_module_free(gpt);
    teardown();
}

static void test_memorises_text(void)
{
    setup();
    static const char phrase[] = "the quick brown fox jumps over the lazy dog. ";
    char text[512];
    size_t len = 0;
    while (len + sizeof phrase - 1 < sizeof text) {
        memcpy(text + len, phrase, sizeof phrase - 1);
        len += sizeof phrase - 1;
    }
    ts_rng rng;
    ts_rng_init(&rng, 7);
    ts_gpt_config cfg = {256, 32, 2, 2, 48, 0, 0};
    ts_module *gpt;
    CHECK_OK(ts_gpt_new(&cfg, dev, &rng, &gpt));
    size_t np = ts_module_parameters(gpt, NULL, 0);
    ts_named_tensor *params = calloc(np, sizeof *params);
    ts_module_parameters(gpt, params, np);
    ts_optim *opt;
    CHECK_OK(ts_optim_adamw(params, np, &(ts_adam_options){3e-3, 0.9, 0.95, 1e-8, 0.1}, &opt));
    ts_gpt_decay_groups(opt);
    CHECK(ts_optim_param_weight_decay(opt, "transformer.wte.weight") == 0);
    CHECK(ts_optim_param_weight_decay(opt, "transformer.h.0.attn.c_attn.bias") == 0);
    CHECK(ts_optim_param_weight_decay(opt, "transformer.h.0.attn.c_attn.weight") == 0.1);
    const int64_t B = 8, T = 32;
    uint64_t pick = 12345;
    double first = 0, last = 0;
    int steps = 300;
    for (int it = 0; it < steps; it++) {
        int64_t starts[8];
        for (int b = 0; b < B; b++) {
            pick = pick * 6364136223846793005ull + 1442695040888963407ull;
            starts[b] = (int64_t)((pick >> 33) % (uint64_t)(len - (size_t)T - 1));
        }
        ts_tensor *x, *y, *logits, *loss, *d;
        batch(text, starts, B, T, &x, &y);
        CHECK_OK(ts_module_forward(gpt, x, &logits));
        CHECK_OK(ts_gpt_loss(logits, y, &loss));
        CHECK_OK(ts_backward(loss, NULL, 0));
        CHECK_OK(ts_clip_grad_norm(params, np, 1.0, NULL));
        CHECK_OK(ts_optim_step(opt));
        ts_optim_zero_grad(opt);
        double lv;
        CHECK_OK(ts_cast(loss, TS_F64, &d));
        CHECK_OK(ts_tensor_to_host(d, &lv, sizeof lv));
        if (it == 0)
            first = lv;
        last = lv;
        ts_tensor_unref(x), ts_tensor_unref(y), ts_tensor_unref(logits), ts_tensor_unref(loss);
        ts_tensor_unref(d);
    }
    printf("# first loss %.4f (ln 256 = %.4f), after %d steps %.4f\n", first, log(256.0), steps,
           last);
    CHECK_MSG(fabs(first - log(256.0)) < 0.03 * log(256.0), "first loss %.4f, want ln 256 "
              "= %.4f within 3%%", first, log(256.0));
    CHECK_MSG(last < 0.1, "after %d steps the loss is %.4f, want < 0.1 (memorised)", steps, last);
    ts_optim_free(opt);
    free(params);
    ts_module_free(gpt);
    CHECK_INT_EQ(ts_memory_live_count(), 0);
    teardown();
}

/* The loss of gpt on (x, y) without recording a graph, as a double. */
static double loss_value(ts_module *gpt, ts_tensor *x, ts_tensor *y)
{
    ts_tensor *logits, *loss;
    double v = NAN;
    ts_no_grad_enter();
    CHECK_OK(ts_module_forward(gpt, x, &logits));
    CHECK_OK(ts_gpt_loss(logits, y, &loss));
    ts_no_grad_exit();
    CHECK_INT_EQ(ts_tensor_dtype(loss), TS_F64);
    CHECK_OK(ts_tensor_to_host(loss, &v, sizeof v));
    ts_tensor_unref(logits), ts_tensor_unref(loss);
    return v;
}

/* A whole tiny GPT (two blocks: layer norms, causal attention over two heads, the GELU MLP,
 * the residuals, the final norm and the tied head) in float64 (ts_module_to_dtype): every
 * parameter element's gradient from backward against a central difference of the loss.
 * Weights are drawn large (uniform +-0.6, norms' gains around 1) so that every path carries
 * gradient. With h = 1e-5 the difference's truncation error is O(h^2) ~ 1e-10 and its
 * rounding 1e-16 / 1e-5 ~ 1e-11, so 1e-7 + 1e-6 |g| bounds it with room. */
/* The gradient check with the attention composed and with the fused kernel (mode of
 * ts_attention_fused). */
static void gradcheck(int mode)
{
    setup();
    int was = ts_attention_fused(mode);
    ts_rng rng;
    ts_rng_init(&rng, 3);
    ts_gpt_config cfg = {11, 6, 2, 2, 8, 0, 0};
    ts_module *gpt;
    CHECK_OK(ts_gpt_new(&cfg, dev, &rng, &gpt));
    CHECK_OK(ts_module_to_dtype(gpt, TS_F64));
    size_t np = ts_module_parameters(gpt, NULL, 0);
    ts_named_tensor *p = calloc(np, sizeof *p);
    ts_module_parameters(gpt, p, np);
    CHECK(ts_module_param(gpt, "lm_head_weight") == p[0].tensor); /* still tied */
    uint64_t r = 99;
    for (size_t i = 0; i < np; i++) {
        CHECK_INT_EQ(ts_tensor_dtype(p[i].tensor), TS_F64);
        CHECK(ts_tensor_is_contiguous(p[i].tensor));
        double *d = ts_tensor_data(p[i].tensor);
        int gain = strstr(p[i].name, "ln_") && strstr(p[i].name, ".weight");
        for (int64_t j = 0; j < ts_tensor_numel(p[i].tensor); j++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            d[j] = ((double)(r >> 11) * 0x1p-53 - 0.5) * 1.2 + (gain ? 1.0 : 0.0);
        }
    }
    const int64_t B = 2, T = 5; /* shorter than the context: the mask is narrowed */
    int64_t xv[10], yv[10];
    for (int i = 0; i < 10; i++)
        xv[i] = (i * 7 + 3) % 11, yv[i] = (i * 5 + 1) % 11;
    ts_tensor *x, *y, *logits, *loss;
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){B, T}, xv, &x));
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){B, T}, yv, &y));
    CHECK_OK(ts_module_forward(gpt, x, &logits));
    CHECK_OK(ts_gpt_loss(logits, y, &loss));
    CHECK_OK(ts_backward(loss, NULL, 0));
    const double h = 1e-5;
    double worst = 0;
    int64_t checked = 0, bad = 0;
    for (size_t i = 0; i < np; i++) {
        ts_tensor *g = ts_tensor_grad(p[i].tensor);
        CHECK_MSG(g != NULL, "%s has no gradient", p[i].name);
        double *d = ts_tensor_data(p[i].tensor);
        const int64_t n = ts_tensor_numel(p[i].tensor);
        double *gv = malloc(sizeof *gv * (size_t)n);
        CHECK_OK(ts_tensor_to_host(g, gv, sizeof *gv * (size_t)n));
        for (int64_t j = 0; j < n; j++) {
            double keep = d[j];
            d[j] = keep + h;
            double fp = loss_value(gpt, x, y);
            d[j] = keep - h;
            double fm = loss_value(gpt, x, y);
            d[j] = keep;
            double num = (fp - fm) / (2 * h), err = fabs(num - gv[j]);
            double ratio = err / (1e-7 + 1e-6 * fabs(gv[j]));
            worst = ratio > worst ? ratio : worst;
            checked++;
            if (ratio > 1 && bad++ < 5)
                CHECK_MSG(0, "%s[%lld]: backward %.12g, central difference %.12g", p[i].name,
                          (long long)j, gv[j], num);
        }
        free(gv);
    }
    printf("# %lld parameter elements checked, worst error / bound %.3g\n", (long long)checked,
           worst);
    CHECK_INT_EQ(bad, 0);
    CHECK(checked == ts_module_num_params(gpt));
    ts_tensor_unref(x), ts_tensor_unref(y), ts_tensor_unref(logits), ts_tensor_unref(loss);
    free(p);
    ts_module_free(gpt);
    CHECK_INT_EQ(ts_memory_live_count(), 0);
    ts_attention_fused(was);
    teardown();
}

static void test_gradcheck_float64(void)
{
    gradcheck(TS_ATTENTION_COMPOSED);
}

static void test_gradcheck_float64_fused(void)
{
    gradcheck(TS_ATTENTION_FUSED);
}

/* The key/value-cached step gives, for each new position, the logits a full forward pass
 * over the same tokens gives there. Both are float32 over embd-long dot products; they differ
 * only in summation order, so 1e-4 relative to (1 + |logit|) bounds it with room. */
/* Activation checkpointing (cfg.checkpoint): the same gradients bit for bit, dropout's
 * masks included (the recomputation draws what the forward drew, and the generator ends
 * where it would have), and a lower peak of the pool while backward runs. */
static void test_checkpoint_activations(void)
{
    setup();
    const char *text = "the quick brown fox jumps over the lazy dog; the lazy dog sleeps.";
    const int64_t B = 4, T = 24, starts[4] = {0, 7, 19, 33};
    ts_tensor *x, *y;
    batch(text, starts, B, T, &x, &y);
    ts_module *m[2];
    ts_rng rng[2];
    size_t peak[2];
    for (int c = 0; c < 2; c++) {
        ts_gpt_config cfg = {256, 32, 4, 2, 32, 0.1, c};
        ts_rng_init(&rng[c], 11);
        CHECK_OK(ts_gpt_new(&cfg, dev, &rng[c], &m[c]));
        ts_module_train(m[c], 1);
        ts_tensor *logits, *loss;
        ts_device_reset_peak(dev);
        ts_memory_stats st0 = {.struct_size = sizeof st0}, st1 = {.struct_size = sizeof st1};
        ts_device_memory_stats(dev, &st0);
        CHECK_OK(ts_module_forward(m[c], x, &logits));
        CHECK_OK(ts_gpt_loss(logits, y, &loss));
        CHECK_OK(ts_backward(loss, NULL, 0));
        ts_device_memory_stats(dev, &st1);
        peak[c] = (size_t)(st1.peak_in_use - st0.in_use);
        ts_tensor_unref(logits), ts_tensor_unref(loss);
    }
    CHECK_FAILS(ts_nn_sequential_checkpoint(m[0], NULL, 1), TS_EINVAL, "sequential");
    CHECK_MSG(rng[0].offset == rng[1].offset && rng[0].offset > 0,
              "the generator is at %llu with checkpointing, %llu without",
              (unsigned long long)rng[1].offset, (unsigned long long)rng[0].offset);
    ts_named_tensor p0[64], p1[64];
    size_t n = ts_module_parameters(m[0], p0, 64);
    CHECK(ts_module_parameters(m[1], p1, 64) == n && n > 0);
    int differ = 0;
    for (size_t i = 0; i < n; i++) {
        ts_tensor *g0 = ts_tensor_grad(p0[i].tensor), *g1 = ts_tensor_grad(p1[i].tensor);
        CHECK_MSG(g0 && g1, "%s has no gradient", p0[i].name);
        if (!g0 || !g1)
            continue;
        size_t bytes = (size_t)ts_tensor_numel(g0) * sizeof(float);
        float *h0 = malloc(bytes), *h1 = malloc(bytes);
        CHECK_OK(ts_tensor_to_host(g0, h0, bytes));
        CHECK_OK(ts_tensor_to_host(g1, h1, bytes));
        if (memcmp(h0, h1, bytes) && differ++ < 3)
            CHECK_MSG(0, "%s: the gradient differs with checkpointing", p0[i].name);
        free(h0), free(h1);
    }
    CHECK_MSG(peak[1] < peak[0] * 3 / 4, "peak in use %zu B with checkpointing, %zu B without",
              peak[1], peak[0]);
    printf("# peak in use during forward and backward: %zu B checkpointed, %zu B not\n", peak[1],
           peak[0]);
    ts_module_free(m[0]), ts_module_free(m[1]);
    ts_tensor_unref(x), ts_tensor_unref(y);
    teardown();
}

/* The trainer's cross-entropy over a sequence's logits (B, T, vocab) is ts_gpt_loss: a
 * trainer step with clipping leaves the weights of the hand-written step, bit for bit. */
static void test_trainer_step_is_gpt_step(void)
{
    setup();
    const char *text = "a stitch in time saves nine; a penny saved is a penny earned.";
    const int64_t starts[3] = {0, 5, 21};
    ts_tensor *x, *y;
    batch(text, starts, 3, 16, &x, &y);
    ts_module *m[2];
    ts_optim *o[2];
    ts_named_tensor p[2][64];
    size_t n[2];
    ts_rng rng[2];
    for (int k = 0; k < 2; k++) {
        ts_gpt_config cfg = {256, 16, 1, 2, 16, 0, 0};
        ts_rng_init(&rng[k], 5);
        CHECK_OK(ts_gpt_new(&cfg, dev, &rng[k], &m[k]));
        n[k] = ts_module_parameters(m[k], p[k], 64);
        ts_adam_options ao = {1e-2, 0.9, 0.95, 1e-8, 0.1};
        CHECK_OK(ts_optim_adamw(p[k], n[k], &ao, &o[k]));
        ts_gpt_decay_groups(o[k]);
    }
    ts_trainer_options to = TS_TRAINER_OPTIONS_INIT;
    to.clip_grad_norm = 0.5;
    ts_trainer *t;
    CHECK_OK(ts_trainer_new(m[1], o[1], &to, &t));
    for (int step = 0; step < 3; step++) {
        ts_tensor *logits, *loss;
        ts_module_train(m[0], 1);
        CHECK_OK(ts_module_forward(m[0], x, &logits));
        CHECK_OK(ts_gpt_loss(logits, y, &loss));
        CHECK_OK(ts_backward(loss, NULL, 0));
        CHECK_OK(ts_clip_grad_norm(p[0], n[0], 0.5, NULL));
        CHECK_OK(ts_optim_step(o[0]));
        ts_optim_zero_grad(o[0]);
        double lh;
        CHECK_OK(ts_tensor_item(loss, &lh));
        ts_tensor_unref(logits), ts_tensor_unref(loss);
        ts_step_result r = {0};
        CHECK_OK(ts_trainer_step(t, x, y, &r));
        CHECK_MSG(r.loss == lh, "step %d: the trainer's loss %.9g, ts_gpt_loss %.9g", step,
                  r.loss, lh);
    }
    for (size_t i = 0; i < n[0]; i++) {
        size_t bytes = (size_t)ts_tensor_numel(p[0][i].tensor) * sizeof(float);
        float *a = malloc(bytes), *b = malloc(bytes);
        CHECK_OK(ts_tensor_to_host(p[0][i].tensor, a, bytes));
        CHECK_OK(ts_tensor_to_host(p[1][i].tensor, b, bytes));
        CHECK_MSG(!memcmp(a, b, bytes), "%s differs from the hand-written step's", p[0][i].name);
        free(a), free(b);
    }
    ts_trainer_free(t);
    for (int k = 0; k < 2; k++)
        ts_optim_free(o[k]), ts_module_free(m[k]);
    ts_tensor_unref(x), ts_tensor_unref(y);
    teardown();
}

/* Memory by role over GPT training steps: after every step the roles' bytes add up to what
 * the pool holds for callers (its requested bytes), and the model's four roles are there:
 * parameters, AdamW's state, data (the batches, tagged) and, inside a step, activations and
 * gradients. */
static void test_roles_add_up(void)
{
    setup();
    const char *text = "it was the best of times, it was the worst of times, it was the age";
    const int64_t starts[4] = {0, 3, 9, 14};
    ts_tensor *x, *y;
    batch(text, starts, 4, 16, &x, &y);
    ts_tensor_set_role(x, TS_ROLE_DATA);
    ts_tensor_set_role(y, TS_ROLE_DATA);
    ts_rng rng;
    ts_rng_init(&rng, 3);
    ts_gpt_config cfg = {256, 16, 2, 2, 16, 0, 0};
    ts_module *m;
    CHECK_OK(ts_gpt_new(&cfg, dev, &rng, &m));
    ts_named_tensor p[64];
    size_t n = ts_module_parameters(m, p, 64);
    ts_adam_options ao = {1e-2, 0.9, 0.95, 1e-8, 0.1};
    ts_optim *o;
    CHECK_OK(ts_optim_adamw(p, n, &ao, &o));
    uint64_t seen_act = 0, seen_grad = 0;
    for (int step = 0; step < 3; step++) {
        ts_tensor *logits, *loss;
        ts_module_train(m, 1);
        CHECK_OK(ts_module_forward(m, x, &logits));
        CHECK_OK(ts_gpt_loss(logits, y, &loss));
        uint64_t r[TS_ROLE_COUNT];
        ts_device_memory_by_role(dev, r);
        seen_act = r[TS_ROLE_ACTIVATION] > seen_act ? r[TS_ROLE_ACTIVATION] : seen_act;
        CHECK_OK(ts_backward(loss, NULL, 0));
        ts_device_memory_by_role(dev, r);
        seen_grad = r[TS_ROLE_GRADIENT] > seen_grad ? r[TS_ROLE_GRADIENT] : seen_grad;
        CHECK_OK(ts_optim_step(o));
        ts_optim_zero_grad(o);
        ts_tensor_unref(logits), ts_tensor_unref(loss);
        ts_memory_stats st = {.struct_size = sizeof st};
        ts_device_memory_stats(dev, &st);
        ts_device_memory_by_role(dev, r);
        uint64_t sum = 0;
        for (int k = 0; k < TS_ROLE_COUNT; k++)
            sum += r[k];
        CHECK_MSG(sum == st.requested, "step %d: the roles add up to %llu bytes, the pool holds "
                  "%llu for callers", step, (unsigned long long)sum,
                  (unsigned long long)st.requested);
        CHECK(r[TS_ROLE_PARAMETER] > 0 && r[TS_ROLE_OPTIMIZER] == 2 * r[TS_ROLE_PARAMETER] &&
              r[TS_ROLE_DATA] > 0);
    }
    CHECK_MSG(seen_act > 0 && seen_grad > 0, "activations %llu, gradients %llu bytes at most",
              (unsigned long long)seen_act, (unsigned long long)seen_grad);
    ts_optim_free(o), ts_module_free(m);
    ts_tensor_unref(x), ts_tensor_unref(y);
    teardown();
}

static void test_cache_matches_full_forward(void)
{
    setup();
    ts_rng rng;
    ts_rng_init(&rng, 3);
    ts_gpt_config cfg = {256, 12, 2, 4, 32, 0, 0};
    ts_module *gpt;
    CHECK_OK(ts_gpt_new(&cfg, dev, &rng, &gpt));
    /* weights of a trained size: scale the small init up so that attention is not uniform */
    ts_named_tensor p[64];
    size_t np = ts_module_parameters(gpt, p, 64);
    for (size_t i = 0; i < np; i++)
        if (ts_tensor_ndim(p[i].tensor) == 2) {
            ts_no_grad_enter();
            CHECK_OK(ts_mul_scalar_(p[i].tensor, 25.0));
            ts_no_grad_exit();
        }
    int64_t ids[12];
    for (int i = 0; i < 12; i++)
        ids[i] = (int64_t)((i * 37 + 11) % 256);
    ts_tensor *x, *full;
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 2, (const int64_t[]){1, 12}, ids, &x));
    ts_module_train(gpt, 0);
    ts_no_grad_enter();
    CHECK_OK(ts_module_forward(gpt, x, &full));
    ts_no_grad_exit();
    float *fv = malloc(sizeof(float) * 12 * 256), sv[256];
    CHECK_OK(ts_tensor_to_host(full, fv, sizeof(float) * 12 * 256));
    ts_gpt_cache *c;
    CHECK_OK(ts_gpt_cache_new(gpt, &c));
    double worst = 0;
    for (int t = 0; t < 12; t++) {
        ts_tensor *l;
        CHECK_OK(ts_gpt_cache_step(gpt, c, ids[t], &l));
        CHECK_INT_EQ(ts_tensor_numel(l), 256);
        CHECK_OK(ts_tensor_to_host(l, sv, sizeof sv));
        for (int j = 0; j < 256; j++) {
            double d = fabs((double)sv[j] - fv[t * 256 + j]) / (1 + fabs(fv[t * 256 + j]));
            worst = d > worst ? d : worst;
        }
        ts_tensor_unref(l);
    }
    printf("# worst relative difference, cached vs full: %.3g\n", worst);
    CHECK_MSG(worst < 1e-4, "cached logits differ from the full forward's by %.3g", worst);
    ts_tensor *l = (ts_tensor *)1;
    CHECK_FAILS(ts_gpt_cache_step(gpt, c, 1, &l), TS_ESHAPE, "whole context");
    ts_gpt_cache_free(c);
    free(fv);
    ts_tensor_unref(x), ts_tensor_unref(full);
    ts_module_free(gpt);
    CHECK_INT_EQ(ts_memory_live_count(), 0);
    teardown();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_names_and_tying),
        TAP_SLOW_TEST(test_memorises_text),
        TAP_TEST(test_cache_matches_full_forward),
        TAP_TEST(test_gradcheck_float64),
        TAP_TEST(test_gradcheck_float64_fused),
        TAP_TEST(test_checkpoint_activations),
        TAP_TEST(test_trainer_step_is_gpt_step),
        TAP_TEST(test_roles_add_up),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
