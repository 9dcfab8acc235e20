/* tests/unit/test-hostile.c: plugins that misbehave once loaded (tests/fixtures/: allocfail,
 * kernfail, badmem, needslib; initfail and the ABI breakers are in test-loader.c). The core
 * reports each clearly, falls back where configured, keeps nothing alive, never crashes. */
#include <sys/stat.h>
#include <unistd.h>

#include "../tap.h"


static char logged[4096];

static void capture_log(int level, const char *msg, void *user)
{
    (void)user;
    if (level <= TS_LOG_WARN)
        snprintf(logged + strlen(logged), sizeof logged - strlen(logged), "%s\n", msg);
}

/* Every allocation fails: creating tensors says so, nothing is left half made, and the
 * device still copies and unloads. */
static void test_alloc_fails(void)
{
    tap_start();
    ts_device *dev;
    CHECK_OK(ts_device_get(tap_fixture("allocfail"), &dev));
    int64_t shape[] = {4, 4};
    ts_tensor *t = (ts_tensor *)1;
    CHECK_FAILS(ts_tensor_zeros(dev, TS_F32, 2, shape, &t), TS_ENOMEM, "allocate failed on "
                "purpose");
    CHECK(t == NULL);
    float v[16] = {0};
    CHECK_FAILS(ts_tensor_from_host(dev, TS_F32, 2, shape, v, &t), TS_ENOMEM, "on purpose");
    /* A tensor on a good device cannot move there either. */
    ts_tensor *a;
    CHECK_OK(ts_tensor_ones(NULL, TS_F32, 2, shape, &a));
    CHECK_FAILS(ts_tensor_to(a, dev, &t), TS_ENOMEM, "on purpose");
    CHECK(t == NULL);
    ts_tensor_unref(a);
    tap_end();
}

/* Every kernel fails: each op returns the plugin's error; inputs and the graph are intact
 * and nothing leaks. A training-style forward/backward fails at its first kernel. */
static void test_kernel_fails(void)
{
    tap_start();
    ts_device *dev;
    CHECK_OK(ts_device_get(tap_fixture("kernfail"), &dev));
    int64_t shape[] = {3, 3};
    ts_tensor *a, *c = NULL;
    CHECK_OK(ts_tensor_full(dev, TS_F32, 2, shape, 2.0, &a)); /* fill is no kernel */
    CHECK_OK(ts_tensor_set_requires_grad(a, 1));
    CHECK_FAILS(ts_add(a, a, &c), TS_EPLUGIN, "kernel failed on purpose");
    CHECK(c == NULL);
    CHECK_FAILS(ts_matmul(a, a, &c), TS_EPLUGIN, "on purpose");
    CHECK_FAILS(ts_relu(a, &c), TS_EPLUGIN, "on purpose");
    CHECK_FAILS(ts_sum(a, 0, NULL, 0, &c), TS_EPLUGIN, "on purpose");
    CHECK_FAILS(ts_tensor_clone(a, &c), TS_EPLUGIN, "on purpose");
    CHECK(c == NULL);
    CHECK_INT_EQ(ts_autograd_live_nodes(), tap_live0.nodes);
    /* The data is still readable: copies are not kernels. */
    float v[9];
    CHECK_OK(ts_tensor_to_host(a, v, sizeof v));
    CHECK(v[0] == 2.0f && v[8] == 2.0f);
    ts_tensor_unref(a);
    tap_end();
}

/* Absurd memory figures are dropped with a warning naming the plugin; honest ones pass. */
static void test_absurd_memory(void)
{
    ts_set_log_handler(capture_log, NULL);
    static const char *why[] = {"a total of 0 bytes", "implausible total",
                                "more free memory than total"};
    for (int lie = 0; lie < 4; lie++) {
        char text[128];
        snprintf(text, sizeof text, "[plugin.badmem]\nlie = %d\n", lie);
        ts_config *cfg;
        CHECK_OK(ts_config_parse(text, "badmem.ini", NULL, &cfg));
        ts_device *dev;
        CHECK_OK(ts_device_load(cfg, tap_fixture("badmem"), &dev));
        ts_device_info info;
        logged[0] = 0;
        CHECK_OK(ts_device_info_get(dev, &info));
        if (lie < 3) {
            CHECK_STR_CONTAINS(logged, "plugin 'badmem' reports");
            CHECK_STR_CONTAINS(logged, why[lie]);
            CHECK_STR_CONTAINS(logged, "ignored");
            CHECK_INT_EQ(info.valid & (TS_DEVINFO_TOTAL | TS_DEVINFO_FREE), 0);
        } else { /* free without a total is unusual, not absurd */
            CHECK(logged[0] == 0);
            CHECK_INT_EQ(info.valid, TS_DEVINFO_FREE);
            CHECK_INT_EQ(info.free_bytes, 12345);
        }
        CHECK(strcmp(info.name, "badmem") == 0);
        ts_device_unload(dev);
        ts_config_free(cfg);
    }
    ts_set_log_handler(NULL, NULL);
}

/* A plugin whose .so needs a library that is not there: dlerror names the library; with a
 * fallback configured the runtime starts on it and warns with the same reason. */
