/* tests/unit/test-half.c: the bfloat16 and float16 conversions of plugin.h, bit for bit:
 * every one of the 65,536 patterns of each widens exactly and narrows back to itself (NaN to
 * a quiet NaN of the same sign); narrowing float32 rounds to nearest, ties to even, against
 * an independent computation in double (and against the compiler's _Float16 where it has
 * one) over every midpoint between neighbouring values, the patterns around them, and a
 * stride through all float32 patterns; a table of the edges (the largest finite value, the
 * overflow threshold, subnormals, the underflow tie, signed zeros, infinities, NaN); and a
 * double narrows correctly where rounding through float32 to nearest would round twice. Then
 * the dtypes themselves (TS_BF16, TS_F16) on every CPU plugin and the reference kernels:
 * casts both ways, fills, a scalar's value, printing, checkpoints and .npy files holding them
 * as such, elementwise ops computed in float32 and rounded once, clear errors from ops that
 * do not take them yet, and a plugin built for an older ABI never asked about them. */
#include <float.h>
#include <math.h>

#include "../tap.h"

static int is_nan16(uint16_t h, int bf)
{
    return bf ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}

static float widen(uint16_t h, int bf)
{
    return bf ? ts_plugin_bf16_to_f32(h) : ts_plugin_f16_to_f32(h);
}

static uint16_t narrow(float f, int bf)
{
    return bf ? ts_plugin_f32_to_bf16(f) : ts_plugin_f32_to_f16(f);
}

/* The value of a finite pattern, in double (independent of the code under test). */
static double value16(uint16_t h, int bf)
{
    int sign = h >> 15, ebits = bf ? 8 : 5, mbits = bf ? 7 : 10, bias = bf ? 127 : 15;
    int e = (h >> mbits) & ((1 << ebits) - 1), m = h & ((1 << mbits) - 1);
    double v = e ? ldexp(1.0 + ldexp(m, -mbits), e - bias) : ldexp(m, 1 - bias - mbits);
    return sign ? -v : v;
}

/* The correctly rounded pattern of x (finite, not NaN) by search: the nearest of the finite
 * values, ties to the even pattern, infinity past the largest finite value plus half its
 * last unit (IEEE's overflow rule). */
static uint16_t reference(double x, int bf)
{
    uint16_t sign = signbit(x) ? 0x8000u : 0, maxfin = bf ? 0x7f7fu : 0x7bffu;
    double a = fabs(x), top = value16(maxfin, bf), ulp = top - value16(maxfin - 1, bf);
    if (a >= top + ulp / 2)
        return (uint16_t)(sign | (bf ? 0x7f80u : 0x7c00u));
    uint16_t lo = 0, hi = maxfin; /* the largest pattern whose value <= a: binary search */
    while (lo < hi) {
        uint16_t mid = (uint16_t)((lo + hi + 1) / 2);
        if (value16(mid, bf) <= a)
            lo = mid;
        else
            hi = (uint16_t)(mid - 1);
    }
    uint16_t r = lo;
    if (lo < maxfin || a > value16(maxfin, bf)) {
        double dl = a - value16(lo, bf), dh = value16((uint16_t)(lo + 1), bf) - a;
        if (lo == maxfin)
            dh = top + ulp - a; /* the next value would be top + ulp (rounds to infinity) */
        if (dh < dl || (dh == dl && (lo & 1)))
            r = (uint16_t)(lo + 1);
    }
    return (uint16_t)(sign | r);
}

static void test_every_pattern_round_trips(void)
{
    tap_start();
    for (int bf = 0; bf < 2; bf++)
        for (uint32_t h = 0; h < 65536; h++) {
            float f = widen((uint16_t)h, bf);
            uint16_t back = narrow(f, bf);
            if (is_nan16((uint16_t)h, bf)) {
                CHECK_MSG(isnan(f) && back == (h | (bf ? 0x0040u : 0x0200u)),
                          "%s NaN 0x%04x -> %g -> 0x%04x", bf ? "bf16" : "f16", h, f, back);
                continue;
            }
            CHECK_MSG(back == h, "%s 0x%04x -> %.9g -> 0x%04x", bf ? "bf16" : "f16", h, f, back);
            if ((h & 0x7fffu) < (bf ? 0x7f80u : 0x7c00u))
                CHECK_MSG((double)f == value16((uint16_t)h, bf), "%s 0x%04x widens to %.9g, "
                          "not %.9g", bf ? "bf16" : "f16", h, f, value16((uint16_t)h, bf));
#ifdef __FLT16_MAX__
            if (!bf) {
                _Float16 c;
                uint16_t hh = (uint16_t)h;
                memcpy(&c, &hh, 2);
                CHECK_MSG(isnan((float)c) ? isnan(f) : (float)c == f && signbit(f) == signbit((float)c),
                          "f16 0x%04x: %g, _Float16 says %g", h, f, (float)c);
            }
#endif
        }
    tap_end();
}

static void check_narrow(float x, int bf)
{
    uint16_t got = narrow(x, bf);
    if (isnan(x)) {
        CHECK(is_nan16(got, bf));
        return;
    }
    uint16_t want = isinf(x) ? (uint16_t)((signbit(x) ? 0x8000u : 0) | (bf ? 0x7f80u : 0x7c00u))
                             : reference(x, bf);
    CHECK_MSG(got == want, "%s of %.9g (0x%08x): 0x%04x, correctly rounded 0x%04x",
              bf ? "bf16" : "f16", x, ts_plugin_f32_bits(x), got, want);
#ifdef __FLT16_MAX__
    if (!bf) {
        _Float16 c = (_Float16)x;
        uint16_t cb;
        memcpy(&cb, &c, 2);
        CHECK_MSG(got == cb, "f16 of %.9g: 0x%04x, _Float16 says 0x%04x", x, got, cb);
    }
#endif
}

