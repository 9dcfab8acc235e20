/* tests/unit/test-status.c: status names/texts and the thread-local last error. */
#include "config.h"

#include <pthread.h>

#include "../tap.h"

static void test_names_and_texts(void)
{
    CHECK(strcmp(ts_status_name(TS_OK), "TS_OK") == 0);
    CHECK(strcmp(ts_status_name(TS_ESHAPE), "TS_ESHAPE") == 0);
    CHECK(strcmp(ts_status_text(TS_ENOMEM), "out of memory") == 0);
    CHECK(strcmp(ts_status_name((ts_status)-999), "TS_UNKNOWN") == 0);
    /* Every code in the list has a distinct name and a non-empty text. */
#define X(name, code, text) CHECK(strcmp(ts_status_name(TS_##name), "TS_" #name) == 0);
    TS_STATUS_MAP(X)
#undef X
}

static void *other_thread(void *arg)
{
    (void)arg;
    ts_config *cfg;
    ts_status s = ts_config_parse("[nope]\n", "t.ini", NULL, &cfg);
    CHECK(s == TS_ECONFIG);
    CHECK_STR_CONTAINS(ts_last_error(), "nope");
    return NULL;
}

static void test_last_error_is_thread_local(void)
{
    ts_clear_error();
    ts_config *cfg;
    CHECK(ts_config_parse("[core]\nbogus = 1\n", "main.ini", NULL, &cfg) == TS_ECONFIG);
    CHECK(cfg == NULL);
    CHECK_STR_CONTAINS(ts_last_error(), "bogus");
    pthread_t t;
    CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0);
    pthread_join(t, NULL);
    /* The other thread's failure did not touch this thread's message. */
    CHECK_STR_CONTAINS(ts_last_error(), "bogus");
    ts_clear_error();
    CHECK(ts_last_error()[0] == 0);
}

/* A message may quote the previous one: ts_fail(s, "...: %s", ts_last_error()) (the
 * buffer it reads is the one it writes). */
static void test_fail_quoting_last_error(void)
{
    ts_fail(TS_EIO, "inner reason %d", 42);
    CHECK_INT_EQ(ts_fail(TS_EINVAL, "outer: %s (again: %s)", ts_last_error(), ts_last_error()),
                 TS_EINVAL);
    CHECK_MSG(!strcmp(ts_last_error(), "outer: inner reason 42 (again: inner reason 42)"), "%s",
              ts_last_error());
}

static void test_version(void)
{
    CHECK(strcmp(ts_version(), PACKAGE_VERSION) == 0);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_names_and_texts),
        TAP_TEST(test_last_error_is_thread_local),
        TAP_TEST(test_version),
        TAP_TEST(test_fail_quoting_last_error),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
