/* tests/unit/test-vmath.c: the host kernels' vectorizable float exp, tanh and GELU
 * (kernels/host/vmath.h) against double precision: within 2 ulp of the correctly rounded
 * result on a sweep of float bit patterns (every 61st, both signs, subnormals and the
 * overflow and underflow edges included), and the special values exactly. */
#include "../tap.h"
#include "../../kernels/host/vmath.h"

#include <math.h>

/* |got - want| in units of the float spacing at want (the subnormal spacing below 2^-126). */
static double ulps(float got, double want)
{
    if (isnan(want))
        return isnan(got) ? 0 : INFINITY;
    float w = (float)want;
    if (isinf(w))
        return got == w ? 0 : INFINITY;
    double spacing = fabs(want) < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(w) - 23);
    return fabs((double)got - want) / spacing;
}

static void sweep(const char *name, float (*f)(float), double (*ref)(double))
{
    double worst = 0;
    float at = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += 61) {
        uint32_t u = (uint32_t)b;
        float x;
        memcpy(&x, &u, sizeof x);
        double e = ulps(f(x), ref((double)x));
        if (e > worst)
            worst = e, at = x;
    }
    printf("# %s: worst %.3f ulp at %a\n", name, worst, (double)at);
    CHECK_MSG(worst <= 2.0, "%s: %.3f ulp at %a (f = %a, want %a)", name, worst, (double)at,
              (double)f(at), ref((double)at));
}

static float expf_v(float x) { return hk_expf(x); }
static float tanhf_v(float x) { return hk_tanhf(x); }

static void test_exp(void)
{
    sweep("exp", expf_v, exp);
    CHECK(hk_expf(INFINITY) == INFINITY);
    CHECK(hk_expf(-INFINITY) == 0.0f);
    CHECK(isnan(hk_expf(NAN)) && isnan(hk_expf(-NAN)));
    CHECK(hk_expf(0.0f) == 1.0f && hk_expf(-0.0f) == 1.0f);
    CHECK(isfinite(hk_expf(88.72283f)) && hk_expf(88.7229f) == INFINITY);
    /* the subnormal tail, down to the smallest, then zero */
    for (float x = -87.0f; x > -105.0f; x -= 0.25f)
        CHECK_MSG(ulps(hk_expf(x), exp((double)x)) <= 2.0, "exp(%g) = %a", (double)x,
                  (double)hk_expf(x));
    CHECK(hk_expf(-104.0f) == 0.0f && hk_expf(-1e30f) == 0.0f);
}

static void test_tanh(void)
{
    sweep("tanh", tanhf_v, tanh);
    CHECK(hk_tanhf(INFINITY) == 1.0f && hk_tanhf(-INFINITY) == -1.0f);
    CHECK(hk_tanhf(20.0f) == 1.0f && hk_tanhf(-1e30f) == -1.0f);
    CHECK(isnan(hk_tanhf(NAN)));
    CHECK(hk_tanhf(0.0f) == 0.0f && !signbit(hk_tanhf(0.0f)));
    CHECK(hk_tanhf(-0.0f) == 0.0f && signbit(hk_tanhf(-0.0f)));
    CHECK(hk_tanhf(0x1p-140f) == 0x1p-140f); /* tiny: tanh x = x */
    for (float x = -12.0f; x <= 12.0f; x += 0.001f) /* odd, and bounded by 1 */
        CHECK_MSG(hk_tanhf(-x) == -hk_tanhf(x) && fabsf(hk_tanhf(x)) <= 1.0f, "tanh(%a)",
                  (double)x);
}

/* GELU's tanh form and its derivative against double precision, from the float argument of
 * the exp each computes (its rounding is the formula's, shared by every evaluation in float):
 * the exp's 2 ulp, the sum's and the division's roundings give at most 4 ulp of GELU; in the
 * derivative, s's 4 ulp become an absolute error 4 * 2^-24 s in 1 - s, times the second
 * term's factor. Every 61st float bit pattern. */
static void test_gelu_tanh(void)
{
    const float c = 0.7978845608028654f, k = 0.044715f;
    double worst_g = 0, worst_d = 0;
    float at_g = 0, at_d = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += 61) {
        uint32_t u = (uint32_t)b;
        float x;
        memcpy(&x, &u, sizeof x);
        /* Below x = -10.07 e^-2u overflows float: the result is a zero of x's sign for a
         * value of magnitude below 2^-124 (the tanh form gave zero from x = -5.9 on, for
         * values up to 1e-7). */
        float ag = -2.0f * (c * (x + k * x * x * x));
        double want = (double)x / (1.0 + exp((double)ag)), e;
        float gg = hk_gelu_tanhf(x);
        if (ag > 88.72283935546875f)
            e = gg == 0.0f && signbit(gg) == signbit(x) && fabs(want) < 0x1p-124 ? 0 : INFINITY;
        else
            e = ulps(gg, want);
        if (e > worst_g)
            worst_g = e, at_g = x;
        float x2 = x * x, ad = -2.0f * (c * x * (1.0f + k * x2));
        double sd = 1.0 / (1.0 + exp((double)ad));
        double f = 2.0 * (double)x * (double)c * (1.0 + 3.0 * (double)k * (double)x2);
        double wd = sd + f * sd * (1.0 - sd), got = hk_gelu_tanh_derivf(x);
        if (isinf(x2) || isnan(x)) { /* |x| >= 2^64: x^2 overflows, NaN as in the tanh form */
            e = isnan(got) ? 0 : INFINITY;
        } else if (ad > 88.72283935546875f) { /* e^ad overflows: zero, for below 2^-120 */
            e = got == 0.0 && fabs(wd) < 0x1p-120 ? 0 : INFINITY;
        } else {
            float w = (float)wd;
            double ulp = fabs(wd) < 0x1p-126 ? 0x1p-149 : ldexp(1.0, ilogb(w) - 23);
            e = fabs(got - wd) / (4 * ulp + 4 * 0x1p-24 * sd * fabs(f));
        }
        if (e > worst_d)
            worst_d = e, at_d = x;
    }
    printf("# gelu_tanh: worst %.3f ulp at %a; derivative: worst %.3f of its bound at %a\n",
           worst_g, (double)at_g, worst_d, (double)at_d);
    CHECK_MSG(worst_g <= 4.0, "gelu_tanh: %.3f ulp at %a (got %a)", worst_g, (double)at_g,
              (double)hk_gelu_tanhf(at_g));
    CHECK_MSG(worst_d <= 1.0, "gelu_tanh derivative: %.3f of the bound at %a (got %a)", worst_d,
              (double)at_d, (double)hk_gelu_tanh_derivf(at_d));
    /* the special values as the tanh form gives them */
    CHECK(hk_gelu_tanhf(0.0f) == 0.0f && !signbit(hk_gelu_tanhf(0.0f)));
    CHECK(hk_gelu_tanhf(-0.0f) == 0.0f && signbit(hk_gelu_tanhf(-0.0f)));
    CHECK(hk_gelu_tanhf(INFINITY) == INFINITY && hk_gelu_tanhf(1e30f) == 1e30f);
    CHECK(hk_gelu_tanhf(-1e30f) == 0.0f && isnan(hk_gelu_tanhf(NAN)));
    CHECK(hk_gelu_tanh_derivf(0.0f) == 0.5f && hk_gelu_tanh_derivf(30.0f) == 1.0f);
    CHECK(hk_gelu_tanh_derivf(-30.0f) == 0.0f && isnan(hk_gelu_tanh_derivf(NAN)));
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_exp),
        TAP_TEST(test_tanh),
        TAP_TEST(test_gelu_tanh),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
