/* tests/unit/test-loader.c: finding, loading, refusing and falling back between plugins.
 * The fixtures in tests/fixtures/ each break one rule of the ABI. */
#include "config.h"

#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tap.h"


static ts_config *cfg_text(const char *text, const char *dir)
{
    ts_config *cfg;
    CHECK_OK(ts_config_parse(text, "test.ini", dir, &cfg));
    return cfg;
}

/* Copies a fixture into dir under its own name. */
static void install_fixture(const char *name, const char *dir)
{
    char cmd[9000];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s' '%s/%s.so'", dir, tap_fixture(name), dir, name);
    CHECK(system(cmd) == 0);
}

static void test_not_found(void)
{
    ts_device *dev = (ts_device *)1;
    CHECK_FAILS(ts_device_load(NULL, "nosuchplugin", &dev), TS_EPLUGIN,
                "plugin 'nosuchplugin' not found", "nosuchplugin.so", "TESSERA_PLUGIN_PATH");
    CHECK(dev == NULL);
    CHECK_FAILS(ts_device_load(NULL, "Bad Name", &dev), TS_EPLUGIN, "neither a plugin name");
    CHECK_FAILS(ts_device_load(NULL, "/nonexistent/x.so", &dev), TS_EPLUGIN, "/nonexistent/x.so",
                "no such file");
    CHECK_FAILS(ts_device_load(NULL, NULL, &dev), TS_EINVAL, "NULL");
}

static void test_not_a_plugin(void)
{
    ts_device *dev;
    CHECK_FAILS(ts_device_load(NULL, tap_fixture("noentry"), &dev), TS_EPLUGIN, "not a tessera plugin",
                "tessera_plugin_entry", "noentry.so");
    const char *garbage = tap_write_file(tap_tmpdir(), "garbage.so", "this is not an ELF file\n");
    CHECK_FAILS(ts_device_load(NULL, garbage, &dev), TS_EPLUGIN, "cannot load", "garbage.so");
}

static void test_abi_mismatch(void)
{
    ts_device *dev;
    char want[64];
    snprintf(want, sizeof want, "ABI %d.%d", TS_PLUGIN_ABI_MAJOR + 1, 3);
    char have[64];
    snprintf(have, sizeof have, "speaks ABI %d.%d", TS_PLUGIN_ABI_MAJOR, TS_PLUGIN_ABI_MINOR);
    CHECK_FAILS(ts_device_load(NULL, tap_fixture("badabi"), &dev), TS_EPLUGIN, want, have, "rebuild");
    /* A 1.x plugin: both versions, what to do, and where the porting notes are. */
    CHECK_FAILS(ts_device_load(NULL, tap_fixture("abi1"), &dev), TS_EPLUGIN, "built for plugin ABI 1.3",
                have, "rebuild the plugin against this tessera's headers", "mem_alloc",
                "Porting from ABI 1");
    CHECK(dev == NULL);
}

static void test_missing_required_member(void)
{
    ts_device *dev;
    CHECK_FAILS(ts_device_load(NULL, tap_fixture("missingslot"), &dev), TS_EPLUGIN, "'mem_alloc'",
                "missingslot");
}

static void test_older_minor_loads(void)
{
    ts_device *dev;
    CHECK_OK(ts_device_load(NULL, tap_fixture("oldminor"), &dev));
    CHECK(ts_device_desc(dev)->struct_size < sizeof(ts_plugin_desc));
    /* The trap behind the short descriptor is never called. */
    CHECK(ts_device_supports(dev, TS_OP_COPY, TS_F32) == 0);
    void *p;
    CHECK_OK(ts_device_alloc(dev, 16, "test", &p));
    ts_device_free(dev, p);
    ts_device_unload(dev);
}

/* TS_PLUGIN_HOST_MEMORY: the core composes every op a plugin does not claim on its reference
 * host kernels; without the flag it does not. */
