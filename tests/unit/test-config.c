/* tests/unit/test-config.c: the INI loader: every bad input gives TS_ECONFIG naming file,
 * line, key and the expected form; good input and defaults come back as written. */
#include "config.h"

#include <math.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../tap.h"

static ts_config *parse_ok(const char *text)
{
    ts_config *cfg = NULL;
    CHECK_OK(ts_config_parse(text, "t.ini", NULL, &cfg));
    CHECK(cfg != NULL);
    return cfg;
}

#define BAD(text, ...)                                                                      \
    do {                                                                                    \
        ts_config *c_ = (ts_config *)1;                                                     \
        CHECK_FAILS(ts_config_parse(text, "t.ini", NULL, &c_), TS_ECONFIG, __VA_ARGS__);    \
        CHECK(c_ == NULL);                                                                  \
    } while (0)

static void test_full_file(void)
{
    ts_config *cfg = parse_ok("; comment\n"
                              "# another\n"
                              "[core]\n"
                              "device = cuda        ; inline comment\n"
                              "fallback = cpu_blas\n"
                              "plugin_path =            ; empty\n"
                              "log_level = debug\n"
                              "\n"
                              "[plugin.cpu_blas]\n"
                              "memory_fraction = 0.25\n"
                              "cache_limit = 1G\n"
                              "threads = 4\n");
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "cuda") == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "fallback"), "cpu_blas") == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "plugin_path"), "") == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "log_level"), "debug") == 0);
    CHECK(strcmp(ts_config_get(cfg, "plugin.cpu_blas", "cache_limit"), "1G") == 0);
    CHECK(strcmp(ts_config_get(cfg, "plugin.cpu_blas", "threads"), "4") == 0);
    /* Defaults for what the file leaves out. */
    CHECK(strcmp(ts_config_get(cfg, "plugin.cuda", "memory_fraction"), "0.5") == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "allow_insecure_plugin_path"), "false") == 0);
    CHECK(ts_config_get(cfg, "core", "nonexistent") == NULL);
    CHECK(strcmp(ts_config_source(cfg), "t.ini") == 0);
    ts_config_free(cfg);
}

static void test_defaults(void)
{
    ts_config *cfg;
    CHECK_OK(ts_config_defaults(&cfg));
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "cpu_blas") == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "log_level"), "warn") == 0);
    CHECK(strcmp(ts_config_get(cfg, "plugin.cpu_blas", "cache_limit"), "512M") == 0);
    CHECK_STR_CONTAINS(ts_config_source(cfg), "defaults");
    ts_config_free(cfg);
    ts_config_free(NULL);
}

static void test_unknown_key_and_section(void)
{
    BAD("[core]\ndevice = cpu_blas\ndevcie = cuda\n", "t.ini:3:", "[core]", "'devcie'",
        "known keys");
    BAD("[cor]\ndevice = cpu_blas\n", "t.ini:1:", "unknown section [cor]", "[plugin.NAME]");
    BAD("[plugin.Bad-Name]\nthreads = 1\n", "t.ini:1:", "plugin.Bad-Name", "lower-case");
    BAD("device = cpu_blas\n", "t.ini:1:", "unknown section []");
    /* A misspelt section with no keys under it is still an error. */
    BAD("[core]\ndevice = cpu_blas\n[plugn.cuda]\n", "t.ini:3:", "unknown section [plugn.cuda]");
}

static void test_bad_values(void)
{
    const char *fractions[] = {"0", "1.5", "-0.1", "abc", "nan", "inf", "0.5x", "", "1e-12", "9e-7", "+0.5"};
    for (size_t i = 0; i < sizeof fractions / sizeof *fractions; i++) {
        char text[128];
        snprintf(text, sizeof text, "[plugin.cpu_blas]\n\nmemory_fraction = %s\n", fractions[i]);
        BAD(text, "t.ini:3:", "[plugin.cpu_blas] memory_fraction", "(0, 1]");
    }
    const char *sizes[] = {"12Q", "", "-5M", "M", "1.5.2G", "5 M B", "99999999999999T"};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        char text[128];
        snprintf(text, sizeof text, "[plugin.cuda]\ncache_limit = %s\n", sizes[i]);
        BAD(text, "t.ini:2:", "cache_limit", "K/M/G/T suffix");
    }
    BAD("[plugin.cpu_blas]\ncaching = maybe\n", "t.ini:2:", "caching", "true/false");
    BAD("[core]\nlog_level = loud\n", "t.ini:2:", "log_level", "error, warn, info, debug");
    BAD("[core]\nallow_insecure_plugin_path = sure\n", "allow_insecure_plugin_path", "boolean");
    BAD("[core]\ndevice =\n", "t.ini:2:", "device is empty");
    BAD("[dist]\nhierarchical = maybe\n", "t.ini:2:", "hierarchical", "auto", "on or off");
    const char *rpn[] = {"0", "-2", "2x", "", "65537", "99999999999999999999"};
    for (size_t i = 0; i < sizeof rpn / sizeof *rpn; i++) {
        char text[96];
        snprintf(text, sizeof text, "[dist]\nranks_per_node = %s\n", rpn[i]);
        BAD(text, "t.ini:2:", "ranks_per_node", "1 to 65536");
    }
    BAD("[dist]\nshards = 2\n", "t.ini:2:", "unknown key 'shards'", "ranks_per_node",
        "shard_optimizer");
    BAD("[dist]\nshard_optimizer = 2\n", "t.ini:2:", "shard_optimizer = '2'", "true or false");
}