static void test_narrowing_rounds_to_nearest_even(void)
{
    tap_start();
    for (int bf = 0; bf < 2; bf++) {
        uint16_t top = bf ? 0x7f7fu : 0x7bffu;
        /* every midpoint between neighbours (and the one past the largest finite value), the
         * float32 patterns on either side of it, and the values themselves */
        for (uint32_t h = 0; h <= top; h++) {
            double v = value16((uint16_t)h, bf);
            double next = h < top ? value16((uint16_t)(h + 1), bf)
                                  : 2 * v - value16((uint16_t)(h - 1), bf);
            float mid = (float)((v + next) / 2); /* exact: float32 has the bits */
            CHECK_MSG((double)mid == (v + next) / 2, "midpoint above 0x%04x not exact", h);
            uint32_t mb = ts_plugin_f32_bits(mid);
            for (int s = 0; s < 2; s++) {
                float sg = s ? -1.0f : 1.0f;
                check_narrow(sg * (float)v, bf);
                check_narrow(sg * mid, bf);
                check_narrow(sg * ts_plugin_f32_from_bits(mb - 1), bf);
                check_narrow(sg * ts_plugin_f32_from_bits(mb + 1), bf);
            }
        }
        /* a stride through every float32 pattern (both signs, NaN and infinities included) */
        for (uint64_t u = 0; u < 0x100000000ull; u += 65521)
            check_narrow(ts_plugin_f32_from_bits((uint32_t)u), bf);
    }
    tap_end();
}

static void test_edges(void)
{
    tap_start();
    static const struct {
        float x;
        uint16_t f16, bf16;
    } t[] = {
        {0.0f, 0x0000, 0x0000},
        {-0.0f, 0x8000, 0x8000},
        {1.0f, 0x3c00, 0x3f80},
        {-2.0f, 0xc000, 0xc000},
        {65504.0f, 0x7bff, 0x4780},         /* float16's largest finite; bfloat16 rounds up */
        {65519.99609375f, 0x7bff, 0x4780},  /* just under the overflow threshold */
        {65520.0f, 0x7c00, 0x4780},         /* the threshold: a tie, to even = infinity */
        {1e6f, 0x7c00, 0x4974},
        {FLT_MAX, 0x7c00, 0x7f80},          /* bfloat16 overflows too */
        {INFINITY, 0x7c00, 0x7f80},
        {-INFINITY, 0xfc00, 0xff80},
        {6.103515625e-05f, 0x0400, 0x3880}, /* 2^-14, float16's smallest normal */
        {5.9604644775390625e-08f, 0x0001, 0x3380}, /* 2^-24, its smallest subnormal */
        {2.98023223876953125e-08f, 0x0000, 0x3300}, /* 2^-25: the tie with 0, to even */
        {2.98023259e-08f, 0x0001, 0x3300},  /* just above it */
        {1.00048828125f, 0x3c00, 0x3f80},   /* 1 + 2^-11: float16 tie, to even (down) */
        {1.00146484375f, 0x3c02, 0x3f80},   /* 1 + 3 2^-11: tie, to even (up) */
        {1.00390625f, 0x3c04, 0x3f80},      /* 1 + 2^-8: bfloat16 tie, to even (down) */
        {1.01171875f, 0x3c0c, 0x3f82},      /* 1 + 3 2^-8: bfloat16 tie, to even (up) */
        {1e-40f, 0x0000, 0x0001},           /* a float32 subnormal: bfloat16 keeps it */
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        CHECK_MSG(ts_plugin_f32_to_f16(t[i].x) == t[i].f16, "f16 of %.9g: 0x%04x, not 0x%04x",
                  t[i].x, ts_plugin_f32_to_f16(t[i].x), t[i].f16);
        CHECK_MSG(ts_plugin_f32_to_bf16(t[i].x) == t[i].bf16, "bf16 of %.9g: 0x%04x, not 0x%04x",
                  t[i].x, ts_plugin_f32_to_bf16(t[i].x), t[i].bf16);
    }
    float qnan = NAN, nnan = -NAN;
    CHECK(ts_plugin_f32_to_f16(qnan) == 0x7e00 && ts_plugin_f32_to_bf16(qnan) == 0x7fc0);
    CHECK((ts_plugin_f32_to_f16(nnan) & 0x8000) && is_nan16(ts_plugin_f32_to_f16(nnan), 0));
    float snan = ts_plugin_f32_from_bits(0x7f800001u); /* signaling, payload in the low bit */
    CHECK(is_nan16(ts_plugin_f32_to_f16(snan), 0) && is_nan16(ts_plugin_f32_to_bf16(snan), 1));
    tap_end();
}

/* A double just above a float16 tie: float32 rounds it onto the tie (1 + 2^-11) and a second
 * rounding to nearest would then go to even (1); rounded once it is 1 + 2^-10. */
static void test_double_rounds_once(void)
{
    tap_start();
    double d = 1.0 + ldexp(1, -11) + ldexp(1, -40);
    CHECK_MSG(ts_plugin_f32_to_f16((float)d) == 0x3c00, "the double rounding this guards "
              "against did not happen");
    CHECK_MSG(ts_plugin_f64_to_f16(d) == 0x3c01, "f16 of 1 + 2^-11 + 2^-40: 0x%04x",
              ts_plugin_f64_to_f16(d));
    CHECK(ts_plugin_f64_to_f16(-d) == 0xbc01);
    d = 1.0 + ldexp(1, -8) + ldexp(1, -40);
    CHECK_MSG(ts_plugin_f64_to_bf16(d) == 0x3f81, "bf16 of 1 + 2^-8 + 2^-40: 0x%04x",
              ts_plugin_f64_to_bf16(d));
    /* exact ties and every float16 value stay as float32 takes them */
    for (uint32_t h = 0; h < 0x7c00; h++) {
        double v = value16((uint16_t)h, 0);
        CHECK(ts_plugin_f64_to_f16(v) == h);
        CHECK(ts_plugin_f64_to_bf16(v) == ts_plugin_f32_to_bf16((float)v));
    }
    CHECK(ts_plugin_f64_to_f16(1e300) == 0x7c00 && ts_plugin_f64_to_bf16(-1e300) == 0xff80);
    CHECK(ts_plugin_f64_to_f16(1e-300) == 0x0000 && ts_plugin_f64_to_bf16(-1e-300) == 0x8000);
    CHECK(is_nan16(ts_plugin_f64_to_f16(NAN), 0) && ts_plugin_f64_to_f16(INFINITY) == 0x7c00);
    tap_end();
}

