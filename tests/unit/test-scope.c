/* tests/unit/test-scope.c: scoped tensors. Results equal the status API's; the status is
 * sticky (the first failure's message survives, nothing runs after it, a NULL input fails
 * once); kept tensors outlive the scope and everything else is released; scopes nest and
 * ending an outer one ends the inner ones; a scope's bookkeeping stops allocating once warm. */
#include <math.h>

#include "../tap.h"

static ts_device *dev;

static void setup(void)
{
    dev = tap_start();
}

static ts_tensor *vec(const float *v, int64_t n)
{
    ts_tensor *t;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n, v, &t));
    return t;
}

static void test_same_results(void)
{
    setup();
    ts_tensor *a = vec((const float[]){1, 2, 3, 4}, 4), *b = vec((const float[]){5, 6, 7, 8}, 4);
    uint64_t live = ts_memory_live_count();
    /* (a + b) * a - exp(b / 8), both ways */
    ts_tensor *s1, *s2, *s3, *s4, *s5, *want;
    CHECK_OK(ts_add(a, b, &s1));
    CHECK_OK(ts_mul(s1, a, &s2));
    CHECK_OK(ts_mul_scalar(b, 0.125, &s3));
    CHECK_OK(ts_exp(s3, &s4));
    CHECK_OK(ts_sub(s2, s4, &want));
    ts_tensor_unref(s1), ts_tensor_unref(s2), ts_tensor_unref(s3), ts_tensor_unref(s4);
    ts_scope *sc = ts_scope_begin();
    CHECK(sc != NULL);
    ts_tensor *got = ts_s_sub(ts_s_mul(ts_s_add(a, b), a), ts_s_exp(ts_s_mul_scalar(b, 0.125)));
    CHECK_OK(ts_scope_return(sc, got, &s5));
    float w[4], g[4];
    CHECK_OK(ts_tensor_to_host(want, w, sizeof w));
    CHECK_OK(ts_tensor_to_host(s5, g, sizeof g));
    CHECK(memcmp(w, g, sizeof w) == 0);
    ts_tensor_unref(want);
    ts_tensor_unref(s5);
    CHECK_INT_EQ(ts_memory_live_count(), live); /* every intermediate went back */
    ts_tensor_unref(a);
    ts_tensor_unref(b);
    tap_end();
}

static void test_sticky_failure(void)
{
    setup();
    ts_tensor *a = vec((const float[]){1, 2, 3}, 3), *b = vec((const float[]){1, 2}, 2);
    uint64_t live = ts_memory_live_count();
    ts_scope *sc = ts_scope_begin();
    ts_tensor *ok = ts_s_add(a, a);
    CHECK(ok != NULL);
    ts_tensor *bad = ts_s_add(a, b); /* shapes (3) and (2) */
    CHECK(bad == NULL);
    CHECK_INT_EQ(ts_scope_status(sc), TS_ESHAPE);
    /* Nothing runs now, even with good inputs, and the first message stays. */
    CHECK(ts_s_add(a, a) == NULL);
    CHECK(ts_s_exp(bad) == NULL);
    ts_tensor *out = (ts_tensor *)1;
    CHECK_FAILS(ts_scope_return(sc, ts_s_mul(bad, a), &out), TS_ESHAPE, "(3)", "(2)");
    CHECK(out == NULL);
    CHECK_INT_EQ(ts_memory_live_count(), live);

    /* An in-place call brought in with no tensor: success records nothing, failure does. */
    sc = ts_scope_begin();
    CHECK(ts_scope_adopt(ts_mul_scalar_(a, 2), NULL) == NULL);
    CHECK_OK(ts_scope_status(sc));
    CHECK(ts_scope_adopt(ts_add_(a, b), NULL) == NULL);
    CHECK_FAILS(ts_scope_end(sc), TS_ESHAPE, "(3)");
    /* A NULL input that no failure explains is one, named. */
    sc = ts_scope_begin();
    CHECK(ts_s_neg(NULL) == NULL);
    CHECK_FAILS(ts_scope_end(sc), TS_EINVAL, "ts_s_neg", "NULL");
    /* Outside any scope. */
    CHECK(ts_s_neg(a) == NULL);
    CHECK(strstr(ts_last_error(), "ts_scope_begin") != NULL);
    ts_tensor_unref(a);
    ts_tensor_unref(b);
    tap_end();
}

