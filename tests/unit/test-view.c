/* tests/unit/test-view.c: views are zero-copy and their refcounting is right by construction.
 * The frameworks in the project's origin stories crashed when a view's destructor freed its
 * parent's data and leaked when reshape/slice allocated a dummy buffer; here every view is
 * checked for sharing storage, adding no pool bytes, and leaving no tensor, storage or pool
 * block behind in any release order. */
#include "../tap.h"

static ts_device *dev;

/* Live counters at a test's start; every test ends with tap_end(). */

static void setup(void)
{
    dev = tap_start();
}

static uint64_t in_use(void)
{
    ts_memory_stats st;
    CHECK_OK(ts_device_memory_stats(dev, &st));
    return st.in_use;
}

/* A (2, 3, 4) float64 tensor holding 0..23. */
static ts_tensor *iota(void)
{
    ts_tensor *t;
    CHECK_OK(ts_tensor_arange(dev, TS_F64, 0, 24, 1, &t));
    ts_tensor *v;
    CHECK_OK(ts_tensor_view(t, 3, (const int64_t[]){2, 3, 4}, &v));
    ts_tensor_unref(t);
    return v;
}

/* The tensor's elements, row-major, into out (numel doubles). */
static void values(const ts_tensor *t, double *out)
{
    CHECK_OK(ts_tensor_to_host(t, out, (size_t)ts_tensor_numel(t) * sizeof(double)));
}

static void check_values(const ts_tensor *t, const double *want, int64_t n)
{
    CHECK_INT_EQ(ts_tensor_numel(t), n);
    double got[64];
    values(t, got);
    for (int64_t i = 0; i < n; i++)
        CHECK_MSG(got[i] == want[i], "element %lld: %g, want %g", (long long)i, got[i], want[i]);
}

static void test_views_share_storage_and_add_no_bytes(void)
{
    setup();
    ts_tensor *t = iota();
    uint64_t used = in_use();
    ts_tensor *v[9];
    int n = 0;
    CHECK_OK(ts_tensor_view(t, 2, (const int64_t[]){6, 4}, &v[n++]));
    CHECK_OK(ts_tensor_slice(t, 2, 1, 4, 2, &v[n++]));
    CHECK_OK(ts_tensor_narrow(t, 1, 1, 2, &v[n++]));
    CHECK_OK(ts_tensor_select(t, 0, 1, &v[n++]));
    CHECK_OK(ts_tensor_transpose(t, 0, 2, &v[n++]));
    CHECK_OK(ts_tensor_permute(t, (const int[]){2, 0, 1}, &v[n++]));
    CHECK_OK(ts_tensor_unsqueeze(t, 1, &v[n++]));
    CHECK_OK(ts_tensor_flatten(t, 0, 1, &v[n++]));
    ts_tensor *one;
    CHECK_OK(ts_tensor_slice(t, 0, 0, 1, 1, &one));
    CHECK_OK(ts_tensor_expand(one, 4, (const int64_t[]){5, 1, 3, 4}, &v[n++]));
    for (int i = 0; i < n; i++)
        CHECK(ts_tensor_shares_storage(v[i], t));
    CHECK_INT_EQ(in_use(), used);
    ts_tensor_unref(t); /* the parent goes first: views keep the storage alive */
    ts_tensor_unref(one);
    double got[64];
    values(v[3], got); /* select(0, 1): 12..23 */
    CHECK(got[0] == 12 && got[11] == 23);
    for (int i = 0; i < n; i++)
        ts_tensor_unref(v[i]);
    tap_end();
}