/* ---- the dtypes --------------------------------------------------------------------- */

static const float edge_vals[] = {0.0f, -0.0f, 1.0f, -2.5f, 3.14159265f, 65504.0f, 65520.0f,
                                  70000.0f, 1e-8f, 6e-8f, 1.00048828125f, 1.00390625f,
                                  -1e30f, INFINITY, -INFINITY, NAN};
enum { NE = sizeof edge_vals / sizeof edge_vals[0] };

/* Casts on dev: float32 to each 16-bit dtype gives plugin.h's patterns, and back widens them
 * exactly (to float32 and float64); int32 and uint8 narrow alike; a fill rounds once. */
static void check_dtype_ops(ts_device *dev, const char *what)
{
    int64_t n = NE;
    ts_tensor *x, *h, *back, *d, *i32, *hi;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n, edge_vals, &x));
    for (int bf = 0; bf < 2; bf++) {
        int32_t dt = bf ? TS_BF16 : TS_F16;
        uint16_t got[NE];
        float w[NE];
        double wd[NE];
        CHECK_OK(ts_cast(x, dt, &h));
        CHECK(ts_tensor_dtype(h) == dt && ts_dtype_size(dt) == 2);
        CHECK_OK(ts_tensor_to_host(h, got, sizeof got));
        for (int i = 0; i < NE; i++) {
            uint16_t want = narrow(edge_vals[i], bf);
            CHECK_MSG(got[i] == want, "%s: cast %.9g to %s: 0x%04x, not 0x%04x", what,
                      edge_vals[i], ts_dtype_name(dt), got[i], want);
        }
        CHECK_OK(ts_cast(h, TS_F32, &back));
        CHECK_OK(ts_cast(h, TS_F64, &d));
        CHECK_OK(ts_tensor_to_host(back, w, sizeof w));
        CHECK_OK(ts_tensor_to_host(d, wd, sizeof wd));
        for (int i = 0; i < NE; i++) {
            float want = widen(got[i], bf);
            CHECK_MSG(isnan(want) ? isnan(w[i]) && isnan(wd[i])
                                  : w[i] == want && wd[i] == (double)want,
                      "%s: %s 0x%04x widens to %.9g / %.17g, not %.9g", what, ts_dtype_name(dt),
                      got[i], w[i], wd[i], want);
        }
        int32_t ints[4] = {-7, 0, 257, 65535};
        int64_t n4 = 4;
        CHECK_OK(ts_tensor_from_host(dev, TS_I32, 1, &n4, ints, &i32));
        CHECK_OK(ts_cast(i32, dt, &hi));
        CHECK_OK(ts_tensor_to_host(hi, got, 8));
        for (int i = 0; i < 4; i++)
            CHECK_MSG(got[i] == (bf ? ts_plugin_f64_to_bf16(ints[i]) : ts_plugin_f64_to_f16(ints[i])),
                      "%s: int32 %d to %s: 0x%04x", what, ints[i], ts_dtype_name(dt), got[i]);
        CHECK_OK(ts_fill_(hi, 0.1));
        CHECK_OK(ts_tensor_to_host(hi, got, 8));
        CHECK_MSG(got[3] == (bf ? ts_plugin_f64_to_bf16(0.1) : ts_plugin_f64_to_f16(0.1)),
                  "%s: fill 0.1 as %s: 0x%04x", what, ts_dtype_name(dt), got[3]);
        ts_tensor_unref(h), ts_tensor_unref(back), ts_tensor_unref(d);
        ts_tensor_unref(i32), ts_tensor_unref(hi);
    }
    ts_tensor_unref(x);
}

static void check_plugin_dtypes(ts_device *d, const char *name)
{
    CHECK(ts_device_supports(d, TS_OP_CAST, TS_BF16) && ts_device_supports(d, TS_OP_COPY, TS_F16));
    /* every op (matmul around sgemm or on oneDNN's bfloat16 primitive), but the optimizer
     * steps: their state stays float32 */
    CHECK(ts_device_supports(d, TS_OP_MATMUL, TS_BF16) &&
          ts_device_supports(d, TS_OP_LAYER_NORM, TS_F16) &&
          !ts_device_supports(d, TS_OP_ADAM_STEP, TS_BF16));
    check_dtype_ops(d, name);
}

static void test_dtypes_on_every_plugin(void)
{
    ts_device *dev = tap_start();
    check_dtype_ops(dev, "the test device");
    tap_on_cpu_plugins(check_plugin_dtypes);
    /* a scalar's value, printing, and an op that does not take them yet */
    ts_tensor *s, *h, *sum = NULL;
    int64_t two = 2;
    float v[2] = {1.5f, -0.1f};
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &two, v, &s));
    CHECK_OK(ts_cast(s, TS_BF16, &h));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    CHECK_OK(ts_tensor_print(h, f));
    fclose(f);
    CHECK_STR_CONTAINS(buf, "bfloat16");
    CHECK_STR_CONTAINS(buf, "1.5");
    CHECK_STR_CONTAINS(buf, "-0.1001"); /* -0.1 in bfloat16 is -0.10009765625 */
    free(buf);
    ts_tensor *one;
    CHECK_OK(ts_tensor_narrow(h, 0, 1, 1, &one));
    double item;
    CHECK_OK(ts_tensor_item(one, &item));
    CHECK_MSG(item == -0.10009765625, "item of bfloat16 -0.1: %.17g", item);
    /* elementwise ops compute in float32 and round once; a matmul does not take them yet */
    CHECK_OK(ts_add(h, h, &sum));
    uint16_t sb[2];
    CHECK_OK(ts_tensor_to_host(sum, sb, sizeof sb));
    CHECK_MSG(ts_tensor_dtype(sum) == TS_BF16 && sb[0] == ts_plugin_f32_to_bf16(3.0f) &&
              sb[1] == ts_plugin_f32_to_bf16(2 * ts_plugin_bf16_to_f32(ts_plugin_f32_to_bf16(-0.1f))),
              "bfloat16 sum: 0x%04x 0x%04x", sb[0], sb[1]);
    /* a matmul too, accumulating in float32 and rounding once: (1, 2) @ (2, 1) */
    ts_tensor *row, *col, *mm = NULL;
    CHECK_OK(ts_tensor_reshape(h, 2, (const int64_t[]){1, 2}, &row));
    CHECK_OK(ts_tensor_reshape(h, 2, (const int64_t[]){2, 1}, &col));
    CHECK_OK(ts_matmul(row, col, &mm));
    uint16_t mb = 0;
    float m1 = ts_plugin_bf16_to_f32(ts_plugin_f32_to_bf16(-0.1f));
    CHECK_OK(ts_tensor_to_host(mm, &mb, sizeof mb));
    CHECK_MSG(ts_tensor_dtype(mm) == TS_BF16 && mb == ts_plugin_f32_to_bf16(2.25f + m1 * m1),
              "bfloat16 matmul: 0x%04x", mb);
    ts_tensor_unref(sum), ts_tensor_unref(row), ts_tensor_unref(col), ts_tensor_unref(mm);
    ts_tensor_unref(one), ts_tensor_unref(h), ts_tensor_unref(s);
    tap_end();
}

