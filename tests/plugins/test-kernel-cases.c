/* tests/plugins/test-kernel-cases.c: the kernel-case table (tools/kernel_cases.h), which
 * `tessera plugin-check` runs too, on every CPU plugin: every (op, dtype) the plugin claims,
 * every case of its builder, in every layout of the operand harness, with two seeds of
 * values, against the float64 reference within the tolerance derived from the computation.
 * A claim no case covers fails (a new op needs its builder), and so does a kernel that is off
 * by far less than a fixed tolerance would see (the sloppyexp fixture). */
#include "../../tools/kernel_cases.h"
#include "kt.h"

/* Runs every case of every claim of dev; the number of case runs that agreed. */
static int64_t run_all(ts_device *dev, const char *name)
{
    int claims = 0;
    int64_t agreed = 0;
    for (int32_t op = TS_OP_NONE + 1; op < TS_OP_COUNT; op++)
        for (int32_t dt = 0; dt < TS_DTYPE_COUNT; dt++) {
            if (!ts_device_supports(dev, op, dt))
                continue;
            claims++;
            caselist l = {0};
            kc_build(dev, op, dt, &l);
            int64_t ran = 0;
            for (int i = 0; i < l.n; i++)
                for (int lay = 0; lay < OPH_NLAYOUTS; lay++)
                    for (uint64_t seed = 1; seed <= 2; seed++) {
                        char why[512] = "";
                        int r = kc_run(dev, &l.v[i], (oph_layout)lay,
                                       seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)(op * 64 + lay),
                                       why, sizeof why);
                        CHECK_MSG(r != 0, "%s: %s (%s layout)", name, why,
                                  oph_layout_name(lay));
                        ran += r == 1;
                    }
            CHECK_MSG(ran > 0, "%s claims %s %s, but no case of the table ran on it (%d cases): "
                      "the op needs a builder in tools/kernel_cases.c", name,
                      ts_plugin_op_name(op), ts_dtype_name(dt), l.n);
            agreed += ran;
            free(l.v);
        }
    CHECK_MSG(claims > 10, "%s claims only %d (op, dtype) pairs", name, claims);
    printf("# %s: %d claims, %lld case runs agree with the float64 reference\n", name, claims,
           (long long)agreed);
    return agreed;
}

static void test_plugin(const char *name)
{
    ts_device *dev = tap_start();
    (void)dev;
    run_all(kt_load(name), name);
    tap_end();
}

static void test_cpu_blas(void)
{
    test_plugin("cpu_blas");
}

static void test_cpu_onednn(void)
{
    test_plugin("cpu_onednn");
}

/* exp off by 5e-5 relative (840 ulps), inside a fixed 2e-4 tolerance: the derived one sees
 * it, in every layout, and names the case, the value and the bound. */
static void test_sloppy_kernel_fails(void)
{
    tap_start();
    char path[4096];
    const char *dir = getenv("TS_BUILDDIR");
    snprintf(path, sizeof path, "%s/tests/fixtures/.libs/sloppyexp.so", dir ? dir : ".");
    ts_device *dev;
    if (ts_device_load(NULL, path, &dev) != TS_OK)
        SKIP("the sloppyexp fixture is not built: %s", ts_last_error());
    caselist l = {0};
    kc_build(dev, TS_OP_UNARY, TS_F32, &l);
    int failed = 0, exp_cases = 0;
    for (int i = 0; i < l.n; i++) {
        if (!strstr(l.v[i].what, "exp"))
            continue;
        exp_cases++;
        char why[512] = "";
        int r = kc_run(dev, &l.v[i], OPH_STRIDED, 7, why, sizeof why);
        int64_t n = 1;
        for (int d = 0; d < l.v[i].out[0].ndim; d++)
            n *= l.v[i].out[0].shape[d];
        if (r == 0) {
            failed++;
            CHECK_STR_CONTAINS(why, "float64 reference");
            CHECK_STR_CONTAINS(why, "tolerance");
        } else {
            CHECK_MSG(n == 0, "%s passed: %s", l.v[i].what, why); /* only an empty one may */
        }
    }
    CHECK_MSG(exp_cases > 0 && failed > 0, "%d of %d exp cases failed", failed, exp_cases);
    free(l.v);
    ts_device_unload(dev);
    tap_end();
}

int main(int argc, char **argv)
{
    /* LeakSanitizer's stop-the-world tracer crashes once oneDNN's primitives have run their
     * threads in this process (as in test-onednn.c): no per-test LSan check here. */
    setenv("TS_NO_LSAN_CHECK", "1", 1);
    static const tap_test tests[] = {
        TAP_TEST(test_cpu_blas),
        TAP_TEST(test_cpu_onednn),
        TAP_TEST(test_sloppy_kernel_fails),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
