/* tests/unit/test-fuzz-regress.c: every input in tests/fuzz/corpus/{config,checkpoint,idx,npy,
 * elf} (the seeds, what libFuzzer's runs kept as new coverage, and any crash-* it found) goes
 * through its loader (for elf: plugin-check's symbol reader, tools/elf_exports.c, compiled in)
 * in the normal suite, so the sanitizer build re-checks them all on every
 * run and a fixed crash stays fixed. Inputs named ok-* must load; the rest may fail, but with
 * a status, a message and nothing left behind. */
#include <dirent.h>
#include <sys/stat.h>

#include "../tap.h"
#include "../../tools/elf_exports.h"

/* The reason a reader that reports its own (not through ts_last_error) gave; "" if none. */
static const char *feed_why = "";

typedef ts_status (*feed_fn)(const char *path, ts_device *dev);

static ts_status feed_config(const char *path, ts_device *dev)
{
    (void)dev;
    FILE *f = fopen(path, "rb");
    CHECK(f);
    static char text[1 << 20];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    ts_config *cfg = (ts_config *)1;
    ts_status s = ts_config_parse(text, "corpus.ini", "/nonexistent", &cfg);
    if (s == TS_OK) {
        (void)ts_config_get(cfg, "core", "device");
        ts_config_free(cfg);
    } else {
        CHECK(cfg == NULL);
    }
    return s;
}

static ts_status feed_checkpoint(const char *path, ts_device *dev)
{
    ts_checkpoint *ck = (ts_checkpoint *)1;
    ts_status s = ts_checkpoint_load(path, dev, &ck);
    if (s != TS_OK) {
        CHECK(ck == NULL);
        return s;
    }
    for (size_t i = 0; i < ts_checkpoint_count(ck); i++) {
        ts_tensor *t = ts_checkpoint_get(ck, ts_checkpoint_name(ck, i));
        CHECK(t);
        size_t n = (size_t)ts_tensor_numel(t) * ts_dtype_size(ts_tensor_dtype(t));
        void *buf = malloc(n ? n : 1);
        CHECK_OK(ts_tensor_to_host(t, buf, n));
        free(buf);
    }
    ts_checkpoint_free(ck);
    return s;
}

/* A loader of one tensor: an error without a tensor, or a tensor whose bytes all read. */
static ts_status feed_tensor(const char *path, ts_device *dev,
                             ts_status (*load)(const char *, ts_device *, ts_tensor **))
{
    ts_tensor *t = (ts_tensor *)1;
    ts_status s = load(path, dev, &t);
    if (s != TS_OK) {
        CHECK(t == NULL);
        return s;
    }
    size_t n = (size_t)ts_tensor_numel(t) * ts_dtype_size(ts_tensor_dtype(t));
    void *buf = malloc(n ? n : 1);
    CHECK_OK(ts_tensor_to_host(t, buf, n));
    free(buf);
    ts_tensor_unref(t);
    return s;
}

static ts_status feed_idx(const char *path, ts_device *dev)
{
    return feed_tensor(path, dev, ts_idx_load);
}

static ts_status feed_npy(const char *path, ts_device *dev)
{
    return feed_tensor(path, dev, ts_npy_load);
}

/* plugin-check's ELF symbol reader, on the file's bytes at an odd address (a file's structs
 * need not be aligned): a count and a terminated list, or -1 and a reason. */
static ts_status feed_elf(const char *path, ts_device *dev)
{
    (void)dev;
    FILE *f = fopen(path, "rb");
    CHECK(f);
    static unsigned char bytes[1 << 20];
    size_t n = fread(bytes + 1, 1, sizeof bytes - 1, f);
    fclose(f);
    char out[64];
    int k = pc_elf_exports(bytes + 1, n, out, sizeof out, &feed_why);
    CHECK(feed_why);
    if (k < 0)
        return TS_ECORRUPT;
    CHECK(memchr(out, 0, sizeof out));
    return TS_OK;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void feed_dir(const char *name, feed_fn fn)
{
    ts_device *dev = tap_start();
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/../fuzz/corpus/%s", tap_srcdir(), name);
    DIR *d = opendir(dir);
    CHECK_MSG(d, "no corpus at %s", dir);
    char *names[4096];
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096)
        if (e->d_name[0] != '.')
            names[n++] = strdup(e->d_name);
    closedir(d);
    qsort(names, n, sizeof *names, cmp_name);
    int loaded = 0, refused = 0, ok_seeds = 0;
    for (size_t i = 0; i < n; i++) {
        char path[8300];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        ts_clear_error();
        feed_why = "";
        ts_status s = fn(path, dev);
        if (strncmp(names[i], "ok-", 3) == 0) {
            CHECK_MSG(s == TS_OK, "%s/%s: %s: %s", name, names[i], ts_status_name(s),
                      feed_why[0] ? feed_why : ts_last_error());
            ok_seeds++;
        }
        if (s == TS_OK) {
            loaded++;
        } else {
            CHECK_MSG(ts_last_error()[0] || feed_why[0], "%s/%s: %s without a message", name,
                      names[i], ts_status_name(s));
            refused++;
        }
        free(names[i]);
    }
    CHECK(ok_seeds > 0);
    printf("# %s: %zu inputs, %d loaded, %d refused\n", name, n, loaded, refused);
    tap_end();
}

static void test_config_corpus(void)
{
    feed_dir("config", feed_config);
}

static void test_checkpoint_corpus(void)
{
    feed_dir("checkpoint", feed_checkpoint);
}

static void test_idx_corpus(void)
{
    feed_dir("idx", feed_idx);
}

static void test_npy_corpus(void)
{
    feed_dir("npy", feed_npy);
}

static void test_elf_corpus(void)
{
    feed_dir("elf", feed_elf);
}

int main(int argc, char **argv)
{
    static const tap_test tests[] = {TAP_TEST(test_config_corpus),
                                     TAP_TEST(test_checkpoint_corpus),
                                     TAP_TEST(test_idx_corpus), TAP_TEST(test_npy_corpus),
                                     TAP_TEST(test_elf_corpus)};
    return tap_run(tests, sizeof tests / sizeof tests[0], argc, argv);
}