/* A checkpoint holds them as BF16 and F16 and loads them as such (every bit kept), or widened
 * into a float32 destination; .npy holds float16 as <f2 and loads it as float16. */
static void test_files_hold_them_as_such(void)
{
    ts_device *dev = tap_start();
    int64_t n = NE;
    ts_tensor *x, *b, *h;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n, edge_vals, &x));
    CHECK_OK(ts_cast(x, TS_BF16, &b));
    CHECK_OK(ts_cast(x, TS_F16, &h));
    ts_checkpoint *ck;
    CHECK_OK(ts_checkpoint_new(&ck));
    CHECK_OK(ts_checkpoint_add(ck, "b", b));
    CHECK_OK(ts_checkpoint_add(ck, "h", h));
    const char *path = tap_path_in(tap_tmpdir(), "half.safetensors");
    CHECK_OK(ts_checkpoint_save(ck, path));
    ts_checkpoint_free(ck);
    CHECK_OK(ts_checkpoint_load(path, dev, &ck));
    CHECK(!strcmp(ts_checkpoint_stored_dtype(ck, "b"), "BF16"));
    CHECK(!strcmp(ts_checkpoint_stored_dtype(ck, "h"), "F16"));
    ts_tensor *got = ts_checkpoint_get(ck, "b");
    CHECK(got && ts_tensor_dtype(got) == TS_BF16); /* as stored */
    ts_tensor *f32;
    float fw[NE];
    uint16_t hb0[NE];
    CHECK_OK(ts_tensor_empty(dev, TS_F32, 1, &n, &f32)); /* into float32: widened exactly */
    CHECK_OK(ts_checkpoint_restore(ck, "b", f32));
    CHECK_OK(ts_tensor_to_host(f32, fw, sizeof fw));
    CHECK_OK(ts_tensor_to_host(b, hb0, sizeof hb0));
    for (int i = 0; i < NE; i++)
        CHECK(isnan(fw[i]) ? is_nan16(hb0[i], 1) : fw[i] == ts_plugin_bf16_to_f32(hb0[i]));
    ts_tensor_unref(f32);
    for (int k = 0; k < 2; k++) {
        ts_tensor *src = k ? h : b, *dst;
        CHECK_OK(ts_tensor_empty(dev, k ? TS_F16 : TS_BF16, 1, &n, &dst));
        CHECK_OK(ts_checkpoint_restore(ck, k ? "h" : "b", dst));
        uint16_t a1[NE], a2[NE];
        CHECK_OK(ts_tensor_to_host(src, a1, sizeof a1));
        CHECK_OK(ts_tensor_to_host(dst, a2, sizeof a2));
        CHECK_MSG(!memcmp(a1, a2, sizeof a1), "%s restored with other bits", k ? "h" : "b");
        ts_tensor_unref(dst);
    }
    ts_tensor *wrong;
    CHECK_OK(ts_tensor_empty(dev, TS_F16, 1, &n, &wrong));
    CHECK_FAILS(ts_checkpoint_restore(ck, "b", wrong), TS_EDTYPE, "float16");
    ts_tensor_unref(wrong);
    ts_checkpoint_free(ck);
    const char *np = tap_path_in(tap_tmpdir(), "h.npy");
    CHECK_OK(ts_npy_save(h, np));
    ts_tensor *back;
    CHECK_OK(ts_npy_load(np, dev, &back));
    uint16_t w[NE], hb[NE];
    CHECK(ts_tensor_dtype(back) == TS_F16);
    CHECK_OK(ts_tensor_to_host(back, w, sizeof w));
    CHECK_OK(ts_tensor_to_host(h, hb, sizeof hb));
    CHECK(!memcmp(w, hb, sizeof w));
    CHECK_FAILS(ts_npy_save(b, np), TS_EDTYPE, "bfloat16");
    ts_tensor_unref(back), ts_tensor_unref(x), ts_tensor_unref(b), ts_tensor_unref(h);
    tap_end();
}

/* A plugin built for ABI 2.0 is never asked about them (its supports aborts if it is): on
 * its host memory the reference kernels cast, and ts_device_run says why it will not call
 * the plugin. */