static void test_syntax_errors(void)
{
    BAD("[core]\ndevice = cpu_blas\nthis line has no equals sign\n", "t.ini:3:", "syntax error");
    BAD("[core\n", "t.ini:1:", "syntax error");
    BAD("[core]\ndevice = a\ndevice = b\n", "t.ini:3:", "set twice", "line 2");
    char big[400];
    memset(big, 'x', sizeof big);
    memcpy(big, "[core]\nplugin_path = ", 21);
    big[sizeof big - 2] = '\n';
    big[sizeof big - 1] = 0;
    BAD(big, "t.ini:2:", "too long");
}

static void test_sizes(void)
{
    struct {
        const char *text;
        unsigned long long want;
    } ok[] = {{"0", 0},           {"100", 100},          {"64K", 64ull << 10},
              {"64k", 64ull << 10}, {"512M", 512ull << 20}, {"512MiB", 512ull << 20},
              {"4G", 4ull << 30},  {"4GB", 4ull << 30},   {"1.5G", 3ull << 29},
              {"1T", 1ull << 40},  {" 8M ", 8ull << 20}};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        unsigned long long v = 1;
        CHECK_OK(ts_parse_size(ok[i].text, &v));
        CHECK_MSG(v == ok[i].want, "%s -> %llu, want %llu", ok[i].text, v, ok[i].want);
    }
    unsigned long long v;
    CHECK_FAILS(ts_parse_size("1Z", &v), TS_EINVAL, "'1Z'", "512M");
    /* 0 is a size (cache nothing), but a non-zero size under one byte must not become 0. */
    const char *sub[] = {"0.5", "0.1B", "1e-30K", "0.0000000001G"};
    for (size_t i = 0; i < sizeof sub / sizeof *sub; i++) {
        v = 7;
        CHECK_FAILS(ts_parse_size(sub[i], &v), TS_EINVAL, sub[i], "less than one byte");
        CHECK_MSG(v == 7, "%s: *bytes changed on failure", sub[i]);
        char text[128];
        snprintf(text, sizeof text, "[plugin.cpu_blas]\ncache_limit = %s\n", sub[i]);
        BAD(text, "t.ini:2:", "cache_limit", "less than one byte");
    }
    CHECK_OK(ts_parse_size("0.0", &v));
    CHECK(v == 0);
    CHECK_OK(ts_parse_size("1.5", &v)); /* a fraction of a byte above 1 rounds down */
    CHECK(v == 1);
    CHECK_FAILS(ts_parse_size(NULL, &v), TS_EINVAL, "NULL");
}

static void test_files(void)
{
    const char *dir = tap_tmpdir();
    char missing[4200];
    snprintf(missing, sizeof missing, "%s/does-not-exist.ini", dir);
    ts_config *cfg;
    CHECK_FAILS(ts_config_load(missing, &cfg), TS_EIO, "does-not-exist.ini", "cannot open");
    const char *path = tap_write_file(dir, "good.ini", "[core]\ndevice = cuda\n");
    CHECK_OK(ts_config_load(path, &cfg));
    CHECK(strcmp(ts_config_source(cfg), path) == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "cuda") == 0);
    ts_config_free(cfg);
    path = tap_write_file(dir, "bad.ini", "[core]\n\n\nthreads = 2\n");
    CHECK_FAILS(ts_config_load(path, &cfg), TS_ECONFIG, "bad.ini:4:", "'threads'");
}