static void test_view_values(void)
{
    setup();
    ts_tensor *t = iota(), *v;
    CHECK_OK(ts_tensor_slice(t, 2, 1, 4, 2, &v)); /* (2, 3, 2): cols 1 and 3 */
    check_values(v, (const double[]){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23}, 12);
    ts_tensor_unref(v);
    CHECK_OK(ts_tensor_slice(t, 1, -2, 100, 1, &v)); /* Python clamping */
    CHECK_INT_EQ(ts_tensor_shape(v)[1], 2);
    check_values(v, (const double[]){4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23},
                 16);
    ts_tensor_unref(v);
    CHECK_OK(ts_tensor_slice(t, 1, 2, 1, 1, &v)); /* empty */
    CHECK_INT_EQ(ts_tensor_numel(v), 0);
    ts_tensor_unref(v);
    CHECK_OK(ts_tensor_transpose(t, 0, 2, &v)); /* (4, 3, 2): v[i][j][k] = t[k][j][i] */
    check_values(v, (const double[]){0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10,
                                     22, 3, 15, 7, 19, 11, 23},
                 24);
    CHECK(!ts_tensor_is_contiguous(v));
    ts_tensor *w;
    CHECK_OK(ts_tensor_select(v, -1, 1, &w)); /* (4, 3): t[1][j][i] */
    check_values(w, (const double[]){12, 16, 20, 13, 17, 21, 14, 18, 22, 15, 19, 23}, 12);
    ts_tensor_unref(w);
    ts_tensor_unref(v);
    ts_tensor *one;
    CHECK_OK(ts_tensor_narrow(t, 1, 2, 1, &one)); /* (2, 1, 4): rows 8..11 and 20..23 */
    CHECK_OK(ts_tensor_expand(one, 3, (const int64_t[]){-1, 2, 4}, &v));
    CHECK_INT_EQ(ts_tensor_strides(v)[1], 0);
    check_values(v, (const double[]){8, 9, 10, 11, 8, 9, 10, 11, 20, 21, 22, 23, 20, 21, 22, 23},
                 16);
    ts_tensor_unref(v);
    CHECK_OK(ts_tensor_squeeze(one, 1, &v));
    CHECK_INT_EQ(ts_tensor_ndim(v), 2);
    check_values(v, (const double[]){8, 9, 10, 11, 20, 21, 22, 23}, 8);
    ts_tensor_unref(v);
    ts_tensor_unref(one);
    ts_tensor_unref(t);
    tap_end();
}

static void test_reshape_copies_only_when_needed(void)
{
    setup();
    ts_tensor *t = iota(), *tt, *r;
    uint64_t used = in_use();
    /* Contiguous: a view, no bytes. */
    CHECK_OK(ts_tensor_reshape(t, 2, (const int64_t[]){4, -1}, &r));
    CHECK(ts_tensor_shares_storage(r, t));
    CHECK_INT_EQ(ts_tensor_shape(r)[1], 6);
    CHECK_INT_EQ(in_use(), used);
    ts_tensor_unref(r);
    /* Transposed last two dims: merging dims 0 and 1 is still a view... */
    CHECK_OK(ts_tensor_transpose(t, 1, 2, &tt)); /* (2, 4, 3) */
    CHECK_OK(ts_tensor_flatten(tt, 0, 0, &r));
    CHECK(ts_tensor_shares_storage(r, t));
    ts_tensor_unref(r);
    /* ...but merging the swapped dims is not: view fails with advice, reshape copies. */
    CHECK_FAILS(ts_tensor_view(tt, 2, (const int64_t[]){2, 12}, &r), TS_ESHAPE,
                "without a copy", "ts_tensor_reshape");
    CHECK(r == NULL);
    CHECK_OK(ts_tensor_reshape(tt, 2, (const int64_t[]){2, 12}, &r));
    CHECK(!ts_tensor_shares_storage(r, t));
    CHECK(in_use() > used);
    check_values(r, (const double[]){0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11, 12, 16, 20, 13, 17, 21,
                                     14, 18, 22, 15, 19, 23},
                 24);
    ts_tensor_unref(r);
    ts_tensor_unref(tt);
    /* Errors name both shapes. */
    CHECK_FAILS(ts_tensor_view(t, 2, (const int64_t[]){5, 5}, &r), TS_ESHAPE, "(5, 5)",
                "(2, 3, 4)");
    CHECK_FAILS(ts_tensor_view(t, 2, (const int64_t[]){-1, -1}, &r), TS_EINVAL, "-1");
    CHECK_FAILS(ts_tensor_view(t, 2, (const int64_t[]){-1, 5}, &r), TS_ESHAPE, "infer");
    ts_tensor_unref(t);
    tap_end();
}