static void test_older_plugin_never_sees_them(void)
{
    tap_start();
    ts_device *dev;
    CHECK_OK(ts_device_load(NULL, tap_fixture("minor0"), &dev));
    CHECK(!ts_device_supports(dev, TS_OP_CAST, TS_BF16) && !ts_device_supports(dev, TS_OP_COPY, TS_F16));
    check_dtype_ops(dev, "minor0");
    ts_operand in, out;
    memset(&in, 0, sizeof in);
    memset(&out, 0, sizeof out);
    in.dtype = TS_F16;
    out.dtype = TS_F32;
    ts_kernel_call call = {.struct_size = sizeof call, .op = TS_OP_CAST, .ninputs = 1,
                           .noutputs = 1, .inputs = &in, .outputs = &out};
    CHECK_FAILS(ts_device_run(dev, &call), TS_ENOTSUP, "built for plugin ABI 2.0",
                "the dtype float16", "rebuild");
    ts_device_unload(dev);
    /* a 2.5 plugin claiming comparisons but no bfloat16 op gets no bfloat16 comparison: on
     * its host memory the reference kernels compare, and ts_device_run says why */
    CHECK_OK(ts_device_load(NULL, tap_fixture("cmpu8"), &dev));
    float v[3] = {1.0f, -2.0f, 0.5f}, w[3] = {1.0f, 3.0f, 0.25f};
    int64_t n3 = 3;
    ts_tensor *a, *b, *ah, *bh, *lt;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n3, v, &a));
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n3, w, &b));
    CHECK_OK(ts_cast(a, TS_BF16, &ah));
    CHECK_OK(ts_cast(b, TS_BF16, &bh));
    CHECK_OK(ts_lt(ah, bh, &lt));
    uint8_t r[3];
    CHECK_OK(ts_tensor_to_host(lt, r, sizeof r));
    CHECK(r[0] == 0 && r[1] == 1 && r[2] == 0);
    in.dtype = TS_BF16;
    ts_operand ins[2] = {in, in}, o8 = out;
    o8.dtype = TS_U8;
    ts_binary_params bp = {TS_BINARY_LT};
    ts_kernel_call cc = {.struct_size = sizeof cc, .op = TS_OP_BINARY, .ninputs = 2,
                         .noutputs = 1, .inputs = ins, .outputs = &o8, .params = &bp,
                         .params_size = sizeof bp};
    CHECK_FAILS(ts_device_run(dev, &cc), TS_ENOTSUP, "takes no bfloat16 inputs", "cast");
    ts_tensor_unref(a), ts_tensor_unref(b), ts_tensor_unref(ah), ts_tensor_unref(bh);
    ts_tensor_unref(lt);
    ts_device_unload(dev);
    tap_end();
}

/* A raw MATMUL call on dev: out (n x n) = a @ b, operands bf16 over host buffers (the CPU
 * plugins' memory is host memory), each dtype as given. */
static ts_status raw_matmul(ts_device *dev, void *a, int32_t ta, void *b, int32_t tb, void *c,
                            int32_t tc, int64_t n)
{
    ts_operand op[3];
    void *data[3] = {a, b, c};
    int32_t dts[3] = {ta, tb, tc};
    for (int i = 0; i < 3; i++) {
        memset(&op[i], 0, sizeof op[i]);
        op[i].data = data[i];
        op[i].dtype = dts[i];
        op[i].ndim = 2;
        op[i].shape[0] = op[i].shape[1] = n;
        op[i].strides[0] = n;
        op[i].strides[1] = 1;
    }
    ts_matmul_params mp = {1.0, 0.0};
    ts_kernel_call call = {.struct_size = sizeof call, .op = TS_OP_MATMUL, .ninputs = 2,
                           .noutputs = 1, .inputs = op, .outputs = op + 2, .params = &mp,
                           .params_size = sizeof mp};
    return ts_device_run(dev, &call);
}

/* Through float32 (cpu_blas converts around sgemm): an output that aliases an input is
 * computed from the input as it was (both are copies), leaving no message and no pool block;
 * float operands of two dtypes are refused as the ABI says. */
static void check_via_float32_calls(ts_device *dev, const char *name)
{
    enum { N = 4 };
    ts_tensor *a;
    CHECK_OK(ts_tensor_empty(dev, TS_BF16, 1, (const int64_t[]){2 * N * N}, &a));
    uint16_t *buf = ts_tensor_data(a), want[N * N];
    for (int i = 0; i < 2 * N * N; i++)
        buf[i] = ts_plugin_f32_to_bf16((float)(i % 7) - 3.0f);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0;
            for (int k = 0; k < N; k++)
                acc += ts_plugin_bf16_to_f32(buf[i * N + k]) *
                       ts_plugin_bf16_to_f32(buf[N * N + k * N + j]);
            want[i * N + j] = ts_plugin_f32_to_bf16(acc);
        }
    ts_status st = raw_matmul(dev, buf, TS_BF16, buf + N * N, TS_BF16, buf, TS_BF16, N);
    CHECK_MSG(st == TS_OK && !ts_last_error()[0], "%s: bf16 matmul into its own input: %s: %s",
              name, ts_status_name(st), ts_last_error());
    CHECK_MSG(!memcmp(buf, want, sizeof want), "%s: the aliased output is not a @ b", name);
    float f[N * N];
    CHECK_FAILS(raw_matmul(dev, buf, TS_BF16, f, TS_F32, buf + N * N, TS_BF16, N), TS_EINVAL,
                "dtypes differ");
    ts_tensor_unref(a);
}

/* Casts on dev against plugin.h, bit for bit: all 65,536 patterns of each 16-bit format to
 * float32, and float32 to each over 2^21 patterns spread over the whole space (both signs,
 * NaNs, infinities) and every pattern of float16's subnormal and rounding range whose low 12
 * bits sit at a rounding edge. The CPU plugins' dense conversions are vectorized or use the
 * CPU's F16C instruction; these must give the very bits of the scalar definitions. */