static void test_lookup_order(void)
{
    const char *dir = tap_tmpdir();
    char xdg[4200], explicit_path[4300];
    snprintf(xdg, sizeof xdg, "%s/xdg/tessera", dir);
    char cmd[4400];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", xdg);
    CHECK(system(cmd) == 0);
    tap_write_file(xdg, "tessera.ini", "[core]\ndevice = from_xdg\n");
    snprintf(explicit_path, sizeof explicit_path, "%s", tap_write_file(dir, "env.ini",
                                                                       "[core]\ndevice = from_env\n"));
    snprintf(xdg, sizeof xdg, "%s/xdg", dir);
    setenv("XDG_CONFIG_HOME", xdg, 1);

    ts_config *cfg;
    setenv("TESSERA_CONFIG", explicit_path, 1);
    CHECK_OK(ts_config_load(NULL, &cfg));
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "from_env") == 0);
    ts_config_free(cfg);

    setenv("TESSERA_CONFIG", "/nonexistent/tessera.ini", 1);
    CHECK_FAILS(ts_config_load(NULL, &cfg), TS_EIO, "TESSERA_CONFIG", "/nonexistent/tessera.ini");

    unsetenv("TESSERA_CONFIG");
    CHECK_OK(ts_config_load(NULL, &cfg));
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "from_xdg") == 0);
    ts_config_free(cfg);

    /* An explicit path wins over everything. */
    setenv("TESSERA_CONFIG", explicit_path, 1);
    const char *p = tap_write_file(dir, "cli.ini", "[core]\ndevice = from_cli\n");
    CHECK_OK(ts_config_load(p, &cfg));
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "from_cli") == 0);
    ts_config_free(cfg);

    /* Nothing at all: the installed file, or the built-in defaults. */
    unsetenv("TESSERA_CONFIG");
    unsetenv("TESSERA_SYSTEM_CONFIG");
    setenv("XDG_CONFIG_HOME", "/nonexistent", 1);
    CHECK_OK(ts_config_load(NULL, &cfg));
    char installed[4200];
    snprintf(installed, sizeof installed, "%s/tessera/tessera.ini", TS_TEST_SYSCONFDIR);
    if (access(installed, F_OK) == 0)
        CHECK(strcmp(ts_config_source(cfg), installed) == 0);
    else
        CHECK_STR_CONTAINS(ts_config_source(cfg), "defaults");
    ts_config_free(cfg);
}

/* memory_fraction is a share of the device's memory: one whose byte limit on this device is
 * under 1 MiB is refused when the plugin loads (the pool would be useless, and a limit that
 * rounds to 0 bytes would mean no limit at all), with the limit it gives and the smallest
 * fraction accepted here; that fraction itself loads. */
static void test_fraction_byte_limit(void)
{
    const uint64_t mib = 1u << 20;
    ts_config *cfg;
    ts_device *dev = NULL;
    CHECK_OK(ts_config_defaults(&cfg));
    CHECK_OK(ts_device_load(cfg, "cpu_blas", &dev));
    ts_device_info info;
    CHECK_OK(ts_device_info_get(dev, &info));
    ts_device_unload(dev);
    ts_config_free(cfg);
    if (!(info.valid & TS_DEVINFO_TOTAL) || info.total_bytes < 4 * mib) {
        SKIP("cpu_blas reports no usable memory total");
        return;
    }
    double total = (double)info.total_bytes;
    /* Just under the minimum, far under it, and as small as the parser allows. */
    const double tiny[] = {(double)(mib - 64 * 1024) / total, 1000.0 / total, 1e-6};
    for (size_t i = 0; i < sizeof tiny / sizeof *tiny; i++) {
        if (tiny[i] < 1e-6 || tiny[i] * total >= (double)mib)
            continue;
        char text[200], want[64];
        snprintf(text, sizeof text, "[core]\ndevice = cpu_blas\n[plugin.cpu_blas]\n"
                 "memory_fraction = %.9g\n", tiny[i]);
        cfg = parse_ok(text);
        snprintf(want, sizeof want, "memory_fraction = %.9g", tiny[i]);
        dev = (ts_device *)1;
        CHECK_FAILS(ts_device_load(cfg, "cpu_blas", &dev), TS_ECONFIG, "t.ini:4:",
                    "[plugin.cpu_blas]", want, "1 MiB", "smallest");
        CHECK(dev == NULL);
        char limit[64];
        char written[32];
        snprintf(written, sizeof written, "%.9g", tiny[i]);
        snprintf(limit, sizeof limit, " %llu bytes",
                 (unsigned long long)(total * strtod(written, NULL)));
        CHECK_STR_CONTAINS(ts_last_error(), limit);
        /* The smallest fraction the message offers is accepted. */
        const char *at = strstr(ts_last_error(), "on this device is ");
        CHECK(at != NULL);
        double least = at ? strtod(at + 18, NULL) : 0;
        CHECK_MSG(least > tiny[i] && least <= 2.0 * (double)mib / total,
                  "smallest fraction %g (from: %s)", least, ts_last_error());
        ts_config_free(cfg);
        snprintf(text, sizeof text, "[plugin.cpu_blas]\nmemory_fraction = %.17g\n", least);
        cfg = parse_ok(text);
        CHECK_OK(ts_device_load(cfg, "cpu_blas", &dev));
        ts_memory_stats st;
        CHECK_OK(ts_device_memory_stats(dev, &st));
        CHECK_MSG(st.reserve_limit >= mib, "reserve_limit %llu", (unsigned long long)st.reserve_limit);
        ts_device_unload(dev);
        ts_config_free(cfg);
    }
    /* The boundary: the smallest fraction whose limit is exactly 1 MiB loads; the double just
     * below it (a limit of 1 MiB - 1 byte) is refused. */
    double f = (double)mib / total;
    while ((uint64_t)(total * f) < mib)
        f = nextafter(f, 1.0);
    while ((uint64_t)(total * nextafter(f, 0.0)) >= mib)
        f = nextafter(f, 0.0);
    if ((uint64_t)(total * f) != mib || (uint64_t)(total * nextafter(f, 0.0)) != mib - 1) {
        SKIP("no fraction gives exactly 1 MiB on a device of %.0f bytes", total);
        return;
    }
    char text[200];
    snprintf(text, sizeof text, "[plugin.cpu_blas]\nmemory_fraction = %.17g\n", f);
    cfg = parse_ok(text);
    CHECK_OK(ts_device_load(cfg, "cpu_blas", &dev));
    ts_device_unload(dev);
    ts_config_free(cfg);
    snprintf(text, sizeof text, "[plugin.cpu_blas]\nmemory_fraction = %.17g\n",
             nextafter(f, 0.0));
    cfg = parse_ok(text);
    CHECK_FAILS(ts_device_load(cfg, "cpu_blas", &dev), TS_ECONFIG, " 1048575 bytes");
    ts_config_free(cfg);
}

