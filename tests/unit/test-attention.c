/* tests/unit/test-attention.c: ts_attention, fused (TS_OP_ATTENTION and its backward, the
 * online softmax) against the same arithmetic composed from matmul and softmax
 * (ts_attention_fused(0)), on every CPU plugin: in float64 the two agree to float64
 * rounding, forward and every gradient, causal and not, with more keys than queries, views
 * for operands; in float32 and bfloat16 against float64 within bounds derived from the unit
 * roundoff; under autocast it runs in the low dtype; the fused pass never holds the
 * Tq x Tk matrix (its peak pool memory at T = 512 is below one such matrix); bad calls fail
 * with messages; nothing leaks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../tap.h"

/* q (.., Tq, D), k and v (.., Tk, D / Dv) with leading dims (2, 3), float64 values in
 * [-2, 2): made as float64, then cast to dtype (the same values for every dtype). */
typedef struct qkv {
    ts_tensor *q, *k, *v, *w; /* w: weights of the loss sum(out * w) */
} qkv;

static void make(ts_device *dev, int32_t dtype, int64_t Tq, int64_t Tk, int64_t D, int64_t Dv,
                 uint64_t seed, qkv *t)
{
    ts_rng rng = TS_RNG(seed);
    ts_tensor *f[4];
    const int64_t shapes[4][4] = {{2, 3, Tq, D}, {2, 3, Tk, D}, {2, 3, Tk, Dv}, {2, 3, Tq, Dv}};
    for (int i = 0; i < 4; i++) {
        CHECK_OK(ts_tensor_rand(dev, TS_F64, 4, shapes[i], -2, 2, &rng, &f[i]));
        ts_tensor *c;
        CHECK_OK(ts_cast(f[i], dtype, &c));
        ts_tensor_unref(f[i]);
        f[i] = c;
        if (i < 3)
            CHECK_OK(ts_tensor_set_requires_grad(f[i], 1));
    }
    t->q = f[0], t->k = f[1], t->v = f[2], t->w = f[3];
}

static void drop(qkv *t)
{
    ts_tensor_unref(t->q), ts_tensor_unref(t->k), ts_tensor_unref(t->v), ts_tensor_unref(t->w);
}

/* Output and the gradients of sum(out * w) as float64 host arrays (out[0..3]: o, gq, gk, gv). */
static void run(const qkv *t, int causal, double scale, int fused, double *out[4])
{
    int was = ts_attention_fused(fused ? TS_ATTENTION_FUSED : TS_ATTENTION_COMPOSED);
    ts_tensor *o, *l;
    CHECK_OK(ts_attention(t->q, t->k, t->v, causal, scale, &o));
    ts_attention_fused(was);
    ts_scope *sc = ts_scope_begin();
    ts_tensor *w = ts_s_cast(t->w, TS_F64);
    l = ts_scope_keep(ts_s_sum(ts_s_mul(ts_s_cast(o, TS_F64), w), 0, NULL, 0));
    CHECK_OK(ts_scope_end(sc));
    for (int i = 0; i < 3; i++)
        ts_tensor_zero_grad((ts_tensor *)(i == 0 ? t->q : i == 1 ? t->k : t->v));
    CHECK_OK(ts_backward(l, NULL, 0));
    const ts_tensor *src[4] = {o, ts_tensor_grad(t->q), ts_tensor_grad(t->k),
                               ts_tensor_grad(t->v)};
    for (int i = 0; i < 4; i++) {
        CHECK(src[i] != NULL);
        ts_tensor *d;
        CHECK_OK(ts_cast(src[i], TS_F64, &d));
        size_t n = (size_t)ts_tensor_numel(d);
        out[i] = malloc(n * sizeof(double));
        CHECK_OK(ts_tensor_to_host(d, out[i], n * sizeof(double)));
        ts_tensor_unref(d);
    }
    ts_tensor_unref(o), ts_tensor_unref(l);
}

static const char *const what[4] = {"output", "gq", "gk", "gv"};