static void check_casts_bit_exact(ts_device *dev, const char *what)
{
    int64_t n16 = 65536;
    uint16_t *h = malloc(2 * (size_t)n16);
    float *w = malloc(4 * (size_t)n16);
    for (int64_t i = 0; i < n16; i++)
        h[i] = (uint16_t)i;
    for (int bf = 0; bf < 2; bf++) {
        ts_tensor *t, *f;
        CHECK_OK(ts_tensor_from_host(dev, bf ? TS_BF16 : TS_F16, 1, &n16, h, &t));
        CHECK_OK(ts_cast(t, TS_F32, &f));
        CHECK_OK(ts_tensor_to_host(f, w, 4 * (size_t)n16));
        int bad = 0;
        for (int64_t i = 0; i < n16 && bad < 3; i++) {
            float want = widen(h[i], bf);
            if (memcmp(&want, &w[i], 4)) {
                bad++;
                CHECK_MSG(0, "%s: %s 0x%04x widens to %a, not %a", what, bf ? "bf16" : "f16",
                          h[i], w[i], want);
            }
        }
        ts_tensor_unref(t), ts_tensor_unref(f);
    }
    free(h), free(w);
    const uint32_t edges[] = {0x000, 0x001, 0x7ff, 0x800, 0x801, 0xfff, 0x1000, 0x1fff};
    int64_t nf = (1 << 21) + 2 * 22528 * 8, k = 0;
    uint32_t *u = malloc(4 * (size_t)nf);
    uint16_t *got = malloc(2 * (size_t)nf);
    for (int64_t i = 0; i < (1 << 21); i++)
        u[k++] = (uint32_t)i * 0x9E3779B1u;
    for (uint32_t hi = 0x33000000u >> 13; hi < 0x38800000u >> 13 && k + 16 <= nf; hi += 2)
        for (int e = 0; e < 8; e++)
            u[k++] = (hi << 13) | edges[e], u[k++] = 0x80000000u | (hi << 13) | edges[e];
    /* dense (the vectorized / F16C runs) and every other element (the strided loops) */
    for (int run = 0; run < 4; run++) {
        int bf = run & 1, strided = run >> 1;
        ts_tensor *t, *v = NULL, *c;
        CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &k, u, &t));
        if (strided)
            CHECK_OK(ts_tensor_slice(t, 0, 0, k, 2, &v));
        CHECK_OK(ts_cast(v ? v : t, bf ? TS_BF16 : TS_F16, &c));
        int64_t m = ts_tensor_numel(c);
        CHECK_OK(ts_tensor_to_host(c, got, 2 * (size_t)m));
        int bad = 0;
        for (int64_t i = 0; i < m && bad < 3; i++) {
            float f;
            uint32_t ui = u[strided ? 2 * i : i];
            memcpy(&f, &ui, 4);
            uint16_t want = narrow(f, bf);
            if (got[i] != want) {
                bad++;
                CHECK_MSG(0, "%s: float32 0x%08x to %s%s: 0x%04x, not 0x%04x", what, ui,
                          bf ? "bf16" : "f16", strided ? " (strided)" : "", got[i], want);
            }
        }
        ts_tensor_unref(t), ts_tensor_unref(v), ts_tensor_unref(c);
    }
    free(u), free(got);
}

/* Elementwise arithmetic on dense 16-bit runs narrows its float32 result as plugin.h does:
 * every pattern plus, minus and times eight others, each broadcast along a row and dense, and
 * with a float32 scalar (products of two 8- or 11-bit significands round, and the small ones
 * land among the subnormals, which the CPU plugins' vectorized narrowing handles apart; the
 * bfloat16 add, sub and mul run in one pass where the CPU has AVX-512), against the scalar
 * float32 result narrowed once. */
static void check_products_narrow_bit_exact(ts_device *dev, const char *what)
{
    enum { NB = 8 };
    const uint16_t bs[2][NB] = {{0x3c01, 0xbc03, 0x0401, 0x1fff, 0x7bff, 0x0001, 0x3555, 0xc000},
                                {0x3f81, 0xbf83, 0x0081, 0x1fff, 0x7f7f, 0x0001, 0x3eab, 0xc000}};
    static const char *const names[] = {"+", "-", "*", "* (scalar)", "+ (scalar)"};
    const double scalar = 0.3; /* taken in float32 by the 16-bit ops */
    int64_t n = 65536, shape[2] = {NB, n}, bshape[2] = {NB, 1};
    uint16_t *a = malloc(2 * (size_t)n), *got = malloc(2 * (size_t)(n * NB));
    for (int64_t i = 0; i < n; i++)
        a[i] = (uint16_t)i;
    for (int bf = 0; bf < 2; bf++) {
        int32_t dt = bf ? TS_BF16 : TS_F16;
        ts_tensor *ta, *tb, *wa, *wb, *y;
        CHECK_OK(ts_tensor_from_host(dev, dt, 1, &n, a, &ta));
        CHECK_OK(ts_tensor_from_host(dev, dt, 2, bshape, bs[bf], &tb));
        CHECK_OK(ts_tensor_expand(ta, 2, shape, &wa));
        CHECK_OK(ts_tensor_contiguous(wa, &y)); /* a dense (NB, n) */
        ts_tensor_unref(wa);
        wa = y;
        CHECK_OK(ts_tensor_expand(tb, 2, shape, &wb));
        CHECK_OK(ts_tensor_contiguous(wb, &y)); /* b dense too */
        ts_tensor_unref(wb);
        wb = y;
        /* each op with b broadcast along the rows and dense, then with a scalar */
        for (int c = 0; c < 8; c++) {
            int op = c < 6 ? c % 3 : c - 3;
            const ts_tensor *b = c < 3 ? tb : wb;
            ts_status st = op == 0   ? ts_add(wa, b, &y)
                           : op == 1 ? ts_sub(wa, b, &y)
                           : op == 2 ? ts_mul(wa, b, &y)
                           : op == 3 ? ts_mul_scalar(wa, scalar, &y)
                                     : ts_add_scalar(wa, scalar, &y);
            CHECK_OK(st);
            if (st)
                continue;
            CHECK_OK(ts_tensor_to_host(y, got, 2 * (size_t)(n * NB)));
            ts_tensor_unref(y);
            int bad = 0;
            for (int j = 0; j < NB; j++)
                for (int64_t i = 0; i < n && bad < 3; i++) {
                    float x = widen(a[i], bf), v = op >= 3 ? (float)scalar : widen(bs[bf][j], bf);
                    float p = op == 0 || op == 4 ? x + v : op == 1 ? x - v : x * v;
                    uint16_t want = narrow(p, bf), g = got[j * n + i];
                    if (g != want && !(isnan(p) && is_nan16(g, bf))) {
                        bad++;
                        CHECK_MSG(0, "%s: %s 0x%04x %s 0x%04x (%s b) gives 0x%04x, not 0x%04x",
                                  what, bf ? "bf16" : "f16", a[i], names[op],
                                  op >= 3 ? 0 : bs[bf][j], c < 3 ? "broadcast" : "dense", g,
                                  want);
                    }
                }
        }
        ts_tensor_unref(ta), ts_tensor_unref(tb), ts_tensor_unref(wa), ts_tensor_unref(wb);
    }
    free(a), free(got);
}