static char logged[4096];

static void capture_log(int level, const char *msg, void *user)
{
    (void)user;
    if (level <= TS_LOG_WARN)
        snprintf(logged + strlen(logged), sizeof logged - strlen(logged), "%s\n", msg);
}

/* A section for a plugin that is not on the search path gets one warning, at its line, naming
 * the plugins found and the closest one ("did you mean"), empty sections included; a section
 * for a plugin whose file is there but does not load (broken.so) gets none, nor does one for a
 * plugin tessera ships that this build lacks (the installed file's [plugin.cuda] on a machine
 * without CUDA: info level only), nor one for a plugin that is there. */
static void test_unknown_plugin_sections(void)
{
    char dir[4200], text[8192];
    snprintf(dir, sizeof dir, "%s/plugins", tap_tmpdir());
    CHECK(mkdir(dir, 0755) == 0);
    tap_write_file(dir, "broken.so", "not an ELF file\n");
    snprintf(text, sizeof text,
             "[core]\ndevice = cpu_blas\nplugin_path = %s\n" /* 1-3 */
             "[plugin.cpu_blas]\nthreads = 1\n"               /* 4-5 */
             "[plugin.cpu_blass]\nthreads = 1\ncache_limit = 1M\n" /* 6-8 */
             "[plugin.vendorgpu]\nthreads = 1\n"              /* 9-10 */
             "[plugin.cpu_onednnn]\n"                         /* 11: empty */
             "[plugin.broken]\nthreads = 2\n"                 /* 12-13 */
             "[plugin.cuda]\ndevice_index = 0\n"              /* 14-15 */
             "[plugin.cpu_blass]\n"                           /* 16: the same one again */
             "[plugin.cpublass]\n",                           /* 17: two edits away */
             dir);
    const char *ini = tap_write_file(tap_tmpdir(), "sections.ini", text);
    ts_set_log_handler(capture_log, NULL);
    logged[0] = 0;
    CHECK_OK(ts_init(ini));
    ts_shutdown();
    ts_set_log_handler(NULL, NULL);
    CHECK_STR_CONTAINS(logged, "sections.ini:6: [plugin.cpu_blass] names no plugin");
    CHECK_STR_CONTAINS(logged, "did you mean [plugin.cpu_blas]?");
    CHECK_STR_CONTAINS(logged, "sections.ini:9: [plugin.vendorgpu] names no plugin");
    CHECK_STR_CONTAINS(logged, "sections.ini:11: [plugin.cpu_onednnn] names no plugin");
    CHECK_STR_CONTAINS(logged, "did you mean [plugin.cpu_onednn]?");
    CHECK_STR_CONTAINS(logged, "sections.ini:17: [plugin.cpublass] names no plugin on the search "
                       "path: did you mean [plugin.cpu_blas]?");
    /* Each warning lists the plugins found, the broken one included. */
    const char *v = strstr(logged, "[plugin.vendorgpu]");
    const char *eol = v ? strchr(v, '\n') : NULL;
    CHECK_MSG(v && eol, "%s", logged);
    if (v && eol) {
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(eol - v), v);
        CHECK_STR_CONTAINS(line, "plugins found: ");
        CHECK_STR_CONTAINS(line, "cpu_blas");
        CHECK_STR_CONTAINS(line, "broken");
        CHECK_STR_CONTAINS(line, "closest: "); /* no "did you mean": far from every name */
        CHECK(!strstr(line, "did you mean"));
    }
    /* once per section, and nothing about the others */
    const char *first = strstr(logged, "[plugin.cpu_blass]");
    CHECK_MSG(first && !strstr(first + 1, "[plugin.cpu_blass]"), "%s", logged);
    CHECK_MSG(!strstr(logged, "[plugin.broken]"), "a plugin that is there but does not load was "
              "warned about: %s", logged);
    CHECK_MSG(!strstr(logged, "[plugin.cuda]"), "a plugin tessera ships but this build lacks "
              "was warned about: %s", logged);
    CHECK_MSG(!strstr(logged, "[plugin.cpu_blas] "), "the real plugin was warned about: %s",
              logged);
}

