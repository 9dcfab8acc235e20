/* tests/unit/test-tap.c: the test runner's own tests (tests/tap.c). A test stopped at its time
 * limit must be reported with its wall and CPU time and the right reading of them: a test
 * that waits (here: sleeps) is told apart from one that spins, and on a busy machine a test is
 * let run on while it has had less CPU time than its limit. The load is given to the runner
 * (tap_limits.load) so that each case means the same on an idle and on a loaded machine; the
 * limits are a fraction of a second. */
#include <time.h>
#include <unistd.h>

#include "../tap.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleeps_30s(void)
{
    sleep(30);
}

static void sleeps_1s(void)
{
    struct timespec d = {1, 0};
    while (nanosleep(&d, &d) != 0)
        ;
}

static void spins(void)
{
    for (volatile unsigned long i = 0;; i++)
        ;
}

static void passes(void)
{
}

static void fails(void)
{
    CHECK_MSG(0, "as it should");
}

static void skips(void)
{
    SKIP("nothing to do here");
}

/* Runs fn under lim; returns its status, *why its message, *secs the time it took. */
static int run(void (*fn)(void), tap_limits lim, char *why, size_t len, double *secs)
{
    tap_test t = {"inner", fn, 1};
    double t0 = now_s();
    int rc = tap_run_one(&t, &lim, why, len);
    *secs = now_s() - t0;
    if (why[0])
        printf("# %s\n", why); /* what the runner said, into the log */
    return rc;
}

/* On an idle machine a test past its limit is stopped there; one that had almost no CPU
 * time is waiting on something, not slow. */
static void test_waiting_test_on_idle_machine(void)
{
    char why[4096];
    double secs;
    CHECK_INT_EQ(run(sleeps_30s, (tap_limits){0.3, TAP_MAX_STRETCH, 0}, why, sizeof why, &secs), 1);
    CHECK_MSG(secs < 5, "stopped after %.1f s, not at its 0.3 s limit", secs);
    CHECK_STR_CONTAINS(why, "timed out after 0.");
    CHECK_STR_CONTAINS(why, " s wall, 0.0 s CPU (limit 0.3 s");
    CHECK_STR_CONTAINS(why, "the test is waiting, not running");
}

/* On a busy machine (4 runnable per CPU) the same test is let run to 2 x 4 = 8 times its
 * limit, then reported as starved by the machine, with what to raise. */
static void test_waiting_test_on_busy_machine(void)
{
    char why[4096];
    double secs;
    CHECK_INT_EQ(run(sleeps_30s, (tap_limits){0.3, TAP_MAX_STRETCH, 4}, why, sizeof why, &secs), 1);
    CHECK_MSG(secs >= 2.4 && secs < 10, "stopped after %.1f s, not at 8 x 0.3 s", secs);
    CHECK_STR_CONTAINS(why, " s wall, 0.0 s CPU");
    CHECK_STR_CONTAINS(why, "the machine is busy; raise TS_TEST_TIMEOUT");
}

/* A test that spins is stopped once it has had its limit in CPU time, busy machine or not,
 * and is reported as spinning. */
static void test_spinning_test(void)
{
    char why[4096];
    double secs;
    CHECK_INT_EQ(run(spins, (tap_limits){0.3, 40, 20}, why, sizeof why, &secs), 1);
    CHECK_MSG(secs < 12, "stopped after %.1f s, not once it had 0.3 s of CPU", secs);
    CHECK_STR_CONTAINS(why, "the test is spinning or far too slow");
    CHECK_MSG(!strstr(why, "0.0 s CPU") && !strstr(why, "0.1 s CPU"),
              "a spinning test reported with almost no CPU time: %s", why);
}

/* On a busy machine a test that needs more wall time than its limit, and little CPU, passes,
 * with a note of its times. */
static void test_busy_machine_lets_a_test_finish(void)
{
    char why[4096];
    double secs;
    CHECK_INT_EQ(run(sleeps_1s, (tap_limits){0.3, TAP_MAX_STRETCH, 4}, why, sizeof why, &secs), 0);
    CHECK_STR_CONTAINS(why, "past its 0.3 s limit");
    CHECK_INT_EQ(run(passes, (tap_limits){0.3, TAP_MAX_STRETCH, 4}, why, sizeof why, &secs), 0);
    CHECK_MSG(why[0] == 0, "a quick test got a note: %s", why);
}

/* The runner's ordinary outcomes, through tap_run_one. */
static void test_pass_fail_skip(void)
{
    char why[4096];
    double secs;
    tap_limits lim = {5, TAP_MAX_STRETCH, -1};
    CHECK_INT_EQ(run(passes, lim, why, sizeof why, &secs), 0);
    CHECK_INT_EQ(run(fails, lim, why, sizeof why, &secs), 1);
    CHECK_STR_CONTAINS(why, "test-tap.c:");
    CHECK_STR_CONTAINS(why, "as it should");
    CHECK_INT_EQ(run(skips, lim, why, sizeof why, &secs), 77);
    CHECK_STR_CONTAINS(why, "nothing to do here");
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_waiting_test_on_idle_machine),
        TAP_TEST(test_waiting_test_on_busy_machine),
        TAP_TEST(test_spinning_test),
        TAP_TEST(test_busy_machine_lets_a_test_finish),
        TAP_TEST(test_pass_fail_skip),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