/* Sums and means of 16-bit floats: over the rows of a matrix (a bias gradient) the CPU
 * plugins read the 16-bit input as it is, other layouts go through float32; either way the
 * result is the float32 reduction narrowed once, and the plugin runs it (no reference kernel
 * stands in). The values are multiples of 2^-8, so every order of summation is exact. */
static void check_sums_narrow_once(ts_device *dev, const char *what)
{
    enum { M = 37, N = 300 };
    int64_t shape[2] = {M, N}, n = M * N;
    uint16_t *x = malloc(2 * (size_t)n), got[N];
    double *v = malloc(sizeof *v * (size_t)n);
    for (int bf = 0; bf < 2; bf++) {
        for (int64_t i = 0; i < n; i++) {
            v[i] = (double)((int)((i * 7919 + 13) % 513) - 256) / 256.0;
            x[i] = narrow((float)v[i], bf);
        }
        ts_tensor *t, *y;
        CHECK_OK(ts_tensor_from_host(dev, bf ? TS_BF16 : TS_F16, 2, shape, x, &t));
        ts_profile_reset();
        int was = ts_profile_enable(1);
        for (int k = 0; k < 3; k++) { /* sum over rows, mean over rows, sum over columns */
            int dim = k == 2 ? 1 : 0;
            CHECK_OK(k == 1 ? ts_mean(t, 1, &dim, 0, &y) : ts_sum(t, 1, &dim, 0, &y));
            int64_t m = ts_tensor_numel(y);
            CHECK_OK(ts_tensor_to_host(y, got, 2 * (size_t)m));
            for (int64_t j = 0; j < m; j++) {
                double sum = 0;
                for (int64_t i = 0; i < (dim ? N : M); i++)
                    sum += dim ? v[j * N + i] : v[i * N + j];
                uint16_t want = narrow((float)(k == 1 ? sum / M : sum), bf);
                if (got[j] != want) {
                    CHECK_MSG(0, "%s: %s %s over dim %d, element %lld: 0x%04x, not 0x%04x", what,
                              bf ? "bf16" : "f16", k == 1 ? "mean" : "sum", dim, (long long)j,
                              got[j], want);
                    break;
                }
            }
            ts_tensor_unref(y);
        }
        ts_profile_enable(was);
        ts_profile_entry e[64];
        size_t ne = ts_profile_read(e, 64), reduces = 0;
        for (size_t i = 0; i < ne && i < 64; i++)
            if (e[i].op == TS_OP_REDUCE) {
                reduces += e[i].calls;
                CHECK_MSG(e[i].reference_calls == 0 && e[i].declined_calls == 0,
                          "%s: a %s reduction ran on the reference kernels", what,
                          bf ? "bf16" : "f16");
            }
        CHECK_MSG(reduces == 3, "%s: %zu reductions counted, not 3", what, reduces);
        ts_tensor_unref(t);
    }
    free(x), free(v);
}

/* Softmax and its gradient on 16-bit rows, as the attention's composed path runs them under
 * autocast: computed in float32, rounded once. The forward against the plugin's own float32
 * softmax of the widened values, narrowed (rows of 37, of HK_HALF_ROW = 4096, the longest the
 * host kernels run in place, and of 4097, which go through float32 copies); the gradient
 * against y (g - sum(g y)) on the host from the forward's own 16-bit y, whose products with
 * g (8- or 11-bit significands each) are exact in float32 and whose sums are exact in double,
 * so that only the roundings the kernel must make remain. */
static void check_softmax_narrow_once(ts_device *dev, const char *what)
{
    static const int64_t lens[] = {37, 4096, 4097};
    for (int bf = 0; bf < 2; bf++)
        for (size_t li = 0; li < 3; li++) {
            const int64_t M = 3, N = lens[li], n = M * N;
            uint16_t *x = malloc(2 * (size_t)n), *y = malloc(2 * (size_t)n);
            uint16_t *g = malloc(2 * (size_t)n), *gx = malloc(2 * (size_t)n);
            uint16_t *want = malloc(2 * (size_t)n);
            float *xf = malloc(4 * (size_t)n), *yf = malloc(4 * (size_t)n);
            for (int64_t i = 0; i < n; i++) {
                xf[i] = widen(narrow((float)((i * 7919 + 17) % 1201 - 600) / 97.0f, bf), bf);
                x[i] = narrow(xf[i], bf);
                g[i] = narrow((float)((i * 104729 + 5) % 129 - 64) / 64.0f, bf);
            }
            const int64_t shape[2] = {M, N};
            ts_tensor *t, *t32, *yt, *y32, *gt;
            CHECK_OK(ts_tensor_from_host(dev, bf ? TS_BF16 : TS_F16, 2, shape, x, &t));
            CHECK_OK(ts_tensor_from_host(dev, TS_F32, 2, shape, xf, &t32));
            CHECK_OK(ts_tensor_from_host(dev, bf ? TS_BF16 : TS_F16, 2, shape, g, &gt));
            CHECK_OK(ts_tensor_set_requires_grad(t, 1));
            CHECK_OK(ts_softmax(t, 1, &yt));
            CHECK_OK(ts_softmax(t32, 1, &y32));
            CHECK_OK(ts_tensor_to_host(yt, y, 2 * (size_t)n));
            CHECK_OK(ts_tensor_to_host(y32, yf, 4 * (size_t)n));
            int64_t bad = -1;
            for (int64_t i = 0; i < n && bad < 0; i++)
                if (y[i] != narrow(yf[i], bf))
                    bad = i;
            CHECK_MSG(bad < 0, "%s: %s softmax, rows of %lld: element %lld is 0x%04x, not 0x%04x",
                      what, bf ? "bf16" : "f16", (long long)N, (long long)bad,
                      bad < 0 ? 0 : y[bad], bad < 0 ? 0 : narrow(yf[bad], bf));
            CHECK_OK(ts_backward(yt, gt, 0));
            const ts_tensor *gr = ts_tensor_grad(t);
            CHECK(gr && ts_tensor_dtype(gr) == ts_tensor_dtype(t));
            if (gr)
                CHECK_OK(ts_tensor_to_host(gr, gx, 2 * (size_t)n));
            for (int64_t r = 0; r < M; r++) {
                double sum = 0;
                for (int64_t j = 0; j < N; j++)
                    sum += (double)(widen(g[r * N + j], bf) * widen(y[r * N + j], bf));
                const float dot = (float)sum;
                for (int64_t j = 0; j < N; j++) {
                    float yv = widen(y[r * N + j], bf), gv = widen(g[r * N + j], bf);
                    want[r * N + j] = narrow(yv * (gv - dot), bf);
                }
            }
            bad = -1;
            for (int64_t i = 0; gr && i < n && bad < 0; i++)
                if (gx[i] != want[i])
                    bad = i;
            CHECK_MSG(bad < 0,
                      "%s: %s softmax gradient, rows of %lld: element %lld is 0x%04x, not 0x%04x",
                      what, bf ? "bf16" : "f16", (long long)N, (long long)bad,
                      bad < 0 ? 0 : gx[bad], bad < 0 ? 0 : want[bad]);
            ts_tensor_unref(t), ts_tensor_unref(t32), ts_tensor_unref(yt);
            ts_tensor_unref(y32), ts_tensor_unref(gt);
            free(x), free(y), free(g), free(gx), free(want), free(xf), free(yf);
        }
}

