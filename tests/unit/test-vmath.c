/* tests/unit/test-vmath.c: the host kernels' vectorizable float exp and tanh
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

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_exp),
        TAP_TEST(test_tanh),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