static void test_keep_and_nesting(void)
{
    setup();
    ts_tensor *a = vec((const float[]){1, 2}, 2);
    uint64_t live = ts_memory_live_count();
    ts_scope *outer = ts_scope_begin();
    ts_tensor *x = ts_s_mul_scalar(a, 3);
    ts_tensor *kept = ts_scope_keep(x);
    ts_scope *inner = ts_scope_begin();
    ts_tensor *y = ts_s_add(x, x); /* owned by inner */
    CHECK(y != NULL);
    /* Ending the outer scope ends the inner one too. */
    CHECK_OK(ts_scope_end(outer));
    CHECK_INT_EQ(ts_memory_live_count(), live + 1); /* the kept one */
    float v[2];
    CHECK_OK(ts_tensor_to_host(kept, v, sizeof v));
    CHECK(v[0] == 3 && v[1] == 6);
    ts_tensor_unref(kept);
    CHECK_INT_EQ(ts_memory_live_count(), live);
    CHECK_FAILS(ts_scope_end(inner), TS_ESTATE, "not open");
    /* A failure in an inner scope is the inner scope's. */
    outer = ts_scope_begin();
    inner = ts_scope_begin();
    ts_tensor *t = NULL;
    CHECK(ts_scope_adopt(ts_tensor_narrow(a, 0, 0, 9, &t), &t) == NULL);
    CHECK_FAILS(ts_scope_end(inner), TS_EINVAL, "narrow");
    CHECK_OK(ts_scope_status(outer));
    ts_tensor *u = NULL;
    CHECK(ts_scope_adopt(ts_tensor_narrow(a, 0, 1, 1, &u), &u) != NULL && u == NULL);
    CHECK_OK(ts_scope_end(outer));
    CHECK_INT_EQ(ts_memory_live_count(), live);
    ts_tensor_unref(a);
    tap_end();
}

/* Autograd through scoped ops: gradients as with the status API. */
static void test_backward(void)
{
    setup();
    ts_tensor *w = vec((const float[]){0.5f, -1.0f, 2.0f}, 3);
    CHECK_OK(ts_tensor_set_requires_grad(w, 1));
    ts_scope *sc = ts_scope_begin();
    /* loss = sum(tanh(w) * w) */
    ts_tensor *loss = ts_s_sum(ts_s_mul(ts_s_tanh(w), w), 0, NULL, 0);
    CHECK(loss != NULL);
    CHECK_OK(ts_backward(loss, NULL, 0));
    CHECK_OK(ts_scope_end(sc));
    float g[3];
    CHECK_OK(ts_tensor_to_host(ts_tensor_grad(w), g, sizeof g));
    const float x[3] = {0.5f, -1.0f, 2.0f};
    for (int i = 0; i < 3; i++) {
        double t = tanh(x[i]), want = t + x[i] * (1 - t * t);
        CHECK_MSG(fabs(g[i] - want) < 1e-6, "grad %d: %g, want %g", i, (double)g[i], want);
    }
    ts_tensor_unref(w);
    tap_end();
}

static void test_depth_limit(void)
{
    ts_scope *sc[65];
    for (int i = 0; i < 64; i++)
        CHECK((sc[i] = ts_scope_begin()) != NULL);
    CHECK(ts_scope_begin() == NULL);
    CHECK(strstr(ts_last_error(), "64 scopes") != NULL);
    CHECK_INT_EQ(ts_scope_status(sc[63]), TS_ESTATE); /* nothing runs in the one below */
    CHECK_FAILS(ts_scope_end(sc[63]), TS_ESTATE, "64 scopes");
    CHECK((sc[63] = ts_scope_begin()) != NULL);
    CHECK_FAILS(ts_scope_end(NULL), TS_ESTATE, "no scope");
    CHECK_OK(ts_scope_end(sc[0]));
    CHECK((sc[0] = ts_scope_begin()) != NULL);
    CHECK_OK(ts_scope_end(sc[0]));
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_same_results),     TAP_TEST(test_sticky_failure),
        TAP_TEST(test_keep_and_nesting), TAP_TEST(test_backward),
        TAP_TEST(test_depth_limit),
    };
    int rc = tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
    return rc;
}