/* A causal mask's rows: softmax skips the exp of a -inf tail (whole blocks of 16) and gives
 * the same bits as the same row whose tail is -1e30 instead (whose exp is as exactly 0 but is
 * computed), in float32 and in bfloat16; the tail exactly 0; a row all -inf NaN as before. */
static void check_softmax_masked_tail(ts_device *dev, const char *what)
{
    static const int64_t tails[] = {0, 5, 16, 17, 33, 100, 127, 128};
    enum { M = sizeof tails / sizeof *tails };
    for (int dt = 0; dt < 2; dt++)
        for (int64_t N = 37; N <= 128; N += 91) { /* 37 (never cut) and 128 */
            float *a = malloc(4 * (size_t)(M * N)), *b = malloc(4 * (size_t)(M * N));
            float *ya = malloc(4 * (size_t)(M * N)), *yb = malloc(4 * (size_t)(M * N));
            for (int64_t r = 0; r < M; r++)
                for (int64_t j = 0; j < N; j++) {
                    float v = widen(narrow((float)((r * N + j) * 37 % 101 - 50) / 9.0f, 1), 1);
                    int masked = j >= N - (tails[r] < N ? tails[r] : N);
                    a[r * N + j] = masked ? -INFINITY : v;
                    b[r * N + j] = masked ? -1e30f : v;
                }
            const int64_t shape[2] = {M, N};
            ts_tensor *ta, *tb, *sa, *sb, *ca, *cb, *fa, *fb;
            CHECK_OK(ts_tensor_from_host(dev, TS_F32, 2, shape, a, &ta));
            CHECK_OK(ts_tensor_from_host(dev, TS_F32, 2, shape, b, &tb));
            CHECK_OK(ts_cast(ta, dt ? TS_BF16 : TS_F32, &ca));
            CHECK_OK(ts_cast(tb, dt ? TS_BF16 : TS_F32, &cb));
            CHECK_OK(ts_softmax(ca, 1, &sa));
            CHECK_OK(ts_softmax(cb, 1, &sb));
            CHECK_OK(ts_cast(sa, TS_F32, &fa));
            CHECK_OK(ts_cast(sb, TS_F32, &fb));
            CHECK_OK(ts_tensor_to_host(fa, ya, 4 * (size_t)(M * N)));
            CHECK_OK(ts_tensor_to_host(fb, yb, 4 * (size_t)(M * N)));
            int64_t bad = -1;
            for (int64_t r = 0; r < M && bad < 0; r++)
                for (int64_t j = 0; j < N && bad < 0; j++) {
                    int64_t i = r * N + j;
                    if (tails[r] >= N ? ya[i] == ya[i] /* all -inf: NaN */
                                      : memcmp(&ya[i], &yb[i], 4) ||
                                            (a[i] == -INFINITY && ya[i] != 0.0f))
                        bad = i;
                }
            CHECK_MSG(bad < 0, "%s: %s softmax of a row of %lld with a -inf tail: element %lld "
                      "is %a, with -1e30 %a", what, dt ? "bf16" : "f32", (long long)N,
                      (long long)bad, bad < 0 ? 0.0 : ya[bad], bad < 0 ? 0.0 : yb[bad]);
            ts_tensor_unref(ta), ts_tensor_unref(tb), ts_tensor_unref(ca), ts_tensor_unref(cb);
            ts_tensor_unref(sa), ts_tensor_unref(sb), ts_tensor_unref(fa), ts_tensor_unref(fb);
            free(a), free(b), free(ya), free(yb);
        }
}

static void test_plugin_casts_bit_exact(void)
{
    ts_device *dev = tap_start();
    check_casts_bit_exact(dev, "the test device");
    check_products_narrow_bit_exact(dev, "the test device");
    tap_on_cpu_plugins(check_products_narrow_bit_exact);
    tap_on_cpu_plugins(check_sums_narrow_once);
    tap_on_cpu_plugins(check_softmax_narrow_once);
    tap_on_cpu_plugins(check_softmax_masked_tail);
    tap_on_cpu_plugins(check_casts_bit_exact);
    tap_on_cpu_plugins(check_via_float32_calls);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_every_pattern_round_trips),
        TAP_TEST(test_narrowing_rounds_to_nearest_even),
        TAP_TEST(test_edges),
        TAP_TEST(test_double_rounds_once),
        TAP_TEST(test_dtypes_on_every_plugin),
        TAP_TEST(test_files_hold_them_as_such),
        TAP_TEST(test_older_plugin_never_sees_them),
        TAP_TEST(test_plugin_casts_bit_exact),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