static void test_host_memory_composes(void)
{
    ts_device *dev, *old;
    CHECK_OK(ts_device_load(NULL, tap_fixture("hostonly"), &dev));
    CHECK(!ts_device_supports(dev, TS_OP_MATMUL, TS_F32)); /* the plugin itself claims none */
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1}, c[4];
    int64_t sa[2] = {2, 3}, sb[2] = {3, 2};
    ts_tensor *ta, *tb, *tc, *tr;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 2, sa, a, &ta));
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 2, sb, b, &tb));
    CHECK_OK(ts_matmul(ta, tb, &tc));
    CHECK_OK(ts_relu(tc, &tr));
    CHECK_OK(ts_tensor_to_host(tr, c, sizeof c));
    CHECK(c[0] == 4 && c[1] == 5 && c[2] == 10 && c[3] == 11);
    /* ts_device_run stays exactly the plugin's own. */
    ts_operand o;
    memset(&o, 0, sizeof o);
    ts_kernel_call call = {.struct_size = sizeof call, .op = TS_OP_COPY, .ninputs = 1,
                           .noutputs = 1, .inputs = &o, .outputs = &o};
    CHECK_FAILS(ts_device_run(dev, &call), TS_ENOTSUP, "'hostonly' does not implement copy");
    /* Reference kernel errors carry the plugin's name. */
    int64_t idx[1] = {7}, n1 = 1;
    ts_tensor *ti, *ts_;
    CHECK_OK(ts_tensor_from_host(dev, TS_I64, 1, &n1, idx, &ti));
    CHECK_FAILS(ts_index_select(ta, 0, ti, &ts_), TS_EINVAL, "plugin 'hostonly'", "7");
    ts_tensor_unref(ti);
    ts_tensor_unref(ta);
    ts_tensor_unref(tb);
    ts_tensor_unref(tc);
    ts_tensor_unref(tr);
    ts_device_unload(dev);

    CHECK_OK(ts_device_load(NULL, tap_fixture("oldminor"), &old)); /* no TS_PLUGIN_HOST_MEMORY */
    CHECK_OK(ts_tensor_from_host(old, TS_F32, 2, sa, a, &ta));
    CHECK_FAILS(ts_relu(ta, &tr), TS_ENOTSUP, "'oldminor' does not implement");
    ts_tensor_unref(ta);
    ts_device_unload(old);
}

/* A plugin that ignores memory_fraction and cache_limit is held to them: the host owns the
 * pool over its raw allocator. greedy reports 64 MiB; a quarter of it is the reserve limit. */