/* Runs ts_init(ini) + ts_shutdown with stderr captured into out. */
static void init_capturing_stderr(const char *ini, char *out, size_t len)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/stderr.txt", tap_tmpdir());
    fflush(stderr);
    int saved = dup(2), fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
    CHECK_OK(ts_init(ini));
    ts_shutdown();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(out, 1, len - 1, f) : 0;
    out[n] = 0;
    if (f)
        fclose(f);
}

/* Without a handler of the program's, a warning (here a fallback to another device) reaches
 * stderr instead of vanishing; log_level = error keeps it quiet. */
static void test_default_log_to_stderr(void)
{
    const char *ini = tap_write_file(tap_tmpdir(), "fallback.ini", "[core]\ndevice = cpu_blass\n");
    char err[8192];
    ts_set_log_handler(NULL, NULL); /* the default */
    init_capturing_stderr(ini, err, sizeof err);
    CHECK_STR_CONTAINS(err, "tessera: warn: ");
    CHECK_STR_CONTAINS(err, "falling back to 'cpu_blas'");
    ini = tap_write_file(tap_tmpdir(), "quiet.ini", "[core]\ndevice = cpu_blass\nlog_level = error\n");
    init_capturing_stderr(ini, err, sizeof err);
    CHECK_MSG(!strstr(err, "tessera: "), "log_level = error still logged a warning: %s", err);
}

/* A misspelt device is an error (or, with a fallback, a warning) that names the closest
 * plugin found. */
static void test_misspelt_device(void)
{
    const char *ini = tap_write_file(tap_tmpdir(), "device.ini",
                                     "[core]\ndevice = cpu_blass\nfallback =\n");
    CHECK_FAILS(ts_init(ini), TS_EPLUGIN, "'cpu_blass' not found", "did you mean 'cpu_blas'?");
    ini = tap_write_file(tap_tmpdir(), "device2.ini", "[core]\ndevice = cpu_blass\n");
    ts_set_log_handler(capture_log, NULL);
    logged[0] = 0;
    CHECK_OK(ts_init(ini));
    ts_shutdown();
    ts_set_log_handler(NULL, NULL);
    CHECK_STR_CONTAINS(logged, "did you mean 'cpu_blas'?");
    CHECK_STR_CONTAINS(logged, "falling back to 'cpu_blas'");
    ini = tap_write_file(tap_tmpdir(), "device4.ini", "[core]\ndevice = cpu_blsa\nfallback =\n");
    CHECK_FAILS(ts_init(ini), TS_EPLUGIN, "'cpu_blsa' not found", "did you mean 'cpu_blas'?");
    /* Far from every plugin: no guess. */
    ini = tap_write_file(tap_tmpdir(), "device3.ini", "[core]\ndevice = zzzzzzzzzz\nfallback =\n");
    CHECK_FAILS(ts_init(ini), TS_EPLUGIN, "'zzzzzzzzzz' not found");
    CHECK_MSG(!strstr(ts_last_error(), "did you mean"), "%s", ts_last_error());
}


/* The installed file is the bottom layer and the user's file goes on top of it key by key:
 * a user file that sets one key keeps every other installed setting, and each value says
 * which file and line set it. TESSERA_SYSTEM_CONFIG stands in for the installed file here. */
