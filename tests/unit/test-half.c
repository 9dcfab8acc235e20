/* tests/unit/test-half.c: the bfloat16 and float16 conversions of plugin.h, bit for bit:
 * every one of the 65,536 patterns of each widens exactly and narrows back to itself (NaN to
 * a quiet NaN of the same sign); narrowing float32 rounds to nearest, ties to even, against
 * an independent computation in double (and against the compiler's _Float16 where it has
 * one) over every midpoint between neighbouring values, the patterns around them, and a
 * stride through all float32 patterns; a table of the edges (the largest finite value, the
 * overflow threshold, subnormals, the underflow tie, signed zeros, infinities, NaN); and a
 * double narrows correctly where rounding through float32 to nearest would round twice. */
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

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_every_pattern_round_trips),
        TAP_TEST(test_narrowing_rounds_to_nearest_even),
        TAP_TEST(test_edges),
        TAP_TEST(test_double_rounds_once),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