static void test_limits_hold_for_any_plugin(void)
{
    ts_device *dev;
    ts_config *cfg = cfg_text("[plugin.greedy]\nmemory_fraction = 0.25\ncache_limit = 1M\n", NULL);
    CHECK_OK(ts_device_load(cfg, tap_fixture("greedy"), &dev));
    ts_memory_stats st;
    CHECK_OK(ts_device_memory_stats(dev, &st));
    CHECK(st.valid & TS_STATS_POOL);
    CHECK_INT_EQ(st.reserve_limit, 16u << 20);
    CHECK_INT_EQ(st.cache_limit, 1u << 20);
    void *a = NULL, *b = (void *)1;
    CHECK_OK(ts_device_alloc(dev, 10u << 20, "test", &a));
    CHECK_FAILS(ts_device_alloc(dev, 10u << 20, "test", &b), TS_ENOMEM, "pool 'greedy'",
                "memory_fraction");
    CHECK(b == NULL);
    CHECK_OK(ts_device_memory_stats(dev, &st));
    CHECK(st.reserved <= 16u << 20 && st.peak_reserved <= 16u << 20);
    /* Kernel scratch comes from the same pool: a fill whose scratch does not fit fails with
     * the pool's message, one that fits leaves no block behind. */
    int64_t big = (12 << 20) / 4, small = 1000;
    ts_tensor *t;
    CHECK_OK(ts_tensor_empty(dev, TS_F32, 1, &small, &t));
    uint64_t live = ts_memory_live_count();
    CHECK_OK(ts_fill_(t, 2.5));
    float back[1000];
    CHECK_OK(ts_tensor_to_host(t, back, sizeof back));
    CHECK(back[0] == 2.5f && back[999] == 2.5f);
    CHECK_INT_EQ(ts_memory_live_count(), live);
    ts_tensor_unref(t);
    ts_device_free(dev, a);
    CHECK_OK(ts_tensor_empty(dev, TS_F32, 1, &big, &t));
    CHECK_FAILS(ts_fill_(t, 1.0), TS_ENOMEM, "pool 'greedy'", "memory_fraction");
    ts_tensor_unref(t);
    /* cache_limit is hard: after every free the cached bytes are within it. */
    void *p[64] = {0};
    uint64_t seed = 12345, worst = 0;
    for (int round = 0; round < 2000; round++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int i = (int)(seed >> 58);
        if (p[i]) {
            ts_device_free(dev, p[i]);
            p[i] = NULL;
        } else {
            size_t sizes[] = {100, 5000, 70000, 300000, 900000, 1500000, 3000000};
            size_t n = sizes[(seed >> 40) % 7];
            if (ts_device_alloc(dev, n, "test", &p[i]) != TS_OK)
                p[i] = NULL; /* the reserve limit may refuse; that is not this check */
            ts_clear_error();
        }
        CHECK_OK(ts_device_memory_stats(dev, &st));
        if (st.cached > worst)
            worst = st.cached;
    }
    printf("# worst cached %llu\n", (unsigned long long)worst);
    CHECK_MSG(worst <= st.cache_limit, "cached reached %llu bytes under a cache_limit of %llu",
              (unsigned long long)worst, (unsigned long long)st.cache_limit);
    for (int i = 0; i < 64; i++)
        ts_device_free(dev, p[i]);
    ts_device_unload(dev);
    ts_config_free(cfg);
}

/* run may decline one call of an op it claims: on host memory the reference kernels stand
 * in; elsewhere the call fails naming the op, its dtypes and the plugin. */
static void test_declined_calls(void)
{
    ts_device *dev;
    float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40}, c[4];
    int64_t n = 4;
    ts_tensor *ta, *tb, *tc;
    CHECK_OK(ts_device_load(NULL, tap_fixture("decline"), &dev));
    CHECK(ts_device_supports(dev, TS_OP_BINARY, TS_F32));
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n, a, &ta));
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n, b, &tb));
    CHECK_OK(ts_add(ta, tb, &tc));
    CHECK_OK(ts_tensor_to_host(tc, c, sizeof c));
    CHECK(c[0] == 11 && c[3] == 44);
    ts_tensor_unref(tc);
    ts_tensor_unref(ta);
    ts_tensor_unref(tb);
    ts_device_unload(dev);

    CHECK_OK(ts_device_load(NULL, tap_fixture("declinedev"), &dev));
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n, a, &ta));
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n, b, &tb));
    CHECK_FAILS(ts_add(ta, tb, &tc), TS_ENOTSUP, "plugin 'declinedev' declined binary",
                "float32 <- float32, float32", "no host memory");
    ts_tensor_unref(ta);
    ts_tensor_unref(tb);
    ts_device_unload(dev);
}

/* A function added in a later minor ABI never reaches a plugin built before it: the reference
 * kernels run it on host memory, and ts_device_run says why it will not call the plugin. */