/* got against want, element by element within rel * (1 + |want|). */
static void agree(double *got[4], double *want[4], const int64_t n[4], double rel,
                  const char *label)
{
    for (int i = 0; i < 4; i++)
        for (int64_t e = 0; e < n[i]; e++)
            CHECK_MSG(fabs(got[i][e] - want[i][e]) <= rel * (1 + fabs(want[i][e])),
                      "%s: %s[%lld] is %.17g, want %.17g (tolerance %.3g)", label, what[i],
                      (long long)e, got[i][e], want[i][e], rel * (1 + fabs(want[i][e])));
}

static void release(double *v[4])
{
    for (int i = 0; i < 4; i++)
        free(v[i]);
}

static const struct {
    int64_t Tq, Tk, D, Dv;
    int causal;
} shapes[] = {
    {7, 7, 5, 5, 1},      {7, 7, 5, 3, 0},    {5, 9, 4, 6, 1},   {5, 9, 4, 6, 0},
    {1, 1, 3, 3, 1},      {1, 70, 8, 8, 1},   {70, 70, 8, 8, 1}, {33, 131, 16, 16, 1},
    {130, 130, 32, 32, 1}, {20, 17, 33, 2, 0},
};

/* In float64 fused == composed to float64 rounding: the sums are the same sums, in other
 * orders, of at most Tk + D terms of magnitude below 16 * scale. */
static void fused_matches_composed_f64(ts_device *dev, const char *name)
{
    CHECK(ts_device_supports(dev, TS_OP_ATTENTION, TS_F64) &&
          ts_device_supports(dev, TS_OP_ATTENTION_BWD, TS_F32));
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        qkv t;
        make(dev, TS_F64, shapes[c].Tq, shapes[c].Tk, shapes[c].D, shapes[c].Dv, 3 + c, &t);
        double *f[4], *r[4];
        run(&t, shapes[c].causal, 0, 1, f);
        run(&t, shapes[c].causal, 0, 0, r);
        const int64_t n[4] = {ts_tensor_numel(t.w), ts_tensor_numel(t.q), ts_tensor_numel(t.k),
                              ts_tensor_numel(t.v)};
        char label[96];
        snprintf(label, sizeof label, "%s float64 Tq %lld Tk %lld causal %d", name,
                 (long long)shapes[c].Tq, (long long)shapes[c].Tk, shapes[c].causal);
        agree(f, r, n, 1e-12, label);
        release(f), release(r), drop(&t);
    }
}

static void test_fused_matches_composed(void)
{
    tap_start();
    tap_on_cpu_plugins(fused_matches_composed_f64);
    tap_end();
}

/* Float32 and bfloat16, fused and composed, against the float64 result on the same values.
 * Float32: each score a sum of D products (D u of the terms' magnitude, below 4 D scale)
 * then exp: relative error ~ (4 D scale + 4) u in each probability; the output and the
 * gradients sum Tk such terms: (Tk + 4 D + 8) u (1 + |want|) times a safety factor 8, with
 * the gradients' terms up to 16 times the output's. Bfloat16 operands are the float64
 * values rounded (half a unit, 2^-9 relative), the result rounded once more: 2^-9 (4 D
 * scale + 2) relative in the scores' exp, and the output again: bounded by 64 * 2^-9. */
