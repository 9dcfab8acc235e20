/* tests/unit/test-pinned.c: pinned host memory and asynchronous uploads, through the pinned
 * fixture (which checks that a source is pinned and is not rewritten before its upload is
 * waited for) and the CPU plugins (ordinary pool memory, synchronous copies); and the loader's
 * ts_loader_set_device, which must deliver the same batches as the data's own device. */
#include <unistd.h>

#include "../tap.h"


static ts_device *load(const char *name)
{
    ts_device *d;
    CHECK_OK(ts_device_load(NULL, strchr(name, '/') ? name : tap_fixture(name), &d));
    return d;
}

/* The device API: pinned blocks come from a pool with statistics; an upload names a ticket;
 * rewriting the source before waiting is caught by the fixture (so the loader test below can
 * fail). */
static void test_pinned_api(void)
{
    ts_device *d = load("pinned");
    void *p, *q, *dst;
    CHECK_OK(ts_device_pinned_alloc(d, 4096, "test", &p));
    CHECK_OK(ts_device_alloc(d, 4096, "test", &dst));
    ts_memory_stats st;
    CHECK_OK(ts_device_pinned_stats(d, &st));
    CHECK(st.valid & TS_STATS_POOL);
    CHECK(st.in_use >= 4096 && st.live_blocks == 1 && st.n_raw_alloc == 1);
    memset(p, 7, 4096);
    uint64_t t1, t2;
    CHECK_OK(ts_device_copy_from_pinned(d, dst, p, 4096, &t1));
    CHECK(t1 > 0);
    CHECK_OK(ts_device_wait_copy(d, t1));
    CHECK(((unsigned char *)dst)[4095] == 7);
    /* Rewritten before the wait: the fixture says so. */
    CHECK_OK(ts_device_copy_from_pinned(d, dst, p, 4096, &t2));
    CHECK(t2 > t1);
    memset(p, 8, 16);
    CHECK_FAILS(ts_device_wait_copy(d, t2), TS_ECORRUPT, "written before");
    /* Not pinned memory: refused by the fixture. */
    char plain[64] = {0};
    uint64_t t3;
    CHECK_FAILS(ts_device_copy_from_pinned(d, dst, plain, sizeof plain, &t3), TS_EINVAL,
                "not pinned");
    /* Freed blocks stay cached: the next one of the same size is no new raw allocation. */
    ts_device_pinned_free(d, p);
    CHECK_OK(ts_device_pinned_alloc(d, 4096, "test", &q));
    CHECK_OK(ts_device_pinned_stats(d, &st));
    CHECK_INT_EQ(st.n_raw_alloc, 1);
    ts_device_pinned_free(d, q);
    /* Freeing waits for the uploads from the block, which the pool hands out again at once
     * (the fixture checks every pending source at the next upload). */
    CHECK_OK(ts_device_pinned_alloc(d, 4096, "test", &p));
    CHECK_OK(ts_device_copy_from_pinned(d, dst, p, 4096, &t1));
    ts_device_pinned_free(d, p);
    CHECK_OK(ts_device_pinned_alloc(d, 4096, "test", &q));
    CHECK(q == p);
    memset(q, 9, 4096);
    CHECK_OK(ts_device_copy_from_pinned(d, dst, q, 4096, &t2));
    CHECK_OK(ts_device_wait_copy(d, t2));
    ts_device_pinned_free(d, q);
    ts_device_free(d, dst);
    CHECK_FAILS(ts_device_pinned_alloc(d, 16, "test", NULL), TS_EINVAL, "ptr is NULL");
    ts_device_unload(d);

    /* A CPU plugin: its own pool memory, copies done on return (ticket 0). */
    ts_device *cpu = load("hostonly");
    CHECK_OK(ts_device_pinned_alloc(cpu, 100, NULL, &p));
    CHECK_OK(ts_device_alloc(cpu, 100, "test", &dst));
    memset(p, 3, 100);
    CHECK_OK(ts_device_copy_from_pinned(cpu, dst, p, 100, &t1));
    CHECK_INT_EQ(t1, 0);
    CHECK_OK(ts_device_wait_copy(cpu, t1));
    CHECK(((unsigned char *)dst)[99] == 3);
    ts_device_pinned_free(cpu, p);
    ts_device_free(cpu, dst);
    ts_device_unload(cpu);

    /* A device whose memory is not host memory and that has no host_alloc: none. */
    ts_device *none = load("withkeys");
    CHECK(!(ts_device_desc(none)->flags & TS_PLUGIN_HOST_MEMORY));
    CHECK_FAILS(ts_device_pinned_alloc(none, 16, "test", &p), TS_ENOTSUP, "no pinned");
    CHECK_OK(ts_device_pinned_stats(none, &st));
    CHECK_INT_EQ(st.valid, 0);
    ts_device_unload(none);
}

/* Every batch of two shuffled epochs, uploaded to the fixture through pinned staging, equals
 * the batch the data's own device gives; the staging buffers are allocated once. */
