/* tests/tap.h: a small test runner in the manner of libuv's: a table of tests, assertion
 * macros that abort in every build, each test forked with a time limit, TAP output for
 * automake's tap-driver. A test that calls SKIP() is reported "ok N - name # SKIP why".
 * When every test skipped, the program prints "1..0 # SKIP" and exits 77 unless it runs
 * under the TAP driver (TS_TAP_DRIVER set), which reads the skip from the TAP itself.
 * In AddressSanitizer builds each test ends with LeakSanitizer's check (the forked child
 * leaves with _exit, which would skip it); TS_NO_LSAN_CHECK set in the environment turns
 * that off for a program that cannot have it (see tests/plugins/test-onednn.c). */
#ifndef TESSERA_TESTS_TAP_H
#define TESSERA_TESTS_TAP_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tessera/tessera.h>

/* RUNNING_ON_VALGRIND: nonzero under valgrind, where a test's memory or time bounds do not
 * hold (0 where valgrind's header is not installed). */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

typedef struct tap_test {
    const char *name;
    void (*fn)(void);
    double limit; /* its time limit in units of $TS_TEST_TIMEOUT: 1, or TAP_SLOW */
} tap_test;

#define TAP_TEST(fn) {#fn, fn, 1}
/* A test that takes tens of seconds on an idle machine (thousands of training steps): its
 * limit is TAP_SLOW times the default. */
#define TAP_SLOW 3
#define TAP_SLOW_TEST(fn) {#fn, fn, TAP_SLOW}

/* Runs the tests named in argv (all if none), forked, each within its time limit:
 * $TS_TEST_TIMEOUT seconds (default 120) times the test's limit times
 * $TS_TEST_TIMEOUT_SCALE (default 1). What the limit bounds is the test's CPU time: on a
 * busy machine (load average at or above the CPU count) a test past its limit in wall time
 * runs on while it has used less than its limit in CPU time, up to TAP_MAX_STRETCH times
 * the limit in wall time (less on a less loaded machine: see tap_limits). A test stopped
 * is reported with its wall and CPU time and what they say: the machine is busy, the test
 * spins, or it waits on something that never comes. Returns the process exit status. */
int tap_run(const tap_test *tests, size_t n, int argc, char **argv);

#define TAP_MAX_STRETCH 10

/* What tap_run_one enforces on one test. */
typedef struct tap_limits {
    double limit_s;     /* seconds of wall time on an idle machine, of CPU time on a busy one */
    double max_stretch; /* a busy machine stretches the wall limit at most this many times */
    double load;        /* load average per CPU to assume; < 0: read it (getloadavg) */
} tap_limits;

/* Runs test t forked under lim, as tap_run runs each test: 0 if it passed, 77 if it
 * skipped, 1 if it failed, with why (whylen bytes) the reason, or for a test that passed
 * past limit_s of wall time a note of its times ("" otherwise). The runner's own test
 * (tests/unit/test-tap.c) calls it with small limits. */
int tap_run_one(const tap_test *t, const tap_limits *lim, char *why, size_t whylen);