static void test_view_errors(void)
{
    setup();
    ts_tensor *t = iota(), *v = (ts_tensor *)1;
    CHECK_FAILS(ts_tensor_select(t, 3, 0, &v), TS_EINVAL, "dim 3", "(2, 3, 4)");
    CHECK(v == NULL);
    CHECK_FAILS(ts_tensor_select(t, 0, 2, &v), TS_EINVAL, "index 2", "size 2");
    CHECK_FAILS(ts_tensor_narrow(t, 2, 3, 2, &v), TS_EINVAL, "[3, 5)", "size 4");
    CHECK_FAILS(ts_tensor_slice(t, 0, 0, 2, 0, &v), TS_EINVAL, "step");
    CHECK_FAILS(ts_tensor_permute(t, (const int[]){0, 0, 1}, &v), TS_EINVAL, "permutation");
    CHECK_FAILS(ts_tensor_expand(t, 3, (const int64_t[]){2, 6, 4}, &v), TS_ESHAPE, "(2, 3, 4)",
                "(2, 6, 4)");
    CHECK_FAILS(ts_tensor_transpose(t, 0, -4, &v), TS_EINVAL, "dim -4");
    CHECK_FAILS(ts_tensor_unsqueeze(t, 5, &v), TS_EINVAL, "dim 5");
    CHECK_FAILS(ts_tensor_flatten(t, 2, 1, &v), TS_EINVAL, "2..1");
    CHECK_FAILS(ts_tensor_view(NULL, 1, (const int64_t[]){1}, &v), TS_EINVAL, "NULL");
    ts_tensor_unref(t);
    tap_end();
}

/* 10,000 rounds of create, view, view-of-view, release in every order (the seed documents'
 * crash and leak, as a test): counts return to the start and the data stays intact. */
/* Shapes whose sizes multiply past int64: a view, reshape or expand must refuse them, never
 * overflow (UBSan aborts on the signed overflow) or build strides that wrapped. */
static void test_huge_view_shapes(void)
{
    setup();
    const int64_t big = (int64_t)1 << 40;
    ts_tensor *e, *v = (ts_tensor *)1;
    CHECK_OK(ts_tensor_empty(NULL, TS_F32, 1, (const int64_t[]){0}, &e));
    CHECK_FAILS(ts_tensor_view(e, 3, (const int64_t[]){big, big, 0}, &v), TS_EINVAL, "too large");
    CHECK(v == NULL);
    CHECK_FAILS(ts_tensor_view(e, 3, (const int64_t[]){0, big, big}, &v), TS_EINVAL, "too large");
    CHECK_FAILS(ts_tensor_reshape(e, 3, (const int64_t[]){big, 0, big}, &v), TS_EINVAL,
                "too large");
    CHECK_FAILS(ts_tensor_view(e, 3, (const int64_t[]){big, big, -1}, &v), TS_EINVAL, "too large");
    /* Within the bound an empty view is fine. */
    CHECK_OK(ts_tensor_view(e, 3, (const int64_t[]){0, 1 << 20, 1 << 20}, &v));
    CHECK_INT_EQ(ts_tensor_numel(v), 0);
    ts_tensor_unref(v);
    ts_tensor_unref(e);
    ts_tensor *one;
    CHECK_OK(ts_tensor_ones(NULL, TS_F32, 2, (const int64_t[]){1, 1}, &one));
    v = (ts_tensor *)1;
    CHECK_FAILS(ts_tensor_expand(one, 2, (const int64_t[]){big, big}, &v), TS_EINVAL, "too large");
    CHECK(v == NULL);
    ts_tensor_unref(one);
    tap_end();
}