static void test_layers(void)
{
    const char *dir = tap_tmpdir();
    char sys[4200], user[4200], bad[4200];
    snprintf(sys, sizeof sys, "%s", tap_write_file(dir, "system.ini",
             "[core]\n"
             "device = sysdev\n"
             "log_level = info\n"
             "[plugin.cpu_blas]\n"
             "memory_fraction = 0.25\n"
             "cache_limit = 64M\n"));
    snprintf(user, sizeof user, "%s", tap_write_file(dir, "user.ini",
             "; mine\n"
             "[plugin.cpu_blas]\n"
             "cache_limit = 128M\n"
             "[core]\n"
             "device = userdev\n"));
    setenv("TESSERA_SYSTEM_CONFIG", sys, 1);
    unsetenv("TESSERA_CONFIG");
    setenv("XDG_CONFIG_HOME", "/nonexistent", 1);

    ts_config *cfg;
    CHECK_OK(ts_config_load(user, &cfg));
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "userdev") == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "log_level"), "info") == 0);
    CHECK(strcmp(ts_config_get(cfg, "plugin.cpu_blas", "cache_limit"), "128M") == 0);
    CHECK(strcmp(ts_config_get(cfg, "plugin.cpu_blas", "memory_fraction"), "0.25") == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "fallback"), "cpu_blas") == 0); /* default */
    /* Where each value came from. */
    CHECK(ts_config_file(cfg, "core", "device") &&
          strcmp(ts_config_file(cfg, "core", "device"), user) == 0);
    CHECK(ts_config_line(cfg, "core", "device") == 5);
    CHECK(ts_config_file(cfg, "core", "log_level") &&
          strcmp(ts_config_file(cfg, "core", "log_level"), sys) == 0);
    CHECK(ts_config_line(cfg, "core", "log_level") == 3);
    CHECK(strcmp(ts_config_file(cfg, "plugin.cpu_blas", "cache_limit"), user) == 0);
    CHECK(ts_config_line(cfg, "plugin.cpu_blas", "cache_limit") == 3);
    CHECK(strcmp(ts_config_file(cfg, "plugin.cpu_blas", "memory_fraction"), sys) == 0);
    CHECK(ts_config_line(cfg, "plugin.cpu_blas", "memory_fraction") == 5);
    CHECK(ts_config_file(cfg, "core", "fallback") == NULL);
    CHECK(ts_config_line(cfg, "core", "fallback") == 0);
    /* The layers, bottom first; the source is the top one. */
    CHECK(ts_config_layer(cfg, 0) && strcmp(ts_config_layer(cfg, 0), sys) == 0);
    CHECK(ts_config_layer(cfg, 1) && strcmp(ts_config_layer(cfg, 1), user) == 0);
    CHECK(ts_config_layer(cfg, 2) == NULL);
    CHECK(strcmp(ts_config_source(cfg), user) == 0);
    ts_config_free(cfg);

    /* The same layering for $TESSERA_CONFIG and the XDG file. */
    setenv("TESSERA_CONFIG", user, 1);
    CHECK_OK(ts_config_load(NULL, &cfg));
    CHECK(strcmp(ts_config_get(cfg, "core", "log_level"), "info") == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "userdev") == 0);
    ts_config_free(cfg);
    unsetenv("TESSERA_CONFIG");
    char xdg[4300], cmd[4400];
    snprintf(xdg, sizeof xdg, "%s/xdgl/tessera", dir);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", xdg);
    CHECK(system(cmd) == 0);
    tap_write_file(xdg, "tessera.ini", "[plugin.cpu_blas]\nmemory_fraction = 0.125\n");
    snprintf(xdg, sizeof xdg, "%s/xdgl", dir);
    setenv("XDG_CONFIG_HOME", xdg, 1);
    CHECK_OK(ts_config_load(NULL, &cfg));
    CHECK(strcmp(ts_config_get(cfg, "plugin.cpu_blas", "memory_fraction"), "0.125") == 0);
    CHECK(strcmp(ts_config_get(cfg, "plugin.cpu_blas", "cache_limit"), "64M") == 0);
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "sysdev") == 0);
    ts_config_free(cfg);
    setenv("XDG_CONFIG_HOME", "/nonexistent", 1);

    /* Only the installed file. */
    CHECK_OK(ts_config_load(NULL, &cfg));
    CHECK(strcmp(ts_config_source(cfg), sys) == 0);
    CHECK(ts_config_layer(cfg, 1) == NULL);
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "sysdev") == 0);
    ts_config_free(cfg);

    /* The installed file given as the user's too: read once. */
    CHECK_OK(ts_config_load(sys, &cfg));
    CHECK(ts_config_layer(cfg, 1) == NULL);
    ts_config_free(cfg);

    /* A key set twice in one file is still an error; once in each layer is an override. */
    snprintf(bad, sizeof bad, "%s", tap_write_file(dir, "twice.ini",
             "[core]\ndevice = a\ndevice = b\n"));
    CHECK_FAILS(ts_config_load(bad, &cfg), TS_ECONFIG, "twice.ini:3:", "set twice");

    /* A broken installed file is named as such, whatever the user's file says. */
    const char *broken = tap_write_file(dir, "broken-system.ini", "[core]\nthreads = 2\n");
    setenv("TESSERA_SYSTEM_CONFIG", broken, 1);
    CHECK_FAILS(ts_config_load(user, &cfg), TS_ECONFIG, "broken-system.ini:2:", "'threads'");

    /* Empty: no installed file (the test suite runs this way); a missing one is skipped. */
    setenv("TESSERA_SYSTEM_CONFIG", "", 1);
    CHECK_OK(ts_config_load(user, &cfg));
    CHECK(ts_config_layer(cfg, 1) == NULL);
    CHECK(strcmp(ts_config_get(cfg, "core", "log_level"), "warn") == 0);
    ts_config_free(cfg);
    setenv("TESSERA_SYSTEM_CONFIG", "/nonexistent/tessera.ini", 1);
    CHECK_OK(ts_config_load(user, &cfg));
    CHECK(strcmp(ts_config_layer(cfg, 0), user) == 0);
    ts_config_free(cfg);
    /* The installed file as a directory or FIFO is an error, not silently skipped. */
    setenv("TESSERA_SYSTEM_CONFIG", dir, 1);
    CHECK_FAILS(ts_config_load(user, &cfg), TS_EIO, dir);
    unsetenv("TESSERA_SYSTEM_CONFIG");
}