static void low_precision_against_f64(ts_device *dev, const char *name)
{
    for (size_t ci = 0; ci < sizeof shapes / sizeof shapes[0]; ci++) {
        const int64_t Tq = shapes[ci].Tq, Tk = shapes[ci].Tk, D = shapes[ci].D;
        qkv t64, t32, t16;
        make(dev, TS_F64, Tq, Tk, D, shapes[ci].Dv, 40 + ci, &t64);
        make(dev, TS_F32, Tq, Tk, D, shapes[ci].Dv, 40 + ci, &t32);
        make(dev, TS_BF16, Tq, Tk, D, shapes[ci].Dv, 40 + ci, &t16);
        double *want[4], *got[4];
        run(&t64, shapes[ci].causal, 0, 1, want);
        const int64_t n[4] = {ts_tensor_numel(t64.w), ts_tensor_numel(t64.q),
                              ts_tensor_numel(t64.k), ts_tensor_numel(t64.v)};
        const double scale = 1 / sqrt((double)D);
        const double u32 = 0x1p-24, ub = 0x1p-9;
        const double tol32 = 8 * 16 * (double)(Tk + 4 * D + 8) * u32 * (1 + 4 * D * scale);
        for (int fused = 0; fused < 2; fused++) {
            char label[96];
            snprintf(label, sizeof label, "%s float32 %s Tq %lld Tk %lld", name,
                     fused ? "fused" : "composed", (long long)Tq, (long long)Tk);
            run(&t32, shapes[ci].causal, 0, fused, got);
            agree(got, want, n, tol32, label);
            release(got);
        }
        /* bfloat16: the float64 reference on the bfloat16 values themselves, so that only
         * the arithmetic's roundings count */
        qkv r;
        r.q = r.k = r.v = r.w = NULL;
        const ts_tensor *src[4] = {t16.q, t16.k, t16.v, t16.w};
        ts_tensor **dst[4] = {&r.q, &r.k, &r.v, &r.w};
        for (int i = 0; i < 4; i++) {
            ts_tensor *c;
            CHECK_OK(ts_cast(src[i], TS_F64, &c));
            CHECK_OK(ts_tensor_detach(c, dst[i]));
            ts_tensor_unref(c);
            if (i < 3)
                CHECK_OK(ts_tensor_set_requires_grad(*dst[i], 1));
        }
        double *want16[4];
        run(&r, shapes[ci].causal, 0, 1, want16);
        const double tolb = 64 * ub * (1 + 4 * D * scale);
        char label[96];
        snprintf(label, sizeof label, "%s bfloat16 fused Tq %lld Tk %lld", name, (long long)Tq,
                 (long long)Tk);
        run(&t16, shapes[ci].causal, 0, 1, got);
        agree(got, want16, n, tolb, label);
        release(got), release(want16), release(want);
        drop(&t64), drop(&t32), drop(&t16), drop(&r);
    }
}

static void test_low_precision(void)
{
    tap_start();
    /* LeakSanitizer's stop-the-world tracer crashes once oneDNN's primitives (the composed
     * path's matmuls on cpu_onednn) have run their threads in this process, as in
     * test-onednn.c: no LSan check after this test; tap_end still finds any tensor, storage,
     * block or node left alive. */
    setenv("TS_NO_LSAN_CHECK", "1", 1);
    tap_on_cpu_plugins(low_precision_against_f64);
    tap_end();
}

/* Under autocast the attention runs in the low dtype, its softmax too; heads as views (a transpose, as a GPT
 * hands them) give what their contiguous copies give. */
static void test_autocast_and_views(void)
{
    ts_device *dev = tap_start();
    ts_rng rng = TS_RNG(11);
    ts_tensor *x, *o, *oc;
    /* (B, T, H, D) transposed to (B, H, T, D): a strided view */
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 4, (const int64_t[]){2, 9, 3, 4}, 0, 1, &rng, &x));
    ts_scope *sc = ts_scope_begin();
    ts_tensor *h = ts_s_transpose(x, 1, 2), *hc = ts_s_contiguous(h);
    CHECK_OK(ts_attention(h, h, h, 1, 0, &o));
    CHECK_OK(ts_attention(hc, hc, hc, 1, 0, &oc));
    ts_profile_reset();
    int was = ts_profile_enable(1);
    CHECK_OK(ts_autocast_begin(TS_BF16));
    ts_tensor *ob = ts_s_attention(h, h, h, 1, 0);
    ts_autocast_end();
    ts_profile_enable(was);
    CHECK(ob && ts_tensor_dtype(ob) == TS_BF16);
    /* composed here (9 keys), its softmax too in bfloat16 (computed in float32 inside the
     * kernel): no float32 softmax with casts of the scores both ways */
    uint64_t sm16 = tap_profile_calls(TS_OP_SOFTMAX, -1, TS_BF16);
    uint64_t sm32 = tap_profile_calls(TS_OP_SOFTMAX, -1, -1) - sm16;
    if (!ts_attention_fuses(h, h))
        CHECK_MSG(sm16 == 1 && sm32 == 0, "softmax calls under autocast: %llu bfloat16, "
                  "%llu float32", (unsigned long long)sm16, (unsigned long long)sm32);
    float a[216], b[216], c[216];
    CHECK_OK(ts_tensor_to_host(o, a, sizeof a));
    CHECK_OK(ts_tensor_to_host(oc, b, sizeof b));
    CHECK_OK(ts_tensor_to_host(ts_s_cast(ob, TS_F32), c, sizeof c));
    CHECK(ts_scope_end(sc) == TS_OK);
    for (int i = 0; i < 216; i++) {
        CHECK_MSG(a[i] == b[i], "view and copy differ at %d: %.9g %.9g", i, a[i], b[i]);
        CHECK_MSG(fabsf(a[i] - c[i]) <= 0.05f * (1 + fabsf(a[i])),
                  "bfloat16 at %d: %.9g, float32 %.9g", i, c[i], a[i]);
    }
    ts_tensor_unref(x), ts_tensor_unref(o), ts_tensor_unref(oc);
    tap_end();
}

