/* tests/unit/test-config.c: the INI loader: every bad input gives TS_ECONFIG naming file,
 * line, key and the expected form; good input and defaults come back as written. */
#include "config.h"

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

static char logged[4096];

static void capture_log(int level, const char *msg, void *user)
{
    (void)user;
    if (level <= TS_LOG_WARN)
        snprintf(logged + strlen(logged), sizeof logged - strlen(logged), "%s\n", msg);
}

/* A section for a plugin that is not on the search path: a misspelling of one that is gets a
 * warning naming the closest; a plugin simply not installed here (a GPU plugin on a CPU box)
 * gets no warning; a section for a plugin that is there gets none. */
static void test_unknown_plugin_sections(void)
{
    const char *ini = tap_write_file(tap_tmpdir(), "sections.ini",
                                     "[core]\ndevice = cpu_blas\n"
                                     "[plugin.cpu_blas]\nthreads = 1\n"
                                     "[plugin.cpu_blass]\nthreads = 1\ncache_limit = 1M\n"
                                     "[plugin.vendorgpu]\nthreads = 1\n");
    ts_set_log_handler(capture_log, NULL);
    logged[0] = 0;
    CHECK_OK(ts_init(ini));
    ts_shutdown();
    ts_set_log_handler(NULL, NULL);
    CHECK_STR_CONTAINS(logged, "sections.ini:6: [plugin.cpu_blass] names no plugin");
    CHECK_STR_CONTAINS(logged, "did you mean [plugin.cpu_blas]?");
    /* once per section, and nothing about the others */
    const char *first = strstr(logged, "[plugin.cpu_blass]");
    CHECK(first && !strstr(first + 1, "[plugin.cpu_blass]"));
    CHECK_MSG(!strstr(logged, "vendorgpu"), "a plugin not installed here was warned about: %s",
              logged);
    CHECK_MSG(!strstr(logged, "[plugin.cpu_blas] "), "the real plugin was warned about: %s",
              logged);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {
        TAP_TEST(test_full_file),     TAP_TEST(test_defaults),
        TAP_TEST(test_unknown_key_and_section), TAP_TEST(test_bad_values),
        TAP_TEST(test_syntax_errors), TAP_TEST(test_sizes),
        TAP_TEST(test_files),         TAP_TEST(test_lookup_order),
        TAP_TEST(test_unknown_plugin_sections),
    };
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