static void test_newer_functions_not_sent(void)
{
    ts_device *dev;
    CHECK_OK(ts_device_load(NULL, tap_fixture("minor0"), &dev));
    float a[4] = {-1, 0, 0.5f, 2}, y[4];
    int64_t n = 4;
    ts_tensor *ta, *tg;
    CHECK_OK(ts_tensor_from_host(dev, TS_F32, 1, &n, a, &ta));
    CHECK_OK(ts_gelu_tanh(ta, &tg));
    CHECK_OK(ts_tensor_to_host(tg, y, sizeof y));
    for (int i = 0; i < 4; i++) {
        double v = a[i], want = 0.5 * v * (1 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        CHECK_MSG(fabs(y[i] - want) < 1e-6, "gelu_tanh(%g) = %g, want %g", v, y[i], want);
    }
    ts_operand o;
    memset(&o, 0, sizeof o);
    ts_unary_params p = {TS_UNARY_GELU_TANH};
    ts_kernel_call call = {.struct_size = sizeof call, .op = TS_OP_UNARY, .ninputs = 1,
                           .noutputs = 1, .inputs = &o, .outputs = &o, .params = &p,
                           .params_size = sizeof p};
    CHECK_FAILS(ts_device_run(dev, &call), TS_ENOTSUP, "built for plugin ABI 2.0",
                "before unary gelu_tanh", "rebuild");
    ts_tensor_unref(ta);
    ts_tensor_unref(tg);
    ts_device_unload(dev);
}

static void test_init_failures(void)
{
    ts_device *dev;
    CHECK_FAILS(ts_device_load(NULL, tap_fixture("initfail"), &dev), TS_EPLUGIN,
                "plugin 'initfail': init failed on purpose");
    CHECK_FAILS(ts_device_load(NULL, tap_fixture("nodevice"), &dev), TS_ENODEV,
                "plugin 'nodevice': no fixture driver found");
}

static void test_plugin_settings(void)
{
    ts_device *dev;
    ts_config *cfg = cfg_text("[plugin.withkeys]\nwidgets = 7\nmode = slow\n", NULL);
    CHECK_OK(ts_device_load(cfg, tap_fixture("withkeys"), &dev));
    ts_device_info info;
    CHECK_OK(ts_device_info_get(dev, &info));
    CHECK(strcmp(info.name, "widgets=7") == 0);
    size_t n;
    const ts_setting *s = ts_device_settings(dev, &n);
    const ts_setting *cl = ts_setting_find(s, n, "cache_limit");
    CHECK(cl && cl->v.size == (1ull << 30) && !cl->from_file); /* the plugin's own default */
    const ts_setting *mode = ts_setting_find(s, n, "mode");
    CHECK(mode && strcmp(mode->text, "slow") == 0 && mode->from_file);
    ts_device_unload(dev);
    ts_config_free(cfg);

    cfg = cfg_text("[plugin.withkeys]\n\nwidgets = 11\n", NULL);
    CHECK_FAILS(ts_device_load(cfg, tap_fixture("withkeys"), &dev), TS_ECONFIG, "test.ini:3:",
                "widgets = '11'", "from 1 to 10");
    ts_config_free(cfg);
    cfg = cfg_text("[plugin.withkeys]\ngizmos = 1\n", NULL);
    CHECK_FAILS(ts_device_load(cfg, tap_fixture("withkeys"), &dev), TS_ECONFIG,
                "test.ini:2:", "unknown key 'gizmos'",
                "memory_fraction, cache_limit, caching, expandable_segments, widgets, mode");
    ts_config_free(cfg);
}

static void test_cpu_blas_memory(void)
{
    ts_device *dev;
    CHECK_OK(ts_device_load(NULL, "cpu_blas", &dev));
    CHECK(strcmp(ts_device_name(dev), "cpu_blas") == 0);
    ts_device_info info;
    CHECK_OK(ts_device_info_get(dev, &info));
    CHECK(info.count == 1 && (info.valid & TS_DEVINFO_TOTAL) && info.total_bytes > 0);
    float host[1000], back[1000];
    for (int i = 0; i < 1000; i++)
        host[i] = (float)i * 0.5f;
    void *p;
    CHECK_OK(ts_device_alloc(dev, sizeof host, "test", &p));
    CHECK(((uintptr_t)p % 64) == 0);
    CHECK_OK(ts_device_copy_from_host(dev, p, host, sizeof host));
    CHECK_OK(ts_device_copy_to_host(dev, back, p, sizeof back));
    CHECK(memcmp(host, back, sizeof host) == 0);
    ts_memory_stats st;
    CHECK_OK(ts_device_memory_stats(dev, &st));
    CHECK(st.valid & TS_STATS_POOL);
    CHECK(st.in_use >= sizeof host && st.live_blocks == 1);
    ts_device_free(dev, p);
    CHECK_OK(ts_device_memory_stats(dev, &st));
    CHECK_INT_EQ(st.live_blocks, 0);
    CHECK_INT_EQ(st.in_use, 0);
    CHECK(ts_device_supports(dev, TS_OP_COPY, TS_F32));
    ts_device_unload(dev);
}

static void test_search_path(void)
{
    const char *tmp = tap_tmpdir();
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/envplugins", tmp);
    install_fixture("withkeys", dir);
    ts_device *dev;
    unsetenv("TESSERA_PLUGIN_PATH");
    CHECK_FAILS(ts_device_load(NULL, "withkeys", &dev), TS_EPLUGIN, "not found");
    setenv("TESSERA_PLUGIN_PATH", dir, 1);
    CHECK_OK(ts_device_load(NULL, "withkeys", &dev));
    CHECK_STR_CONTAINS(ts_device_path(dev), "envplugins/withkeys.so");
    ts_device_unload(dev);

    /* Relative entries are never resolved against the current directory. */
    CHECK(chdir(tmp) == 0);
    setenv("TESSERA_PLUGIN_PATH", "envplugins", 1);
    CHECK_FAILS(ts_device_load(NULL, "withkeys", &dev), TS_EPLUGIN, "not found");
    unsetenv("TESSERA_PLUGIN_PATH");

    /* plugin_path in a file: relative to the file's directory. */
    char cfgdir[4200];
    snprintf(cfgdir, sizeof cfgdir, "%s/etc", tmp);
    install_fixture("withkeys", cfgdir); /* creates etc/ */
    char plugdir[4300];
    snprintf(plugdir, sizeof plugdir, "%s/plugins", cfgdir);
    install_fixture("withkeys", plugdir);
    const char *ini = tap_write_file(cfgdir, "t.ini", "[core]\nplugin_path = plugins\n");
    ts_config *cfg;
    CHECK_OK(ts_config_load(ini, &cfg));
    CHECK_OK(ts_device_load(cfg, "withkeys", &dev));
    CHECK_STR_CONTAINS(ts_device_path(dev), "etc/plugins/withkeys.so");
    ts_device_unload(dev);
    ts_config_free(cfg);
}

static void test_insecure_path(void)
{
    char dir[4200];
    snprintf(dir, sizeof dir, "%s/open", tap_tmpdir());
    install_fixture("withkeys", dir);
    CHECK(chmod(dir, 0777) == 0);
    char so[4300];
    snprintf(so, sizeof so, "%s/withkeys.so", dir);
    ts_device *dev;
    CHECK_FAILS(ts_device_load(NULL, so, &dev), TS_EPLUGIN, "writable by every user",
                "allow_insecure_plugin_path");
    ts_config *cfg = cfg_text("[core]\nallow_insecure_plugin_path = true\n", NULL);
    CHECK_OK(ts_device_load(cfg, so, &dev));
    ts_device_unload(dev);
    ts_config_free(cfg);
}

static char logged[4096];

static void capture_log(int level, const char *msg, void *user)
{
    (void)user;
    if (level <= TS_LOG_WARN)
        snprintf(logged + strlen(logged), sizeof logged - strlen(logged), "%s\n", msg);
}

static void test_fallback(void)
{
    ts_set_log_handler(capture_log, NULL);
    char text[8400];
    snprintf(text, sizeof text, "[core]\ndevice = %s\nfallback = cpu_blas\n", tap_fixture("nodevice"));
    const char *ini = tap_write_file(tap_tmpdir(), "fb.ini", text);
    logged[0] = 0;
    CHECK_OK(ts_init(ini));
    CHECK(strcmp(ts_device_name(ts_default_device()), "cpu_blas") == 0);
    CHECK_STR_CONTAINS(logged, "plugin 'nodevice': no fixture driver found");
    CHECK_STR_CONTAINS(logged, "falling back to 'cpu_blas'");
    CHECK_FAILS(ts_init(ini), TS_ESTATE, "already initialised");
    ts_shutdown();
    CHECK(ts_default_device() == NULL);

    /* Both fail: one error with both reasons. */
    snprintf(text, sizeof text, "[core]\ndevice = %s\nfallback = nosuchplugin\n", tap_fixture("initfail"));
    ini = tap_write_file(tap_tmpdir(), "fb2.ini", text);
    CHECK_FAILS(ts_init(ini), TS_EPLUGIN, "init failed on purpose", "the fallback failed too",
                "'nosuchplugin' not found");
    CHECK(ts_runtime_config() == NULL);

    /* No fallback configured: the device's own error. */
    snprintf(text, sizeof text, "[core]\ndevice = %s\nfallback =\n", tap_fixture("nodevice"));
    ini = tap_write_file(tap_tmpdir(), "fb3.ini", text);
    CHECK_FAILS(ts_init(ini), TS_ENODEV, "no fixture driver found");
}

static void test_tessera_device_env(void)
{
    const char *ini = tap_write_file(tap_tmpdir(), "env.ini", "[core]\ndevice = cpu_blas\n");
    setenv("TESSERA_DEVICE", tap_fixture("withkeys"), 1);
    CHECK_OK(ts_init(ini));
    CHECK(strcmp(ts_device_name(ts_default_device()), "withkeys") == 0);
    /* Another device by name; the same pointer the second time. */
    ts_device *a, *b;
    CHECK_OK(ts_device_get("cpu_blas", &a));
    CHECK_OK(ts_device_get("cpu_blas", &b));
    CHECK(a == b && a != ts_default_device());
    ts_shutdown();
    unsetenv("TESSERA_DEVICE");
    CHECK_FAILS(ts_device_get("cpu_blas", &a), TS_ESTATE, "ts_init");
}

static void test_cuda_plugin(void)
{
    char *path;
    if (ts_plugin_find(NULL, "cuda", &path) != TS_OK)
        SKIP("the cuda plugin was not built (configure found no CUDA Toolkit)");
    free(path);
    ts_device *dev;
    ts_status s = ts_device_load(NULL, "cuda", &dev);
    if (s == TS_OK) {
        /* A GPU is here: it must report itself. */
        ts_device_info info;
        CHECK_OK(ts_device_info_get(dev, &info));
        CHECK(info.count > 0 && (info.valid & TS_DEVINFO_TOTAL));
        ts_device_unload(dev);
        return;
    }
    /* No GPU: a clean TS_ENODEV naming the CUDA error, never a crash. */
    CHECK_MSG(s == TS_ENODEV, "cuda load: %s: %s", ts_status_name(s), ts_last_error());
    CHECK_STR_CONTAINS(ts_last_error(), "plugin 'cuda'");
    CHECK_STR_CONTAINS(ts_last_error(), "cuda");
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_not_found),
        TAP_TEST(test_not_a_plugin),
        TAP_TEST(test_abi_mismatch),
        TAP_TEST(test_missing_required_member),
        TAP_TEST(test_older_minor_loads),
        TAP_TEST(test_host_memory_composes),
        TAP_TEST(test_limits_hold_for_any_plugin),
        TAP_TEST(test_declined_calls),
        TAP_TEST(test_newer_functions_not_sent),
        TAP_TEST(test_init_failures),
        TAP_TEST(test_plugin_settings),
        TAP_TEST(test_cpu_blas_memory),
        TAP_TEST(test_search_path),
        TAP_TEST(test_insecure_path),
        TAP_TEST(test_fallback),
        TAP_TEST(test_tessera_device_env),
        TAP_TEST(test_cuda_plugin),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