/* The fused pass stores no Tq x Tk matrix: forward and backward at T = 512 peak below one
 * such matrix (B H T T floats) above what the operands take, where the composed path needs
 * several. */
static void test_no_score_matrix(void)
{
    ts_device *dev = tap_start();
    const int64_t B = 2, H = 2, T = 512, D = 16;
    ts_rng rng = TS_RNG(12);
    ts_tensor *q;
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 4, (const int64_t[]){B, H, T, D}, 0, 1, &rng, &q));
    CHECK_OK(ts_tensor_set_requires_grad(q, 1));
    const double matrix = (double)(B * H * T * T) * 4;
    double peak[2];
    for (int fused = 0; fused < 2; fused++) {
        ts_memory_stats st = {.struct_size = sizeof st}, st0 = {.struct_size = sizeof st0};
        CHECK_OK(ts_device_memory_stats(dev, &st0));
        ts_device_reset_peak(dev);
        int was = ts_attention_fused(fused ? TS_ATTENTION_FUSED : TS_ATTENTION_COMPOSED);
        ts_scope *sc = ts_scope_begin();
        ts_tensor *l = ts_s_sum(ts_s_attention(q, q, q, 1, 0), 0, NULL, 0);
        CHECK_OK(l ? ts_backward(l, NULL, 0) : TS_EINVAL);
        CHECK_OK(ts_scope_end(sc));
        ts_attention_fused(was);
        CHECK_OK(ts_device_memory_stats(dev, &st));
        peak[fused] = (double)st.peak_in_use - (double)st0.in_use;
        ts_tensor_zero_grad(q);
    }
    CHECK_MSG(peak[1] < matrix && peak[0] > 2 * matrix,
              "peak above the operands: fused %.0f bytes, composed %.0f; one score matrix is "
              "%.0f", peak[1], peak[0], matrix);
    ts_tensor_unref(q);
    tap_end();
}

/* The modes: fused and composed as asked; auto on a CPU plugin from 512 keys on (where the
 * fused pass was measured to pay); the default is auto; a bad mode only asks. */
static void test_modes(void)
{
    ts_device *dev = tap_start();
    ts_tensor *q, *k128, *k512;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 3, (const int64_t[]){1, 4, 8}, &q));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 3, (const int64_t[]){1, 128, 8}, &k128));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 3, (const int64_t[]){1, 512, 8}, &k512));
    CHECK_INT_EQ(ts_attention_fused(-1), TS_ATTENTION_AUTO);
    CHECK(!ts_attention_fuses(q, k128) && ts_attention_fuses(q, k512));
    CHECK_INT_EQ(ts_attention_fused(TS_ATTENTION_FUSED), TS_ATTENTION_AUTO);
    CHECK(ts_attention_fuses(q, k128) && ts_attention_fuses(q, k512));
    CHECK_INT_EQ(ts_attention_fused(TS_ATTENTION_COMPOSED), TS_ATTENTION_FUSED);
    CHECK(!ts_attention_fuses(q, k128) && !ts_attention_fuses(q, k512));
    CHECK_INT_EQ(ts_attention_fused(7), TS_ATTENTION_COMPOSED); /* asks */
    CHECK_INT_EQ(ts_attention_fused(TS_ATTENTION_AUTO), TS_ATTENTION_COMPOSED);
    CHECK(!ts_attention_fuses(NULL, k128));
    ts_tensor_unref(q), ts_tensor_unref(k128), ts_tensor_unref(k512);
    tap_end();
}