_Noreturn void tap_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
_Noreturn void tap_skip(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* What is alive in the process: tensors, storages, pool blocks, graph nodes. */
typedef struct tap_live {
    uint64_t tensors, storages, blocks, nodes;
} tap_live;

/* What was alive when the running test called tap_start. */
extern tap_live tap_live0;

/* ts_init(NULL) for a test and a snapshot of what is alive into tap_live0. Returns the
 * default device. */
ts_device *tap_start(void);
/* Fails the test unless exactly what was alive at tap_start is alive now (every test ends so:
 * no tensor, storage, pool block or graph node leaked), then ts_shutdown(). */
#define tap_end() tap_end_at(__FILE__, __LINE__)
void tap_end_at(const char *file, int line);

/* Directory of test data in the source tree ($TS_SRCDIR/tests/data). (transfer none) */
const char *tap_srcdir(void);
/* What to load for plugin name: the test build of cpu_onednn (its diagnostics exported,
 * $TS_BUILDDIR/tests/plugins/hooks) when it is built, else name itself. */
const char *tap_plugin_under_test(const char *name);
/* fn on each CPU plugin that is built (cpu_blas, cpu_onednn), loaded for the call and
 * unloaded after it. */
void tap_on_cpu_plugins(void (*fn)(ts_device *dev, const char *name));
/* A fresh empty directory for this test, removed at exit. (transfer none) */
const char *tap_tmpdir(void);
/* Writes text to dir/name and returns the path. (transfer none until next call) */
const char *tap_write_file(const char *dir, const char *name, const char *text);

/* dir/name in one of 64 rotating buffers (dir may be an earlier result). (transfer none) */
const char *tap_path_in(const char *dir, const char *name);
/* The absolute path of fixture plugin NAME in the build tree ($TS_BUILDDIR/tests/fixtures/
 * .libs/NAME.so), in one of those buffers; fails the test if it is not built. */
const char *tap_fixture(const char *name);
/* Writes n bytes to path, or fails the test. */
void tap_write_bytes(const char *path, const void *data, size_t n);
/* The whole file, malloc'd (one spare byte); *n its size. (transfer full) */
unsigned char *tap_read_all(const char *path, size_t *n);
/* How many entries of dir have needle in their name. */
int tap_count_entries(const char *dir, const char *needle);
/* Kernel calls of op in the profile so far (ts_profile_read), of function fn and dtype dtype
 * (-1: any). */
uint64_t tap_profile_calls(int32_t op, int32_t fn, int32_t dtype);
/* dir/name as a safetensors file: hlen as the 8-byte header length (the true one is
 * strlen(header)), the header text, then data_len bytes of 0x11. (transfer none) */
const char *tap_write_safetensors(const char *dir, const char *name, uint64_t hlen,
                                  const char *header, size_t data_len);

#define CHECK(cond)                                                                         \
    do {                                                                                    \
        if (!(cond))                                                                        \
            tap_fail(__FILE__, __LINE__, "CHECK(%s) failed", #cond);                        \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                \
    do {                                                                                    \
        if (!(cond))                                                                        \
            tap_fail(__FILE__, __LINE__, __VA_ARGS__);                                      \
    } while (0)

#define CHECK_INT_EQ(a, b)                                                                  \
    do {                                                                                    \
        long long a_ = (long long)(a), b_ = (long long)(b);                                 \
        if (a_ != b_)                                                                       \
            tap_fail(__FILE__, __LINE__, "%s == %s failed: %lld vs %lld", #a, #b, a_, b_);   \
    } while (0)

/* expr must return TS_OK; otherwise fail with the status name and ts_last_error(). */
#define CHECK_OK(expr)                                                                      \
    do {                                                                                    \
        ts_status s_ = (expr);                                                              \
        if (s_ != TS_OK)                                                                    \
            tap_fail(__FILE__, __LINE__, "%s returned %s: %s", #expr, ts_status_name(s_),   \
                     ts_last_error());                                                      \
    } while (0)

/* expr must fail with status code, and ts_last_error() must contain every needle. */
#define CHECK_FAILS(expr, code, ...)                                                        \
    do {                                                                                    \
        ts_clear_error();                                                                   \
        ts_status s_ = (expr);                                                              \
        if (s_ != (code))                                                                   \
            tap_fail(__FILE__, __LINE__, "%s returned %s, expected %s (message: %s)",       \
                     #expr, ts_status_name(s_), ts_status_name(code), ts_last_error());      \
        const char *needles_[] = {__VA_ARGS__, NULL};                                       \
        for (int i_ = 0; needles_[i_]; i_++)                                                \
            if (!strstr(ts_last_error(), needles_[i_]))                                     \
                tap_fail(__FILE__, __LINE__, "error message lacks \"%s\": %s",             \
                         needles_[i_], ts_last_error());                                    \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                                     \
    do {                                                                                    \
        const char *h_ = (hay), *n_ = (needle);                                             \
        if (!h_ || !strstr(h_, n_))                                                         \
            tap_fail(__FILE__, __LINE__, "\"%s\" does not contain \"%s\"", h_ ? h_ : "(null)", \
                     n_);                                                                   \
    } while (0)

#define SKIP(...) tap_skip(__VA_ARGS__)

#endif /* TESSERA_TESTS_TAP_H */