/* Loads path alone (no installed file) and expects a refusal naming it and needle. */
static void refused(const char *path, const char *needle)
{
    ts_config *cfg = (ts_config *)1;
    CHECK_FAILS(ts_config_load(path, &cfg), TS_ECONFIG, path, needle);
    CHECK(cfg == NULL);
}

/* A configuration file names the code that runs (device, plugin_path, [dist] backend), so it
 * passes the plugins' trust rule before anything in it is honoured. */
static void test_untrusted_files_refused(void)
{
    setenv("TESSERA_SYSTEM_CONFIG", "", 1);
    unsetenv("TESSERA_CONFIG");
    const char *dir = tap_tmpdir();
    char path[4200];
    snprintf(path, sizeof path, "%s", tap_write_file(dir, "open.ini", "[core]\ndevice = x\n"));
    CHECK(chmod(path, 0666) == 0);
    refused(path, "writable by every user");
    CHECK(chmod(path, 0664) == 0);
    refused(path, "writable by its group");
    CHECK(chmod(path, 0644) == 0);
    ts_config *cfg = NULL;
    CHECK_OK(ts_config_load(path, &cfg));
    ts_config_free(cfg);
    /* The same through $TESSERA_CONFIG (and the XDG file, below). */
    CHECK(chmod(path, 0646) == 0);
    setenv("TESSERA_CONFIG", path, 1);
    CHECK_FAILS(ts_config_load(NULL, &cfg), TS_ECONFIG, path, "every user");
    unsetenv("TESSERA_CONFIG");
    CHECK(chmod(path, 0644) == 0);
    /* A directory above it that others can write and that is not sticky. */
    char sub[4200], in_sub[4300];
    snprintf(sub, sizeof sub, "%s/shared", dir);
    CHECK(mkdir(sub, 0700) == 0);
    snprintf(in_sub, sizeof in_sub, "%s", tap_write_file(sub, "t.ini", "[core]\n"));
    CHECK(chmod(sub, 0777) == 0);
    refused(in_sub, "writable by every user and not sticky");
    CHECK(chmod(sub, 0770) == 0);
    refused(in_sub, "writable by its group (or an ACL entry) and not sticky");
    /* Sticky, as /tmp: no one else can rename or remove our entry. */
    CHECK(chmod(sub, 01777) == 0);
    CHECK_OK(ts_config_load(in_sub, &cfg));
    ts_config_free(cfg);
    /* The XDG file is checked as well. */
    char xdg[4200], xdgdir[4300];
    snprintf(xdg, sizeof xdg, "%s/xdg", dir);
    snprintf(xdgdir, sizeof xdgdir, "%s/tessera", xdg);
    CHECK(mkdir(xdg, 0700) == 0 && mkdir(xdgdir, 0700) == 0);
    const char *x = tap_write_file(xdgdir, "tessera.ini", "[core]\n");
    CHECK(chmod(x, 0666) == 0);
    setenv("XDG_CONFIG_HOME", xdg, 1);
    CHECK_FAILS(ts_config_load(NULL, &cfg), TS_ECONFIG, "tessera.ini", "every user");
    setenv("XDG_CONFIG_HOME", "/nonexistent", 1);
    /* Another user's file (root can make one to test with). */
    if (geteuid() == 0) {
        CHECK(chown(path, 65534, 65534) == 0);
        refused(path, "owned by uid 65534");
        CHECK(chown(path, 0, 0) == 0);
        CHECK(chown(sub, 65534, 0) == 0);
        refused(in_sub, "owned by uid 65534");
        /* ...also as the installed file */
        setenv("TESSERA_SYSTEM_CONFIG", in_sub, 1);
        CHECK_FAILS(ts_config_load(NULL, &cfg), TS_ECONFIG, "installed", in_sub);
        setenv("TESSERA_SYSTEM_CONFIG", "", 1);
    }
    unsetenv("TESSERA_SYSTEM_CONFIG");
}