static void test_refcount_stress(void)
{
    setup();
    uint64_t blocks = ts_memory_live_count();
    for (int round = 0; round < 10000; round++) {
        ts_tensor *a, *v[4];
        CHECK_OK(ts_tensor_full(dev, TS_F32, 2, (const int64_t[]){8, 8}, (double)round, &a));
        CHECK_OK(ts_tensor_slice(a, 0, 1, 7, 2, &v[0]));
        CHECK_OK(ts_tensor_transpose(v[0], 0, 1, &v[1]));
        CHECK_OK(ts_tensor_select(v[1], 1, 2, &v[2]));
        CHECK_OK(ts_tensor_unsqueeze(v[2], 0, &v[3]));
        ts_tensor *all[5] = {a, v[0], v[1], v[2], v[3]};
        /* A different release order each round: all 120 permutations over 120 rounds. */
        int order[5] = {0, 1, 2, 3, 4};
        int k = round % 120;
        for (int i = 4; i > 0; i--) {
            int j = k % (i + 1);
            k /= i + 1;
            int tmp = order[i];
            order[i] = order[j];
            order[j] = tmp;
        }
        ts_tensor_ref(all[order[4]]);
        for (int i = 0; i < 4; i++)
            ts_tensor_unref(all[order[i]]);
        /* The survivor still reads its values: the storage outlived its parent. */
        float x;
        ts_tensor *last = all[order[4]];
        if (ts_tensor_numel(last) > 0) {
            ts_tensor *first;
            int64_t n = ts_tensor_numel(last);
            CHECK_OK(ts_tensor_reshape(last, 1, &n, &first));
            ts_tensor *e;
            CHECK_OK(ts_tensor_narrow(first, 0, 0, 1, &e));
            CHECK_OK(ts_tensor_to_host(e, &x, sizeof x));
            CHECK(x == (float)round);
            ts_tensor_unref(e);
            ts_tensor_unref(first);
        }
        ts_tensor_unref(last);
        ts_tensor_unref(last);
        CHECK_INT_EQ(ts_tensor_live_count(), tap_live0.tensors);
        CHECK_INT_EQ(ts_memory_live_count(), blocks);
    }
    /* Steady state: the pool served every round from its cache. */
    ts_memory_stats st;
    CHECK_OK(ts_device_memory_stats(dev, &st));
    CHECK_MSG(st.n_raw_alloc <= 2, "%llu raw allocations for 10,000 identical rounds",
              (unsigned long long)st.n_raw_alloc);
    tap_end();
}

/* Slicing a batch out of a dataset tensor adds no bytes to the pool's in-use count. */
static void test_batch_slicing_is_zero_copy(void)
{
    setup();
    ts_tensor *data;
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 2, (const int64_t[]){1000, 784}, &data));
    uint64_t used = in_use();
    for (int64_t b = 0; b < 10; b++) {
        ts_tensor *batch;
        CHECK_OK(ts_tensor_narrow(data, 0, b * 100, 100, &batch));
        CHECK(ts_tensor_is_contiguous(batch));
        CHECK(ts_tensor_data(batch) == (float *)ts_tensor_data(data) + b * 100 * 784);
        CHECK_INT_EQ(in_use(), used);
        ts_tensor_unref(batch);
    }
    ts_tensor_unref(data);
    tap_end();
}

static void test_threads_share_views(void);

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_views_share_storage_and_add_no_bytes),
        TAP_TEST(test_view_values),
        TAP_TEST(test_reshape_copies_only_when_needed),
        TAP_TEST(test_view_errors),
        TAP_TEST(test_huge_view_shapes),
        TAP_TEST(test_refcount_stress),
        TAP_TEST(test_batch_slicing_is_zero_copy),
        TAP_TEST(test_threads_share_views),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}

/* Views of one tensor made and dropped on 4 threads at once: atomic refcounts keep the counts
 * exact (run under helgrind or TSan for the races themselves). */
#include <pthread.h>

static ts_tensor *shared;

static void *churn(void *arg)
{
    (void)arg;
    for (int i = 0; i < 20000; i++) {
        ts_tensor *v, *w;
        if (ts_tensor_slice(shared, 0, i % 4, 8, 1, &v) != TS_OK)
            return (void *)1;
        if (ts_tensor_transpose(v, 0, 1, &w) != TS_OK)
            return (void *)1;
        ts_tensor_unref(v);
        ts_tensor_unref(w);
    }
    return NULL;
}

static void test_threads_share_views(void)
{
    setup();
    CHECK_OK(ts_tensor_zeros(dev, TS_F32, 2, (const int64_t[]){8, 8}, &shared));
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        CHECK(pthread_create(&th[i], NULL, churn, NULL) == 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
    CHECK_INT_EQ(ts_tensor_live_count(), tap_live0.tensors + 1);
    ts_tensor_unref(shared);
    tap_end();
}