/* A plugin call whose output overlaps an input is refused (the kernels read every row of
 * the inputs while writing the outputs; the core never makes such a call). */
static void test_kernel_refuses_aliasing(void)
{
    ts_device *dev = tap_start();
    ts_tensor *q, *k, *v, *o, *lse;
    ts_rng rng = TS_RNG(4);
    const int64_t sh[3] = {1, 8, 4};
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 3, sh, 0, 1, &rng, &q));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 3, sh, 0, 1, &rng, &k));
    CHECK_OK(ts_tensor_randn(dev, TS_F32, 3, sh, 0, 1, &rng, &v));
    CHECK_OK(ts_tensor_empty(dev, TS_F32, 3, sh, &o));
    CHECK_OK(ts_tensor_empty(dev, TS_F32, 2, (const int64_t[]){1, 8}, &lse));
    ts_operand in[3], out[2];
    const ts_tensor *ins[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        in[i] = (ts_operand){.data = ts_tensor_data((ts_tensor *)ins[i]), .dtype = TS_F32,
                             .ndim = 3};
        for (int d = 0; d < 3; d++)
            in[i].shape[d] = sh[d], in[i].strides[d] = d == 0 ? 32 : d == 1 ? 4 : 1;
    }
    out[0] = in[0];
    out[0].data = ts_tensor_data(o);
    out[1] = (ts_operand){.data = ts_tensor_data(lse), .dtype = TS_F32, .ndim = 2,
                          .shape = {1, 8}, .strides = {8, 1}};
    ts_attention_params p = {0.5, 1};
    ts_kernel_call call = {.struct_size = sizeof call, .op = TS_OP_ATTENTION, .ninputs = 3,
                           .noutputs = 2, .inputs = in, .outputs = out, .params = &p,
                           .params_size = sizeof p};
    CHECK_OK(ts_device_run(dev, &call));
    out[0] = in[0]; /* o == q */
    CHECK_FAILS(ts_device_run(dev, &call), TS_EINVAL, "overlaps");
    ts_tensor_unref(q), ts_tensor_unref(k), ts_tensor_unref(v), ts_tensor_unref(o);
    ts_tensor_unref(lse);
    tap_end();
}

static void test_bad_calls(void)
{
    ts_device *dev = tap_start();
    ts_tensor *q, *k, *i, *o = (ts_tensor *)1;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 3, (const int64_t[]){2, 4, 8}, &q));
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 3, (const int64_t[]){2, 3, 8}, &k));
    CHECK_OK(ts_tensor_zeros(dev, TS_I32, 3, (const int64_t[]){2, 4, 8}, &i));
    CHECK_FAILS(ts_attention(q, k, k, 1, 0, &o), TS_ESHAPE, "4 queries and 3 keys", "causal");
    CHECK(o == NULL);
    CHECK_FAILS(ts_attention(q, q, k, 0, 0, &o), TS_ESHAPE, "(2, 4, 8)", "(2, 3, 8)");
    CHECK_FAILS(ts_attention(q, q, q, 2, 0, &o), TS_EINVAL, "causal is 2");
    CHECK_FAILS(ts_attention(i, i, i, 0, 0, &o), TS_EDTYPE, "int32");
    CHECK_FAILS(ts_attention(q, NULL, q, 0, 0, &o), TS_EINVAL, "NULL");
    CHECK_FAILS(ts_attention(q, q, q, 0, INFINITY, &o), TS_EINVAL, "scale");
    CHECK_FAILS(ts_attention(q, q, q, 0, 0, NULL), TS_EINVAL, "out");
    /* no queries: an empty output */
    ts_tensor *e;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 3, (const int64_t[]){2, 0, 8}, &e));
    CHECK_OK(ts_attention(e, q, q, 1, 0, &o));
    CHECK(ts_tensor_numel(o) == 0);
    ts_tensor_unref(o), ts_tensor_unref(e);
    ts_tensor_unref(q), ts_tensor_unref(k), ts_tensor_unref(i);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_fused_matches_composed), TAP_TEST(test_low_precision),
        TAP_TEST(test_autocast_and_views),     TAP_TEST(test_no_score_matrix),
        TAP_TEST(test_modes),                  TAP_TEST(test_kernel_refuses_aliasing),
        TAP_TEST(test_bad_calls),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
