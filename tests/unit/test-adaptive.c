/* tests/unit/test-adaptive.c: the CPU plugins' adaptive thread count (kernels/host/hostdev.c,
 * the adaptive_threads setting): the policy gives the threads the cores other processes left
 * free, never fewer than one nor more than the setting, with a quarter core of slack; a
 * sampling plugin stays within those bounds; with the setting off (the default), or one
 * thread, nothing changes. (What it buys is a benchmark, `tessera bench train --contend N`.) */
#include "../tap.h"
#include "../../kernels/host/hostdev.c"

static void test_policy(void)
{
    tap_start();
    static const struct {
        int configured, ncpu;
        double others;
        int want;
    } t[] = {
        {2, 2, 0.0, 2},  {2, 2, 0.2, 2}, /* a shell or a logger costs no thread */
        {2, 2, 0.3, 1},  {2, 2, 1.0, 1}, {2, 2, 7.0, 1}, /* never fewer than one */
        {4, 8, 3.0, 4},  {8, 8, 3.5, 4}, {8, 8, 0.0, 8}, {16, 8, 0.0, 8},
        {1, 8, 0.0, 1},  {8, 8, -0.5, 8}, /* sampling noise below zero */
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        CHECK_MSG(hk_threads_for(t[i].configured, t[i].ncpu, t[i].others) == t[i].want,
                  "%d threads on %d cores, others using %.2f: %d, want %d", t[i].configured,
                  t[i].ncpu, t[i].others, hk_threads_for(t[i].configured, t[i].ncpu, t[i].others),
                  t[i].want);
    tap_end();
}

static void wait_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static void test_sampling(void)
{
    tap_start();
    ts_setting set[2] = {{.name = "threads", .kind = TS_SETTING_INT, .v.i = 3},
                         {.name = "adaptive_threads", .kind = TS_SETTING_BOOL, .v.boolean = 1}};
    hk_dev hd;
    hk_dev_init(&hd, NULL, "test", set, 2);
    CHECK(hd.configured == 3 && hk_threads(&hd) == 3 && hd.adaptive);
    for (int i = 0; i < 4; i++) { /* samples 0.3 s apart: the threads stay within bounds */
        hk_dev_adapt(&hd);
        CHECK_MSG(hk_threads(&hd) >= 1 && hk_threads(&hd) <= 3, "%d threads", hk_threads(&hd));
        wait_s(0.3);
    }
    CHECK(hd.probe_ns > 0 || access("/proc/stat", R_OK) != 0);
    /* off, the default: the setting holds whatever the machine does */
    hk_dev_init(&hd, NULL, "test", set, 1);
    CHECK(!hd.adaptive);
    for (int i = 0; i < 2; i++, wait_s(0.3))
        hk_dev_adapt(&hd);
    CHECK(hk_threads(&hd) == 3 && hd.probe_ns == 0);
    set[1].v.boolean = 0;
    hk_dev_init(&hd, NULL, "test", set, 2);
    for (int i = 0; i < 2; i++, wait_s(0.3))
        hk_dev_adapt(&hd);
    CHECK(hk_threads(&hd) == 3 && hd.probe_ns == 0);
    /* one thread: nothing to adapt */
    set[0].v.i = 1;
    set[1].v.boolean = 1;
    hk_dev_init(&hd, NULL, "test", set, 2);
    hk_dev_adapt(&hd);
    CHECK(hk_threads(&hd) == 1 && hd.probe_ns == 0);
    tap_end();
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_policy),
        TAP_TEST(test_sampling),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