static void check_loader(int pinned)
{
    ts_device *host = load("hostonly"), *d = load("pinned");
    enum { N = 23, F = 5, B = 4 };
    float xs[N * F];
    int64_t ys[N];
    for (int i = 0; i < N * F; i++)
        xs[i] = (float)i * 0.5f;
    for (int i = 0; i < N; i++)
        ys[i] = i * 3;
    ts_tensor *x, *y;
    CHECK_OK(ts_tensor_from_host(host, TS_F32, 2, (const int64_t[]){N, F}, xs, &x));
    CHECK_OK(ts_tensor_from_host(host, TS_I64, 1, (const int64_t[]){N}, ys, &y));
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        ts_loader *ref, *up;
        CHECK_OK(ts_loader_new(x, y, B, shuffle, 11, 0, &ref));
        CHECK_OK(ts_loader_new(x, y, B, shuffle, 11, 0, &up));
        CHECK_OK(ts_loader_set_device(up, d, pinned));
        uint64_t raw = 0;
        for (uint64_t epoch = 0; epoch < 2; epoch++) {
            CHECK_OK(ts_loader_start_epoch(ref, epoch));
            CHECK_OK(ts_loader_start_epoch(up, epoch));
            for (int b = 0;; b++) {
                ts_tensor *rx, *ry, *ux, *uy;
                CHECK_OK(ts_loader_next(ref, &rx, &ry));
                CHECK_OK(ts_loader_next(up, &ux, &uy));
                CHECK((rx == NULL) == (ux == NULL));
                if (!rx)
                    break;
                CHECK(ts_tensor_device(ux) == d && ts_tensor_device(uy) == d);
                CHECK_INT_EQ(ts_tensor_shape(ux)[0], ts_tensor_shape(rx)[0]);
                float a[B * F], c[B * F];
                int64_t ya[B], yc[B];
                size_t rows = (size_t)ts_tensor_shape(rx)[0];
                CHECK_OK(ts_tensor_to_host(rx, a, rows * F * sizeof(float)));
                CHECK_OK(ts_tensor_to_host(ux, c, rows * F * sizeof(float)));
                CHECK_OK(ts_tensor_to_host(ry, ya, rows * sizeof(int64_t)));
                CHECK_OK(ts_tensor_to_host(uy, yc, rows * sizeof(int64_t)));
                CHECK_MSG(memcmp(a, c, rows * F * sizeof(float)) == 0 &&
                              memcmp(ya, yc, rows * sizeof(int64_t)) == 0,
                          "shuffle %d epoch %llu batch %d differs on the target", shuffle,
                          (unsigned long long)epoch, b);
                ts_tensor_unref(rx);
                ts_tensor_unref(ry);
                ts_tensor_unref(ux);
                ts_tensor_unref(uy);
            }
            ts_memory_stats st;
            CHECK_OK(ts_device_pinned_stats(d, &st));
            if (epoch == 0)
                raw = st.n_raw_alloc;
            else
                CHECK_INT_EQ(st.n_raw_alloc, raw);
            CHECK_INT_EQ(st.live_blocks, pinned ? 4 : 0); /* x and y, two slots each */
        }
        ts_loader_free(ref);
        ts_loader_free(up);
    }
    ts_tensor_unref(x);
    ts_tensor_unref(y);
    ts_device_unload(d);
    ts_device_unload(host);
}

static void test_loader_pinned(void)
{
    check_loader(1);
}

static void test_loader_plain(void)
{
    check_loader(0);
}

/* Two buffers in turn: holding batch k while asking for k + 2 is refused, k + 1 is fine. */
static void test_loader_holds(void)
{
    ts_device *host = load("hostonly"), *d = load("pinned");
    ts_tensor *x;
    CHECK_OK(ts_tensor_zeros(host, TS_F32, 2, (const int64_t[]){12, 3}, &x));
    ts_loader *l;
    CHECK_OK(ts_loader_new(x, NULL, 2, 0, 1, 0, &l));
    CHECK_OK(ts_loader_set_device(l, d, 1));
    ts_tensor *b0, *b1, *b2;
    CHECK_OK(ts_loader_next(l, &b0, NULL));
    CHECK_OK(ts_loader_next(l, &b1, NULL));
    CHECK_FAILS(ts_loader_next(l, &b2, NULL), TS_ESTATE, "still referenced", "two buffers");
    ts_tensor_unref(b0);
    CHECK_OK(ts_loader_next(l, &b2, NULL));
    CHECK(b2 != NULL);
    ts_tensor_unref(b1);
    ts_tensor_unref(b2);
    /* Back to the data's device: batches are views of the data again. */
    CHECK_OK(ts_loader_set_device(l, NULL, 0));
    CHECK_OK(ts_loader_next(l, &b0, NULL));
    CHECK(ts_tensor_device(b0) == host);
    ts_tensor_unref(b0);
    /* Pinned staging on a device that has none. */
    ts_device *none = load("withkeys");
    CHECK_FAILS(ts_loader_set_device(l, none, 1), TS_ENOTSUP, "no pinned");
    ts_loader_free(l);
    ts_tensor_unref(x);
    ts_device_unload(none);
    ts_device_unload(d);
    ts_device_unload(host);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_pinned_api),
        TAP_TEST(test_loader_pinned),
        TAP_TEST(test_loader_plain),
        TAP_TEST(test_loader_holds),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