static void test_missing_library(void)
{
    ts_device *dev = (ts_device *)1;
    CHECK_FAILS(ts_device_load(NULL, tap_fixture("needslib"), &dev), TS_EPLUGIN, "needslib.so",
                "libtessera-fixture-gone.so.1");
    CHECK(dev == NULL);

    ts_set_log_handler(capture_log, NULL);
    char text[8400];
    snprintf(text, sizeof text, "[core]\ndevice = %s\nfallback = cpu_blas\n", tap_fixture("needslib"));
    const char *ini = tap_write_file(tap_tmpdir(), "fb.ini", text);
    logged[0] = 0;
    CHECK_OK(ts_init(ini));
    CHECK(strcmp(ts_device_name(ts_default_device()), "cpu_blas") == 0);
    CHECK_STR_CONTAINS(logged, "libtessera-fixture-gone.so.1");
    CHECK_STR_CONTAINS(logged, "falling back to 'cpu_blas'");
    ts_shutdown();

    snprintf(text, sizeof text, "[core]\ndevice = %s\nfallback =\n", tap_fixture("needslib"));
    ini = tap_write_file(tap_tmpdir(), "nofb.ini", text);
    CHECK_FAILS(ts_init(ini), TS_EPLUGIN, "libtessera-fixture-gone.so.1");
    CHECK(ts_default_device() == NULL);
    ts_set_log_handler(NULL, NULL);
}

/* ---- hostile install locations (the rest of the search-path rules: test-loader.c) ------ */

static void copy_fixture(const char *name, const char *dir, const char *as)
{
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/%s'", dir, tap_fixture(name), dir, as);
    CHECK(system(cmd) == 0);
}

/* [core] device = a relative path: resolved against the INI file's directory, never the
 * current directory, even when the current directory holds a plugin of that name. */
static void test_relative_device_path(void)
{
    char etc[4200], cwd[4200], ini[4300];
    snprintf(etc, sizeof etc, "%s/etc", tap_tmpdir());
    snprintf(cwd, sizeof cwd, "%s/cwd", tap_tmpdir());
    char plug[4400];
    snprintf(plug, sizeof plug, "%s/plugins", etc);
    copy_fixture("withkeys", plug, "mine.so");
    snprintf(plug, sizeof plug, "%s/plugins", cwd);
    copy_fixture("nodevice", plug, "mine.so"); /* a decoy that would fail to start */
    copy_fixture("nodevice", plug, "decoy.so");
    CHECK(chdir(cwd) == 0);
    snprintf(ini, sizeof ini, "%s/t.ini", etc);
    tap_write_file(etc, "t.ini", "[core]\ndevice = plugins/mine.so\nfallback =\n");
    CHECK_OK(ts_init(ini));
    char want[4400];
    snprintf(want, sizeof want, "%s/plugins/mine.so", etc);
    CHECK_STR_CONTAINS(ts_device_path(ts_default_device()), want);
    CHECK(strcmp(ts_device_name(ts_default_device()), "withkeys") == 0);
    ts_shutdown();
    /* Only the current directory has it: not found, and the message names the file's dir. */
    tap_write_file(etc, "t.ini", "[core]\ndevice = plugins/decoy.so\nfallback =\n");
    CHECK_FAILS(ts_init(ini), TS_EPLUGIN, "etc/plugins/decoy.so");
    CHECK(ts_default_device() == NULL);
}

/* A world-writable plugin file (in a safe directory) is refused with an error naming it (and
 * no log line saying it a second time), unless the configuration allows it. */
static void test_world_writable_file(void)
{
    char dir[4200], so[4300];
    snprintf(dir, sizeof dir, "%s/safe", tap_tmpdir());
    copy_fixture("withkeys", dir, "withkeys.so");
    CHECK(chmod(dir, 0755) == 0);
    snprintf(so, sizeof so, "%s/withkeys.so", dir);
    CHECK(chmod(so, 0666) == 0);
    ts_set_log_handler(capture_log, NULL);
    logged[0] = 0;
    ts_device *dev;
    CHECK_FAILS(ts_device_load(NULL, so, &dev), TS_EPLUGIN, "the file", "writable by every user",
                "allow_insecure_plugin_path = true");
    CHECK_MSG(!strstr(logged, "refusing to load"), "the refusal was logged as well: %s", logged);
    ts_config *cfg;
    CHECK_OK(ts_config_parse("[core]\nallow_insecure_plugin_path = true\n", "t.ini", NULL,
                             &cfg));
    CHECK_OK(ts_device_load(cfg, so, &dev));
    ts_device_unload(dev);
    ts_config_free(cfg);
    /* Permissions fixed: loads without the setting. */
    CHECK(chmod(so, 0755) == 0);
    CHECK_OK(ts_device_load(NULL, so, &dev));
    ts_device_unload(dev);
    ts_set_log_handler(NULL, NULL);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {TAP_TEST(test_alloc_fails), TAP_TEST(test_kernel_fails),
                                     TAP_TEST(test_absurd_memory),
                                     TAP_TEST(test_missing_library),
                                     TAP_TEST(test_relative_device_path),
                                     TAP_TEST(test_world_writable_file)};
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