/* Only the installed file may turn the plugin trust rule off: the user's file can choose the
 * plugin, so together the two keys would load any code. */
static void test_insecure_only_installed(void)
{
    const char *dir = tap_tmpdir();
    char sys[4200], user[4200];
    snprintf(sys, sizeof sys, "%s", tap_write_file(dir, "sys.ini",
             "[core]\nallow_insecure_plugin_path = true\n"));
    snprintf(user, sizeof user, "%s", tap_write_file(dir, "user.ini",
             "[core]\ndevice = /tmp/x.so\nallow_insecure_plugin_path = yes\n"));
    setenv("TESSERA_SYSTEM_CONFIG", "", 1);
    unsetenv("TESSERA_CONFIG");
    setenv("XDG_CONFIG_HOME", "/nonexistent", 1);
    ts_config *cfg = NULL;
    CHECK_FAILS(ts_config_load(user, &cfg), TS_ECONFIG, user, ":3:",
                "honoured only in the installed configuration");
    setenv("TESSERA_CONFIG", user, 1);
    CHECK_FAILS(ts_config_load(NULL, &cfg), TS_ECONFIG, user, "allow_insecure_plugin_path");
    unsetenv("TESSERA_CONFIG");
    /* false is no risk */
    const char *off = tap_write_file(dir, "off.ini", "[core]\nallow_insecure_plugin_path = no\n");
    CHECK_OK(ts_config_load(off, &cfg));
    ts_config_free(cfg);
    /* Not a file $TESSERA_SYSTEM_CONFIG names either, root-owned or not: an environment kept
     * from another user could name any file that happens to set the key. (The installed file
     * at its built-in path may; the program's own text may: test-loader, test-plugin-trust.) */
    setenv("TESSERA_SYSTEM_CONFIG", sys, 1);
    CHECK_FAILS(ts_config_load(NULL, &cfg), TS_ECONFIG, sys, "not one named by");
    unsetenv("TESSERA_SYSTEM_CONFIG");
    /* Any spelling the parser takes is the value the loader sees. */
    cfg = parse_ok("[core]\nallow_insecure_plugin_path = TRUE\n");
    CHECK(strcmp(ts_config_get(cfg, "core", "allow_insecure_plugin_path"), "TRUE") == 0);
    ts_config_free(cfg);
}

/* An empty name is an error, not the installed file; a relative $XDG_CONFIG_HOME is ignored
 * (the XDG specification); pseudo-files and oversized files are refused unread. */
static void test_config_paths(void)
{
    setenv("TESSERA_SYSTEM_CONFIG", "", 1);
    unsetenv("TESSERA_CONFIG");
    ts_config *cfg = (ts_config *)1;
    CHECK_FAILS(ts_config_load("", &cfg), TS_EINVAL, "empty");
    CHECK(cfg == NULL);
    const char *dir = tap_tmpdir();
    char rel[4200];
    snprintf(rel, sizeof rel, "%s/rel/tessera", dir);
    CHECK(mkdir(tap_path_in(dir, "rel"), 0700) == 0 && mkdir(rel, 0700) == 0);
    tap_write_file(rel, "tessera.ini", "[core]\ndevice = relative_xdg\n");
    char cwd[4200];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(dir) == 0);
    setenv("XDG_CONFIG_HOME", "rel", 1);
    setenv("HOME", "/nonexistent", 1);
    CHECK_OK(ts_config_load(NULL, &cfg));
    CHECK(strcmp(ts_config_get(cfg, "core", "device"), "relative_xdg") != 0);
    ts_config_free(cfg);
    CHECK(chdir(cwd) == 0);
    setenv("XDG_CONFIG_HOME", "/nonexistent", 1);
    refused("/proc/self/mem", "pseudo-file");
    refused("/proc/self/status", "pseudo-file");
    char big[4200];
    snprintf(big, sizeof big, "%s/big.ini", dir);
    FILE *f = fopen(big, "w");
    CHECK(f != NULL);
    for (int i = 0; i < 70000; i++)
        fputs("; a comment line\n", f);
    CHECK(fclose(f) == 0);
    refused(big, "at most");
    unsetenv("TESSERA_SYSTEM_CONFIG");
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_full_file),     TAP_TEST(test_defaults),
        TAP_TEST(test_unknown_key_and_section), TAP_TEST(test_bad_values),
        TAP_TEST(test_syntax_errors), TAP_TEST(test_sizes),
        TAP_TEST(test_files),         TAP_TEST(test_lookup_order),
        TAP_TEST(test_unknown_plugin_sections), TAP_TEST(test_fraction_byte_limit),
        TAP_TEST(test_misspelt_device),
        TAP_TEST(test_default_log_to_stderr), TAP_TEST(test_layers),
        TAP_TEST(test_untrusted_files_refused), TAP_TEST(test_insecure_only_installed),
        TAP_TEST(test_config_paths),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
